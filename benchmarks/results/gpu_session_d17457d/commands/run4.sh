. .gpu/common.sh; envinfo
export VITFLASH_CACHE_DIR=/tmp/cache_bench4
step attn_varied_graph 290 python3 scripts/bench_attention.py --shapes varied --timer graph --impls flash sdpa_flash sdpa_cudnn --out $OUT/attn_varied
