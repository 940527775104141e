# piece 2 of run1.sh's run: resume from piece 1's last checkpoint on the same machine, then score the
# last checkpoint without the flip
. .gpu/common.sh; envinfo
export VITFLASH_CACHE_DIR=/tmp/cache_seed$1 TORCHINDUCTOR_CACHE_DIR=/tmp/inductor_seed$1 TRITON_CACHE_DIR=/tmp/triton_seed$1
P1=$(ls -d /tmp/logs/gap_mimetic_800_seed$1/runs/*/ | head -1); echo "piece 1: $P1" >> $OUT/steps.log
step train_piece2 300 python3 scripts/train.py experiment=cifar10_vit_h12_gap_mimetic_10min attention=flash seed=$1 task_name=gap_mimetic_800_seed$1 ckpt_path=${P1}checkpoints/last.ckpt
P2=$(ls -d /tmp/logs/gap_mimetic_800_seed$1/runs/*/ | tail -1); echo "piece 2: $P2" >> $OUT/steps.log
step eval_noflip 90 python3 scripts/eval.py ckpt_path=${P2}checkpoints/last.ckpt attention=flash eval_flip=false
nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv >> $O/env.log; pack
tar --exclude='*.ckpt' -czf $OUT/runs.tar.gz -C /tmp/logs . ; ls -la $(find /tmp/logs -name '*.ckpt') > $OUT/ckpts.log 2>&1
