# the one GPU test case that run H's time limit cut; cifar10_quick to its end; vit_small's
# whole step under reduce-overhead (the SDPA and naive rows a time limit cut at add3f77)
. .gpu/common.sh; envinfo
export VITFLASH_CACHE_DIR=/tmp/cache_i
step narrow 100 python3 -m pytest -v -p no:cacheprovider -m gpu tests/test_flash_attention.py -k "every_config_narrow_heads_and_masked_gpu and 65-16-False"
mkdir -p /tmp/data; [ -d /tmp/data/cifar10/train ] || step prepare 90 python3 scripts/prepare_data.py --archive .cifar/cifar10-jpeg.tar.gz
step quick 110 python3 scripts/train.py experiment=cifar10_quick
tar --exclude='*.ckpt' -czf $O/runs_quick.tar.gz -C /tmp/logs . ; pack
step ro_small 200 python3 scripts/bench_model.py --suite cifar --models vit_small_patch4_32 --compile reduce-overhead --out $O/ro_small
