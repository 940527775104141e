# commit 2da74d7: the Gluon kernels by default: their GPU tests (CUDA-graph capture included), and the varied shapes against cuDNN
. .gpu/common.sh >/dev/null 2>&1; envinfo; export VITFLASH_CACHE_DIR=/tmp/cache_run4
step gluon_tests 150 python3 -m pytest -q -m gpu tests/test_flash_attention.py -k "gluon" -p no:cacheprovider
step attn_varied 230 python3 scripts/bench_attention.py --shapes varied --timer graph --impls flash sdpa_cudnn --out $O/attn_varied
pack; cat $OUT/steps.log; tail -15 $O/gluon_tests.log; grep "^|" $O/attn_varied.log | head -24; tail -3 $O/attn_varied.log
