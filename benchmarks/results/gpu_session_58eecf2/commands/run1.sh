# a time budget's stop and resume on the GPU, against the same run without the stop: the best
# recipe cut to 40 epochs, seed 1, flash; the same command twice without a budget (the control:
# is the GPU run deterministic?), once stopped by trainer.max_time and resumed from its last.ckpt
. .gpu/common.sh; envinfo
export VITFLASH_CACHE_DIR=/tmp/cache_b TORCHINDUCTOR_CACHE_DIR=/tmp/inductor_b TRITON_CACHE_DIR=/tmp/triton_b
[ -d /tmp/data/cifar10 ] || step prepare 60 python3 scripts/prepare_data.py --archive .gpu/cifar10-jpeg.tar.gz
E="experiment=cifar10_vit_h12_gap_mimetic_10min attention=flash seed=1 trainer.max_epochs=40 test=false"
step whole 150 python3 scripts/train.py $E task_name=budget_whole
step whole_again 120 python3 scripts/train.py $E task_name=budget_whole_again
step piece1 120 python3 scripts/train.py $E trainer.max_time=00:00:00:20 task_name=budget_piece1
P1=$(ls -d /tmp/logs/budget_piece1/runs/*/ | head -1); echo "piece 1: $P1" >> $OUT/steps.log
step piece2 120 python3 scripts/train.py $E task_name=budget_piece2 ckpt_path=${P1}checkpoints/last.ckpt
last() { echo $(ls -d /tmp/logs/$1/runs/*/ | head -1)checkpoints/last.ckpt; }
step same_control 60 python3 benchmarks/probes/same_state.py $(last budget_whole) $(last budget_whole_again)
step same_resumed 60 python3 benchmarks/probes/same_state.py $(last budget_whole) $(last budget_piece2)
nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv >> $O/env.log; pack
tar --exclude='*.ckpt' -czf $OUT/runs.tar.gz -C /tmp/logs . ; ls -la $(find /tmp/logs -name '*.ckpt') > $OUT/ckpts.log 2>&1
