. .gpu/common.sh; envinfo
export VITFLASH_CACHE_DIR=/tmp/cache_tests
step gpu_tests 350 python3 -m pytest -v -m gpu -n 12 -p no:cacheprovider --durations=25 tests
export VITFLASH_CACHE_DIR=/tmp/cache_bench1
step attn_small_graph 200 python3 scripts/bench_attention.py --shapes small --timer graph --out $OUT/attn_small
