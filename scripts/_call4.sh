set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 COLUMNS=110 ASYNCGPU_COMMIT=$1
nvidia-smi -L
echo "== diag_step_events"
timeout 40 python3 -X faulthandler dev/diag_step_events.py --devices 1 --steps 150 --variants alternate 2>&1 | tail -4
echo "== timing"
timeout 60 python3 -m benchmarks timing --out $OUT/benchmarks > $OUT/timing.txt 2>&1; echo "exit $?"
grep -E "^(idle|busy|first|after|the demo|kernels|== |aligned|naive|cuda:|device| +[0-9]+ +160)" $OUT/timing.txt | tail -60
echo "== pytest -m gpu"
timeout 170 python3 -m pytest -q -p no:cacheprovider -o faulthandler_timeout=60 -m gpu tests 2>&1 | grep -v "^SKIPPED" | tail -8
echo "== bench_steps"
timeout 110 python3 benchmarks/bench_steps.py --devices 1 --repeat 10 --out $OUT/steps > $OUT/steps.txt 2>&1; echo "exit $?"; grep -v "^\s*$" $OUT/steps.txt | grep -v CuptiActivityApi | tail -16
