# PIPE twins: the tuner's own timings of every candidate at the six large shapes, flash
# against cuDNN; then every candidate against float64 on the GPU
. .gpu/common.sh; envinfo
export VITFLASH_CACHE_DIR=/tmp/cache_g
step attn_large 330 python3 scripts/bench_attention.py --shapes large --timer graph --impls flash sdpa_cudnn --out $O/attn_large
step gpu_tests 230 python3 -m pytest -v -n 12 -p no:cacheprovider tests/test_flash_attention.py -k "every_config or pipelined or tma_load"
