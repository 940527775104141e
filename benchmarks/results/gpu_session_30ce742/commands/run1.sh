# screen two changes on the best recipe cut to 200 epochs (committed flash baseline at 7004e3b:
# 89.94%), seed 42, the two runs side by side on one GPU (accuracy only; speed not comparable)
. .gpu/common.sh; envinfo
step prepare 60 python3 scripts/prepare_data.py --archive .gpu/cifar10-jpeg.tar.gz
R="python3 scripts/train.py experiment=cifar10_vit_h12_spt_lsa_10min attention=flash trainer.max_epochs=200"
LIM=$(( 590 - ($(date +%s) - T0) ))
( VITFLASH_CACHE_DIR=<tmp>/cache_a timeout $LIM $R model.global_pool=avg task_name=screen_avg > $O/train_avg.log 2>&1; echo "== train_avg rc=$? at $(( $(date +%s) - T0 )) s" >> $OUT/steps.log ) &
sleep 20
( VITFLASH_CACHE_DIR=<tmp>/cache_m timeout $(( LIM - 20 )) $R model.attn_init=mimetic task_name=screen_mimetic > $O/train_mimetic.log 2>&1; echo "== train_mimetic rc=$? at $(( $(date +%s) - T0 )) s" >> $OUT/steps.log ) &
while sleep 30; do pack; jobs -r | grep -q . || break; done; wait
nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv >> $O/env.log
pack; tar --exclude='*.ckpt' -czf $OUT/runs.tar.gz -C <tmp>/logs . ; ls -la $(find <tmp>/logs -name '*.ckpt') > $OUT/ckpts.log 2>&1
