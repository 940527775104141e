# second call: the D = 128 forward in 8-warp tiles held to 128 registers a thread (two programs an SM, whose
# warp groups are not tied by one program's barriers), beside the tuner's (128, 128) pick and the 2-program (64, 64)
. .gpu/common.sh >/dev/null 2>&1; envinfo
step sweep_d128 400 python3 scripts/sweep_configs.py --op fwd --shapes 4,16,4097,128 --timer graph --repeats 3 --out $O/sweep_d128 --configs general:128,128:8:3 general_tma:64,64:4:3 general_tma:128,64:8:2:128 general:128,64:8:2:128 general_tma:128,32:8:3:128 general:128,32:8:3:128 general_tma:128,64:8:2
pack; cat $OUT/steps.log; tail -30 $O/sweep_d128.log
