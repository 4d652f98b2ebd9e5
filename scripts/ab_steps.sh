#!/usr/bin/env bash
# A same-machine A/B of what a step costs the loop's thread (lent machines differ by more than a change does):
# `bench_steps --parts --harvest-steps 0` (the marks by neighbours and by phase, no harvest share) for a baseline tree
# and for the working tree, in turn, ROUNDS times (default 2): base, head, base, head, ...
#   here:    bash scripts/ab_steps.sh --make BASE    # BASE's asyncgpu/ and kernels/ into .ab/ (ignored by git)
#   device:  carry [".whl", ".ab"]; command "ASYNCGPU_COMMIT=<head> bash scripts/ab_steps.sh" (NEIGHBOURS=60 groups a
#            run by default; extra arguments go to bench_steps, e.g. --devices 2, or --backend host to try it here)
# Prints each run's marked and unmarked phases and its always-on line; JSON goes to $OUT/ab/<n>-<base|head>/.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
if [ "${1:-}" = "--make" ]; then
  base=${2:?"name the baseline commit: bash scripts/ab_steps.sh --make BASE"}
  rm -rf "$ROOT/.ab" && mkdir -p "$ROOT/.ab" || exit 1
  git -C "$ROOT" archive "$base" asyncgpu kernels | tar -x -C "$ROOT/.ab" || exit 1
  git -C "$ROOT" rev-parse --short "$base" > "$ROOT/.ab/COMMIT"
  echo "baseline $(cat "$ROOT/.ab/COMMIT") in $ROOT/.ab: carry \".ab\" with the run"
  exit 0
fi
[ -d "$ROOT/.ab/asyncgpu" ] || { echo "no baseline: run 'bash scripts/ab_steps.sh --make BASE' here first, carry .ab"; exit 2; }
SITE=""
if [[ ":${PYTHONPATH:-}:" == *":/tmp/site:"* ]]; then  # (run by gpu_check.sh, which installed the wheels there)
  SITE=/tmp/site:
elif [ "${WHEELS:-1}" = 1 ] && ls "$ROOT"/.whl/*.whl >/dev/null 2>&1; then  # (WHEELS=0: the installed packages)
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$ROOT"/.whl/*.whl || exit 1
  SITE=/tmp/site:
fi
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
OUT=${OUT:-out}
rc=0
for n in $(seq "${ROUNDS:-2}"); do
  for side in base head; do
    tree=$ROOT; [ $side = base ] && tree=$ROOT/.ab
    label=${ASYNCGPU_COMMIT:-the working tree}; [ $side = base ] && label=$(cat "$ROOT/.ab/COMMIT")
    echo "== round $n, $side ($label)"
    PYTHONPATH=$SITE$tree python3 "$ROOT/benchmarks/bench_steps.py" --parts --harvest-steps 0 \
      --neighbours "${NEIGHBOURS:-60}" --out "$OUT/ab/$n-$side" "$@" 2>&1 | grep -E "steps, neighbours|µs p50|always-on|Error" || rc=1
  done
done
exit $rc
