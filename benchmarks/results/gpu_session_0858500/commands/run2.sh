# second call: the ViT-B/16 @224 b256 training step (issue 12's whole-step measure), then the small
# (CIFAR) attention shapes as CUDA-graph replays with the time left
. .gpu/common.sh >/dev/null 2>&1; envinfo
export VITFLASH_CACHE_DIR=/tmp/cache
step model_large 230 python3 scripts/bench_model.py --suite large --models vit_base_patch16_224 --compile eager default --out $O/model_large
L=$(( 585 - ($(date +%s) - T0) )); step attn_small $L python3 scripts/bench_attention.py --shapes small --timer graph --out $O/attn_small
cp /tmp/cache/autotune.json $O/ 2>/dev/null; pack; cat $OUT/steps.log; tail -4 $O/model_large/*.md; head -14 $O/attn_small/*.md | tail -8
