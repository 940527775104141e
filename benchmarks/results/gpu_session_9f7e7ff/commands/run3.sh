# fourth call, the same kernels: vit_tiny's whole step in default compile, then both models eager
. .gpu/common.sh >/dev/null 2>&1; envinfo; export VITFLASH_CACHE_DIR=/tmp/cache_small
step default_tiny 140 python3 scripts/bench_model.py --suite cifar --models vit_tiny_patch4_32 --compile default --out $O/default_tiny
step eager 150 python3 scripts/bench_model.py --suite cifar --compile eager --out $O/eager
pack; cat $OUT/steps.log; grep "^| vit" $O/default_tiny/*.md $O/eager/*.md
