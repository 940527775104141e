# why trainer=gpu and trainer=ddp (one device) sometimes log different first losses under load
. .gpu/common.sh; envinfo
COMMON="data=synthetic data.train_size=256 data.batch_size=32 trainer.max_epochs=1 trainer.log_every_n_steps=1 model.compile=false model.graph_step=false logger=csv trainer.deterministic=warn"
losses() { python3 -c "
import csv, sys, glob
f = glob.glob('/tmp/p/$1/**/metrics.csv', recursive=True)
rows = list(csv.DictReader(open(f[0]))) if f else []
print('$1', [round(float(r['train/loss_step']), 5) for r in rows if r.get('train/loss_step')][:4])" | tee -a $O/losses.txt; }
runv() { local name=$1; shift; timeout 120 python3 scripts/train.py $COMMON "$@" hydra.run.dir=/tmp/p/$name > $O/$name.out 2>&1; echo "$name rc=$?" >> $O/losses.txt; grep -h "gpu_storage=auto\|captured\|flash attention" $O/$name.out | head -5 >> $O/losses.txt; losses $name; cp $VITFLASH_CACHE_DIR/autotune.json $O/cache_$name.json 2>/dev/null; pack; }
export VITFLASH_CACHE_DIR=/tmp/cA
runv A_gpu trainer=gpu; runv A_ddp trainer=ddp trainer.devices=1
export VITFLASH_CACHE_DIR=/tmp/cB
runv B_ddp trainer=ddp trainer.devices=1; runv B_gpu trainer=gpu
runv C_gpu_stream trainer=gpu data.gpu_storage=stream
runv D_gpu_sdpa trainer=gpu model.attention=sdpa; runv D_ddp_sdpa trainer=ddp trainer.devices=1 model.attention=sdpa
# under load: other processes busy on the GPU
for i in 1 2 3 4; do python3 -c "
import torch, time
a = torch.randn(8192, 8192, device='cuda', dtype=torch.bfloat16); t = time.time()
while time.time() - t < 100: a = (a @ a).clamp_(-1, 1)
torch.cuda.synchronize()" & done
sleep 5
export VITFLASH_CACHE_DIR=/tmp/cE
runv E_gpu_load trainer=gpu; runv E_ddp_load trainer=ddp trainer.devices=1
export VITFLASH_CACHE_DIR=/tmp/cF
runv F_ddp_load trainer=ddp trainer.devices=1; runv F_gpu_load trainer=gpu
wait; cat $O/losses.txt
export VITFLASH_CACHE_DIR=/tmp/cT VITFLASH_TEST_CIFAR=$PWD/.gpu/cifar10-mini.tar.gz
step alone 200 python3 -m pytest -v -p no:cacheprovider tests/test_train.py tests/test_gpu_data.py -k "ddp_on_one_gpu or resident_and_streamed"
