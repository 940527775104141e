# fourth call, on the same warm machine: the CIFAR whole step in default compile, and vit_small's naive path in reduce-overhead (run1 timed its flash and SDPA)
. .gpu/common.sh; envinfo; export VITFLASH_CACHE_DIR=/tmp/cache
step step_default 300 python3 scripts/bench_model.py --suite cifar --compile default --out $O/step_default
L=$(( 500 - ($(date +%s) - T0) )); step step_small_ro $L python3 scripts/bench_model.py --suite cifar --models vit_small_patch4_32 --compile reduce-overhead --paths naive --out $O/step_small_ro
