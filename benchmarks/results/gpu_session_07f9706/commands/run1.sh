# the short backward pipelined (2, 3 stages) beside the listed 1 stage at the N = 65 shapes,
# issue 7's small-shape table, then issue 12's six large shapes, all under the graph timer
. .gpu/common.sh >/dev/null 2>&1; envinfo; export VITFLASH_CACHE_DIR=/tmp/cache_run1
step short_bwd 125 python3 benchmarks/probes/short_bwd.py --shapes 1024,6,65,64 256,3,65,64 1024,3,65,64 256,6,65,64 --configs 16x4x168 16x4x168s2 16x4x168s3 16x4 16x4s2 32x4 32x4s2 --out $O/short_bwd
step attn_small 175 python3 scripts/bench_attention.py --shapes small --timer graph --out $O/attn_small
step attn_large 265 python3 scripts/bench_attention.py --shapes large --timer graph --impls flash sdpa_flash sdpa_cudnn --out $O/attn_large
pack; cat $OUT/steps.log; grep "^|" $O/short_bwd/*.md | grep -v "^|---"; tail -25 $O/attn_small.log; tail -25 $O/attn_large.log
