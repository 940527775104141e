# piece 2 of run1.sh's run ($1: attention path, $2: seed): resume from piece 1's last checkpoint on the
# same machine, then score the last checkpoint without the flip
. .gpu/common.sh; envinfo
export VITFLASH_CACHE_DIR=/tmp/cache_$1 TORCHINDUCTOR_CACHE_DIR=/tmp/inductor_$1 TRITON_CACHE_DIR=/tmp/triton_$1
P1=$(ls -d /tmp/logs/gap_mimetic_800_$1_seed$2/runs/*/ | head -1); echo "piece 1: $P1" >> $OUT/steps.log
step train_piece2 400 python3 scripts/train.py experiment=cifar10_vit_h12_gap_mimetic_10min attention=$1 seed=$2 task_name=gap_mimetic_800_$1_seed$2 ckpt_path=${P1}checkpoints/last.ckpt
P2=$(ls -d /tmp/logs/gap_mimetic_800_$1_seed$2/runs/*/ | tail -1); echo "piece 2: $P2" >> $OUT/steps.log
step eval_noflip 90 python3 scripts/eval.py ckpt_path=${P2}checkpoints/last.ckpt attention=$1 eval_flip=false
nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv >> $O/env.log; pack
tar --exclude='*.ckpt' -czf $OUT/runs.tar.gz -C /tmp/logs . ; ls -la $(find /tmp/logs -name '*.ckpt') > $OUT/ckpts.log 2>&1
