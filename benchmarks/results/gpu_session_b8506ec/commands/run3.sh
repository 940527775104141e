# repeated augmentation on the best recipe cut to 200 epochs (the committed 200-epoch flash run
# at 7295f2d had no repeats), seed 42, alone on the GPU
. .gpu/common.sh; envinfo
export VITFLASH_CACHE_DIR=<tmp>/cache_train
step prepare 60 python3 scripts/prepare_data.py --archive .gpu/cifar10-jpeg.tar.gz
step train $(( 370 - ($(date +%s) - T0) )) python3 scripts/train.py experiment=cifar10_vit_h12_spt_lsa_10min attention=flash trainer.max_epochs=200 data.aug_repeats=3 trainer.max_time=00:00:05:00
tar --exclude='*.ckpt' -czf $OUT/runs.tar.gz -C <tmp>/logs . ; ls -la $(find <tmp>/logs -name '*.ckpt') > $OUT/ckpts.log 2>&1
