# the best recipe cut to 160 epochs through SDPA, seed 42 (the default), alone on the GPU, cold
# caches: the run that the command limit cut in epoch 109 at commit a0b2db2, to its end
. .gpu/common.sh; envinfo
export VITFLASH_CACHE_DIR=/tmp/cache_s TORCHINDUCTOR_CACHE_DIR=/tmp/inductor_s TRITON_CACHE_DIR=/tmp/triton_s
[ -d /tmp/data/cifar10 ] || step prepare 60 python3 scripts/prepare_data.py --archive .gpu/cifar10-jpeg.tar.gz
step sdpa 480 python3 scripts/train.py experiment=cifar10_vit_h12_gap_mimetic_10min attention=sdpa trainer.max_epochs=160 trainer.max_time=00:00:07:00 task_name=three_path_160_sdpa
nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv >> $O/env.log; pack
tar --exclude='*.ckpt' -czf $OUT/runs.tar.gz -C /tmp/logs . ; ls -la $(find /tmp/logs -name '*.ckpt') > $OUT/ckpts.log 2>&1
