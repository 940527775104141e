. .gpu/common.sh; envinfo
export VITFLASH_DATA=/tmp/data VITFLASH_LOGS=/tmp/logs VITFLASH_CACHE_DIR=/tmp/cache_train
step prepare 60 python3 scripts/prepare_data.py --archive .gpu/cifar10-jpeg.tar.gz
step train 565 python3 scripts/train.py experiment=cifar10_vit_h12_spt_lsa_10min attention=sdpa trainer.max_time=00:00:08:50
tar --exclude='*.ckpt' -czf $OUT/runs.tar.gz -C /tmp/logs . ; ls -la $(find /tmp/logs -name '*.ckpt') > $OUT/ckpts.log 2>&1
