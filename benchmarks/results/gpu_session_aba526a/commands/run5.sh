# piece 2 of the 800-epoch run (run4.sh 800 was cut by the command's limit in epoch 784): the next
# command on the same machine resumes from its last checkpoint (epoch 779) to 800 epochs with the
# same caches, tests, then scores the last checkpoint without the flip, and with the flip and
# 1 px shifts (model.eval_shift=1, chosen before the run on the CPU probe, reported apart)
. .gpu/common.sh >/dev/null 2>&1
export VITFLASH_CACHE_DIR=/tmp/cache_train_800 TORCHINDUCTOR_CACHE_DIR=/tmp/inductor_train_800 TRITON_CACHE_DIR=/tmp/triton_train_800
CK=$(ls -t $(find /tmp/logs -name last.ckpt) | head -1); echo "resume from $CK" >> $OUT/steps.log
step train2 150 python3 scripts/train.py experiment=cifar10_vit_h12_gap_mimetic_10min attention=flash trainer.max_epochs=800 task_name=gap_mimetic_800 ckpt_path=$CK
L=$(ls -t $(find /tmp/logs -name last.ckpt) | head -1); echo "last $L" >> $OUT/steps.log
step eval_noflip 40 python3 scripts/eval.py ckpt_path=$L attention=flash eval_flip=false
step eval_shift1 40 python3 scripts/eval.py ckpt_path=$L attention=flash eval_flip=true eval_shift=1
tar --exclude='*.ckpt' -czf $OUT/runs.tar.gz -C /tmp/logs . ; pack
