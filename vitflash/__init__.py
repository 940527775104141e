"""vitflash: Vision Transformers trained with a Triton FlashAttention."""
import torch
from omegaconf import OmegaConf

# `${if_cuda:a,b}` in the configs: a where a CUDA GPU is visible, else b. Registered on import of
# the package, so every config group (trainer precision, data.pipeline) can use it.
if not OmegaConf.has_resolver("if_cuda"):
    OmegaConf.register_new_resolver("if_cuda", lambda a, b: a if torch.cuda.is_available() else b)


class SetupError(RuntimeError):
    """A run cannot start as configured, for a reason outside the config's values (no GPU for
    attention=flash, pretrained weights out of reach). scripts/ print it as a short message,
    like a bad value; any other RuntimeError is a bug and keeps its traceback."""


from vitflash.model import VisionTransformer, build_model, list_models  # noqa: E402
from vitflash.pretrained import create_model, export_timm  # noqa: E402
from vitflash.timm_attention import patch_timm_attention  # noqa: E402

__version__ = "0.1.0"

__all__ = ["SetupError", "VisionTransformer", "build_model", "create_model", "export_timm", "list_models",
           "patch_timm_attention"]
