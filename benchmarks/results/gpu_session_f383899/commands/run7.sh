# seventh call, same H200: the varied shapes (other N, D = 80 and 96, other B * H) against cuDNN, as far as the time allows
. .gpu/common.sh >/dev/null 2>&1; envinfo; export VITFLASH_CACHE_DIR=/tmp/cache_large
step varied 255 python3 scripts/bench_attention.py --shapes varied --timer graph --impls flash sdpa_cudnn --out $O/varied
pack; cat $OUT/steps.log; grep -E "^\| \(" $O/varied/*.md | head -12
