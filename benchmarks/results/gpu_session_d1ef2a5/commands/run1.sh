# first call (nvidia-h200 asked for, an H100 came): the probe of the first batch under load (ddp_probe3.sh, the loaded run twice), the GPU suite, then the CIFAR whole step
. .gpu/common.sh; envinfo; cp .gpu/probe_cb.py /tmp/site/
mkdir -p /tmp/data && tar -xzf .gpu/cifarA.tar.gz -C /tmp/data; echo "cifar train A $(find /tmp/data/cifar10 -name "*.jpg" | wc -l)" >> $OUT/steps.log
COMMON="data=synthetic data.train_size=256 data.batch_size=32 trainer.max_epochs=1 trainer.log_every_n_steps=1 trainer.limit_train_batches=4 model.compile=false model.graph_step=false logger=csv trainer.deterministic=warn trainer=gpu +callbacks.probe._target_=probe_cb.Probe"
losses() { python3 -c "
import csv, sys, glob
f = glob.glob('/tmp/p/$1/**/metrics.csv', recursive=True)
rows = list(csv.DictReader(open(f[0]))) if f else []
print('$1', [round(float(r['train/loss_step']), 5) for r in rows if r.get('train/loss_step')][:4])" | tee -a $O/losses.txt; }
runv() { local name=$1; shift; timeout 60 python3 scripts/train.py $COMMON "$@" hydra.run.dir=/tmp/p/$name > $O/$name.out 2>&1; echo "$name rc=$?" >> $O/losses.txt; grep -h PROBE $O/$name.out | head -4 >> $O/losses.txt; losses $name; pack; }
mkdir -p /tmp/cA; cp .gpu/cacheA.json /tmp/cA/autotune.json; export VITFLASH_CACHE_DIR=/tmp/cA
runv H0_noload
for i in 1 2 3 4; do python3 -c "
import torch, time
a = torch.randn(8192, 8192, device='cuda', dtype=torch.bfloat16); t = time.time()
while time.time() - t < 75: a = (a @ a).clamp_(-1, 1)
torch.cuda.synchronize()" & done; sleep 4
runv H1_load
runv H1b_load
runv H2_sdpa_load model.attention=sdpa
wait; echo "== probe done at $(( $(date +%s) - T0 )) s" | tee -a $OUT/steps.log
unset VITFLASH_CACHE_DIR
export VITFLASH_TEST_CIFAR=$PWD/.gpu/cifar10-mini.tar.gz VITFLASH_CACHE_DIR=/tmp/cache
step gpu_tests 300 python3 -m pytest -v -m gpu -n 12 -p no:cacheprovider --durations=20 tests
L=$(( 585 - ($(date +%s) - T0) )); step step_cifar $L python3 scripts/bench_model.py --suite cifar --models vit_small_patch4_32 --compile reduce-overhead --paths flash sdpa --out $O/step_cifar
cp /tmp/cache/autotune.json $O/ 2>/dev/null; pack
