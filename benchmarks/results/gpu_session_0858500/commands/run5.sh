# fifth call, the same warm machine: the ViT shapes again in another fresh tuning cache (does the tuner choose
# the same?), then the small shapes with the eager-loop timer (and the one synchronized call) with the time left
. .gpu/common.sh >/dev/null 2>&1; envinfo
export VITFLASH_CACHE_DIR=/tmp/cache5
step attn_large 210 python3 scripts/bench_attention.py --shapes large --timer graph --impls flash sdpa_cudnn --out $O/attn_large
export VITFLASH_CACHE_DIR=/tmp/cache
step attn_small_eager $(( 450 - ($(date +%s) - T0) )) python3 scripts/bench_attention.py --shapes small --out $O/attn_small_eager
pack; cat $OUT/steps.log; head -16 $O/attn_large/*.md | tail -9; grep -i -A6 "one call\|synchron" $O/attn_small_eager/*.md | head -20
