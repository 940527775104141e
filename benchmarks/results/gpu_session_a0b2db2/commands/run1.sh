# piece 1 of the best recipe (mean pooling, mimetic init) at 750 epochs, seed 42, alone on the GPU;
# stopped by trainer.max_time, resumed exactly by the next command on the same machine
. .gpu/common.sh; envinfo
export VITFLASH_CACHE_DIR=/tmp/cache_train
step prepare 60 python3 scripts/prepare_data.py --archive .gpu/cifar10-jpeg.tar.gz
step train1 $(( 590 - ($(date +%s) - T0) )) python3 scripts/train.py experiment=cifar10_vit_h12_gap_mimetic_10min attention=flash trainer.max_epochs=750 trainer.max_time=00:00:08:40
nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv >> $O/env.log; pack
tar --exclude='*.ckpt' -czf $OUT/runs.tar.gz -C /tmp/logs . ; ls -la $(find /tmp/logs -name '*.ckpt') > $OUT/ckpts.log 2>&1
