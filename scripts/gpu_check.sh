#!/usr/bin/env bash
# The whole GPU check in one call on the device machine (see README "Developing"): GPU tests on every GPU and on
# one, the demo, the examples, the benchmarks. Everything goes to $OUT/all.txt (JSON results next to it); the
# tail of each step is printed, and a table of every step last (step, exit code, seconds, key figure). Exits 1
# when a step failed. The benchmarks run through their runner, one suite a step (`python -m benchmarks SUITE`):
# each step writes $OUT/benchmarks/benchmarks-<time>.json, and `python -m benchmarks.table $OUT/benchmarks`
# renders the table of current figures from them (benchmarks/RESULTS.md says how).
#   carry: [".whl"]   (made by ../shared/device/fetch-wheels.sh: nvtx, pytest-asyncio, trio, cupti-python, perfetto…)
#   ONLY=REGEX: run only the steps whose name matches (e.g. ONLY='demo|workers|balance')
#   SKIP=REGEX: leave out the steps whose name matches (e.g. SKIP='waits|timing'; a suite's step names its scripts)
#   REPEAT=N: the two GPU-suite steps N times in a row (e.g. ONLY='pytest -m gpu' REPEAT=3 for three one-GPU runs)
#   PARTS_REPEAT=N: the step 'steps parts' N times, then each run's always-on cost and the medians (e.g.
#     ONLY='steps parts' PARTS_REPEAT=3: ~45 s a run)
#   COPY_VARIANTS=LIST: on 2+ GPUs, the copy test's reproduction per variant (e.g. COPY_VARIANTS='base streams1
#     streams2 primer-generic'; default base)
#   CUPTI_VARIANTS=LIST: the variants dev/diag_step_cupti runs (e.g. CUPTI_VARIANTS=default,toggle,alternate)
#   ASYNCGPU_COMMIT=SHA: the commit the benchmarks' JSON names (set it from your checkout: the device machine's copy
#     of the tree may carry a stale .git), e.g. command "ASYNCGPU_COMMIT=$(git rev-parse HEAD) bash scripts/gpu_check.sh"
#   extra arguments go to the pytest steps
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1 COLUMNS=110 NCCL_NVLS_ENABLE=0 NCCL_CUMEM_ENABLE=0
ALL="$OUT/all.txt"
if [ -e "$ALL" ] && [ /proc/self/fd/1 -ef "$ALL" ]; then  # (both would write it: each step's log overwritten)
  echo "gpu_check: its standard output is $ALL, the log it writes itself: send it elsewhere (> \$OUT/stdout.txt)" >&2
  exit 2
fi
NGPU=$(nvidia-smi -L | wc -l)
TABLE=()
FAILED=0
step() {  # step NAME LIMIT_S TAIL_LINES COMMAND...: run with a time limit, log all, print the tail and the exit code
  local name=$1 limit=$2 lines=$3; shift 3
  if [ -n "${ONLY:-}" ] && ! [[ $name =~ $ONLY ]]; then return; fi
  if [ -n "${SKIP:-}" ] && [[ $name =~ $SKIP ]]; then return; fi
  echo "== [$name]" >> "$ALL"
  local t0=$SECONDS
  timeout "$limit" "$@" > /tmp/step.txt 2>&1; local rc=$?
  cat /tmp/step.txt >> "$ALL"
  echo "-- [$name] exit $rc ($((SECONDS - t0)) s)"; tail -n "$lines" /tmp/step.txt
  local key; key=$(grep -E "^(KEY|[0-9]+ (passed|failed))|passed|failed" /tmp/step.txt | tail -n 1 | cut -c1-90)
  TABLE+=("$(printf '%-44s %4s %5ss  %s' "$name" "$rc" "$((SECONDS - t0))" "$key")")
  [ "$rc" -ne 0 ] && FAILED=1
}
nvidia-smi -L | tee -a "$ALL"
python3 - <<'PY' 2>&1 | tee -a "$ALL"
from importlib.metadata import PackageNotFoundError, version
def v(p):
    try:
        return version(p)
    except PackageNotFoundError:
        return "not installed"
