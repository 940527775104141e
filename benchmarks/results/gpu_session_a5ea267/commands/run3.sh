# third call, on the same warm machine: the ViT attention shapes against cuDNN (the tuning cache of the first call)
. .gpu/common.sh >/dev/null 2>&1; export VITFLASH_CACHE_DIR=/tmp/cache; step attn_large 230 python3 scripts/bench_attention.py --shapes large --timer graph --impls flash sdpa_cudnn --out $O/attn_large; cat $OUT/steps.log
