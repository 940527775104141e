# second call: the GPU tests of every candidate at N = 65, D = 64 (the capped 16-row short backward
# among them), then the CIFAR attention shapes against SDPA
. .gpu/common.sh >/dev/null 2>&1; envinfo; export VITFLASH_CACHE_DIR=/tmp/cache_small
python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu/pytest_xdist*.whl .gpu/execnet*.whl
step gpu_tests 100 python3 -m pytest -q -m gpu -n 4 tests/test_flash_attention.py -k "every_config and 65-64"
step attn_small 130 python3 scripts/bench_attention.py --shapes small --timer graph --out $O/attn_small
pack; cat $OUT/steps.log; tail -3 $O/gpu_tests.log; grep -E "^\| \(" $O/attn_small/*.md | head -40
