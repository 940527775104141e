# the best recipe with both screened changes (mean pooling without a class token, mimetic
# attention init), its full 500 epochs, seed 42, alone on the GPU
. .gpu/common.sh; envinfo
export VITFLASH_CACHE_DIR=<tmp>/cache_train
step prepare 60 python3 scripts/prepare_data.py --archive .gpu/cifar10-jpeg.tar.gz
step train $(( 590 - ($(date +%s) - T0) )) python3 scripts/train.py experiment=cifar10_vit_h12_spt_lsa_10min attention=flash model.global_pool=avg model.attn_init=mimetic trainer.max_time=00:00:09:00
nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv >> $O/env.log; pack
tar --exclude='*.ckpt' -czf $OUT/runs.tar.gz -C <tmp>/logs . ; ls -la $(find <tmp>/logs -name '*.ckpt') > $OUT/ckpts.log 2>&1
