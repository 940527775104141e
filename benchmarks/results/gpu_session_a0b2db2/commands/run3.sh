# the best recipe (mean pooling, mimetic init) cut to 160 epochs, seed 42, with flash, naive and
# sdpa one after the other, each alone on the GPU
. .gpu/common.sh; envinfo
step prepare 60 python3 scripts/prepare_data.py --archive .gpu/cifar10-jpeg.tar.gz
for a in flash naive sdpa; do
  VITFLASH_CACHE_DIR=/tmp/cache_$a step train_$a $(( 590 - ($(date +%s) - T0) )) python3 scripts/train.py experiment=cifar10_vit_h12_gap_mimetic_10min attention=$a trainer.max_epochs=160 task_name=three_path_160_$a
done
nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv >> $O/env.log; pack
tar --exclude='*.ckpt' -czf $OUT/runs.tar.gz -C /tmp/logs . ; ls -la $(find /tmp/logs -name '*.ckpt') > $OUT/ckpts.log 2>&1
