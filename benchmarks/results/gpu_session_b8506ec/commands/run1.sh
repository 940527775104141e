# the capped dK/dV probe on a quiet GPU; the new capture test at 1484e79's gpu_data.py; the GPU suite under -n 12
. .gpu/common.sh; envinfo
export VITFLASH_CACHE_DIR=<tmp>/cache1
left() { echo $(( $1 - ($(date +%s) - T0) )); }
step bwd_parts 220 python3 benchmarks/probes/bwd_parts.py --shapes 64,12,577,64 32,16,1025,64 8,12,4097,64 --warps 4 --stages 3 --maxnreg 0 168 --out $O/bwd_parts
rm -rf <tmp>/old && mkdir <tmp>/old && cp -r vitflash tests pyproject.toml <tmp>/old/ && cp .gpu/gpu_data_1484e79.py <tmp>/old/vitflash/gpu_data.py
step capture_test_at_1484e79 90 bash -c "cd <tmp>/old && PYTHONPATH=<tmp>/site:<tmp>/old python3 -m pytest -v -p no:cacheprovider -m gpu tests/test_gpu_data.py -k 'capture_holds or resident_and_streamed'"
mkdir -p <tmp>/data; [ -d <tmp>/data/cifar10/train ] || step prepare 60 python3 scripts/prepare_data.py --archive .gpu/cifar10-jpeg.tar.gz
step gpu_tests $(left 585) python3 -m pytest -v -n 12 -p no:cacheprovider --durations=15 -m gpu tests -k "not every_config"
