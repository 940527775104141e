# the same machine: both models eager (every path), then vit_small in default compile (flash, SDPA)
. .gpu/common.sh >/dev/null 2>&1; envinfo; export VITFLASH_CACHE_DIR=/tmp/cache_small
step eager 120 python3 scripts/bench_model.py --suite cifar --compile eager --out $O/eager
step default_small 150 python3 scripts/bench_model.py --suite cifar --models vit_small_patch4_32 --compile default --paths flash sdpa --out $O/default_small
pack; cat $OUT/steps.log; grep -h "^| vit" $O/eager/*.md $O/default_small/*.md
