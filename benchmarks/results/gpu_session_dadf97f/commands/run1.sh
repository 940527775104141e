# split backward candidates with and without WS=1 (the dK/dV loop warp-specialized), against
# cuDNN in the same process; then warp_specialize.py's minimal dK/dV program both ways
. .gpu/common.sh >/dev/null 2>&1; envinfo; export VITFLASH_CACHE_DIR=/tmp/cache_small
step sweep_d64 250 python3 scripts/sweep_configs.py --op bwd --shapes 8,12,4097,64 256,12,197,64 --timer graph --out $O/sweep_d64 --configs general_tma:32,128,128,32,SPLIT=1:4:3 general_tma:64,64,64,64,SPLIT=1:4:3 general_tma:64,64,64,64,SPLIT=1,WS=1:4:3 general_tma:32,128,128,32,SPLIT=1,WS=1:4:3
step sweep_d128 130 python3 scripts/sweep_configs.py --op bwd --shapes 4,16,4097,128 --timer graph --out $O/sweep_d128 --configs general_tma:64,64,64,64,SPLIT=1:4:2 general_tma:64,64,64,64,SPLIT=1,WS=1:4:2 general_tma:64,64,64,64,SPLIT=1,WS=1:4:3
step ws_bwd 170 python3 benchmarks/probes/warp_specialize.py --op bwd
pack; cat $OUT/steps.log; grep -h "^(" $O/sweep_*.log; cat $O/ws_bwd.log | tail -20
