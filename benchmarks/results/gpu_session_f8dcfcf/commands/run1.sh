# the best recipe at 800 epochs on another attention path ($1) with seed $2, alone on the GPU, cold
# caches; piece 1 stops at trainer.max_time (TimeBudget writes last.ckpt at the stopping step),
# piece 2 (run2.sh) resumes from it
. .gpu/common.sh; envinfo
export VITFLASH_CACHE_DIR=/tmp/cache_$1 TORCHINDUCTOR_CACHE_DIR=/tmp/inductor_$1 TRITON_CACHE_DIR=/tmp/triton_$1
[ -d /tmp/data/cifar10 ] || step prepare 60 python3 scripts/prepare_data.py --archive .gpu/cifar10-jpeg.tar.gz
step train_piece1 530 python3 scripts/train.py experiment=cifar10_vit_h12_gap_mimetic_10min attention=$1 seed=$2 trainer.max_time=00:00:08:00 task_name=gap_mimetic_800_$1_seed$2
nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv >> $O/env.log; pack
tar --exclude='*.ckpt' -czf $OUT/runs.tar.gz -C /tmp/logs . ; ls -la $(find /tmp/logs -name '*.ckpt') > $OUT/ckpts.log 2>&1
