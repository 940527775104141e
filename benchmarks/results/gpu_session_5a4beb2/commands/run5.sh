# fifth call: issue 12's six ViT shapes against cuDNN on this H100, in a fresh tuning cache
. .gpu/common.sh >/dev/null 2>&1; envinfo; export VITFLASH_CACHE_DIR=/tmp/cache_large
step attn_large 400 python3 scripts/bench_attention.py --shapes large --timer graph --impls flash sdpa_cudnn --out $O/attn_large
pack; cat $OUT/steps.log; head -16 $O/attn_large/*.md | tail -9
