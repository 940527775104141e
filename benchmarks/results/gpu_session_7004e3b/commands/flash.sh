. .gpu/common.sh; envinfo; . .gpu/train_common.sh; train200 flash 500
