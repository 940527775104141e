# first call: the ViT attention shapes against cuDNN in a fresh tuning cache (the tuner's graph-timed
# finalists), then every GPU test with the time left
. .gpu/common.sh; envinfo
export VITFLASH_TEST_CIFAR=$PWD/.gpu/cifar10-mini.tar.gz VITFLASH_CACHE_DIR=/tmp/cache
step attn_large 240 python3 scripts/bench_attention.py --shapes large --timer graph --impls flash sdpa_cudnn --out $O/attn_large
L=$(( 588 - ($(date +%s) - T0) )); step gpu_tests $L python3 -m pytest -v -m gpu -n 12 -p no:cacheprovider --durations=20 tests
cp /tmp/cache/autotune.json $O/ 2>/dev/null; pack; cat $OUT/steps.log; grep -E "passed|failed" $O/gpu_tests.log | tail -3; head -16 $O/attn_large/*.md | tail -9
