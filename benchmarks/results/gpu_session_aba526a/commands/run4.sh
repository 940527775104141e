# the best recipe at $1 epochs, seed 42, flash, alone on the GPU, with cold caches (a fresh
# inductor cache and flash autotune cache, as on a fresh machine); trainer.max_time only as a
# guard against the command's limit
. .gpu/common.sh; envinfo
export VITFLASH_CACHE_DIR=/tmp/cache_train_$1 TORCHINDUCTOR_CACHE_DIR=/tmp/inductor_train_$1 TRITON_CACHE_DIR=/tmp/triton_train_$1
[ -d /tmp/data/cifar10 ] || step prepare 60 python3 scripts/prepare_data.py --archive .gpu/cifar10-jpeg.tar.gz
step train 590 python3 scripts/train.py experiment=cifar10_vit_h12_gap_mimetic_10min attention=flash trainer.max_epochs=$1 trainer.max_time=00:00:09:30 task_name=gap_mimetic_$1
nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv >> $O/env.log; pack
tar --exclude='*.ckpt' -czf $OUT/runs.tar.gz -C /tmp/logs . ; ls -la $(find /tmp/logs -name '*.ckpt') > $OUT/ckpts.log 2>&1
