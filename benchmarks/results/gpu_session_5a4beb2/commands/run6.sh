# sixth call: the varied shapes (other N, D = 80 and 96, other B * H) against cuDNN on an H100
. .gpu/common.sh >/dev/null 2>&1; envinfo; export VITFLASH_CACHE_DIR=/tmp/cache_large
step varied 300 python3 scripts/bench_attention.py --shapes varied --timer graph --impls flash sdpa_cudnn --out $O/varied
pack; cat $OUT/steps.log; cat $O/env.log; grep -E "^\| \(" $O/varied/*.md | head -10
