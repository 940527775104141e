# the general backward four ways, one after the other on one machine, each with the backward-parts probe
# of its own commit: main's kernels (.gpu/main_tree), the tail programs (exp/bwd-tail-programs,
# .gpu/tails_tree), with delta in the dQ launch too (exp/bwd-fused-delta, .gpu/fused_tree), and with
# the tail programs' wide steps too (exp/bwd-tail-wide, with exp/fwd-tail-ahead on top: this tree): each backward part timed apart at
# N = 192-256; then, if time is left, the ViT shapes against cuDNN with this tree
. .gpu/common.sh; envinfo
for side in main tails fused wide; do
  case $side in
    wide) PP=$PYTHONPATH; C=$(cat .gpu/commit); P=benchmarks/probes/bwd_parts.py ;;
    *) PP=$PWD/.gpu/${side}_tree:$PYTHONPATH; C=$(cat .gpu/${side}_commit); P=.gpu/${side}_tree/bwd_parts.py ;;
  esac
  env PYTHONPATH=$PP python3 .gpu/which.py | sed "s/^/$side: /" >> $OUT/steps.log
  step parts_$side 100 env PYTHONPATH=$PP VITFLASH_COMMIT=$C VITFLASH_CACHE_DIR=/tmp/cache_parts_$side python3 $P --shapes 256,12,192,64 256,12,197,64 256,12,208,64 256,12,256,64 --warps 4 --stages 3 --repeats 3 --out $O/parts_$side
done
LEFT=$(( 585 - ($(date +%s) - T0) ))
export VITFLASH_CACHE_DIR=/tmp/cache_bench
[ $LEFT -gt 230 ] && step attn_large $LEFT python3 scripts/bench_attention.py --shapes large --timer graph --impls flash sdpa_flash sdpa_cudnn --out $O/attn_large
echo "left for attn_large: $LEFT s" >> $OUT/steps.log
