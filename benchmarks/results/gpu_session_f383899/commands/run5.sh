# fifth call: the N = 197 forwards with a register cap that fits one program more an SM (4 of the (128, 32) tile
# instead of 3), beside the tuner's pick, at both N = 197 ViT shapes
. .gpu/common.sh >/dev/null 2>&1; envinfo
step sweep_197 400 python3 scripts/sweep_configs.py --op fwd --shapes 256,6,197,64 256,12,197,64 --timer graph --repeats 3 --out $O/sweep_197 --configs general:128,32,TAIL_AHEAD=1:4:3 general_tma:128,32,TAIL_AHEAD=1:4:3 general_tma:128,32,TAIL_AHEAD=1:4:3:128 general:128,32,TAIL_AHEAD=1:4:3:128 general_tma:64,64,TAIL_AHEAD=1:4:2:96 general_tma:128,32:4:3:128
pack; cat $OUT/steps.log; grep -A12 "^## " $O/sweep_197.log | tail -30
