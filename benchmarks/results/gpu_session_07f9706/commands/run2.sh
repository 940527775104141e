# the same machine and kernels: the CIFAR whole step, both models eager, vit_tiny in reduce-overhead and default compile
. .gpu/common.sh >/dev/null 2>&1; envinfo; export VITFLASH_CACHE_DIR=/tmp/cache_run1
step eager 160 python3 scripts/bench_model.py --suite cifar --compile eager --out $O/eager
step ro_tiny 140 python3 scripts/bench_model.py --suite cifar --models vit_tiny_patch4_32 --compile reduce-overhead --out $O/ro_tiny
step default_tiny 130 python3 scripts/bench_model.py --suite cifar --models vit_tiny_patch4_32 --compile default --out $O/default_tiny
pack; cat $OUT/steps.log; grep "^| vit" $O/*/*.md
