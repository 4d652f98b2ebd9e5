#!/usr/bin/env bash
# The whole GPU check in one call on the device machine (see README "Developing"): GPU tests, the demo on every
# GPU, the wait/record benchmarks. Full logs and JSON go to $OUT; a short table is printed last.
#   carry: [".whl"]   (made by ../shared/device/fetch-wheels.sh: nvtx, pytest-asyncio, trio, outcome, sniffio)
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1
nvidia-smi -L
python3 -c "from importlib.metadata import version as v; print({p: v(p) for p in ('cuda-core', 'cuda-bindings', 'anyio', 'numpy', 'trio', 'nvtx')})"
python3 -m pytest -q -rs -p no:cacheprovider tests "$@" 2>&1 | tee "$OUT/pytest.log" | tail -25
echo "pytest exit: ${PIPESTATUS[0]}"
CUDA_VISIBLE_DEVICES=0 python3 -m pytest -q -rs -p no:cacheprovider -m gpu tests 2>&1 | tee "$OUT/pytest-1gpu.log" | tail -3
COLUMNS=110 python3 -m asyncgpu demo --trace "$OUT/demo.trace.json" 2>&1 | tee "$OUT/demo.txt" | tail -14
COLUMNS=110 python3 -m asyncgpu devices 2>&1 | tee "$OUT/devices.txt"
python3 examples/two_gpus.py > /tmp/examples.txt 2>&1 && python3 examples/framework_streams.py >> /tmp/examples.txt 2>&1; echo "examples exit: $?"
timeout 90 python3 examples/kernel_stages.py --trace "$OUT/kstages.trace.json" > "$OUT/kstages.txt" 2>&1; echo "kernel_stages exit: $?"; timeout 120 python3 benchmarks/bench_kprofile.py --out "$OUT/kprofile.json" 2>&1 | sed -n '/^== /,$p'  # in-kernel records (issue 5)
# benchmark helper and framework interop (issue 6)
timeout 120 python3 examples/torch_cupy_two_gpus.py > "$OUT/torch_cupy.txt" 2>&1; echo "torch/cupy example exit: $?"; tail -4 "$OUT/torch_cupy.txt"
timeout 120 python3 benchmarks/bench_peers.py --out "$OUT/peers.json" 2>&1 | tail -10
# thread-to-thread handoff (issue 4)
timeout 120 python3 examples/handoff_two_gpus.py --trace "$OUT/handoff.trace.json" 2>&1 | tee "$OUT/handoff_example.txt" | tail -8
timeout 150 python3 benchmarks/bench_handoff.py --out "$OUT/handoff.json" 2>&1 | sed -n '/^== /,$p'
timeout 120 python3 benchmarks/bench_clock.py --out "$OUT/clock.json" 2>&1 | sed -n '/^== /,$p'
[ -z "${SKIP_ACCURACY:-}" ] && timeout 120 python3 benchmarks/bench_accuracy.py --out "$OUT/accuracy.json" 2>&1 | sed -n '/^== /,$p'
if [ -z "${SKIP_WAIT_BENCH:-}" ]; then
  timeout 300 python3 benchmarks/bench_wait.py --out "$OUT/bench_wait.json" 2>&1 | sed -n '/^== /,$p'
fi
