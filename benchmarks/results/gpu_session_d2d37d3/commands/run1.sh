# the short backward alone, this tree's beside 2e684b7's; registers as the JIT compiled them
. .gpu/common.sh; envinfo
export VITFLASH_CACHE_DIR=<tmp>/cache_j
step regs_short 60 python3 benchmarks/probes/registers.py --op bwd --d 64 --n 65 --tiles 16x4,32x4,32x8 --one-key --maxnreg 0,168
step regs_short_unaligned 45 python3 benchmarks/probes/registers.py --op bwd --d 64 --n 65 --tiles 16x4,32x4,32x8 --one-key --unaligned
step regs_general 45 python3 benchmarks/probes/registers.py --op bwd_general --d 64 --configs 32x128x4x3 --tma
step regs_general_unaligned 45 python3 benchmarks/probes/registers.py --op bwd_general --d 64 --configs 32x128x4x3 --tma --unaligned
step short_bwd 240 python3 benchmarks/probes/short_bwd.py --baseline .gpu/kernels_2e684b7.py --configs 16x4 32x4 32x8 16x4x168 32x4x168 --out $O/short_bwd
step plans 130 python3 benchmarks/probes/registers.py --plans 1024,6,65,64 256,12,197,64 64,12,577,64 4,16,4097,128