print({p: v(p) for p in ('cuda-core', 'cuda-bindings', 'anyio', 'numpy', 'trio', 'nvtx', 'torch', 'cupy-cuda12x')})
PY
demo_offsets() {  # the demo on the first N GPUs: each device's first start, from the scope's start (ms)
  python3 -m asyncgpu demo --devices "$1" --no-trace --format json -q > "$OUT/demo$1.json" || return 1
  python3 - "$OUT/demo$1.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
rows = d["device_summary"]["rows"]
first = [r["first_start_ms"] for r in rows]
last = [r["last_end_ms"] for r in rows]
print("first starts (ms):", [round(x, 3) for x in first], "last ends:", [round(x, 3) for x in last])
print(f"KEY spread of first starts {1000 * (max(first) - min(first)):.0f} us over {len(rows)} GPUs; overlap "
      f"{'yes' if max(first) < min(last) else 'NO'}")
PY
}
export OUT
export -f demo_offsets
for n in 2 4 8; do
  [ "$NGPU" -ge "$n" ] && step "demo start offsets, $n GPUs" 90 3 bash -c "demo_offsets $n"
done
step "demo" 60 3 python3 -m asyncgpu demo --trace /tmp/demo.pftrace
step "report of the demo's trace" 30 3 python3 -m asyncgpu report /tmp/demo.pftrace
step "demo at 80 columns, piped (progress on stderr)" 60 40 env COLUMNS=80 python3 -m asyncgpu demo --no-trace
step "demo, Ctrl-C after 3 s (expect: one line, exit 130)" 30 3 bash -c 'timeout --preserve-status -s INT 3 python3 -m asyncgpu demo --elements 500000000 --no-trace -q; echo "exit $?"'
step "devices" 30 6 python3 -m asyncgpu devices
step "examples/two_gpus.py + framework_streams.py" 90 2 bash -c "python3 examples/two_gpus.py && python3 examples/framework_streams.py"
step "examples/kernel_stages.py" 90 4 python3 examples/kernel_stages.py --trace /tmp/kstages.pftrace
step "examples/torch_cupy_two_gpus.py" 90 4 python3 examples/torch_cupy_two_gpus.py
step "examples/handoff_two_gpus.py" 90 5 python3 examples/handoff_two_gpus.py --trace /tmp/handoff.pftrace
if [ -f examples/gather_ranks.py ] && command -v torchrun >/dev/null; then
  step "torchrun examples/gather_ranks.py" 120 25 torchrun --standalone --nproc-per-node "$NGPU" examples/gather_ranks.py --trace /tmp/gather.pftrace
  [ "$NGPU" -ge 2 ] && step "torchrun dev/diag_ddp_steps (DDP: step timing's cost per rank, a slow rank flagged)" 300 8 torchrun --standalone --nproc-per-node "$NGPU" dev/diag_ddp_steps.py
fi
BENCH=(python3 -m benchmarks --out "$OUT/benchmarks")
[ "$NGPU" -ge 2 ] && step "benchmarks orchestration (bench_workers, bench_balance on 2, 4, 8 GPUs)" 1500 40 "${BENCH[@]}" --limit 240 orchestration
[ "$NGPU" -ge 2 ] && step "dev/diag_handoff (trio handoff)" 120 8 python3 -X faulthandler dev/diag_handoff.py --items 200
step "dev/diag_ticker (the loop-ticking test's workload: long launches and the backend calls beside them)" 240 12 bash -c "for l in asyncio uvloop trio; do python3 -X faulthandler dev/diag_ticker.py \$l ${TICKER_REPS:-12} \"$OUT/ticker-dumps.txt\" --calls ${TICKER_ARGS:-} || exit 1; done"
step "pytest orchestration (queue, workers, balance)" 240 4 python3 -m pytest -q -p no:cacheprovider -o faulthandler_timeout=60 tests/test_load.py tests/test_workers.py tests/test_summary.py tests/test_cli.py "$@"
for r in $(seq "${REPEAT:-1}"); do  # (REPEAT=3: three runs in a row, each its own row in the table)
  run=""; [ "${REPEAT:-1}" -gt 1 ] && run=" (run $r)"
  step "pytest, every GPU$run" 420 6 python3 -m pytest -q -p no:cacheprovider -o faulthandler_timeout=60 tests "$@"
  step "pytest -m gpu, one GPU$run" 150 2 env CUDA_VISIBLE_DEVICES=0 python3 -m pytest -q -p no:cacheprovider -m gpu tests "$@"
