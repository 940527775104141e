# the training loop of the best recipe's model at b512, with the class token and with mean pooling
# + mimetic init, flash, the whole step as one CUDA graph around the compiled model
. .gpu/common.sh; envinfo
step prepare 40 python3 scripts/prepare_data.py --archive .gpu/cifar10-jpeg.tar.gz
C="python3 scripts/bench_loop.py --cases cifar10 --data-root <tmp>/data --compile default --loop-graph-step --pipeline gpu --steps 40 --repeats 3 --attention flash --override data.batch_size=512 --override model.model_name=vit_tiny_h12_patch4_32 --override model.shifted_patches=true --override model.locality_attention=true"
step loop_avg_mimetic $(( 170 - ($(date +%s) - T0) )) $C --override model.global_pool=avg --override model.attn_init=mimetic --out $OUT/loop_avg_mimetic
step loop_token $(( 178 - ($(date +%s) - T0) )) $C --out $OUT/loop_token
