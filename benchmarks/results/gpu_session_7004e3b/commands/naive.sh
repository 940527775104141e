. .gpu/common.sh; envinfo; . .gpu/train_common.sh
train200 naive 560
