# commit 17e1b36 (the first Gluon forward: K and V in one buffer pair per stage)
. .gpu/common.sh >/dev/null 2>&1; envinfo; export VITFLASH_CACHE_DIR=/tmp/cache_run1
step gluon_fwd 420 python3 benchmarks/probes/gluon_fwd.py --out $O/gluon_fwd
pack; cat $OUT/steps.log; tail -30 $O/gluon_fwd.log
