# fourth call: every GPU test at the current commit (the tuner changed since the last full run, 0858500)
. .gpu/common.sh >/dev/null 2>&1; envinfo
export VITFLASH_TEST_CIFAR=$PWD/.gpu/cifar10-mini.tar.gz VITFLASH_CACHE_DIR=/tmp/cache
python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu/pytest_xdist*.whl .gpu/execnet*.whl
step gpu_tests 480 python3 -m pytest -v -m gpu -n 12 -p no:cacheprovider --durations=20 tests
pack; cat $OUT/steps.log; cat $O/env.log; grep -E "FAILED|ERROR" $O/gpu_tests.log | head -20; grep -E "passed|failed" $O/gpu_tests.log | tail -2
