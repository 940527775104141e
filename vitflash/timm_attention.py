"""vitflash's attention inside timm's own models: any timm model built of timm's ViT `Attention`
(ViT, DeiT, DINOv2, CLIP and SigLIP image towers, register-token ViTs, ...) runs its attention
through one of vitflash's paths, with its weights, modules and state dict unchanged.

    model = timm.create_model("vit_small_patch14_dinov2", pretrained=True)
    vitflash.patch_timm_attention(model)             # flash on the GPU in bf16/fp16, else sdpa
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = model(images)
    vitflash.patch_timm_attention(model, None)       # timm's own attention again

The patched forward is timm's with the attention op swapped: the fused qkv projection viewed as
(B, N, 3, H, D) goes to `vitflash.ops.attention_qkvpacked` as it is (q/k norms, where the model
has them, are applied first and the three stacked again: one copy), then timm's output norm,
gate, projection and dropout. A call with an attention mask or is_causal, which vitflash's
ops do not take, runs timm's own forward.
"""
from __future__ import annotations

import types

import torch
import torch.nn as nn
from timm.models.vision_transformer import Attention as TimmAttention

from vitflash.ops import attention_qkvpacked, check_attention_impl

# the attention path a patched module runs, kept on the module
_IMPL = "_vitflash_attention"


def patch_timm_attention(model: nn.Module, impl: str | None = "auto") -> int:
    """Route every timm ViT `Attention` module of `model` through vitflash's attention path
    `impl` ("flash", "naive" or "sdpa"; "auto": flash for CUDA tensors in bf16/fp16, else
    sdpa, decided at each call), or back to timm's own with None. Returns how many modules
    changed; raises ValueError when there are none (another architecture) or when a module's
    head dim is one `impl` cannot run."""
    modules = [m for m in model.modules() if isinstance(m, TimmAttention)]
    if not modules:
        raise ValueError(f"{type(model).__name__} has no timm ViT Attention module to patch: "
                         "patch_timm_attention takes timm models built of timm.models.vision_transformer.Attention")
    for module in modules:
        if impl is not None:
            check_attention_impl("flash" if impl == "auto" else impl, module.head_dim)
    for module in modules:
        if impl is None:
            module.__dict__.pop("forward", None)
            module.__dict__.pop(_IMPL, None)
        else:
            setattr(module, _IMPL, impl)
            module.forward = types.MethodType(_forward, module)
    return len(modules)


def _forward(self: TimmAttention, x: torch.Tensor, attn_mask: torch.Tensor | None = None,
             is_causal: bool = False) -> torch.Tensor:
    if attn_mask is not None or is_causal:
        extra = {"is_causal": True} if is_causal else {}
        return type(self).forward(self, x, attn_mask=attn_mask, **extra)
    B, N, _ = x.shape
    gate = getattr(self, "gate", None)  # (newer timm) a sigmoid gate on the attention output
    gate = gate(x).sigmoid() if gate is not None else None
    qkv = self.qkv(x).view(B, N, 3, self.num_heads, self.head_dim)
    if not (isinstance(self.q_norm, nn.Identity) and isinstance(self.k_norm, nn.Identity)):
        q, k, v = qkv.unbind(2)  # (a norm under autocast returns fp32: back to v's dtype)
        qkv = torch.stack((self.q_norm(q).to(v.dtype), self.k_norm(k).to(v.dtype), v), dim=2)
    drop = self.attn_drop.p if self.training else 0.0
    impl = getattr(self, _IMPL)
    if impl == "auto":
        impl = "flash" if qkv.is_cuda and qkv.dtype in (torch.float16, torch.bfloat16) else "sdpa"
    o = attention_qkvpacked(qkv, impl, softmax_scale=self.scale, dropout_p=drop)
    x = getattr(self, "norm", nn.Identity())(o.reshape(B, N, -1))
    if gate is not None:
        x = x * gate
    return self.proj_drop(self.proj(x))
