# sixth call, at the two-pass finalists' commit: their CPU-stubbed and GPU tests, then the tuner's choice at
# (4, 16, 4097, 128) in fresh tuning caches, one process after another, as many as the time allows
. .gpu/common.sh >/dev/null 2>&1; envinfo
export VITFLASH_CACHE_DIR=/tmp/cache6
step gpu_tests 120 python3 -m pytest -v -m gpu -n 4 -p no:cacheprovider tests/test_probes.py tests/test_flash_attention.py -k "capture or finalist or graph_times"
for i in 1 2 3 4 5 6 7 8; do
  L=$(( 400 - ($(date +%s) - T0) )); [ $L -lt 45 ] && break
  export VITFLASH_CACHE_DIR=/tmp/cache6_$i
  step d128_$i $L python3 scripts/bench_attention.py --shape 4,16,4097,128 --timer graph --impls flash sdpa_cudnn --out $O/d128_$i
done
pack; cat $OUT/steps.log; grep -E "passed|failed" $O/gpu_tests.log | tail -2; for d in $O/d128_*; do grep "(4, 16, 4097, 128) | fwd" $d/*.md; grep -m1 "(4, 16, 4097, 128) | 0" $d/*.md; done
