# third call: the varied ViT-like shapes against cuDNN (the tuning cache of the calls before), and the
# first half of the CIFAR-10 archive kept on the machine for the next call (64 MiB travel a call)
. .gpu/common.sh >/dev/null 2>&1; envinfo
mkdir -p /tmp/parts && cp .gpu/cifar.part.* /tmp/parts/
export VITFLASH_CACHE_DIR=/tmp/cache
step attn_varied 260 python3 scripts/bench_attention.py --shapes varied --timer graph --impls flash sdpa_cudnn --out $O/attn_varied
pack; cat $OUT/steps.log; head -18 $O/attn_varied/*.md | tail -11
