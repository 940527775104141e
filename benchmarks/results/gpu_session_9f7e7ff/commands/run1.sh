# second call, the kernels of 0975598 again (a975f41 reverted): the short path's GPU tests (every
# candidate at N = 65 and the narrow and masked heads), the CIFAR attention shapes against SDPA,
# then vit_small's whole step under CUDA graphs
. .gpu/common.sh >/dev/null 2>&1; envinfo; export VITFLASH_CACHE_DIR=/tmp/cache_small
python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu/pytest_xdist*.whl .gpu/execnet*.whl
step gpu_tests 150 python3 -m pytest -v -m gpu -n 8 -p no:cacheprovider tests/test_flash_attention.py -k "every_config and (65-64 or 65-128 or narrow)"
step attn_small 190 python3 scripts/bench_attention.py --shapes small --timer graph --out $O/attn_small
step ro_small 230 python3 scripts/bench_model.py --suite cifar --models vit_small_patch4_32 --compile reduce-overhead --out $O/ro_small
pack; cat $OUT/steps.log; tail -3 $O/gpu_tests.log; grep -E "^\| \(" $O/attn_small/*.md | head -40; grep "^|" $O/ro_small/*.md