done
# (2+ GPUs: the suite's first tests, the whole suite collected, up to the copy test, which failed in 2-GPU suites
# while it nested events inside CUPTI: benchmarks/HISTORY.md runs 41-42)
# COPY_VARIANTS: base (as the suite), streamsK (K idle streams made on cuda:0 before the test), primer-generic,
# primer-none (dev/diag_suite_copy.py's DIAG_EXTRA_STREAMS and DIAG_PRIMER); ~80 s each; after the test, its pattern
# again in parts on its own device (DIAG_AFTER_TEST)
if [ "$NGPU" -ge 2 ]; then
  for v in ${COPY_VARIANTS:-base}; do
    extra=(DIAG_AFTER_TEST=copies_between_device_buffers); case $v in streams*) extra+=(DIAG_EXTRA_STREAMS="${v#streams}");; primer-*) extra+=(DIAG_PRIMER="${v#primer-}");; esac
    step "pytest up to the copy test, the whole suite collected ($v)" 240 70 env "${extra[@]}" DIAG_VARIANTS= DIAG_CUT_AFTER=copies_between_device_buffers python3 -m pytest -q -p no:cacheprovider -o faulthandler_timeout=60 -p dev.diag_suite_copy tests
  done
fi
step "dev/diag_placement (reference, per-kind excess, placement)" 240 40 python3 -X faulthandler dev/diag_placement.py --repeats 12 --out "$OUT"
step "dev/diag_fresh_clock (%globaltimer vs host, a fresh process's first 3 s)" 60 30 python3 -X faulthandler dev/diag_fresh_clock.py --seconds 3 --out "$OUT"
step "dev/diag_step_cupti (CUPTI step source: harvests by part)" 540 24 python3 -X faulthandler dev/diag_step_cupti.py --steps 600 --pairs 6 --devices "$NGPU" --variants ${CUPTI_VARIANTS:-default,harvest-2s,flush-only,toggle,alternate,no-flush}
step "dev/diag_step_events (events step source: where the cost is)" 240 10 python3 -X faulthandler dev/diag_step_events.py --devices "$NGPU" --steps 150 --pairs 10 --variants alternate,toggle,default
step "dev/diag_outliers (events vs CUPTI vs in-kernel stamps, back to back)" 240 30 python3 -X faulthandler dev/diag_outliers.py --rounds 5 --out "$OUT/outliers.txt"
step "dev/diag_busy_pair (events vs CUPTI per busy sequence and hold)" 180 40 python3 -X faulthandler dev/diag_busy_pair.py --rounds 5 --reference cupti,apart,torch --out "$OUT/busy_pair.txt"
step "dev/diag_cut_choice (which cut each held case takes, and its raw pair excess, per GPU)" 300 60 bash -c "for g in \$(seq 0 $((NGPU - 1))); do python3 -X faulthandler dev/diag_cut_choice.py --rounds ${CUT_ROUNDS:-12} --device \$g --out \"$OUT/cut_choice_\$g.txt\" || exit 1; done"
step "dev/diag_spill (work that spills the L2: events and CUPTI against %globaltimer brackets)" 180 40 python3 -X faulthandler dev/diag_spill.py --rounds 20 --out "$OUT/spill.txt"
step "dev/diag_copy_cut (the calibration's pair around copies and memsets by size and tail)" 120 30 python3 -X faulthandler dev/diag_copy_cut.py --repeats 5 --out "$OUT/copy_cut.txt"
step "dev/diag_copy_pair (copies between device buffers: the copy test's pattern, per position)" 150 20 python3 -X faulthandler dev/diag_copy_pair.py --rounds 60 --variants test,raw,tail,lead,slow --out "$OUT/copy_pair.txt"
step "dev/diag_copy_stamps (copies bracketed by %globaltimer stamps: no scope, events, CUPTI)" 60 8 python3 -X faulthandler dev/diag_copy_stamps.py --rounds 24 --out "$OUT/copy_stamps.txt"
step "dev/diag_copy_pair gil (the same behind a busy Python thread: ~3 s a round)" 90 4 python3 -X faulthandler dev/diag_copy_pair.py --rounds 8 --variants gil --profile 25 --out "$OUT/copy_pair_gil.txt"
step "dev/diag_gil_convoy (a busy Python thread: each call's cost)" 150 18 bash -c "python3 dev/diag_gil_convoy.py --calls 100 --seconds 5 && python3 dev/diag_gil_convoy.py --calls 100 --seconds 5 --switch-ms 0.5"
step "dev/diag_mark_cost (a step mark's cost by method, all GPUs and one)" 180 16 bash -c "python3 -X faulthandler dev/diag_mark_cost.py --devices $NGPU --steps 150 && python3 -X faulthandler dev/diag_mark_cost.py --devices 1 --steps 150"
step "dev/diag_overhead_drift (the pair overhead: when measured)" 120 40 python3 -X faulthandler dev/diag_overhead_drift.py --again 4 --out "$OUT/overhead_drift.txt"
step "dev/diag_exit (a torch loop under the step timer exits 0)" 120 4 python3 dev/diag_exit.py --devices "$NGPU" --repeat 2 --steps 200 --variants full,no-close
step "dev/check_unheld (the hold tests fail without their fixes)" 120 4 python3 dev/check_unheld.py
step "examples/train_loop.py (2000 steps, streamed trace)" 180 6 python3 examples/train_loop.py --steps 2000 --trace "$OUT/train.pftrace"
# (timing before steps: a call that runs out of time has the short suite's figures)
step "benchmarks timing (bench_accuracy, bench_clock)" 210 26 "${BENCH[@]}" --limit 120 timing
step "benchmarks steps (bench_steps: step timing's overhead vs torch.profiler)" 420 46 "${BENCH[@]}" --limit 400 steps
for r in $(seq "${PARTS_REPEAT:-1}"); do  # (one reading moves from run to run by about its own size)
  run=""; [ "${PARTS_REPEAT:-1}" -gt 1 ] && run=" (run $r)"
  step "steps parts$run (bench_steps --parts: neighbours and the harvest share only, harvests profiled)" 240 40 python3 benchmarks/bench_steps.py --parts --profile-harvests --out "$OUT/steps_parts/$r"
