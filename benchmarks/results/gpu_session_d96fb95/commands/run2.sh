. .gpu/common.sh; envinfo
export VITFLASH_CACHE_DIR=/tmp/cache_bench2
step attn_small_graph 170 python3 scripts/bench_attention.py --shapes small --timer graph --out $OUT/attn_small
step step_ro 390 python3 scripts/bench_model.py --suite cifar --compile reduce-overhead --out $OUT/step
