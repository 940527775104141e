# the lazy-rescaling forward twins (exp/fwd-lazy-rescale): the ViT shapes against cuDNN, whose tuning
# times each twin beside its plain candidate (tuning_ms), then the GPU tests of every candidate
. .gpu/common.sh; envinfo
export VITFLASH_CACHE_DIR=/tmp/cache_bench
step attn_large 360 python3 scripts/bench_attention.py --shapes large --timer graph --impls flash sdpa_flash sdpa_cudnn --out $O/attn_large
step gpu_tests $(( 585 - ($(date +%s) - T0) )) python3 -m pytest -v -m gpu -n 12 tests/test_flash_attention.py -k "every_config or lazy" -p no:cacheprovider
cp $VITFLASH_CACHE_DIR/autotune.json $O/autotune_cache.json; pack
