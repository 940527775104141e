"""Attention ops: vitflash's Triton FlashAttention and the paths it is measured against.

Every op takes and returns the (B, N, H, D) layout of a fused qkv projection. Nothing
outside this package imports Triton.
"""
from __future__ import annotations

import torch

from vitflash.ops.flash import check_head_dim, flash_attention, flash_attention_qkvpacked
from vitflash.ops.reference import attention_probs, check_packed, naive_attention, sdpa_attention

ATTENTION_IMPLS = ("flash", "naive", "sdpa")

__all__ = [
    "ATTENTION_IMPLS",
    "attention_probs",
    "attention_qkvpacked",
    "check_attention_impl",
    "check_head_dim",
    "flash_attention",
    "flash_attention_qkvpacked",
    "naive_attention",
    "sdpa_attention",
]


def check_attention_impl(impl: str, head_dim: int | None = None) -> str:
    """Return `impl` if it names an attention path that can run heads of `head_dim` (checked
    for "flash" when given), else raise a ValueError that lists the choices. The one place
    that validates an attention path."""
    if impl not in ATTENTION_IMPLS:
        raise ValueError(
            f"unknown attention path {impl!r}: choose one of {', '.join(ATTENTION_IMPLS)}"
        )
    if impl == "flash" and head_dim is not None:
        check_head_dim(head_dim)
    return impl


def attention_qkvpacked(
    qkv: torch.Tensor, impl: str, softmax_scale: float | None = None, dropout_p: float = 0.0,
    mask_diagonal: bool = False,
) -> torch.Tensor:
    """The one attention dispatch of the project.

    Args:
        qkv: (B, N, 3, H, D), e.g. `qkv_linear(x).view(B, N, 3, H, D)`.
        impl: "flash", "naive" or "sdpa".
        dropout_p: attention dropout, applied whenever > 0 (pass 0 at evaluation).
        mask_diagonal: no query attends to its own key (locality self-attention's masking).
    Returns:
        o: (B, N, H, D), contiguous, so `o.reshape(B, N, H * D)` is free.
    """
    if impl == "flash":
        return flash_attention_qkvpacked(qkv, softmax_scale, dropout_p, mask_diagonal=mask_diagonal)
    check_packed(qkv)
    q, k, v = qkv.unbind(2)  # each (B, N, H, D), views
    if impl == "naive":
        return naive_attention(q, k, v, softmax_scale, dropout_p, mask_diagonal)
    check_attention_impl(impl)
    return sdpa_attention(q, k, v, softmax_scale, dropout_p, mask_diagonal)
