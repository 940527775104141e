# third call, on the same warm machine: the CIFAR whole step, vit_tiny in reduce-overhead and eager, vit_small eager
. .gpu/common.sh; envinfo; export VITFLASH_CACHE_DIR=/tmp/cache
step step_tiny 330 python3 scripts/bench_model.py --suite cifar --models vit_tiny_patch4_32 --compile reduce-overhead eager --out $O/step_tiny
L=$(( 560 - ($(date +%s) - T0) )); step step_small_eager $L python3 scripts/bench_model.py --suite cifar --models vit_small_patch4_32 --compile eager --paths flash sdpa naive --out $O/step_small_eager
