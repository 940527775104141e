"""Placeholder until the Triton kernel lands (same signatures)."""
from __future__ import annotations

import torch


def flash_attention(q, k, v, softmax_scale=None) -> torch.Tensor:
    raise NotImplementedError("flash attention kernel not written yet")


def flash_attention_qkvpacked(qkv, softmax_scale=None) -> torch.Tensor:
    raise NotImplementedError("flash attention kernel not written yet")
