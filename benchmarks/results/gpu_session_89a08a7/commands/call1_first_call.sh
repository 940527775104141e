# call 1: Imagenette train shards 0 and 1; the first call at (256, 12, 197, 64) with cache version 16's list against 15's
. .gpu/common.sh; envinfo; unpack .inetA/*.tar.gz
step first_call 420 python3 benchmarks/probes/first_call.py --shapes 256,12,197,64 --variants listed v15 --repeats 3 --out $O/first_call
pack
