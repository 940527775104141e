# sourced by each run: installs the wheels, sets the environment, defines step(), envinfo()
python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 VITFLASH_COMMIT=$(cat .gpu/commit)
export VITFLASH_DATA=/tmp/data VITFLASH_LOGS=/tmp/logs
T0=$(date +%s)
# every log goes to /tmp/o, packed into $OUT/bundle.tgz after each step (at most 8 files come back)
O=/tmp/o; rm -rf $O; mkdir -p $O
pack() { tar -czf $OUT/bundle.tgz.$BASHPID -C $O . && mv $OUT/bundle.tgz.$BASHPID $OUT/bundle.tgz; }
step() { local name=$1 lim=$2; shift 2; timeout $lim "$@" > $O/$name.log 2>&1; echo "== $name rc=$? at $(( $(date +%s) - T0 )) s" | tee -a $OUT/steps.log; pack; }
envinfo() { { date -u; nvidia-smi --query-gpu=name,driver_version,memory.used,utilization.gpu,clocks.sm --format=csv; python3 -c "import torch, triton, timm, lightning, sys; print(sys.version.split()[0], torch.__version__, triton.__version__, timm.__version__, lightning.__version__, torch.version.cuda, torch.backends.cudnn.version())"; nproc; } > $O/env.log 2>&1; }
# Imagenette travels in three pieces (64 MiB a call); each call unpacks its piece under /tmp/data,
# kept while the machine stays warm
unpack() { mkdir -p /tmp/data; for a in "$@"; do tar -xzf $a -C /tmp/data || echo "unpack $a failed" >> $OUT/steps.log; done; echo "imagenette train $(find /tmp/data/imagenette/train -name '*.JPEG' 2>/dev/null | wc -l) val $(find /tmp/data/imagenette/val -name '*.JPEG' 2>/dev/null | wc -l)" | tee -a $OUT/steps.log; }
