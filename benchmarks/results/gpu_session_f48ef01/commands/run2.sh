# commit f48ef01: the Gluon backward through the op (GPU tests), op timings with and without the Gluon kernels
. .gpu/common.sh >/dev/null 2>&1; envinfo; export VITFLASH_CACHE_DIR=/tmp/cache_run2
step gluon_tests 150 python3 -m pytest -q -m gpu tests/test_flash_attention.py -k "gluon_forward_gpu or gluon_backward_gpu" -p no:cacheprovider
step attn_gluon 220 python3 scripts/bench_attention.py --gluon --shape 64,12,577,64 32,16,1025,64 8,12,4097,64 32,16,577,128 8,16,2049,128 4,16,4097,128 --timer graph --impls flash sdpa_cudnn --out $O/attn_gluon
step attn_triton 190 python3 scripts/bench_attention.py --shape 64,12,577,64 32,16,1025,64 8,12,4097,64 32,16,577,128 8,16,2049,128 4,16,4097,128 --timer graph --impls flash sdpa_cudnn --out $O/attn_triton
pack; cat $OUT/steps.log; tail -3 $O/gluon_tests.log; grep "^|" $O/attn_gluon.log | head -30; grep "^|" $O/attn_triton.log | head -30
