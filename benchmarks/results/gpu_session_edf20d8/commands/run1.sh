# the general backward's tail tiles: the GPU tests of the flash op (every listed candidate, the tail
# tiles' own test), then each backward part timed apart at N = 192, 197, 208, 256 (as run 3 before them)
. .gpu/common.sh; envinfo
export VITFLASH_CACHE_DIR=/tmp/cache_tests
step gpu_tests 300 python3 -m pytest -v -m gpu -n 12 -p no:cacheprovider --durations=15 tests/test_flash_attention.py
export VITFLASH_CACHE_DIR=/tmp/cache_parts
step parts 200 python3 benchmarks/probes/bwd_parts.py --shapes 256,12,192,64 256,12,197,64 256,12,208,64 256,12,256,64 --warps 4 --stages 3 --repeats 3 --out $O/parts
