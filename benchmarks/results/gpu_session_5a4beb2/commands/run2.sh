# second call: the CIFAR whole step of vit_small_patch4_32 at b256 and b1024, reduce-overhead and eager, all three paths
. .gpu/common.sh >/dev/null 2>&1; envinfo; export VITFLASH_CACHE_DIR=/tmp/cache
step step_small 550 python3 scripts/bench_model.py --suite cifar --models vit_small_patch4_32 --compile reduce-overhead eager --out $O/step_small
pack; cat $OUT/steps.log; cat $O/env.log; tail -12 $O/step_small.log
