# commit 64c5aa5: the Gluon dQ kernel computing delta (DQ_DELTA) and the persistent warp-specialized forward (D = 128): the probes first (a hang there skips the op's steps), GPU tests through the op, the six-shape table against cuDNN
. .gpu/common.sh >/dev/null 2>&1; envinfo; export VITFLASH_CACHE_DIR=/tmp/cache_run1
step fwd128 70 python3 benchmarks/probes/gluon_fwd.py --shapes 32,16,577,128 8,16,2049,128 4,16,4097,128 --configs 64x128x2x4w240 64x128x2x4w240p --out $O/fwd128
step bwd128 110 python3 benchmarks/probes/gluon_bwd.py --shapes 32,16,577,128 4,16,4097,128 --configs 64x64x2x4 32x64x2x4o --dq-configs 64x64x2x4 64x64x2x4d 64x64x2x4od --out $O/bwd128
if grep -q "rc=124" $OUT/steps.log; then echo "a probe ran out of time: the op's steps skipped" | tee -a $OUT/steps.log; else
step gluon_tests 120 python3 -m pytest -q -m gpu tests/test_flash_attention.py -k "gluon" -p no:cacheprovider
step attn_gluon 200 python3 scripts/bench_attention.py --gluon --shape 64,12,577,64 32,16,1025,64 8,12,4097,64 32,16,577,128 8,16,2049,128 4,16,4097,128 --timer graph --impls flash sdpa_cudnn --out $O/attn_gluon
fi
pack; cat $OUT/steps.log; grep "^|" $O/fwd128.log | head -20; grep "^|" $O/bwd128.log | head -40; tail -6 $O/gluon_tests.log; grep "^|" $O/attn_gluon.log | head -30; tail -3 $O/attn_gluon.log
