# the whole CIFAR training step under CUDA graphs with today's kernels (the one-key-tail
# twins; reduce-overhead was last run before them), then the small shapes with attention
# dropout (four keys per Philox call, not yet timed)
. .gpu/common.sh; envinfo
export VITFLASH_CACHE_DIR=/tmp/cache_e
step step_ro 300 python3 scripts/bench_model.py --suite cifar --compile reduce-overhead --out $O/step_ro
step attn_dropout 270 python3 scripts/bench_attention.py --shapes small --timer graph --dropout 0.1 --impls flash naive sdpa_flash sdpa_efficient --out $O/attn_dropout
