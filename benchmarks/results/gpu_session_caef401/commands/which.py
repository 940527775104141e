# which vitflash this PYTHONPATH imports, and its tuning cache version
import vitflash
from vitflash.ops import launch
print(vitflash.__file__, "CACHE_VERSION", launch.CACHE_VERSION)
