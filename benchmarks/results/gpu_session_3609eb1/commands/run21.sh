# one call, if only one comes: this session's GPU tests, a short busy-tuner A/B at the three lagging shapes, activation
# checkpointing's memory, the loop over synthetic Imagenette-sized data (no dataset travels), flash and naive
. .gpu/common.sh; envinfo
export VITFLASH_TEST_CIFAR=$PWD/.gpu/cifar10-mini.tar.gz
step tests_new 120 python3 -m pytest -q -p no:cacheprovider tests/test_timm_attention.py tests/test_train.py tests/test_model.py -k "timm or predict or eval_writes or per_class or attention_maps or rollout or grad_checkpointing"
cd .gpu/busy; export PYTHONPATH=/tmp/site:$PWD VITFLASH_COMMIT=1c90423
A="import runpy, sys; from vitflash.ops import launch; launch.BUSY_MS = float('inf'); sys.argv = ['scripts/bench_attention.py'] + sys.argv[1:]; runpy.run_path('scripts/bench_attention.py', run_name='__main__')"
S="64,12,577,64 32,16,1025,64 4,16,4097,128"
VITFLASH_CACHE_DIR=/tmp/cache_a step attn_a 120 python3 -c "$A" --shape $S --timer graph --impls flash sdpa_cudnn --out $O/attn_a
VITFLASH_CACHE_DIR=/tmp/cache_b step attn_b 120 python3 scripts/bench_attention.py --shape $S --timer graph --impls flash sdpa_cudnn --out $O/attn_b
cd ../..; export PYTHONPATH=/tmp/site:$PWD VITFLASH_COMMIT=$(cat .gpu/commit)
step memory_ckpt 90 python3 scripts/bench_memory.py --models vit_base_patch16_224 --attention flash --grad-checkpointing off on --out $O/memory
L=$(( 585 - ($(date +%s) - T0) )); step loop_synth $L python3 scripts/bench_loop.py --cases imagenette_synthetic --compile default --loop-graph-step --pipeline gpu --steps 20 --repeats 3 --attention flash naive --out $O/loop
cp /tmp/cache_a/autotune.json $O/autotune_a.json; cp /tmp/cache_b/autotune.json $O/autotune_b.json; pack
