# first call: every GPU test at this commit (the new timm-patch test among them), then the varied shapes against cuDNN
. .gpu/common.sh; envinfo
export VITFLASH_TEST_CIFAR=$PWD/.gpu/cifar10-mini.tar.gz VITFLASH_CACHE_DIR=/tmp/cache
step gpu_tests 330 python3 -m pytest -v -m gpu -n 12 -p no:cacheprovider --durations=20 tests
L=$(( 585 - ($(date +%s) - T0) )); step attn_varied $L python3 scripts/bench_attention.py --shapes varied --timer graph --impls flash sdpa_cudnn --out $O/attn_varied
cp /tmp/cache/autotune.json $O/ 2>/dev/null; pack
