# sourced after common.sh by each training command: data under /tmp (kept while the machine
# stays warm), one run of the best recipe on a 200-epoch schedule, its logs back without checkpoints
export VITFLASH_DATA=/tmp/data VITFLASH_LOGS=/tmp/logs VITFLASH_CACHE_DIR=/tmp/cache_train
[ -d /tmp/data/cifar10/train ] || step prepare 60 python3 scripts/prepare_data.py --archive .gpu/cifar10-jpeg.tar.gz
train200() { step train_$1 $2 python3 scripts/train.py experiment=cifar10_vit_h12_spt_lsa_10min attention=$1 trainer.max_epochs=200 task_name=spt_lsa_200_$1; tar --exclude='*.ckpt' -czf $OUT/runs_$1.tar.gz -C /tmp/logs spt_lsa_200_$1; ls -la $(find /tmp/logs/spt_lsa_200_$1 -name '*.ckpt') > $OUT/ckpts_$1.log 2>&1; }
