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


def check_dropout_p(dropout_p: float) -> float:
    """Return `dropout_p` as a float if it is a number in [0, 1), else raise a TypeError/ValueError
    naming it."""
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float)):
        raise TypeError(f"attention dropout_p={dropout_p!r} is not a number: pass a float in [0, 1), "
                        "e.g. 0.1, or 0 for none")
    if not 0 <= dropout_p < 1:
        raise ValueError(f"attention dropout_p={dropout_p!r} is outside [0, 1): pass e.g. 0.1, or 0 for none")
    return float(dropout_p)


def check_mask_diagonal(mask_diagonal: bool, n: int) -> bool:
    """Return `mask_diagonal` if it is a bool that N = n tokens allow, else raise a
    TypeError/ValueError naming it: masking each token's own key leaves a single token
    nothing to attend to."""
    if not isinstance(mask_diagonal, bool):
        raise TypeError(f"mask_diagonal={mask_diagonal!r} is not True or False")
    if mask_diagonal and n < 2:
        raise ValueError(f"mask_diagonal=True needs N >= 2 tokens (got N = {n}): with its own key "
                         "masked a lone token has nothing to attend to")
    return mask_diagonal


def check_packed(qkv: torch.Tensor) -> None:
    """Raise a ValueError unless qkv has the (B, N, 3, H, D) layout of a fused projection."""
    if qkv.dim() != 5 or qkv.shape[2] != 3:
        raise ValueError(f"qkv must be (B, N, 3, H, D), got shape {tuple(qkv.shape)}")


def check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """Raise a ValueError unless q is (B, N, H, D) and k, v have its shape (a 3-d input would
    otherwise attend over the wrong dimension without a word)."""
    if q.dim() != 4:
        raise ValueError(f"q must be 4-d (B, N, H, D), got shape {tuple(q.shape)}")
    for name, t in (("k", k), ("v", v)):
        if t.shape != q.shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)}, expected {tuple(q.shape)} "
                             "(B, N, H, D) like q")


def naive_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, softmax_scale: float | None = None,
    dropout_p: float = 0.0, mask_diagonal: bool = False,
) -> torch.Tensor:
    """Textbook attention: softmax(q k^T * scale) v, with the N x N scores materialized.

    Args:
        q, k, v: (B, N, H, D) tensors, any strides.
        softmax_scale: defaults to 1/sqrt(D).
        dropout_p: attention dropout on the probabilities (torch.nn.functional.dropout,
            always applied: pass 0 at evaluation).
        mask_diagonal: no query attends to its own key (N >= 2).
    Returns:
        o: (B, N, H, D), contiguous, in the dtype of q.

    It runs in the dtype it is given (fp16/bf16 scores and probabilities are rounded to
    that dtype, as a plain PyTorch implementation would), which makes it the yardstick for
    the low-precision error of the fused kernels.
    """
    check_qkv(q, k, v)
    probs = attention_probs(q, k, softmax_scale, mask_diagonal)  # (B, H, N, N)
    if check_dropout_p(dropout_p) > 0:
        probs = F.dropout(probs, dropout_p)
    o = torch.matmul(probs, v.transpose(1, 2))  # (B, H, N, D)
    return o.transpose(1, 2).contiguous()  # (B, N, H, D)


def attention_probs(q: torch.Tensor, k: torch.Tensor, softmax_scale: float | None = None,
                    mask_diagonal: bool = False) -> torch.Tensor:
    """The attention weights softmax(q k^T * scale) of (B, N, H, D) q and k: (B, H, N, N), a
    row per query, in q's dtype; what `naive_attention` multiplies v by, and what the flash
    kernel never writes out (scripts/attention_maps.py shows them)."""
    scale = check_softmax_scale(softmax_scale) or 1.0 / math.sqrt(q.shape[-1])
    scores = torch.matmul(q.transpose(1, 2), k.transpose(1, 2).transpose(-2, -1)) * scale  # (B, H, N, N)
    if check_mask_diagonal(mask_diagonal, q.shape[1]):
        scores = scores.masked_fill(_eye(q.shape[1], q.device), float("-inf"))
    return torch.softmax(scores, dim=-1)


def sdpa_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, softmax_scale: float | None = None,
    dropout_p: float = 0.0, mask_diagonal: bool = False,
) -> torch.Tensor:
    """PyTorch's fused scaled_dot_product_attention on the (B, N, H, D) layout; dropout_p and
    mask_diagonal as `naive_attention`'s (the mask goes to SDPA as a boolean attn_mask, which
    rules out its FlashAttention backend).

    Returns o: (B, N, H, D), contiguous.
    """
    check_qkv(q, k, v)
    mask = ~_eye(q.shape[1], q.device) if check_mask_diagonal(mask_diagonal, q.shape[1]) else None
    o = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask,
        dropout_p=check_dropout_p(dropout_p), scale=check_softmax_scale(softmax_scale)
    )  # (B, H, N, D)
    return o.transpose(1, 2).contiguous()  # (B, N, H, D)


def _eye(n: int, device: torch.device) -> torch.Tensor:
    """(N, N) bool, True where a query meets its own key."""
    return torch.eye(n, dtype=torch.bool, device=device)
