# the ViT-B/16 @224 b256 training step (issue 12's whole-step re-measure), with run11's tuning cache, then
# the varied shapes with what time is left
. .gpu/common.sh; envinfo
export VITFLASH_CACHE_DIR=/tmp/cache_bench
step model_large 380 python3 scripts/bench_model.py --suite large --models vit_base_patch16_224 --compile eager default --out $O/model_large
step attn_varied $(( 585 - ($(date +%s) - T0) )) python3 scripts/bench_attention.py --shapes varied --timer graph --impls flash sdpa_flash sdpa_cudnn --out $O/attn_varied
cp $VITFLASH_CACHE_DIR/autotune.json $O/autotune_cache.json; pack
