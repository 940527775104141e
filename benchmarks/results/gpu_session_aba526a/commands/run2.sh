# the best recipe's loop after the CIFAR-10 AutoAugment change (each op kind once per position)
# and the EMA's tensor lists made once: bench_loop on the recipe (profiled), without the EMA, and
# with RandAugment in place of AutoAugment; then the GPU tests of the augmentation and the EMA
. .gpu/common.sh; envinfo
step prepare 60 python3 scripts/prepare_data.py --archive .gpu/cifar10-jpeg.tar.gz
B="python3 scripts/bench_loop.py --cases cifar10 --data-root /tmp/data --compile default --loop-graph-step --pipeline gpu --steps 40 --repeats 3 --attention flash"
R=experiment=cifar10_vit_h12_gap_mimetic_10min
step recipe 150 $B --override $R --profile $O/profile --out $O/recipe
step no_ema 100 $B --override $R --override model.ema_decay=null --out $O/no_ema
step randaug 100 $B --override $R --override data.augment.auto_augment=rand-m9-mstd0.5-inc1 --out $O/randaug
step gpu_tests 200 python3 -m pytest -q -m gpu tests/test_gpu_data.py tests/test_ema.py -p no:cacheprovider
nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv >> $O/env.log; pack
