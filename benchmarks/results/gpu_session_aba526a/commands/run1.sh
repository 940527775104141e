# where the best recipe's loop loses to the plain loop (67k against 79k img/s): bench_loop on the
# recipe itself (profiled), then with one component off at a time, then the earlier plain case
. .gpu/common.sh; envinfo
step prepare 60 python3 scripts/prepare_data.py --archive .gpu/cifar10-jpeg.tar.gz
B="python3 scripts/bench_loop.py --cases cifar10 --data-root /tmp/data --compile default --loop-graph-step --pipeline gpu --steps 40 --repeats 3 --attention flash"
R=experiment=cifar10_vit_h12_gap_mimetic_10min
step recipe 150 $B --override $R --profile $O/profile --out $O/recipe
pack
step no_ema 100 $B --override $R --override model.ema_decay=null --out $O/no_ema
step randaug 100 $B --override $R --override data.augment.auto_augment=rand-m9-mstd0.5-inc1 --out $O/randaug
step no_mixup 100 $B --override $R --override model.mixup_alpha=0 --override model.cutmix_alpha=0 --out $O/no_mixup
step plain 100 $B --override data.batch_size=512 --override model.model_name=vit_tiny_h12_patch4_32 --override model.shifted_patches=true --override model.locality_attention=true --override model.global_pool=avg --override model.attn_init=mimetic --out $O/plain
nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv >> $O/env.log; pack
