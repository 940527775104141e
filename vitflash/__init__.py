"""vitflash: Vision Transformers trained with a Triton FlashAttention."""
__version__ = "0.1.0"
