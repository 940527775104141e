. .gpu/common.sh; envinfo
export VITFLASH_CACHE_DIR=/tmp/cache_bench4
step step_ro_ceiling 290 python3 scripts/bench_model.py --suite cifar --compile reduce-overhead --paths flash sdpa no_attention --out $OUT/step_ro
step step_eager_ceiling 80 python3 scripts/bench_model.py --suite cifar --compile eager --paths flash sdpa no_attention --out $OUT/step_eager
