# commit 1db6d3b, the machine of run1: the varied ViT shapes against cuDNN (issue 12's shapes of the same kind), then the small CIFAR shapes against every SDPA backend
. .gpu/common.sh >/dev/null 2>&1; envinfo; export VITFLASH_CACHE_DIR=/tmp/cache_run1
step varied 270 python3 scripts/bench_attention.py --gluon --shapes varied --timer graph --impls flash sdpa_cudnn --out $O/varied
step small 220 python3 scripts/bench_attention.py --gluon --shapes small --timer graph --out $O/small
pack; cat $OUT/steps.log; grep "^|" $O/varied.log | head -14; grep "^|" $O/small.log | head -24
