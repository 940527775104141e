# call 2 (the same machine): Imagenette train shard 2 and half of val
. .gpu/common.sh; unpack .inetB/*.tar.gz
