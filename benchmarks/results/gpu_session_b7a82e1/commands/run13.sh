# run3: the ViT shapes again on the same machine, with a fresh tuning cache (the tuner decides anew)
. .gpu/common.sh; envinfo; export VITFLASH_CACHE_DIR=/tmp/cache_bench2; step attn_large2 400 python3 scripts/bench_attention.py --shapes large --timer graph --impls flash sdpa_flash sdpa_cudnn --out $O/attn_large2; cp $VITFLASH_CACHE_DIR/autotune.json $O/autotune_cache2.json; pack
