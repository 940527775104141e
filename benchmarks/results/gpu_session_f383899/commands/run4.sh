# fourth call: where vit_tiny's b256 step under default compile spends its host time, flash against SDPA and naive
# (run3: flash 0.83x SDPA there), flash again last to see the order's effect
. .gpu/common.sh >/dev/null 2>&1; envinfo; export VITFLASH_CACHE_DIR=/tmp/cache
step step_host 420 python3 benchmarks/probes/step_host.py --model vit_tiny_patch4_32 --batch 256 --compile default --paths flash sdpa naive flash --top 25
pack; cat $OUT/steps.log; grep -v "^|" $O/step_host.log | grep -v "^$" | tail -30
