# commit 6284e1c: what keeps an eager call's graph alive (diag), then the op with the Gluon kernels against cuDNN
. .gpu/common.sh >/dev/null 2>&1; envinfo; export VITFLASH_CACHE_DIR=/tmp/cache_run3
step diag 100 python3 .gpu/diag.py 1   # .gpu/diag.py: commands/run3_diag.py
step attn_gluon 260 python3 scripts/bench_attention.py --gluon --shape 64,12,577,64 32,16,1025,64 8,12,4097,64 32,16,577,128 8,16,2049,128 4,16,4097,128 --timer graph --impls flash sdpa_cudnn --out $O/attn_gluon
pack; cat $OUT/steps.log; cat $O/diag.log | grep -v Warning | head -60; grep "^|" $O/attn_gluon.log | head -30; tail -5 $O/attn_gluon.log