done
ls "$OUT"/steps_parts/*/bench_steps.json >/dev/null 2>&1 && step "steps parts, always on (benchmarks/steps_summary.py: each run and the medians)" 30 4 bash -c "python3 benchmarks/steps_summary.py \"$OUT\"/steps_parts/*/bench_steps.json"
[ -d .ab/asyncgpu ] && step "steps a/b (a step's cost: the baseline in .ab/ and this tree in turn, scripts/ab_steps.sh)" 300 40 bash scripts/ab_steps.sh
step "benchmarks kprofile (bench_kprofile)" 120 20 "${BENCH[@]}" --limit 110 kprofile
step "benchmarks peers (bench_peers)" 120 18 "${BENCH[@]}" --limit 110 peers
step "benchmarks handoff (bench_handoff)" 150 22 "${BENCH[@]}" --limit 140 handoff
step "benchmarks waits (bench_wait, bench_load --queue --cost --ticker)" 700 66 "${BENCH[@]}" --limit 400 waits
[ -d "$OUT/benchmarks" ] && python3 -m benchmarks.table "$OUT/benchmarks" > "$OUT/benchmarks/table.md" 2>> "$ALL"
echo
echo "== steps ($NGPU GPU(s)): name, exit code, seconds, key figure"
printf '%s\n' "${TABLE[@]}" | tee -a "$ALL"
exit $FAILED
