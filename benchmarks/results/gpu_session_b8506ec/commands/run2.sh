# the best CIFAR-10 recipe with repeated augmentation (3 copies), alone on the GPU, one seed
. .gpu/common.sh; envinfo
export VITFLASH_CACHE_DIR=<tmp>/cache_train
step prepare 60 python3 scripts/prepare_data.py --archive .gpu/cifar10-jpeg.tar.gz
step train $(( 585 - ($(date +%s) - T0) )) python3 scripts/train.py experiment=cifar10_vit_h12_spt_lsa_10min attention=flash data.aug_repeats=3 trainer.max_time=00:00:08:45
tar --exclude='*.ckpt' -czf $OUT/runs.tar.gz -C <tmp>/logs . ; ls -la $(find <tmp>/logs -name '*.ckpt') > $OUT/ckpts.log 2>&1
