. .gpu/common.sh; envinfo
export VITFLASH_CACHE_DIR=/tmp/cache_bench4
step step_eager 250 python3 scripts/bench_model.py --suite cifar --compile eager --out $OUT/step
step attn_small_graph 140 python3 scripts/bench_attention.py --shapes small --timer graph --out $OUT/attn_small
