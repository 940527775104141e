. .gpu/common.sh; envinfo; . .gpu/train_common.sh
train200 sdpa 430
export VITFLASH_CACHE_DIR=/tmp/cache_tests
step gpu_tests $((590 - ($(date +%s) - T0))) python3 -m pytest -v -m gpu -n 12 -p no:cacheprovider --durations=10 tests/test_flash_attention.py -k "every_config and not 577"
