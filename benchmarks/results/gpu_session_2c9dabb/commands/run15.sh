# the backward without tail programs at D = 80: the two D = 80 varied shapes against cuDNN (empty tuning cache),
# then the GPU tests at D = 80 (every candidate at N = 1, 65, 197, 577)
. .gpu/common.sh; envinfo
export VITFLASH_CACHE_DIR=/tmp/cache_bench
step attn_d80 150 python3 scripts/bench_attention.py --shape 32,16,577,80 64,16,257,80 --timer graph --impls flash sdpa_flash sdpa_cudnn --out $O/attn_d80
step gpu_tests $(( 260 - ($(date +%s) - T0) )) python3 -m pytest -v -m gpu -n 8 -p no:cacheprovider -k "every_config and 80" tests/test_flash_attention.py
cp $VITFLASH_CACHE_DIR/autotune.json $O/autotune_cache.json; pack
