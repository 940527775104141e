# every candidate against float64 on the GPU at the final kernels and launch path
. .gpu/common.sh; envinfo
export VITFLASH_CACHE_DIR=<tmp>/cache_p
step every_config 255 python3 -m pytest -v -n 12 -p no:cacheprovider -m gpu tests/test_flash_attention.py -k every_config
