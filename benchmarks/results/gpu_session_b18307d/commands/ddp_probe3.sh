# the first training loss moves with GPU load: which input moves (the batch, the labels, the weights), flash or not
. .gpu/common.sh; envinfo; cp .gpu/probe_cb.py /tmp/site/
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
while time.time() - t < 45: a = (a @ a).clamp_(-1, 1)
torch.cuda.synchronize()" & done; sleep 4
runv H1_load
runv H2_sdpa_load model.attention=sdpa
wait; cat $O/losses.txt
