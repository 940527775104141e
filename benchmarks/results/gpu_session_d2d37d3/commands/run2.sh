# the capped twin against float64 on the GPU; alone beside 2e684b7's kernel; the small shapes with the tuner choosing
. .gpu/common.sh; envinfo
export VITFLASH_CACHE_DIR=<tmp>/cache_k
step gpu_tests 110 python3 -m pytest -v -p no:cacheprovider -m gpu tests/test_flash_attention.py -k "every_config and 65-64"
step short_bwd 130 python3 benchmarks/probes/short_bwd.py --baseline .gpu/kernels_2e684b7.py --configs 32x4 32x4x168 64x4 --shapes 256,3,65,64 1024,3,65,64 256,6,65,64 1024,6,65,64 --out $O/short_bwd
step attn_small 320 python3 scripts/bench_attention.py --shapes small --timer graph --out $O/attn_small
