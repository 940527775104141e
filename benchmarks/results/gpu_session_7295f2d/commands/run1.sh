. .gpu/common.sh; envinfo
export VITFLASH_CACHE_DIR=/tmp/cache_step
step step_vitb 340 python3 scripts/bench_model.py --suite large --models vit_base_patch16_224 --compile eager default --out $OUT/model_large
export VITFLASH_CACHE_DIR=/tmp/cache_tests
step gpu_tests 220 python3 -m pytest -v -m gpu -n 12 -p no:cacheprovider --durations=10 tests/test_flash_attention.py -k "not every_config_gpu or 577"
