# second call: the ViT-B/16 @224 b256 step with timm's own model on vitflash's flash (patch_timm_attention), beside
# vitflash's model and timm's on SDPA; then the ViT attention shapes against cuDNN
. .gpu/common.sh; envinfo
export VITFLASH_CACHE_DIR=/tmp/cache
step model_large 360 python3 scripts/bench_model.py --suite large --models vit_base_patch16_224 --compile eager default --paths flash sdpa timm timm_flash --out $O/model_large
L=$(( 585 - ($(date +%s) - T0) )); step attn_large $L python3 scripts/bench_attention.py --shapes large --timer graph --impls flash sdpa_cudnn --out $O/attn_large
cp /tmp/cache/autotune.json $O/ 2>/dev/null; pack
