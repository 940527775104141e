# third call: vit_small_patch4_32's whole step under default compile, then the ViT-B/16 @224 b256 step (issue 12's whole-step measure)
. .gpu/common.sh >/dev/null 2>&1; envinfo; export VITFLASH_CACHE_DIR=/tmp/cache
step step_small_default 250 python3 scripts/bench_model.py --suite cifar --models vit_small_patch4_32 --compile default --out $O/step_small_default
L=$(( 570 - ($(date +%s) - T0) )); step model_large $L python3 scripts/bench_model.py --suite large --models vit_base_patch16_224 --compile eager default --out $O/model_large
pack; cat $OUT/steps.log; tail -5 $O/step_small_default.log; tail -5 $O/model_large.log
