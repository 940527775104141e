# first call, no dataset: every GPU test at this commit, then the large and small attention tables (CUDA-graph timer)
. .gpu/common.sh; envinfo
export VITFLASH_TEST_CIFAR=$PWD/.gpu/cifar10-mini.tar.gz VITFLASH_CACHE_DIR=/tmp/cache
step gpu_tests 330 python3 -m pytest -v -m gpu -n 12 -p no:cacheprovider --durations=20 tests
step attn_large 150 python3 scripts/bench_attention.py --shapes large --timer graph --impls flash sdpa_cudnn --out $O/attn_large
L=$(( 585 - ($(date +%s) - T0) )); step attn_small $L python3 scripts/bench_attention.py --shapes small --timer graph --impls flash sdpa_flash sdpa_cudnn --out $O/attn_small
cp /tmp/cache/autotune.json $O/ 2>/dev/null; pack
