# the capped short backward at other caps: 128 (4 programs an SM at 4 warps, 2 at 8) beside 168
. .gpu/common.sh; envinfo
export VITFLASH_CACHE_DIR=<tmp>/cache_o
step short_bwd_caps 300 python3 benchmarks/probes/short_bwd.py --configs 32x4x168 32x4x128 16x4x128 32x8x128 64x8x128 --shapes 256,3,65,64 1024,3,65,64 256,6,65,64 1024,6,65,64 --out $O/short_bwd_caps
