. .gpu/common.sh; envinfo
export VITFLASH_CACHE_DIR=/tmp/cache_parts
step bwd_parts 520 python3 benchmarks/probes/bwd_parts.py --shapes 256,12,197,64 8,12,4097,64 64,12,577,64 4,16,4097,128 32,16,1025,64 --out $OUT/parts
