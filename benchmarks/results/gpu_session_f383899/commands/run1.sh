# first call: what the finalists' second pass costs a first call, with the compiles taken out (one shared
# compile cache, filled by an untimed first call at each shape); each case in a fresh process and tuning cache
. .gpu/common.sh >/dev/null 2>&1; envinfo
step first_call 420 python3 benchmarks/probes/first_call.py --shapes 4,16,4097,128 256,12,197,64 --variants listed one_pass --warm-compile --repeats 3 --out $O/first_call
pack; cat $OUT/steps.log; cat $O/env.log; tail -25 $O/first_call.log
