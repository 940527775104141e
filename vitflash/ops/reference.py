"""Reference attention paths that vitflash's FlashAttention is compared against.

Both take the layout of a fused qkv projection, (B, N, H, D), so that every path in the
project is fed the same views of the same tensors.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def check_softmax_scale(softmax_scale: float | None) -> float | None:
    """Return `softmax_scale` if it is None or a finite number > 0, else raise a TypeError/ValueError
    naming it (a string would otherwise fail deep inside a matmul or a kernel launch)."""
    if softmax_scale is None:
        return None
    if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, (int, float)):
        raise TypeError(f"softmax_scale={softmax_scale!r} is not a number: pass a float (e.g. "
                        "1 / math.sqrt(head_dim)) or None for that default")
    if not (math.isfinite(softmax_scale) and softmax_scale > 0):
        raise ValueError(f"softmax_scale={softmax_scale!r} is not a finite number > 0: pass e.g. "
                         "1 / math.sqrt(head_dim), or None for that default")
    return softmax_scale


def naive_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, softmax_scale: float | None = None
) -> torch.Tensor:
    """Textbook attention: softmax(q k^T * scale) v, with the N x N scores materialized.

    Args:
        q, k, v: (B, N, H, D) tensors, any strides.
        softmax_scale: defaults to 1/sqrt(D).
    Returns:
        o: (B, N, H, D), contiguous, in the dtype of q.

    It runs in the dtype it is given (fp16/bf16 scores and probabilities are rounded to
    that dtype, as a plain PyTorch implementation would), which makes it the yardstick for
    the low-precision error of the fused kernels.
    """
    scale = check_softmax_scale(softmax_scale) or 1.0 / math.sqrt(q.shape[-1])
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))  # (B, H, N, D)
    scores = torch.matmul(qt, kt.transpose(-2, -1)) * scale  # (B, H, N, N)
    probs = torch.softmax(scores, dim=-1)  # (B, H, N, N)
    o = torch.matmul(probs, vt)  # (B, H, N, D)
    return o.transpose(1, 2).contiguous()  # (B, N, H, D)


def sdpa_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, softmax_scale: float | None = None
) -> torch.Tensor:
    """PyTorch's fused scaled_dot_product_attention on the (B, N, H, D) layout.

    Returns o: (B, N, H, D), contiguous.
    """
    o = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), scale=check_softmax_scale(softmax_scale)
    )  # (B, H, N, D)
    return o.transpose(1, 2).contiguous()  # (B, N, H, D)
