# fourth call, a fresh machine with the session's last 245 s: every listed forward at (4, 16, 4097, 128) under the tuner's timer and the benchmark's, same process
. .gpu/common.sh >/dev/null 2>&1; envinfo
step sweep_fwd_d128 150 python3 scripts/sweep_configs.py --op fwd --shapes 4,16,4097,128 --listed --timer graph --repeats 3 --budget-s 90 --out $O/sweep_fwd_d128; cat $OUT/steps.log
