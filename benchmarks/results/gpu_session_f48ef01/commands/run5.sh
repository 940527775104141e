# commit a52e172: the overlapped Gluon dK/dV form at D = 64: GPU tests through the op, and the kernel timed directly
. .gpu/common.sh >/dev/null 2>&1; envinfo; export VITFLASH_CACHE_DIR=/tmp/cache_run5
step bwd_tests 90 python3 -m pytest -q -m gpu tests/test_flash_attention.py -k "gluon_backward_gpu" -p no:cacheprovider
step gluon_bwd 125 python3 benchmarks/probes/gluon_bwd.py --shapes 64,12,577,64 8,12,4097,64 --configs 64x64x2x4 64x64x2x4o 64x64x3x4o --dq-configs 64x64x2x4 --out $O/gluon_bwd
pack; cat $OUT/steps.log; tail -4 $O/bwd_tests.log; grep "^|" $O/gluon_bwd.log | head -30; tail -c 1500 $O/gluon_bwd.log
