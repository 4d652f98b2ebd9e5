#!/usr/bin/env bash
# The whole GPU check in one call on the device machine (see README "Developing"): GPU tests on every GPU and on
# one, the demo, the examples, the benchmarks. Everything goes to $OUT/all.txt (JSON results next to it); the
# tail of each step is printed, the benchmark tables last.
#   carry: [".whl"]   (made by ../shared/device/fetch-wheels.sh: nvtx, pytest-asyncio, trio, outcome, sniffio)
#   (add cupti-python==13.0.1 perfetto protobuf to fetch-wheels.sh for the CUPTI tests and the native traces)
#   SKIP_WAIT_BENCH=1, SKIP_ACCURACY=1, SKIP_LOAD_BENCH=1: leave out the longest benchmarks
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1 COLUMNS=110
ALL="$OUT/all.txt"
step() {  # step NAME LIMIT_S TAIL_LINES COMMAND...: run with a time limit, log all, print the tail and the exit code
  local name=$1 limit=$2 lines=$3; shift 3
  echo "== [$name]" >> "$ALL"
  timeout "$limit" "$@" > /tmp/step.txt 2>&1; local rc=$?
  cat /tmp/step.txt >> "$ALL"
  echo "-- [$name] exit $rc"; tail -n "$lines" /tmp/step.txt
}
nvidia-smi -L | tee -a "$ALL"
python3 -c "from importlib.metadata import version as v; print({p: v(p) for p in ('cuda-core', 'cuda-bindings', 'anyio', 'numpy', 'trio', 'nvtx', 'torch', 'cupy-cuda12x')})" 2>&1 | tee -a "$ALL"
step "pytest, every GPU" 420 6 python3 -m pytest -q -p no:cacheprovider -o faulthandler_timeout=60 tests "$@"
grep -E "^(FAILED|ERROR)" "$ALL" | head -20
step "pytest -m gpu, one GPU" 150 2 env CUDA_VISIBLE_DEVICES=0 python3 -m pytest -q -p no:cacheprovider -m gpu tests "$@"
step "demo" 60 3 python3 -m asyncgpu demo --trace /tmp/demo.pftrace
step "report of the demo's trace" 30 3 python3 -m asyncgpu report /tmp/demo.pftrace
step "demo at 80 columns, piped (progress on stderr)" 60 40 env COLUMNS=80 python3 -m asyncgpu demo --no-trace
step "demo, Ctrl-C after 3 s (expect: one line, exit 130)" 30 3 bash -c 'timeout --preserve-status -s INT 3 python3 -m asyncgpu demo --elements 500000000 --no-trace -q; echo "exit $?"'
step "devices" 30 6 python3 -m asyncgpu devices
step "examples/two_gpus.py + framework_streams.py" 90 2 bash -c "python3 examples/two_gpus.py && python3 examples/framework_streams.py"
step "examples/kernel_stages.py (issue 5)" 90 4 python3 examples/kernel_stages.py --trace /tmp/kstages.pftrace
step "examples/torch_cupy_two_gpus.py (issue 6)" 90 4 python3 examples/torch_cupy_two_gpus.py
step "examples/handoff_two_gpus.py (issue 4)" 90 5 python3 examples/handoff_two_gpus.py --trace /tmp/handoff.pftrace
if [ -f examples/gather_ranks.py ] && command -v torchrun >/dev/null; then
  step "torchrun examples/gather_ranks.py (issue 7)" 120 25 torchrun --standalone --nproc-per-node "$(nvidia-smi -L | wc -l)" examples/gather_ranks.py --trace /tmp/gather.pftrace
fi
step "bench_clock" 90 12 python3 benchmarks/bench_clock.py --out "$OUT/clock.json"
step "bench_kprofile" 120 14 python3 benchmarks/bench_kprofile.py --out "$OUT/kprofile.json"
step "bench_peers" 120 12 python3 benchmarks/bench_peers.py --out "$OUT/peers.json"
step "bench_handoff" 150 16 python3 benchmarks/bench_handoff.py --out "$OUT/handoff.json"
[ -z "${SKIP_ACCURACY:-}" ] && step "bench_accuracy" 120 10 python3 benchmarks/bench_accuracy.py --out "$OUT/accuracy.json"
[ -z "${SKIP_WAIT_BENCH:-}" ] && step "bench_wait" 300 30 python3 benchmarks/bench_wait.py --out "$OUT/bench_wait.json"
[ -z "${SKIP_LOAD_BENCH:-}" ] && step "bench_load" 400 32 python3 benchmarks/bench_load.py --queue --cost --ticker --out "$OUT/bench_load.json"
exit 0
