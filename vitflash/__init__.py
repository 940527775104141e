"""vitflash: Vision Transformers trained with a Triton FlashAttention."""
import torch
from omegaconf import OmegaConf

# `${if_cuda:a,b}` in the configs: a where a CUDA GPU is visible, else b. Registered on import of
# the package, so every config group (trainer precision, data.pipeline) can use it.
if not OmegaConf.has_resolver("if_cuda"):
    OmegaConf.register_new_resolver("if_cuda", lambda a, b: a if torch.cuda.is_available() else b)

from vitflash.model import VisionTransformer, build_model, list_models
from vitflash.pretrained import create_model, export_timm

__version__ = "0.1.0"

__all__ = ["VisionTransformer", "build_model", "create_model", "export_timm", "list_models"]
