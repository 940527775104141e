# commit 1d13bff: Gluon forward through the op (VITFLASH_GLUON=1), Gluon backward probe, op timings with the Gluon forward
. .gpu/common.sh >/dev/null 2>&1; envinfo; export VITFLASH_CACHE_DIR=/tmp/cache_run1
step gluon_tests 100 python3 -m pytest -q -m gpu tests/test_flash_attention.py -k "gluon_forward_gpu" -p no:cacheprovider
step gluon_bwd 170 python3 benchmarks/probes/gluon_bwd.py --out $O/gluon_bwd
step attn_gluon 200 python3 scripts/bench_attention.py --gluon --shape 64,12,577,64 32,16,1025,64 8,12,4097,64 32,16,577,128 8,16,2049,128 4,16,4097,128 --timer graph --impls flash sdpa_cudnn --out $O/attn_gluon
pack; cat $OUT/steps.log; tail -3 $O/gluon_tests.log; grep "^|" $O/gluon_bwd.log | head -40; tail -5 $O/gluon_bwd.log; grep "^|" $O/attn_gluon.log | head -40
