# the same machine and kernels: vit_small's whole step in reduce-overhead, then in default compile
. .gpu/common.sh >/dev/null 2>&1; envinfo; export VITFLASH_CACHE_DIR=/tmp/cache_run1
step ro_small 150 python3 scripts/bench_model.py --suite cifar --models vit_small_patch4_32 --compile reduce-overhead --out $O/ro_small
step default_small 160 python3 scripts/bench_model.py --suite cifar --models vit_small_patch4_32 --compile default --out $O/default_small
pack; cat $OUT/steps.log; grep "^| vit" $O/*/*.md
