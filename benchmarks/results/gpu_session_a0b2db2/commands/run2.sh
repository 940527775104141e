# piece 2: resume piece 1 (same machine) exactly to 750 epochs; then score its last checkpoint with and without the flip
. .gpu/common.sh; envinfo
export VITFLASH_CACHE_DIR=/tmp/cache_train
CK=$(ls -t $(find /tmp/logs -name last.ckpt) | head -1); echo "resume from $CK" >> $OUT/steps.log
step train2 400 python3 scripts/train.py experiment=cifar10_vit_h12_gap_mimetic_10min attention=flash trainer.max_epochs=750 ckpt_path=$CK
L=$(ls -t $(find /tmp/logs -name last.ckpt) | head -1); echo "last $L" >> $OUT/steps.log
step eval_flip 60 python3 scripts/eval.py ckpt_path=$L attention=flash eval_flip=true
step eval_noflip 60 python3 scripts/eval.py ckpt_path=$L attention=flash eval_flip=false
nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv >> $O/env.log; pack
tar --exclude='*.ckpt' -czf $OUT/runs.tar.gz -C /tmp/logs . ; ls -la $(find /tmp/logs -name '*.ckpt') > $OUT/ckpts.log 2>&1
