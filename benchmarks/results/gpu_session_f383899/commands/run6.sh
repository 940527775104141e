# sixth call, on the H200 that the fifth got: the six ViT attention shapes against cuDNN, one step per shape
# (a fresh tuning cache), as many as the time allows
. .gpu/common.sh >/dev/null 2>&1; envinfo; export VITFLASH_CACHE_DIR=/tmp/cache_large
for s in 256,12,197,64 8,12,4097,64 4,16,4097,128 256,6,197,64 64,12,577,64 32,16,1025,64; do
  L=$(( 470 - ($(date +%s) - T0) )); [ $L -lt 40 ] && break
  step large_$s $L python3 scripts/bench_attention.py --shape $s --timer graph --impls flash sdpa_cudnn --out $O/large_$s
done
pack; cat $OUT/steps.log; for f in $O/large_*/*.md; do grep -E "^\| \(" $f | head -2; done
