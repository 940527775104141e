# run M's failures again: the sweep with its forced choice taking the dropout keyword; the two data-order tests alone, one process
. .gpu/common.sh; envinfo
export VITFLASH_CACHE_DIR=<tmp>/cache_n
step sweep_test 150 python3 -m pytest -v -p no:cacheprovider -m gpu tests/test_bench_attention.py -k "sweep_checks"
step rerun_alone 150 python3 -m pytest -v -p no:cacheprovider -m gpu tests/test_gpu_data.py tests/test_train.py -k "resident_and_streamed or ddp_on_one_gpu"
