set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 COLUMNS=110 NCCL_NVLS_ENABLE=0 NCCL_CUMEM_ENABLE=0 ASYNCGPU_COMMIT=$1
nvidia-smi -L
echo "== diag_step_events"
timeout 90 python3 -X faulthandler dev/diag_step_events.py --devices 4 --steps 150 --variants alternate,alternate-keep-gil,alternate 2>&1 | tail -12; echo "exit $?"
echo "== bench_steps"
timeout 240 python3 benchmarks/bench_steps.py --repeat 12 --out $OUT/steps > $OUT/steps.txt 2>&1; echo "exit $?"; grep -v "^\s*$" $OUT/steps.txt | tail -30
echo "== pytest"
timeout 330 python3 -m pytest -q -p no:cacheprovider -o faulthandler_timeout=60 tests 2>&1 | grep -v "^SKIPPED" | tail -25
