# vit_tiny's default-mode step on another machine (3 windows of 20 synchronized steps a path, as
# bench_model.py times them) and where its time goes: the GPU's busy time a step against the
# wall time, flash and SDPA, at b1024 and b256
. .gpu/common.sh >/dev/null 2>&1; envinfo; export VITFLASH_CACHE_DIR=/tmp/cache_small
step host_b1024 170 python3 benchmarks/probes/step_host.py --model vit_tiny_patch4_32 --batch 1024 --compile default --paths flash sdpa
step host_b256 150 python3 benchmarks/probes/step_host.py --model vit_tiny_patch4_32 --batch 256 --compile default --paths flash sdpa
pack; cat $OUT/steps.log; grep -h "^## \|Step:\|GPU busy\|launches per\|Tuner" $O/host_*.log
