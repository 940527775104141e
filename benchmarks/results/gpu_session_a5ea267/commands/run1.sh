# the one call: every GPU test at this commit (the new timm-patch test among them); the ViT-B/16 @224 b256 step
# with timm's own model on vitflash's flash (patch_timm_attention) beside vitflash's model on flash and timm's on
# SDPA; then the varied attention shapes against cuDNN with the time left
. .gpu/common.sh; envinfo
export VITFLASH_TEST_CIFAR=$PWD/.gpu/cifar10-mini.tar.gz VITFLASH_CACHE_DIR=/tmp/cache
step gpu_tests 300 python3 -m pytest -v -m gpu -n 12 -p no:cacheprovider --durations=20 tests
step model_large 170 python3 scripts/bench_model.py --suite large --models vit_base_patch16_224 --compile eager default --paths flash timm timm_flash --out $O/model_large
L=$(( 585 - ($(date +%s) - T0) )); step attn_varied $L python3 scripts/bench_attention.py --shapes varied --timer graph --impls flash sdpa_cudnn --out $O/attn_varied
cp /tmp/cache/autotune.json $O/ 2>/dev/null; pack
