. .gpu/common.sh >/dev/null 2>&1; envinfo
export VITFLASH_CACHE_DIR=/tmp/cache_parts
step bwd_parts 380 python3 benchmarks/probes/bwd_parts.py --shapes 8,12,4097,64 64,12,577,64 256,12,197,64 4,16,4097,128 32,16,1025,64 --warps 4 --stages 3 4 5 --out $OUT/parts
