. .gpu/common.sh; envinfo
export VITFLASH_CACHE_DIR=/tmp/cache_bench3
step attn_small_graph 180 python3 scripts/bench_attention.py --shapes small --timer graph --out $OUT/attn_small
step step_default 300 python3 scripts/bench_model.py --suite cifar --compile default --out $OUT/step
