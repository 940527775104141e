# third call: the CIFAR whole step of vit_tiny_patch4_32 at b256 and b1024, every compile mode, all three paths
. .gpu/common.sh >/dev/null 2>&1; envinfo; export VITFLASH_CACHE_DIR=/tmp/cache
step step_tiny 330 python3 scripts/bench_model.py --suite cifar --models vit_tiny_patch4_32 --compile reduce-overhead eager --out $O/step_tiny
L=$(( 555 - ($(date +%s) - T0) )); step step_tiny_default $L python3 scripts/bench_model.py --suite cifar --models vit_tiny_patch4_32 --compile default --out $O/step_tiny_default
pack; cat $OUT/steps.log; tail -12 $O/step_tiny.log; tail -8 $O/step_tiny_default.log
