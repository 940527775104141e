# fourth call, the same warm machine: the ViT shapes again in another fresh tuning cache (does the tuner choose
# the same?), then the varied shapes with the time left
. .gpu/common.sh >/dev/null 2>&1; envinfo
export VITFLASH_CACHE_DIR=/tmp/cache4
step attn_large 200 python3 scripts/bench_attention.py --shapes large --timer graph --impls flash sdpa_cudnn --out $O/attn_large
L=$(( 400 - ($(date +%s) - T0) )); step attn_varied $L python3 scripts/bench_attention.py --shapes varied --timer graph --impls flash sdpa_cudnn --out $O/attn_varied
cat $OUT/steps.log; head -16 $O/attn_large/*.md | tail -9; head -18 $O/attn_varied/*.md | tail -11
