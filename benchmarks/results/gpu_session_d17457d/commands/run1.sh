. .gpu/common.sh; envinfo
export VITFLASH_CACHE_DIR=/tmp/cache_tests
step gpu_tests 330 python3 -m pytest -v -m gpu -n 12 -p no:cacheprovider --durations=25 tests
export VITFLASH_CACHE_DIR=/tmp/cache_bench1
step attn_large_graph 240 python3 scripts/bench_attention.py --shapes large --timer graph --impls flash sdpa_flash sdpa_cudnn --out $OUT/attn_large
