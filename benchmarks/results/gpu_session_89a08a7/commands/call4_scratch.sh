# call 4: the same fine-tuning recipe from random weights, the same two seeds side by side;
# on the same warm machine also a third seed of both starts
. .gpu/common.sh; envinfo
export VITFLASH_CACHE_DIR=/tmp/cache_d
[ -d /tmp/data/cifar10/train ] || step prepare 90 python3 scripts/prepare_data.py --archive .cifar/cifar10-jpeg.tar.gz
ft() { step ft_$2_s$1 240 python3 scripts/train.py experiment=cifar10_finetune attention=flash seed=$1 task_name=ft10_$2_s$1 model.pretrained=$3; }
ft 0 scratch null & ft 1 scratch null & wait
if [ -f /tmp/inet128.safetensors ]; then ft 2 scratch null & ft 2 inet128 /tmp/inet128.safetensors & wait; fi
tar --exclude='*.ckpt' -czf $O/runs_scratch.tar.gz -C /tmp/logs $(cd /tmp/logs && ls -d ft10_scratch_* ft10_inet128_s2 2>/dev/null)
pack
