# call 3 (the same machine): the rest of val; pretrain ViT-S/16 on Imagenette at 128 px (8 x 8
# patches, the token grid of the CIFAR fine-tune), export it in timm's format, fine-tune on
# CIFAR-10 from it, two seeds side by side; run logs back without checkpoints
. .gpu/common.sh; envinfo; unpack .inetC/*.tar.gz
export VITFLASH_CACHE_DIR=/tmp/cache_c
[ -d /tmp/data/cifar10/train ] || step prepare 90 python3 scripts/prepare_data.py --archive .cifar/cifar10-jpeg.tar.gz
step pretrain 330 python3 scripts/train.py experiment=imagenette_scratch attention=flash data.img_size=128 trainer.max_epochs=250 task_name=inet128_pretrain
find /tmp/logs/inet128_pretrain -name '*.ckpt' -exec ls -la {} + > $O/pretrain_ckpts.log 2>&1
tar --exclude='*.ckpt' -czf $O/runs_pretrain.tar.gz -C /tmp/logs inet128_pretrain
step export 60 python3 scripts/export_timm.py $(find /tmp/logs/inet128_pretrain -name last.ckpt | head -1) --out /tmp/inet128.safetensors
ft() { local left=$(( 585 - $(date +%s) + T0 )); [ $left -gt 240 ] && left=240; step ft_$2_s$1 $left python3 scripts/train.py experiment=cifar10_finetune attention=flash seed=$1 task_name=ft10_$2_s$1 model.pretrained=$3; }
ft 0 inet128 /tmp/inet128.safetensors & ft 1 inet128 /tmp/inet128.safetensors & wait
tar --exclude='*.ckpt' -czf $O/runs_ft.tar.gz -C /tmp/logs $(cd /tmp/logs && ls -d ft10_*)
pack
