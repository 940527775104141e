# SIGTERM on the GPU: the best recipe cut to 30 epochs, seed 1, flash; once without a signal,
# once sent SIGTERM 35 s after its start (as a scheduler preempting it would), then resumed
# with the command it printed; the two final checkpoints compared
. .gpu/common.sh; envinfo
export VITFLASH_CACHE_DIR=/tmp/cache_t TORCHINDUCTOR_CACHE_DIR=/tmp/inductor_t TRITON_CACHE_DIR=/tmp/triton_t
[ -d /tmp/data/cifar10 ] || step prepare 60 python3 scripts/prepare_data.py --archive .gpu/cifar10-jpeg.tar.gz
E="experiment=cifar10_vit_h12_gap_mimetic_10min attention=flash seed=1 trainer.max_epochs=30 test=false"
step whole 120 python3 scripts/train.py $E task_name=term_whole
timeout -s TERM 35 python3 scripts/train.py $E task_name=term_signalled > $O/signalled.log 2>&1; echo "== signalled rc=$? at $(( $(date +%s) - T0 )) s" | tee -a $OUT/steps.log; pack
P1=$(ls -d /tmp/logs/term_signalled/runs/*/ | head -1)
step resumed 100 python3 scripts/train.py $E task_name=term_resumed ckpt_path=${P1}checkpoints/last.ckpt
last() { echo $(ls -d /tmp/logs/$1/runs/*/ | head -1)checkpoints/last.ckpt; }
step same_resumed 60 python3 benchmarks/probes/same_state.py $(last term_whole) $(last term_resumed)
tar --exclude='*.ckpt' -czf $OUT/runs.tar.gz -C /tmp/logs . ; ls -la $(find /tmp/logs -name '*.ckpt') > $OUT/ckpts.log 2>&1
