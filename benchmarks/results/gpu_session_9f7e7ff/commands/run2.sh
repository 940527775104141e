# third call, the same kernels: vit_tiny's whole step under CUDA graphs, vit_small's in default compile
. .gpu/common.sh >/dev/null 2>&1; envinfo; export VITFLASH_CACHE_DIR=/tmp/cache_small
step ro_tiny 200 python3 scripts/bench_model.py --suite cifar --models vit_tiny_patch4_32 --compile reduce-overhead --out $O/ro_tiny
step default_small 200 python3 scripts/bench_model.py --suite cifar --models vit_small_patch4_32 --compile default --out $O/default_small
pack; cat $OUT/steps.log; grep "^| vit" $O/ro_tiny/*.md $O/default_small/*.md
