# first call: the short backward with dQ^T = K^T dS^T (this tree) beside the kernel before it
# (baseline), the short path's GPU tests (every candidate at N = 1 and 65, the narrow and masked
# heads), then the CIFAR attention shapes against SDPA
. .gpu/common.sh >/dev/null 2>&1; envinfo; export VITFLASH_CACHE_DIR=/tmp/cache_small
python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu/pytest_xdist*.whl .gpu/execnet*.whl
step short_bwd 150 python3 benchmarks/probes/short_bwd.py --baseline .gpu/kernels_base.py --configs 16x4 32x4 16x4x168 --out $O/short_bwd
step gpu_tests 200 python3 -m pytest -v -m gpu -n 11 -p no:cacheprovider tests/test_flash_attention.py -k "every_config and (1-64 or 65-64 or 65-80 or 65-96 or 65-128 or narrow)"
step attn_small 200 python3 scripts/bench_attention.py --shapes small --timer graph --out $O/attn_small
pack; cat $OUT/steps.log; grep -E "this tree|baseline|^## " $O/short_bwd/*.md; tail -3 $O/gpu_tests.log; grep -E "^\| \(" $O/attn_small/*.md | head -40
