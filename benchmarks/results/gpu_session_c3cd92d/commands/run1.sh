# the best recipe at 800 epochs with a second seed ($1), flash, alone on the GPU, cold caches;
# piece 1 stops cleanly at trainer.max_time (a checkpoint at the stop), piece 2 resumes from it
. .gpu/common.sh; envinfo
export VITFLASH_CACHE_DIR=/tmp/cache_seed$1 TORCHINDUCTOR_CACHE_DIR=/tmp/inductor_seed$1 TRITON_CACHE_DIR=/tmp/triton_seed$1
[ -d /tmp/data/cifar10 ] || step prepare 60 python3 scripts/prepare_data.py --archive .gpu/cifar10-jpeg.tar.gz
step train_piece1 530 python3 scripts/train.py experiment=cifar10_vit_h12_gap_mimetic_10min attention=flash seed=$1 trainer.max_time=00:00:08:00 task_name=gap_mimetic_800_seed$1
nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv >> $O/env.log; pack
tar --exclude='*.ckpt' -czf $OUT/runs.tar.gz -C /tmp/logs . ; ls -la $(find /tmp/logs -name '*.ckpt') > $OUT/ckpts.log 2>&1
