"""ViTModule: attention choice, weight-decay and layer-decay groups, warmup + cosine, mixup."""
from __future__ import annotations

from functools import partial
from types import SimpleNamespace
from unittest import mock

import pytest
import torch

from vitflash.module import ViTModule, resolve_attention


def test_resolve_attention():
    assert resolve_attention("auto", cuda=False) == "sdpa"
    assert resolve_attention("auto", cuda=True) == "flash"
    assert resolve_attention("naive", cuda=False) == "naive"
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        resolve_attention("flash", cuda=False)
    with pytest.raises(ValueError, match="unknown attention 'Flash'"):
        resolve_attention("Flash", cuda=True)


def optimizer_of(module: ViTModule, total_steps: int = 100, max_epochs: int = 10):
    """configure_optimizers() as the Trainer would call it for a run of total_steps."""
    fake = SimpleNamespace(estimated_stepping_batches=total_steps, max_epochs=max_epochs)
    with mock.patch.object(ViTModule, "trainer", new_callable=mock.PropertyMock, return_value=fake):
        out = module.configure_optimizers()
    return out["optimizer"], out["lr_scheduler"]["scheduler"]


def make(**kwargs) -> ViTModule:
    return ViTModule("vit_micro_patch4_32", num_classes=10, attention="sdpa",
                     optimizer=partial(torch.optim.AdamW, lr=1e-3, weight_decay=0.05), **kwargs)


def test_weight_decay_skips_norms_biases_and_embeddings():
    module = make()
    optimizer, _ = optimizer_of(module)
    names = {id(p): n for n, p in module.model.named_parameters()}
    decayed = {names[id(p)] for g in optimizer.param_groups if g["weight_decay"] > 0 for p in g["params"]}
    kept = {names[id(p)] for g in optimizer.param_groups if g["weight_decay"] == 0 for p in g["params"]}
    assert decayed | kept == set(names.values())
    assert {"pos_embed", "cls_token", "norm.weight", "blocks.0.norm1.bias", "head.bias"} <= kept
    assert all(n.endswith("weight") and "norm" not in n for n in decayed)
    assert {"patch_embed.proj.weight", "blocks.3.mlp.fc2.weight", "head.weight"} <= decayed


def test_layer_decay_scales_lr_by_depth():
    module = make(layer_decay=0.5)
    optimizer, scheduler = optimizer_of(module)
    scheduler.step_update(num_updates=50)  # any step after warmup: lr = schedule * lr_scale
    names = {id(p): n for n, p in module.model.named_parameters()}
    scale = {names[id(p)]: g["lr_scale"] for g in optimizer.param_groups for p in g["params"]}
    lr = {names[id(p)]: g["lr"] for g in optimizer.param_groups for p in g["params"]}
    depth = 4  # vit_micro_patch4_32: stem, 4 blocks, then norm and head at full lr
    assert scale["head.weight"] == 1.0
    assert scale["blocks.3.attn.qkv.weight"] == 0.5
    assert scale["blocks.0.attn.qkv.weight"] == 0.5**depth
    assert scale["pos_embed"] == scale["patch_embed.proj.weight"] == 0.5 ** (depth + 1)
    assert lr["blocks.0.mlp.fc1.weight"] == pytest.approx(lr["head.weight"] * 0.5**depth)


def test_warmup_then_cosine_per_step():
    module = make(warmup_epochs=1, warmup_lr=1e-6, min_lr=1e-5)
    optimizer, scheduler = optimizer_of(module, total_steps=100, max_epochs=10)  # warmup: 10 steps

    def lr_at(step: int) -> float:
        scheduler.step_update(num_updates=step)
        return optimizer.param_groups[0]["lr"]

    lrs = [lr_at(step) for step in range(101)]
    assert lrs[0] == pytest.approx(1e-6)
    assert all(a < b for a, b in zip(lrs[:10], lrs[1:11]))  # rising through warmup
    assert lrs[10] == pytest.approx(1e-3)
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:]))  # then only falling
    assert lrs[55] == pytest.approx((1e-3 + 1e-5) / 2, rel=1e-3)  # cosine: halfway at mid-decay
    assert lrs[100] == pytest.approx(1e-5)


def test_mixup_trains_on_soft_targets():
    module = make(mixup_alpha=0.8, cutmix_alpha=1.0, label_smoothing=0.1)
    x, y = torch.randn(8, 3, 32, 32), torch.arange(8) % 10
    with mock.patch.object(module, "log"), mock.patch.object(module, "log_dict"):
        loss = module.training_step((x, y), 0)
    assert loss.ndim == 0 and torch.isfinite(loss)
    assert type(module.train_loss).__name__ == "SoftTargetCrossEntropy"
    assert make(label_smoothing=0.1).train_loss.label_smoothing == 0.1
