# the masked every-candidate case that run K's limit cut; the CIFAR whole step under CUDA graphs, flash and SDPA
. .gpu/common.sh; envinfo
export VITFLASH_CACHE_DIR=<tmp>/cache_l
step gpu_test_masked 150 python3 -m pytest -v -p no:cacheprovider -m gpu tests/test_flash_attention.py -k "every_config_narrow_heads_and_masked_gpu and 65-64-True"
step step_ro 390 python3 scripts/bench_model.py --suite cifar --compile reduce-overhead --paths flash sdpa --out $O/step_ro
