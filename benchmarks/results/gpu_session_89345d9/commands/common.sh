# sourced by each run: installs the wheels, sets the environment, defines step()
python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 VITFLASH_COMMIT=$(cat .gpu/commit)
T0=$(date +%s)
step() { local name=$1 lim=$2; shift 2; timeout $lim "$@" > $OUT/$name.log 2>&1; echo "== $name rc=$? at $(( $(date +%s) - T0 )) s" | tee -a $OUT/steps.log; }
envinfo() { { date -u; nvidia-smi --query-gpu=name,driver_version,memory.used,utilization.gpu,clocks.sm --format=csv; python3 -c "import torch, triton, sys; print(sys.version.split()[0], torch.__version__, triton.__version__, torch.version.cuda, torch.backends.cudnn.version())"; nproc; } > $OUT/env.log 2>&1; }
