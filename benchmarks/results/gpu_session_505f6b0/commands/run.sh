# the short backward with K and V kept in registers as the score products' first operands,
# timed alone against the kernels of 1ba6544 (<kernels.py of e0a450d>), same inputs, bit for bit
. .gpu/common.sh; envinfo
export VITFLASH_CACHE_DIR=/tmp/cache_probe
step short_bwd 200 python3 benchmarks/probes/short_bwd.py --baseline <kernels.py of e0a450d> --shapes 1024,6,65,64 256,6,65,64 1024,3,65,64 256,3,65,64 --configs 32x4x168 32x4 16x4 --repeats 3 --out $O/short_bwd
nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv >> $O/env.log; pack
