# commit 1db6d3b: the atomic Gluon backward (64 and 128 keys a program) and the overlapped dQ kernel at D = 64 called directly (probe first; a hang there skips the rest), the Gluon GPU tests (the atomic one through deterministic=False; DQ_OVERLAP listed at D = 128), the six ViT shapes against cuDNN, then flash_atomic at the three D = 64 shapes
. .gpu/common.sh >/dev/null 2>&1; envinfo; export VITFLASH_CACHE_DIR=/tmp/cache_run1
step bwd64 130 python3 benchmarks/probes/gluon_bwd.py --shapes 64,12,577,64 8,12,4097,64 --configs 64x64x2x4o --dq-configs 64x64x2x4d 64x64x2x4od --atomic-configs 64x64x2x4 64x128x2x8 64x64x2x4t 64x128x2x8t --out $O/bwd64
if grep -q "rc=124" $OUT/steps.log; then echo "the probe ran out of time: the op's steps skipped" | tee -a $OUT/steps.log; else
step gluon_tests 120 python3 -m pytest -q -m gpu tests/test_flash_attention.py -k "gluon" -p no:cacheprovider
step attn_gluon 200 python3 scripts/bench_attention.py --gluon --shape 64,12,577,64 32,16,1025,64 8,12,4097,64 32,16,577,128 8,16,2049,128 4,16,4097,128 --timer graph --impls flash sdpa_cudnn --out $O/attn_gluon
step attn_atomic 100 python3 scripts/bench_attention.py --gluon --shape 64,12,577,64 32,16,1025,64 8,12,4097,64 --timer graph --impls flash flash_atomic sdpa_cudnn --out $O/attn_atomic
fi
pack; cat $OUT/steps.log; grep "^|" $O/bwd64.log | head -30; tail -4 $O/gluon_tests.log; grep "^|" $O/attn_gluon.log | head -12; grep "^|" $O/attn_atomic.log | head -8
