# commit cae18ce (kernels of a4ee2cc): the staged warp-specialized Gluon backward forms' GPU tests (each forced through the op under the rule, 8 workers; a hang there skips the rest), then the six ViT shapes with the staged forms listed, against cuDNN, then (time left) the D = 128 forms called directly by the probe
. .gpu/common.sh >/dev/null 2>&1; envinfo; export VITFLASH_CACHE_DIR=/tmp/cache_run1
step gluon_bwd_tests 150 python3 -m pytest -q -n 8 -m gpu tests/test_flash_attention.py -k "gluon_backward and warp_specialized" -p no:cacheprovider
if grep -q "rc=124" $OUT/steps.log; then echo "the tests ran out of time: the bench skipped" | tee -a $OUT/steps.log; else
step attn_staged 270 python3 scripts/bench_attention.py --gluon-staged --shape 64,12,577,64 32,16,1025,64 8,12,4097,64 32,16,577,128 8,16,2049,128 4,16,4097,128 --timer graph --impls flash sdpa_cudnn --out $O/attn_staged
L=$(( 575 - ($(date +%s) - T0) )); [ $L -gt 40 ] && step ws_probe $L python3 benchmarks/probes/gluon_bwd.py --shapes 4,16,4097,128 32,16,577,128 --configs 64x64x2x4 --dq-configs 64x64x2x4od --atomic-configs --ws-configs 32x128x2x4 32x128x3x4 --wsdq-configs 128x64x2x4 128x128x2x4 --out $O/ws_probe
fi
pack; cat $OUT/steps.log; tail -8 $O/gluon_bwd_tests.log; grep "^|" $O/attn_staged.log | head -60; grep "^|" $O/ws_probe.log | head -30
