# commit cae18ce, the machine of run1 (warm): the ViT-B/16 @224 b256 whole training step, eager and compiled, flash against SDPA, naive and timm + SDPA (issue 12's whole-step evidence)
. .gpu/common.sh >/dev/null 2>&1; envinfo; export VITFLASH_CACHE_DIR=/tmp/cache_run1
step model_large 390 python3 scripts/bench_model.py --suite large --models vit_base_patch16_224 --compile eager default --out $O/model_large
pack; cat $OUT/steps.log; tail -8 $O/model_large.log
