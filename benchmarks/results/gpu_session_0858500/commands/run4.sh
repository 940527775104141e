# fourth call: the second half of the CIFAR-10 archive, joined with the first (kept from the third call);
# the real training loop against the bare step (default on one GPU: the whole step captured around the
# compiled model), flash and naive
. .gpu/common.sh >/dev/null 2>&1; envinfo
export VITFLASH_CACHE_DIR=/tmp/cache
cat /tmp/parts/cifar.part.aa .gpu/cifar.part.ab > /tmp/cifar10-jpeg.tar.gz
step prepare 90 python3 scripts/prepare_data.py --archive /tmp/cifar10-jpeg.tar.gz
step loop_cifar $(( 570 - ($(date +%s) - T0) )) python3 scripts/bench_loop.py --data-root /tmp/data --cases cifar10 --compile default --loop-graph-step --graph-step --pipeline gpu --steps 40 --repeats 3 --attention flash naive --out $O/loop_cifar
pack; cat $OUT/steps.log; tail -3 $O/prepare.log; cat $O/loop_cifar/*.md | head -30
