# first call: the short backward alone, the one key's sums taken once (this tree) against HEAD's kernel (baseline)
. .gpu/common.sh >/dev/null 2>&1; envinfo; export VITFLASH_CACHE_DIR=/tmp/cache_small
step plain 280 python3 benchmarks/probes/short_bwd.py --baseline .gpu/kernels_base.py --configs 16x4 32x4 64x4 32x8 16x4x168 32x4x168 --out $O/plain
step kpc 250 python3 benchmarks/probes/short_bwd.py --baseline .gpu/kernels_base.py --configs 16x4 32x4 16x8 --key-per-chunk --out $O/kpc
pack; cat $OUT/steps.log; cat $O/env.log; cat $O/plain/*.md | grep -v "^$" | head -80; cat $O/kpc/*.md | grep -v "^$"| head -60
