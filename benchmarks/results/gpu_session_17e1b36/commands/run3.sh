# commit 432a806, the same machine as run2 (warm)
. .gpu/common.sh >/dev/null 2>&1; envinfo; export VITFLASH_CACHE_DIR=/tmp/cache_run1; step gluon_d128 280 python3 benchmarks/probes/gluon_fwd.py --shapes 4,16,4097,128 8,16,2049,128 32,16,577,128 --configs 64x128x2x4w240 64x128x3x4w240 64x64x3x4w240 64x64x4x4w240 --out $O/gluon_d128; pack; grep "^|" $O/gluon_d128.log
