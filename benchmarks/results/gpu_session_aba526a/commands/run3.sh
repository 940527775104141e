# after the EMA fix: the graph-step tests with the EMA on the GPU, then bench_loop on the best recipe
. .gpu/common.sh; envinfo
step prepare 60 python3 scripts/prepare_data.py --archive .gpu/cifar10-jpeg.tar.gz
step gpu_tests 150 python3 -m pytest -q -m gpu tests/test_module.py -k "graph_step and (checkpoint_resumes or trains_as_the_eager)" tests/test_ema.py -p no:cacheprovider
B="python3 scripts/bench_loop.py --cases cifar10 --data-root /tmp/data --compile default --loop-graph-step --pipeline gpu --steps 40 --repeats 3 --attention flash"
step recipe 150 $B --override experiment=cifar10_vit_h12_gap_mimetic_10min --profile $O/profile --out $O/recipe
grep -h "^| cifar" $O/recipe/loop_*.md
nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv >> $O/env.log; pack
