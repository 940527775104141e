# the GPU tests other than every_config (which ran for N = 65, D = 64 in runs K and L), after Launch took compile options
. .gpu/common.sh; envinfo
export VITFLASH_CACHE_DIR=<tmp>/cache_m
mkdir -p <tmp>/data; [ -d <tmp>/data/cifar10/train ] || step prepare 90 python3 scripts/prepare_data.py --archive .cifar/cifar10-jpeg.tar.gz
step gpu_tests 420 python3 -m pytest -v -n 12 -p no:cacheprovider --durations=15 -m gpu tests -k "not every_config"
