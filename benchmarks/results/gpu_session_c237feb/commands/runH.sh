# every candidate against float64 on the GPU at the current kernels; then cifar10_vit_tiny to its end
. .gpu/common.sh; envinfo
export VITFLASH_CACHE_DIR=/tmp/cache_h
step gpu_tests 170 python3 -m pytest -v -n 12 -p no:cacheprovider -m gpu tests/test_flash_attention.py -k every_config
mkdir -p /tmp/data; [ -d /tmp/data/cifar10/train ] || step prepare 90 python3 scripts/prepare_data.py --archive .cifar/cifar10-jpeg.tar.gz
step vit_tiny 335 python3 scripts/train.py experiment=cifar10_vit_tiny attention=flash
tar --exclude='*.ckpt' -czf $O/runs_vit_tiny.tar.gz -C /tmp/logs . ; ls -laR /tmp/logs | grep ckpt > $O/ckpts.log; pack
