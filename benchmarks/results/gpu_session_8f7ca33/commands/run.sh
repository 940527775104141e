# the dropout mask of eight keys a Philox call: correctness on the GPU, then the small shapes timed
. .gpu/common.sh; envinfo
export VITFLASH_CACHE_DIR=/tmp/cache_f
step check_dropout 40 python3 .gpu/check_dropout.py   # commands/check_dropout.py
step attn_dropout 110 python3 scripts/bench_attention.py --shapes small --timer graph --dropout 0.1 --impls flash sdpa_flash --out $O/attn_dropout
