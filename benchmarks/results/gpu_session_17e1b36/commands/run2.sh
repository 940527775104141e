# commit 432a806 (K and V buffers of their own; the warp-specialized form)
. .gpu/common.sh >/dev/null 2>&1; envinfo; export VITFLASH_CACHE_DIR=/tmp/cache_run1
step gluon_fwd 300 python3 benchmarks/probes/gluon_fwd.py --out $O/gluon_fwd
pack; cat $OUT/steps.log; tail -30 $O/gluon_fwd.log
