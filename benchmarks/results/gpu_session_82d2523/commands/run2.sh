# second call: the tuner's forward finalists under every timer (a fresh tuning cache), then the GPU tests that
# run1 failed (a failed capture had left the random generator in capture mode) and the new ones
. .gpu/common.sh; envinfo
export VITFLASH_TEST_CIFAR=$PWD/.gpu/cifar10-mini.tar.gz VITFLASH_CACHE_DIR=/tmp/cache2
step finalist_timers 330 python3 benchmarks/probes/finalist_timers.py --shapes 4,16,4097,128 8,12,4097,64 32,16,1025,64 --out $O/finalist_timers
L=$(( 585 - ($(date +%s) - T0) )); step gpu_tests $L python3 -m pytest -v -m gpu -n 8 -p no:cacheprovider tests/test_module.py::test_graph_step_says_what_to_change_when_the_capture_fails tests/test_probes.py tests/test_timm_attention.py tests/test_flash_attention.py -k "capture or finalist or sustained or timm or graph"
cat $OUT/steps.log; grep -E "passed|failed" $O/gpu_tests.log | tail -3; cat $O/finalist_timers/*.md
