# second call, on the machine warm from the first (CIFAR's first five train classes already under /tmp/data):
# the rest of CIFAR, then the training loop against the bare step, the whole step as one CUDA graph (the default on one GPU)
. .gpu/common.sh; envinfo
tar -xzf .gpu/cifarB.tar.gz -C /tmp/data; echo "cifar train $(find /tmp/data/cifar10/train -name '*.jpg' | wc -l) test $(find /tmp/data/cifar10/test -name '*.jpg' | wc -l)" | tee -a $OUT/steps.log
export VITFLASH_CACHE_DIR=/tmp/cache
step loop_cifar 560 python3 scripts/bench_loop.py --cases cifar10 --compile default --loop-graph-step --graph-step --pipeline gpu --steps 40 --repeats 3 --attention flash naive --data-root /tmp/data --out $O/loop_cifar
