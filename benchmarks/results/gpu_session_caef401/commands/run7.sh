# the checked-out branch: the flash op's GPU tests (every listed candidate against float64
# under the FA2 rule at N = 1, 65, 197, 577, the tail programs' own test)
. .gpu/common.sh; envinfo
export VITFLASH_CACHE_DIR=/tmp/cache_tests
step gpu_tests 450 python3 -m pytest -v -m gpu -n 12 -p no:cacheprovider --durations=15 tests/test_flash_attention.py
# the launch forms against each other on the GPU (tests not marked gpu: split against one launch, on CUDA)
step split_forms $(( 590 - ($(date +%s) - T0) )) python3 -m pytest -q -p no:cacheprovider -k "split_backward or tail_programs or tail_ahead" tests/test_flash_attention.py
