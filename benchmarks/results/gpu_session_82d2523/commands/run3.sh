# third call: the finalists timed one after the other (blocks of replays, not turns): the ViT attention shapes
# against cuDNN in a fresh tuning cache, then the GPU tests of the tuner's graph timing and the probe
. .gpu/common.sh; envinfo
export VITFLASH_CACHE_DIR=/tmp/cache3
step attn_large 240 python3 scripts/bench_attention.py --shapes large --timer graph --impls flash sdpa_cudnn --out $O/attn_large
L=$(( 420 - ($(date +%s) - T0) )); step gpu_tests $L python3 -m pytest -v -m gpu -n 4 -p no:cacheprovider tests/test_probes.py tests/test_flash_attention.py -k "capture or finalist"
cat $OUT/steps.log; grep -E "passed|failed" $O/gpu_tests.log | tail -3; head -16 $O/attn_large/*.md | tail -9
