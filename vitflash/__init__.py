"""vitflash: Vision Transformers trained with a Triton FlashAttention."""
from vitflash.model import VisionTransformer, build_model, list_models
from vitflash.pretrained import create_model, export_timm

__version__ = "0.1.0"

__all__ = ["VisionTransformer", "build_model", "create_model", "export_timm", "list_models"]
