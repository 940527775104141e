. .gpu/common.sh >/dev/null 2>&1; envinfo; step first_call 560 python3 benchmarks/probes/first_call.py --shapes 256,12,197,64 4,16,4097,128 --repeats 3 --out $OUT/first_call
