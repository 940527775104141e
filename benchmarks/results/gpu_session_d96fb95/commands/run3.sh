. .gpu/common.sh; envinfo
export VITFLASH_CACHE_DIR=/tmp/cache_sweep
step sweep_fwd12 130 python3 scripts/sweep_configs.py --op fwd --shapes 256,12,197,64 --budget-s 100 --out $OUT/sweep_fwd12
step sweep_fwd6 100 python3 scripts/sweep_configs.py --op fwd --shapes 256,6,197,64 --budget-s 70 --out $OUT/sweep_fwd6
step sweep_bwd12 200 python3 scripts/sweep_configs.py --op bwd --shapes 256,12,197,64 --budget-s 160 --out $OUT/sweep_bwd12
