# both CIFAR models' whole step under reduce-overhead on the same machine, flash and SDPA (naive
# trailed both by 1.26x or more in every earlier run of this mode)
. .gpu/common.sh >/dev/null 2>&1; envinfo; export VITFLASH_CACHE_DIR=/tmp/cache_small
step ro 390 python3 scripts/bench_model.py --suite cifar --compile reduce-overhead --paths flash sdpa --out $O/ro
pack; cat $OUT/steps.log; grep "^| vit" $O/ro/*.md
