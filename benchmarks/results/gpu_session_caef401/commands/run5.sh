# the best recipe's training loop (scripts/bench_loop.py) on the three attention paths as the recipe
# runs it (no time budget), then flash again with trainer.max_time set, so that TimeBudget's
# per-step check runs in the loop
. .gpu/common.sh; envinfo
[ -d /tmp/data/cifar10 ] || step prepare 60 python3 scripts/prepare_data.py --archive .gpu/cifar10-jpeg.tar.gz
C="python3 scripts/bench_loop.py --cases cifar10 --data-root /tmp/data --compile default --loop-graph-step --pipeline gpu --steps 100 --repeats 5 --override experiment=cifar10_vit_h12_gap_mimetic_10min"
step loop_paths 360 $C --attention flash naive sdpa --out $O/loop_paths
step loop_budget $(( 585 - ($(date +%s) - T0) )) $C --attention flash --override trainer.max_time=00:01:00:00 --out $O/loop_budget
