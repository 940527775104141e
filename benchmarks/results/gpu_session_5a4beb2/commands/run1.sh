# first call: the GPU tests not yet run (tuner capture and finalists, graph timer, named sweep, step_host probe), then what
# making each candidate's launches once (2dc8b0e) saves a first call, against the tuner before it ("remade")
. .gpu/common.sh >/dev/null 2>&1; envinfo
python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu/pytest_xdist*.whl .gpu/execnet*.whl
step gpu_tests 230 python3 -m pytest -v -m gpu -n 4 -p no:cacheprovider tests/test_flash_attention.py tests/test_bench_attention.py tests/test_probes.py -k "capture or finalist or graph_times or named or step_host"
L=$(( 560 - ($(date +%s) - T0) )); step first_call $L python3 benchmarks/probes/first_call.py --shapes 256,3,65,64 256,12,197,64 --variants listed remade --warm-compile --repeats 3 --out $O/first_call
pack; cat $OUT/steps.log; cat $O/env.log; grep -E "passed|failed|FAILED|ERROR" $O/gpu_tests.log | tail -15; tail -22 $O/first_call.log
