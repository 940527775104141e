"""ViTModule: attention choice, weight-decay and layer-decay groups, warmup + cosine, mixup, the\nlean step (no host reads), torch.compile and fused AdamW."""
from __future__ import annotations

import gc
import json
import logging
import os
import sys
from contextlib import nullcontext
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import hydra
import lightning as L
import pytest
import torch
from hydra.utils import instantiate
from lightning.pytorch.loggers import CSVLogger, Logger
from torch.distributed.fsdp import FullyShardedDataParallel
from torch.utils.data import DataLoader, TensorDataset

from test_configs import compose_cfg

from vitflash.module import ViTModule, eval_views, load_checkpoint, resolve_attention, resolve_compile


def test_resolve_attention():
    assert resolve_attention("auto", cuda=False) == "sdpa"
    assert resolve_attention("auto", cuda=True) == "flash"
    assert resolve_attention("naive", cuda=False) == "naive"
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        resolve_attention("flash", cuda=False)
    with pytest.raises(ValueError, match="unknown attention 'Flash'"):
        resolve_attention("Flash", cuda=True)


def optimizer_of(module: ViTModule, total_steps: int = 100, max_epochs: int = 10,
                 precision: str = "bf16-mixed", model: torch.nn.Module | None = None,
                 batches: int | None = None, accumulate: int = 1):
    """configure_optimizers() as the Trainer would call it for a run of total_steps, with
    `batches` training batches an epoch (default: total_steps / max_epochs optimizer steps an
    epoch) and gradients accumulated over `accumulate`; `model`: the trainer's (wrapped)
    model, default `module`."""
    fake = SimpleNamespace(estimated_stepping_batches=total_steps, max_epochs=max_epochs,
                           num_training_batches=batches or total_steps * accumulate // max_epochs,
                           accumulate_grad_batches=accumulate,
                           precision=precision, model=module if model is None else model)
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


def named_groups(module: ViTModule, optimizer) -> list[tuple[float, list[str]]]:
    """(weight decay, parameter names) of each group; names as in the unwrapped model."""
    names = {id(p): n.replace("_fsdp_wrapped_module.", "") for n, p in module.model.named_parameters()}
    return [(g["weight_decay"], sorted(names[id(p)] for p in g["params"])) for g in optimizer.param_groups]


def _write_groups_under_fsdp(rank: int, out: Path, kwargs: dict) -> None:
    """The module wrapped as trainer=fsdp wraps it (torch's FSDP with configs/trainer/fsdp.yaml's
    settings; Lightning's strategy refuses the CPU, torch's FSDP does not), then its optimizer's
    groups by parameter name, written by rank 0."""
    module = make(**kwargs)
    strategy = instantiate(compose_cfg(out.parent, ["trainer=fsdp"]).trainer.strategy, _convert_="all")
    wrapped = FullyShardedDataParallel(module, device_id=torch.device("cpu"), sharding_strategy=strategy.sharding_strategy,
                                       mixed_precision=strategy.mixed_precision, **strategy.kwargs)
    assert all(p.ndim == 1 for p in module.model.parameters())  # flat shards, as configure_optimizers sees them
    optimizer, _ = optimizer_of(module, precision="32-true", model=wrapped)
    if rank == 0:
        out.write_text(json.dumps(named_groups(module, optimizer)))


def _groups_under_fsdp(rank: int, out: Path, kwargs: dict) -> None:
    """Rank `rank` of 2 on the CPU. The ranks meet through a file beside `out`, not a TCP port
    that another process could take first.

    Teardown, in this order, because a rank aborted now and then (SIGABRT, "terminate called
    without an active exception"): first when the other rank tore the group down under its
    feet (hence the barrier), later at exit, after the work was done. For the second: the
    wrapped module is dropped and collected while the group lives (FSDP's hooks hold it in
    reference cycles, which kept the gloo group alive into interpreter finalization), and the
    rank leaves without finalization. The result is on disk and the parent checks it; an
    exception before that still reaches the parent as a failure."""
    torch.distributed.init_process_group("gloo", init_method=f"file://{out.parent / 'rendezvous'}", rank=rank,
                                         world_size=2)
    try:
        _write_groups_under_fsdp(rank, out, kwargs)
        gc.collect()
        torch.distributed.barrier()
    finally:
        torch.distributed.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


@pytest.mark.parametrize("kwargs", [{}, {"shifted_patches": True, "locality_attention": True}],
                         ids=["plain", "shifted_locality"])
def test_fsdp_shards_keep_their_weight_decay_groups(tmp_path, kwargs):
    """Norms, biases, tokens and position embedding stay out of weight decay under FSDP, whose
    shards are all 1-D when the optimizer is made; with Lee et al.'s two changes too, whose
    learned softmax scales (one per layer, FSDP takes no 0-d parameter) stay out of it."""
    module = make(**kwargs)
    expected = named_groups(module, optimizer_of(module, precision="32-true")[0])
    torch.multiprocessing.spawn(_groups_under_fsdp, args=(tmp_path / "groups.json", kwargs), nprocs=2)
    assert [tuple(g) for g in json.loads((tmp_path / "groups.json").read_text())] == expected
    assert {wd for wd, _ in expected} == {0.05, 0.0}
    if kwargs:
        kept = {n for wd, names in expected if wd == 0.0 for n in names}
        assert {"blocks.0.attn.log_scale", "patch_embed.norm.weight"} <= kept


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


@pytest.mark.parametrize("total, epochs, batches, accumulate", [(50, 10, 10, 1), (50, -1, 10, 1), (50, 10, 20, 2)],
                         ids=["max_steps before max_epochs", "max_epochs=-1", "accumulated"])
def test_warmup_and_cooldown_count_the_steps_of_an_epoch(total, epochs, batches, accumulate):
    """The warmup and cool-down epochs are the optimizer steps of that many epochs, whatever
    ends the run: 10 steps an epoch here, also where trainer.max_steps (50) ends it before
    max_epochs or max_epochs is -1, and with batches accumulated in twos."""
    module = make(warmup_epochs=1, warmup_lr=1e-6, min_lr=1e-5, cooldown_epochs=1)
    optimizer, scheduler = optimizer_of(module, total_steps=total, max_epochs=epochs, batches=batches,
                                        accumulate=accumulate)
    lrs = []
    for step in range(total + 1):
        scheduler.step_update(num_updates=step)
        lrs.append(optimizer.param_groups[0]["lr"])
    assert lrs[9] < lrs[10] == pytest.approx(1e-3)  # 10 steps of warmup
    assert lrs[39] > 1e-5 and all(lr == pytest.approx(1e-5) for lr in lrs[40:])  # the last 10 at min_lr


def test_cooldown_epochs_hold_min_lr_at_the_end():
    """cooldown_epochs=2 of 10: the cosine ends at step 80 of 100 and the last 20 steps stay at
    min_lr (timm's --cooldown-epochs); a cool-down that leaves no cosine is refused."""
    module = make(warmup_epochs=1, warmup_lr=1e-6, min_lr=1e-5, cooldown_epochs=2)
    optimizer, scheduler = optimizer_of(module, total_steps=100, max_epochs=10)

    def lr_at(step: int) -> float:
        scheduler.step_update(num_updates=step)
        return optimizer.param_groups[0]["lr"]

    lrs = [lr_at(step) for step in range(101)]
    assert lrs[10] == pytest.approx(1e-3) and lrs[45] == pytest.approx((1e-3 + 1e-5) / 2, rel=1e-3)
    assert lrs[79] > 1e-5 and all(lr == pytest.approx(1e-5) for lr in lrs[80:])
    with pytest.raises(ValueError, match="model.cooldown_epochs=9.5 leaves the cosine no steps"):
        optimizer_of(make(warmup_epochs=1, cooldown_epochs=9.5), total_steps=100, max_epochs=10)
    for bad in (-1, "2", True):
        with pytest.raises(ValueError, match="model.cooldown_epochs="):
            make(cooldown_epochs=bad)


def test_mixup_trains_on_soft_targets():
    module = make(mixup_alpha=0.8, cutmix_alpha=1.0, label_smoothing=0.1)
    x, y = torch.randn(8, 3, 32, 32), torch.arange(8) % 10
    with mock.patch.object(module, "log"), mock.patch.object(module, "log_dict"):
        loss = module.training_step((x, y), 0)
    assert loss.ndim == 0 and torch.isfinite(loss)
    assert type(module.train_loss).__name__ == "SoftTargetCrossEntropy"
    assert make(label_smoothing=0.1).train_loss.label_smoothing == 0.1


def test_mixup_stops_at_mixup_off_epoch(tmp_path):
    """With mixup_off_epoch=2 of 3 epochs, the first two epochs train on mixed images and the
    third on whole ones (with the same smoothed soft targets): one-hot rows then, at every step."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(32, 3, 32, 32, generator=g), torch.arange(32) % 10
    seen = []

    class Record(L.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            images, labels = batch
            mixed, target = pl_module.mixup(images.clone(), labels)
            seen.append((trainer.current_epoch, pl_module.mixup.mixup_enabled, torch.equal(mixed, images),
                         bool((target.max(1).values > 0.5).all())))

    trainer = L.Trainer(accelerator="cpu", max_epochs=3, callbacks=[Record()], logger=False, limit_val_batches=0,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        default_root_dir=tmp_path)
    module = make(mixup_alpha=0.8, cutmix_alpha=1.0, mixup_prob=1.0, label_smoothing=0.1, mixup_off_epoch=2)
    trainer.fit(module, DataLoader(TensorDataset(x, y), batch_size=8))
    assert [(e, on) for e, on, _, _ in seen] == [(e, e < 2) for e in range(3) for _ in range(4)]
    assert not any(same for e, _, same, _ in seen if e < 2)  # mixed: every image changed
    assert all(same and hard for e, _, same, hard in seen if e == 2)  # whole images, hard (smoothed) targets


@pytest.mark.parametrize("bad", [-1, 1.5, True, "10"])
def test_mixup_off_epoch_refuses_a_bad_value(bad):
    with pytest.raises(ValueError, match=r"model.mixup_off_epoch=.*whole number of epochs"):
        make(mixup_alpha=0.8, mixup_off_epoch=bad)


def test_eval_flip_scores_each_image_and_its_mirror_image():
    torch.manual_seed(0)
    plain, flip = make().eval(), make(eval_flip=True).eval()
    flip.model.load_state_dict(plain.model.state_dict())
    x = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        direct, mirrored = plain.model(x), plain.model(x.flip(-1))
        assert torch.equal(plain.eval_logits(x), direct)
        torch.testing.assert_close(flip.eval_logits(x), (direct + mirrored) / 2)
        # the mirror image of a mirror image: the same two forwards, the same score
        torch.testing.assert_close(flip.eval_logits(x.flip(-1)), flip.eval_logits(x))
    assert not torch.allclose(direct, mirrored)  # a ViT is not mirror-symmetric: the check can fail


@pytest.mark.parametrize("kwargs, message", [
    (dict(optimizer=partial(torch.optim.AdamW, lr=-1)), r"model.optimizer.lr=-1 is not a positive number: pass e.g."),
    (dict(optimizer=partial(torch.optim.AdamW, lr=0.0)), r"model.optimizer.lr=0.0 is not a positive number"),
    (dict(optimizer=partial(torch.optim.AdamW, lr="1e-3")), r"model.optimizer.lr='1e-3' is not a positive number"),
    (dict(optimizer=partial(torch.optim.SGD, lr=0.1, weight_decay=-0.1)),
     r"model.optimizer.weight_decay=-0.1 is not a number >= 0"),
    (dict(warmup_epochs=-1), r"model.warmup_epochs=-1 is not a number >= 0: pass e.g. 5"),
    (dict(min_lr=float("nan")), r"model.min_lr=nan is not a number >= 0"),
    (dict(layer_decay=0), r"model.layer_decay=0 is not null or a number in \(0, 1\]"),
    (dict(layer_decay=1.5), r"model.layer_decay=1.5 is not null or a number in \(0, 1\]"),
    (dict(label_smoothing=1.0), r"model.label_smoothing=1.0 is not a number in \[0, 1\)"),
    (dict(mixup_prob=2), r"model.mixup_prob=2 is not a number in \[0, 1\]"),
    (dict(cutmix_alpha=True), r"model.cutmix_alpha=True is not a number >= 0"),
    (dict(global_pool="mean"), r"model.global_pool='mean': choose token \(the class token\), avg"),
    (dict(attn_init="xavier"), r"model.attn_init='xavier': choose one of default, mimetic"),
    (dict(attn_init="mimetic", pretrained="augreg_in21k"),
     r"model.attn_init=mimetic draws the weights of a model trained from scratch, but "
     r"model.pretrained='augreg_in21k' loads them: set model.attn_init=default to fine-tune"),
])
def test_bad_hyperparameters_are_refused_before_building(kwargs, message):
    """Values that the optimizer, scheduler or Mixup would refuse only once the data is set up
    (a negative LR: "Invalid learning rate"), or take silently (a layer decay of 0), stop the
    module's constructor with the config key named, before the model is built."""
    kwargs.setdefault("optimizer", partial(torch.optim.AdamW, lr=1e-3, weight_decay=0.05))
    with mock.patch("vitflash.create_model") as create:
        with pytest.raises(ValueError, match=message):
            ViTModule("vit_micro_patch4_32", num_classes=10, attention="sdpa", **kwargs)
    create.assert_not_called()


def test_global_pool_and_attn_init_reach_the_model(tmp_path):
    """global_pool=avg builds no class token (64 tokens for a 32 px image) and pools the mean;
    weights saved from it load back with their pooling, and global_pool is refused beside
    pretrained weights. attn_init=mimetic gives the value-projection product its negative
    diagonal."""
    module = make(global_pool="avg", attn_init="mimetic")
    model = module.model
    assert model.cls_token is None and model.global_pool == "avg" and model.pos_embed.shape[1] == 64
    attn = model.blocks[0].attn
    vo = attn.qkv.weight[2 * 128:].T @ attn.proj.weight.T
    assert vo.diag().mean().item() == pytest.approx(-0.4, abs=0.03)
    assert module(torch.randn(2, 3, 32, 32)).shape == (2, 10)
    assert make(global_pool=None).model.cls_token is not None
    path = tmp_path / "w.pth"
    torch.save(module.model.state_dict(), path)
    tuned = make(pretrained=str(path)).model  # the file's pooling: no class token, the mean
    assert tuned.cls_token is None and tuned.global_pool == "avg"
    with mock.patch("vitflash.create_model") as create:
        with pytest.raises(ValueError, match=r"model.global_pool=token builds a model from scratch, but "
                                             r"model.pretrained='.*w.pth' brings its own pooling"):
            make(global_pool="token", pretrained=str(path))
    create.assert_not_called()


def test_edge_hyperparameters_are_accepted():
    """The ends of each range that mean something: no warmup, an LR floor of 0, no layer decay
    (null) or a layer decay of 1, every batch mixed, SGD without weight decay."""
    module = make(warmup_epochs=0, warmup_lr=0.0, min_lr=0.0, layer_decay=1.0, mixup_alpha=0.8,
                  mixup_prob=1.0, mixup_switch_prob=0.0, label_smoothing=0.0)
    assert module.mixup is not None
    ViTModule("vit_micro_patch4_32", num_classes=10, attention="sdpa", layer_decay=None,
              optimizer=partial(torch.optim.SGD, lr=0.03, momentum=0.9, weight_decay=0.0))


def test_eval_shift_scores_each_image_moved_four_ways():
    """eval_shift=s: the mean of the logits of the image and of its copies moved s pixels left,
    right, up and down with the border reflected (built here with numpy's reflect padding);
    with eval_flip, of those five and their mirror images."""
    import numpy as np

    torch.manual_seed(0)
    plain = make().eval()
    shifted, both = make(eval_shift=2).eval(), make(eval_shift=2, eval_flip=True).eval()
    for module in (shifted, both):
        module.model.load_state_dict(plain.model.state_dict())
    x = torch.randn(3, 3, 32, 32)
    padded = torch.from_numpy(np.pad(x.numpy(), ((0, 0), (0, 0), (2, 2), (2, 2)), mode="reflect"))
    # moved right, left, down, up: row/column offsets into the padded image
    views = [x] + [padded[..., r:r + 32, c:c + 32] for r, c in ((2, 0), (2, 4), (0, 2), (4, 2))]
    assert torch.equal(views[1][..., 2:], x[..., :-2])  # content moved 2 px right, reflected border on the left
    with torch.no_grad():
        logits = [plain.model(v) for v in views]
        mirrored = [plain.model(v.flip(-1)) for v in views]
        torch.testing.assert_close(shifted.eval_logits(x), torch.stack(logits).mean(0))
        torch.testing.assert_close(both.eval_logits(x), torch.stack(logits + mirrored).mean(0))
        assert torch.equal(plain.eval_logits(x), logits[0])  # eval_shift=0 (the default): the image alone
    assert not torch.allclose(logits[0], logits[1])  # a ViT is not translation-invariant: the check can fail
    assert len(eval_views(x, 2, True)) == 10 and len(eval_views(x, 0, True)) == 2


@pytest.mark.parametrize("bad, message", [
    (-1, r"model.eval_shift=-1: give a whole number of pixels >= 0"),
    (True, r"model.eval_shift=True: give a whole number"),
    (1.5, r"model.eval_shift=1.5: give a whole number"),
    (32, r"model.eval_shift=32 does not fit the model's 32px images.*at most 31"),
])
def test_eval_shift_refuses_a_bad_value(bad, message):
    with pytest.raises(ValueError, match=message):
        make(eval_shift=bad)


@pytest.mark.parametrize("bad", ["yes", 1, None])
def test_eval_flip_refuses_a_bad_value(bad):
    with pytest.raises(ValueError, match=r"model.eval_flip=.* is not true or false"):
        make(eval_flip=bad)


# --------------------------------------------------------------------------------------
# The lean step: compile, fused AdamW, no host reads


def test_resolve_compile():
    assert resolve_compile("auto", cuda=True) == "reduce-overhead"
    assert resolve_compile("auto", cuda=False) is None
    for off in ("false", False, None):
        assert resolve_compile(off, cuda=True) is None
    assert resolve_compile("default", cuda=False) == "default"
    assert resolve_compile("reduce-overhead", cuda=True) == "reduce-overhead"
    # CUDA graphs and gradient accumulation do not mix
    assert resolve_compile("auto", cuda=True, accumulate_grad_batches=4) == "default"
    with pytest.raises(ValueError, match=r"reduce-overhead .*accumulate_grad_batches=4.*model.compile=default"):
        resolve_compile("reduce-overhead", cuda=True, accumulate_grad_batches=4)
    # FSDP gathers weights into new memory every step: no CUDA graphs
    assert resolve_compile("auto", cuda=True, sharded=True) is None
    assert resolve_compile("default", cuda=True, sharded=True) == "default"
    with pytest.raises(ValueError, match=r"reduce-overhead .*trainer=fsdp.*model.compile=false"):
        resolve_compile("reduce-overhead", cuda=True, sharded=True)
    for bad in ("max-autotune", "Default", True):
        with pytest.raises(ValueError, match=r"unknown compile .*: choose one of auto, false, default, reduce-overhead"):
            resolve_compile(bad, cuda=True)


def test_bad_compile_value_is_refused_before_building(tmp_path):
    with mock.patch("vitflash.create_model") as create:
        with pytest.raises(ValueError, match=r"unknown compile 'fast': choose one of auto, false, default, reduce-overhead"):
            make(compile="fast")
    create.assert_not_called()
    cfg = compose_cfg(tmp_path, ["model.compile=fast"])
    with pytest.raises(hydra.errors.InstantiationException, match=r"unknown compile 'fast': choose one of auto"):
        instantiate(cfg.model, _convert_="all")
    assert compose_cfg(tmp_path, []).model.compile == "auto"


def test_adamw_is_fused_on_cuda_only():
    def fused(module, on, precision="bf16-mixed"):
        with mock.patch.object(ViTModule, "device", new_callable=mock.PropertyMock, return_value=torch.device(on)):
            return optimizer_of(module, precision=precision)[0].defaults.get("fused")

    assert fused(make(), "cuda") is True
    assert not fused(make(), "cpu")
    assert not fused(make(), "cuda", "16-mixed")  # fp16's scaler: clipping needs unscaled grads
    explicit = ViTModule("vit_micro_patch4_32", num_classes=10, attention="sdpa",
                         optimizer=partial(torch.optim.AdamW, lr=1e-3, fused=False))
    assert fused(explicit, "cuda") is False  # the config's choice stands
    sgd = ViTModule("vit_micro_patch4_32", num_classes=10, attention="sdpa", optimizer=partial(torch.optim.SGD, lr=0.1))
    assert fused(sgd, "cuda") is None


def test_fused_optimizer_clips_gradients_itself():
    """Lightning refuses to clip for a fused optimizer under mixed precision; without a
    gradient scaler the module clips the true gradients itself, to the norm asked for."""
    module = make()
    for p in module.parameters():
        p.grad = torch.full_like(p, 10.0)
    opt = torch.optim.AdamW(module.parameters(), lr=1e-3)
    opt.defaults["fused"] = True  # as configure_optimizers makes it on CUDA
    trainer = SimpleNamespace(model=module)  # not sharded
    with mock.patch.object(ViTModule, "trainer", new_callable=mock.PropertyMock, return_value=trainer):
        module.configure_gradient_clipping(opt, gradient_clip_val=1.0, gradient_clip_algorithm="norm")
    total = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in module.parameters()]))
    assert total == pytest.approx(1.0, rel=1e-4)


def test_fused_clipping_lists_the_parameters_once():
    """The same clipped gradients, bit for bit, as torch's clipping over module.parameters()
    (the same order, so the same sum), without walking the module tree at every step."""
    module = make()
    g = torch.Generator().manual_seed(0)
    grads = [torch.randn(p.shape, generator=g) for p in module.parameters()]
    ref_params = [torch.nn.Parameter(torch.zeros_like(t)) for t in grads]
    for p, t in zip(ref_params, grads):
        p.grad = t.clone()
    torch.nn.utils.clip_grad_norm_(ref_params, 1.0)
    reference = [p.grad for p in ref_params]
    opt = torch.optim.AdamW(module.parameters(), lr=1e-3)
    opt.defaults["fused"] = True
    trainer = SimpleNamespace(model=module)
    with mock.patch.object(ViTModule, "trainer", new_callable=mock.PropertyMock, return_value=trainer):
        for step in range(2):
            for p, t in zip(module.parameters(), grads):
                p.grad = t.clone()
            walk = mock.patch.object(module, "parameters", side_effect=AssertionError("walked")) if step else nullcontext()
            with walk:
                module.configure_gradient_clipping(opt, gradient_clip_val=1.0, gradient_clip_algorithm="norm")
            assert all(torch.equal(p.grad, r) for p, r in zip(module.parameters(), reference))


@pytest.mark.parametrize("fused", [True, False])
def test_fsdp_clips_by_the_norm_of_all_shards(fused):
    """Under FSDP a process's gradients are a shard: the norm is FSDP's clip_grad_norm_ (over
    every shard), not torch's over this process's, and not Lightning's FSDP clipping, which
    refuses the norm."""
    module = make()
    for p in module.parameters():
        p.grad = torch.full_like(p, 10.0)
    opt = torch.optim.AdamW(module.parameters(), lr=1e-3)
    opt.defaults["fused"] = fused
    sharded = mock.MagicMock(spec=FullyShardedDataParallel)  # what trainer.model is under FSDPStrategy
    trainer = SimpleNamespace(model=sharded)
    with mock.patch.object(ViTModule, "trainer", new_callable=mock.PropertyMock, return_value=trainer):
        module.configure_gradient_clipping(opt, gradient_clip_val=0.5, gradient_clip_algorithm="norm")
    sharded.clip_grad_norm_.assert_called_once_with(0.5)
    assert all(torch.all(p.grad == 10.0) for p in module.parameters())  # left to FSDP


def loaders(n_train: int = 256, batch: int = 16) -> tuple[DataLoader, DataLoader]:
    """Synthetic (B, 3, 32, 32) images with 10 labels; the train loader drops no batch."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(n_train, 3, 32, 32, generator=g), torch.arange(n_train) % 10
    train = DataLoader(TensorDataset(x, y), batch_size=batch, shuffle=True, drop_last=True,
                       generator=torch.Generator().manual_seed(1))
    return train, DataLoader(TensorDataset(x[:batch], y[:batch]), batch_size=batch)


class HostReadTrap(L.Callback):
    """Armed from the start of a training step to the start of the next, except on the steps
    that log (global step a multiple of `every`), where the logger and progress bar may read."""

    def __init__(self, every: int):
        self.every, self.armed, self.armed_steps = every, False, 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.armed = (trainer.global_step + 1) % self.every != 0
        self.armed_steps += self.armed

    def on_train_epoch_end(self, trainer, pl_module):
        self.armed = False

    def patch(self, monkeypatch) -> None:
        """Make every tensor-to-Python read fail while the trap is armed."""
        for name in ("item", "tolist", "__bool__", "__float__", "__int__"):
            def trapped(tensor, *args, _orig=getattr(torch.Tensor, name), _name=name, **kwargs):
                if self.armed:
                    raise AssertionError(f"Tensor.{_name}() in a training step that does not log")
                return _orig(tensor, *args, **kwargs)
            monkeypatch.setattr(torch.Tensor, name, trapped)


def test_training_steps_read_nothing_on_the_host(tmp_path, monkeypatch):
    # The configured callbacks (checkpoints, LR monitor, throughput, progress bar) and CSV
    # logger, the CIFAR recipe's mixup/cutmix; any tensor-to-Python read in a step that does
    # not log would be a host sync on the GPU.
    cfg = compose_cfg(tmp_path, ["data=synthetic", "trainer=cpu", "trainer.log_every_n_steps=4"])
    trap = HostReadTrap(every=4)
    callbacks = [trap, *(instantiate(c, _convert_="all") for c in cfg.callbacks.values())]
    trainer = L.Trainer(accelerator="cpu", max_steps=12, log_every_n_steps=4, callbacks=callbacks,
                        logger=CSVLogger(tmp_path), limit_val_batches=1, num_sanity_val_steps=0,
                        gradient_clip_val=1.0, default_root_dir=tmp_path)
    # fused: PyTorch's CPU single-tensor AdamW reads its step count with .item(), CUDA's does not
    module = ViTModule("vit_micro_patch4_32", num_classes=10, attention="sdpa", mixup_alpha=0.8, cutmix_alpha=1.0,
                       optimizer=partial(torch.optim.AdamW, lr=1e-3, weight_decay=0.05, fused=True))
    trap.patch(monkeypatch)
    trainer.fit(module, *loaders())
    assert trap.armed_steps == 9  # steps 1-3, 5-7, 9-11 of 12
    assert trainer.global_step == 12
    logged = trainer.logged_metrics
    assert {"train/loss_step", "train/device/samples_per_sec"} <= set(logged)
    # the throughput monitor reads the clock on logging steps only, yet counts every batch
    assert (logged["train/batches"], logged["train/samples"]) == (12, 12 * 16)
    assert torch.isfinite(torch.as_tensor(logged["train/loss_step"]))


class RecordingLogger(Logger):
    """Keeps what Lightning hands the logger: (step, {name: value})."""

    def __init__(self):
        super().__init__()
        self.rows: list[tuple[int, dict]] = []

    name, version = "recording", 0

    def log_metrics(self, metrics, step=None):
        self.rows.append((step, dict(metrics)))

    def log_hyperparams(self, params, *args, **kwargs):
        pass


def test_logged_losses_are_the_steps_and_their_epoch_mean(tmp_path):
    """train/loss_step is written on the logging steps with that step's loss, and
    train/loss_epoch is the mean of the epoch's step losses weighted by batch size (the last
    batch here is smaller), as Lightning's on_step/on_epoch logging gave them."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(88, 3, 32, 32, generator=g), torch.arange(88) % 10
    train = DataLoader(TensorDataset(x, y), batch_size=16)  # 5 batches of 16, then one of 8
    steps = []

    class Record(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            steps.append((trainer.current_epoch, trainer.global_step - 1, outputs["loss"].item(), len(batch[0])))

    logger = RecordingLogger()
    trainer = L.Trainer(accelerator="cpu", max_epochs=2, log_every_n_steps=4, callbacks=[Record()], logger=logger,
                        limit_val_batches=0, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=tmp_path)
    trainer.fit(make(mixup_alpha=0.8, cutmix_alpha=1.0), train)
    assert len(steps) == 12
    logged_steps = {step: m["train/loss_step"] for step, m in logger.rows if "train/loss_step" in m}
    assert list(logged_steps) == [3, 7, 11]  # every 4th step, across the epoch boundary
    for step, value in logged_steps.items():
        assert value == pytest.approx(steps[step][2], rel=1e-6)
    epochs = [(m["epoch"], m["train/loss_epoch"]) for _, m in logger.rows if "train/loss_epoch" in m]
    assert [e for e, _ in epochs] == [0, 1]
    for epoch, value in epochs:
        losses = [(loss, n) for e, _, loss, n in steps if e == epoch]
        assert [n for _, n in losses] == [16] * 5 + [8]
        assert value == pytest.approx(sum(loss * n for loss, n in losses) / 88, rel=1e-6)


def fit_losses(compile_mode, attention: str, tmp_path: Path, steps: int = 3, **kwargs):
    """Per-step training losses of `steps` steps from one seed, and the fitted module and trainer."""
    L.seed_everything(0)
    module = ViTModule("vit_micro_patch4_32", num_classes=10, attention=attention, compile=compile_mode, **kwargs)
    losses = []

    class Record(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            losses.append(outputs["loss"].detach().clone())

    trainer = L.Trainer(accelerator="cpu", max_steps=steps, callbacks=[Record()], logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, limit_val_batches=1,
                        num_sanity_val_steps=0, default_root_dir=tmp_path)
    trainer.fit(module, *loaders())
    return torch.stack(losses), module, trainer


@pytest.mark.slow  # inductor compiles the forward and backward graphs on the CPU: ~20-60 s
def test_grad_checkpointing_compiled_trains_as_the_plain_eager_model(tmp_path):
    """model.grad_checkpointing under torch.compile: inductor traces each block's rerun into the
    backward graph, and the losses of three steps are the plain eager model's."""
    torch._dynamo.reset()
    eager, _, _ = fit_losses(False, "sdpa", tmp_path)
    torch._dynamo.utils.counters.clear()
    compiled, module, _ = fit_losses("default", "sdpa", tmp_path, grad_checkpointing=True)
    assert module.compile_mode == "default" and module.model.grad_checkpointing
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1
    torch.testing.assert_close(compiled, eager, rtol=1e-4, atol=1e-4)


@pytest.mark.slow  # inductor compiles the forward and backward graphs on the CPU: ~20-60 s
@pytest.mark.parametrize("attention", ["sdpa", "naive"])
def test_compiled_fit_matches_eager_and_its_checkpoint_loads_uncompiled(tmp_path, attention):
    torch._dynamo.reset()
    eager, _, _ = fit_losses(False, attention, tmp_path)
    torch._dynamo.utils.counters.clear()
    compiled, module, trainer = fit_losses("default", attention, tmp_path)
    assert module.compile_mode == "default"
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1  # it did compile
    torch.testing.assert_close(compiled, eager, rtol=1e-4, atol=1e-4)

    # validation, with a partial last batch (40 = 16 + 16 + 8), runs eagerly: no graph is added
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    x, y = loaders()[0].dataset.tensors
    (metrics,) = trainer.validate(module, DataLoader(TensorDataset(x[:40], y[:40]), batch_size=16), verbose=False)
    assert 0.0 <= metrics["val/top1"] <= 1.0
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == graphs

    path = tmp_path / "compiled.ckpt"
    trainer.save_checkpoint(path)
    loaded = load_checkpoint(path)  # hparams say compile=default: applied only when a fit starts
    assert loaded.compile_mode is None
    assert set(loaded.state_dict()) == set(module.state_dict())
    assert not any("_orig_mod" in k for k in module.state_dict())
    x = torch.randn(4, 3, 32, 32)
    module.eval(), loaded.eval()
    with torch.no_grad(), torch.compiler.set_stance("force_eager"):
        torch.testing.assert_close(loaded(x), module(x))


class SyncTrap(HostReadTrap):
    """HostReadTrap on the GPU: CUDA's sync debug mode raises on any synchronizing call
    (.item(), a blocking copy to the host, torch.unique, ...) while armed. Armed only after the
    first logging step, once compiling and CUDA-graph recording are done."""

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.armed = trainer.global_step > self.every and (trainer.global_step + 1) % self.every != 0
        self.armed_steps += self.armed
        torch.cuda.set_sync_debug_mode("error" if self.armed else "default")

    def on_train_epoch_end(self, trainer, pl_module):
        self.armed = False
        torch.cuda.set_sync_debug_mode("default")

    def on_validation_start(self, trainer, pl_module):
        self.graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]

    def on_validation_end(self, trainer, pl_module):
        self.graphs_in_validation = torch._dynamo.utils.counters["stats"]["unique_graphs"] - self.graphs


@pytest.mark.gpu
@pytest.mark.parametrize("attention", ["flash", "naive", "sdpa"])
def test_cuda_graphs_fit_without_host_syncs(tmp_path, attention):
    # compile=auto on CUDA without the graph step is reduce-overhead (CUDA graphs); bf16 autocast;
    # mixup/cutmix; the configured callbacks and logger. Validation, with a partial last batch,
    # compiles nothing. (graph_step=false: the default, auto, would capture the whole step instead.)
    cfg = compose_cfg(tmp_path, ["data=synthetic", "trainer.log_every_n_steps=4"])
    trap = SyncTrap(every=4)
    callbacks = [trap, *(instantiate(c, _convert_="all") for c in cfg.callbacks.values())]
    trainer = L.Trainer(accelerator="gpu", devices=1, precision="bf16-mixed", max_steps=16, log_every_n_steps=4,
                        callbacks=callbacks, logger=CSVLogger(tmp_path), val_check_interval=8,
                        num_sanity_val_steps=0, gradient_clip_val=1.0, default_root_dir=tmp_path)
    module = ViTModule("vit_micro_patch4_32", num_classes=10, attention=attention, mixup_alpha=0.8, cutmix_alpha=1.0,
                       graph_step=False)
    train, _ = loaders(n_train=512)
    train = DataLoader(train.dataset, batch_size=16, shuffle=True, drop_last=True, pin_memory=True)
    val = DataLoader(TensorDataset(*(t[:40] for t in train.dataset.tensors)), batch_size=16, pin_memory=True)
    torch._dynamo.reset()
    trainer.fit(module, train, val)
    assert module.compile_mode == "reduce-overhead"
    assert trainer.optimizers[0].defaults["fused"] is True
    assert trap.armed_steps == 8  # steps 6-8, 10-12, 14-16 less the validation's
    assert trap.graphs_in_validation == 0
    assert 0.0 <= float(trainer.callback_metrics["val/top1"]) <= 1.0
    assert torch.isfinite(torch.as_tensor(trainer.logged_metrics["train/loss_step"]))


# --------------------------------------------------------------------------------------
# model.graph_step: the whole step as one CUDA graph


def test_graph_step_refuses_what_it_cannot_capture():
    from vitflash.module import check_graph_step

    good = dict(compile_mode="auto", cuda=True, precision="bf16-mixed", world_size=1, accumulate_grad_batches=1,
                optimizer=torch.optim.AdamW)
    check_graph_step(**good)  # the supported case passes
    check_graph_step(**{**good, "compile_mode": False, "precision": "32-true", "optimizer": torch.optim.Adam})
    check_graph_step(**{**good, "compile_mode": "default"})  # the compiled model inside the captured step
    cases = {
        "cuda": (False, "needs a CUDA GPU"),
        "compile_mode": ("reduce-overhead", "cannot hold model.compile=reduce-overhead's CUDA graphs"),
        "precision": ("16-mixed", "not trainer.precision=16-mixed"),
        "world_size": (2, "runs on one device \\(2 processes here"),
        "sharded": (True, "cannot run under trainer=fsdp"),
        "ddp": (True, "cannot run under trainer=ddp, even with one device"),
        "accumulate_grad_batches": (4, "not every 4 \\(trainer.accumulate_grad_batches\\)"),
        "optimizer": (torch.optim.SGD, "not SGD: use optim=adamw"),
        "grad_checkpointing": (True, "does not capture model.grad_checkpointing=true"),
    }
    for key, (value, message) in cases.items():
        with pytest.raises((ValueError, RuntimeError), match=message) as error:
            check_graph_step(**{**good, key: value})
        assert "model.graph_step=false" in str(error.value)
    with pytest.raises(ValueError, match="model.graph_step='yes' is not true, false or auto"):
        make(graph_step="yes")


def test_grad_checkpointing_reaches_the_model_and_refuses_what_it_cannot_join():
    from vitflash.module import check_grad_checkpointing

    assert make(grad_checkpointing=True).model.grad_checkpointing and not make().model.grad_checkpointing
    with pytest.raises(ValueError, match="model.grad_checkpointing='yes' is not true or false"):
        make(grad_checkpointing="yes")
    check_grad_checkpointing(True), check_grad_checkpointing(False, sharded=True)  # both run
    with pytest.raises(ValueError, match="not supported under trainer=fsdp: set model.grad_checkpointing=false"):
        check_grad_checkpointing(True, sharded=True)


def test_graph_step_auto_trains_the_eager_step_where_it_cannot_capture(tmp_path, caplog):
    """model.graph_step=auto on a machine without CUDA: the usual step, and a log line saying why."""
    if torch.cuda.is_available():
        pytest.skip("checks auto's fallback on a machine without CUDA")
    trainer = L.Trainer(accelerator="cpu", max_steps=2, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path)
    module = make(graph_step="auto", compile="auto")
    with caplog.at_level(logging.INFO, logger="vitflash.module"):
        trainer.fit(module, *loaders())
    assert trainer.global_step == 2 and module.graph_step is False and module._whole_step is None
    assert module.compile_mode is None  # compile=auto: eager on the CPU, as without the graph step
    assert "model.graph_step=auto -> false" in caplog.text and "needs a CUDA GPU" in caplog.text


def test_graph_step_auto_is_the_default_and_settles_on_the_trainer(caplog):
    """The default, auto, turns the captured step on for a one-device trainer that can run it
    and off, saying why, under DDP (even with one process), fp16 or compile=reduce-overhead."""
    from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy

    def settle(strategy, precision="bf16-mixed", **kw):
        module = make(**kw)
        fake = SimpleNamespace(strategy=strategy, precision=precision, world_size=1, accumulate_grad_batches=1)
        with mock.patch.object(ViTModule, "trainer", new_callable=mock.PropertyMock, return_value=fake):
            return module._settle_graph_step(on_cuda=True)

    assert make().hparams.graph_step == "auto"
    one = mock.MagicMock(spec=SingleDeviceStrategy)
    assert settle(one) is True
    with caplog.at_level(logging.INFO, logger="vitflash.module"):
        assert settle(mock.MagicMock(spec=DDPStrategy)) is False
        assert settle(one, precision="16-mixed") is False
        assert settle(one, compile="reduce-overhead") is False
    reasons = [r.getMessage() for r in caplog.records if "model.graph_step=auto -> false" in r.getMessage()]
    assert len(reasons) == 3
    assert "trainer=ddp" in reasons[0] and "16-mixed" in reasons[1] and "reduce-overhead" in reasons[2]
    assert settle(one, graph_step=False) is False


def test_graph_step_without_cuda_stops_before_any_work(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("checks the refusal on a machine without CUDA")
    import vitflash

    trainer = L.Trainer(accelerator="cpu", max_steps=2, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path)
    with pytest.raises(vitflash.SetupError, match="model.graph_step=true captures the training step as a CUDA graph"):
        trainer.fit(make(graph_step=True), *loaders())
    assert trainer.global_step == 0


def _fit_on_gpu(tmp_path, graph_step: bool | str, ema: float | None = None, compile=False):
    """8 steps on the GPU from one seed, with mixup, clipping and the step's LR schedule; no
    stochastic layers, so the captured and the eager step draw nothing that differs."""
    L.seed_everything(0)
    lrs = []

    class LR(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            lrs.append([float(g["lr"]) for g in trainer.optimizers[0].param_groups])

    trainer = L.Trainer(accelerator="gpu", devices=1, precision="bf16-mixed", max_steps=8, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        gradient_clip_val=1.0, callbacks=[LR()], limit_val_batches=0, default_root_dir=tmp_path)
    module = ViTModule("vit_micro_patch4_32", num_classes=10, attention="flash", mixup_alpha=0.8, cutmix_alpha=1.0,
                       compile=compile, graph_step=graph_step, warmup_epochs=0.5, ema_decay=ema)
    trainer.fit(module, loaders()[0])
    return module, trainer, lrs


@pytest.mark.gpu
def test_graph_step_trains_as_the_eager_step(tmp_path):
    eager, _, eager_lrs = _fit_on_gpu(tmp_path, graph_step=False)
    graphed, trainer, graphed_lrs = _fit_on_gpu(tmp_path, graph_step=True)
    assert graphed._whole_step is not None and graphed._whole_step.graph is not None  # captured, and replayed
    assert trainer.global_step == 8
    # the schedule reached the graph's LR tensors (float32 there)
    assert sum(graphed_lrs, []) == pytest.approx(sum(eager_lrs, []), rel=1e-6)
    assert len(set(sum(eager_lrs, []))) > 2  # the warmup moved the LR
    assert trainer.optimizers[0].defaults["capturable"] is True
    for (name, a), b in zip(graphed.model.state_dict().items(), eager.model.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=2e-3, atol=2e-4, msg=name)


@pytest.mark.gpu
def test_graph_step_with_the_compiled_model_trains_as_the_eager_step(tmp_path):
    eager, _, _ = _fit_on_gpu(tmp_path, graph_step=False)
    graphed, trainer, _ = _fit_on_gpu(tmp_path, graph_step=True, compile="default")
    assert graphed.compile_mode == "default" and graphed._whole_step.graph is not None
    assert trainer.global_step == 8
    # inductor fuses and reorders the bf16 arithmetic, so the weights agree less closely
    # than the eager model's captured step does, but far closer than the steps moved them.
    # The key bias is left out: softmax ignores a shift shared by a row's scores, so its
    # gradient is zero up to rounding, and AdamW scales that rounding noise to full-size steps
    # that differ between any two orders of the arithmetic.
    L.seed_everything(0)
    start = ViTModule("vit_micro_patch4_32", num_classes=10, attention="flash").model.state_dict()
    moved, off = 0.0, {}
    for (name, a), b in zip(graphed.model.state_dict().items(), eager.model.state_dict().values()):
        a, b, s = a.float().cpu(), b.float().cpu(), start[name].float()
        if name.endswith("attn.qkv.bias"):  # the query and value thirds
            a, b, s = (torch.cat(t.chunk(3)[::2]) for t in (a, b, s))
        if not torch.allclose(a, b, rtol=2e-2, atol=2e-3):
            off[name] = (a - b).abs().max().item()
        moved = max(moved, (a - s).abs().max().item())
    assert not off, f"weights that differ from the eager step's (largest difference): {off}"
    assert moved > 2e-3  # the steps moved the weights by more than the tolerance


@pytest.mark.gpu
@pytest.mark.parametrize("compile", [False, "default"])
def test_graph_step_draws_new_random_masks_at_every_replay(compile):
    """Stochastic depth and dropout inside the captured step, the model eager or compiled (whose
    random ops inductor generates from its own seeds): each replay must draw new masks, not
    replay the captured ones. With the learning rate 0 the weights stay put, so two replays on
    one batch differ only by their masks."""
    from vitflash.graph_step import WARMUP_STEPS, WholeStepGraph

    L.seed_everything(0)
    module = ViTModule("vit_micro_patch4_32", num_classes=10, attention="flash", drop_path_rate=0.5,
                       attn_drop_rate=0.2, compile=False).cuda().train()
    model = module.model
    if compile:
        model.compile(mode=compile)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.0, weight_decay=0.0, fused=True, capturable=True)
    whole = WholeStepGraph(model, torch.nn.functional.cross_entropy, optimizer, clip=None, precision="bf16-mixed")
    x, y = torch.randn(32, 3, 32, 32, device="cuda"), torch.randint(0, 10, (32,), device="cuda")
    for _ in range(WARMUP_STEPS + 1):  # the last call captures the graph and replays it
        whole.step(x, y)
    losses = [whole.step(x, y)[1].item() for _ in range(4)]
    assert whole.graph is not None
    assert len(set(losses)) == len(losses), f"replays drew the same masks: losses {losses}"


def test_capturing_orders_the_first_replay_after_the_captures_own_kernels(monkeypatch):
    """When a capture begins, PyTorch resets the graph-side seed and offset of the graph's
    generators by kernels on the capture stream, outside the capture; a replay sets them by
    kernels on its own stream. `capturing` (both captures of vitflash go through it) captures on
    a side stream of its own in thread_local mode and makes the current stream wait for it after
    the capture, so that a replay's kernels run after the capture's. (On an H100 shared with
    other processes, without the wait, the first batch's augmentation came out different.) Here
    with stand-ins for CUDA's streams and graph: the order of the calls."""
    from vitflash import graph_step, gpu_data

    calls = []

    class Stream:
        def __init__(self, device=None, name="side"):
            self.name = name
            calls.append(("new stream", device))

        def wait_stream(self, other):
            calls.append((self.name, "waits for", other.name))

    class Graph:
        def __init__(self, graph, stream=None, capture_error_mode="global"):
            calls.append(("capture on", stream.name, capture_error_mode))

        def __enter__(self):
            calls.append("begin")

        def __exit__(self, *exc):
            calls.append("end")

    current = Stream(name="current")
    monkeypatch.setattr(torch.cuda, "Stream", Stream)
    monkeypatch.setattr(torch.cuda, "graph", Graph)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: current)
    calls.clear()
    with graph_step.capturing(object(), torch.device("cuda", 1)):
        calls.append("the captured work")
    assert calls == [("new stream", torch.device("cuda", 1)), ("capture on", "side", "thread_local"), "begin",
                     "the captured work", "end", ("current", "waits for", "side")]
    assert gpu_data.capturing is graph_step.capturing
    # a capture that fails: its error reaches the caller (who then runs the work eagerly on the
    # current stream), the current stream still waits for the capture's stream first, and the
    # device's random generator is taken out of capture mode
    monkeypatch.setattr(graph_step, "recover_from_failed_capture", lambda device: calls.append(("recover", device)))
    calls.clear()
    with pytest.raises(RuntimeError, match="an op that cannot be captured"):
        with graph_step.capturing(object(), torch.device("cuda", 1)):
            raise RuntimeError("an op that cannot be captured")
    assert calls[-3:] == ["end", ("current", "waits for", "side"), ("recover", torch.device("cuda", 1))]


def test_a_loaded_optimizer_state_is_made_capturable_for_the_graph_step():
    """A run without the graph step saves capturable=False; resumed with it, the loaded groups
    must say capturable again, or the optimizer refuses the capture."""
    from vitflash.graph_step import make_capturable

    model = torch.nn.Linear(4, 2)
    eager = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(3, 4)).sum().backward()
    eager.step()
    resumed = torch.optim.AdamW(model.parameters(), lr=1e-3, capturable=True)
    resumed.load_state_dict(eager.state_dict())
    assert resumed.param_groups[0]["capturable"] is False  # what the checkpoint said
    make_capturable(resumed)
    assert all(g["capturable"] is True for g in resumed.param_groups)
    assert all(resumed.state[p]["step"].item() == 1 for p in model.parameters())  # the state kept


@pytest.mark.gpu
def test_graph_step_resumes_a_checkpoint_of_an_eager_run(tmp_path):
    _, trainer, _ = _fit_on_gpu(tmp_path, graph_step=False)
    path = tmp_path / "eager.ckpt"
    trainer.save_checkpoint(path)
    resumed = L.Trainer(accelerator="gpu", devices=1, precision="bf16-mixed", max_steps=14, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        limit_val_batches=0, default_root_dir=tmp_path)
    again = ViTModule("vit_micro_patch4_32", num_classes=10, attention="flash", compile=False, graph_step=True)
    resumed.fit(again, loaders()[0], ckpt_path=path)
    assert resumed.global_step == 14 and again._whole_step.graph is not None  # captured after the resume


@pytest.mark.gpu
def test_graph_step_auto_captures_the_compiled_model_on_one_gpu(tmp_path):
    """auto on one GPU in bf16 with AdamW: the whole step captured, and compile=auto puts the
    compiled model (no CUDA graphs of its own) inside it."""
    module, trainer, _ = _fit_on_gpu(tmp_path, graph_step="auto", compile="auto")
    assert module.graph_step is True and module.compile_mode == "default"
    assert module._whole_step.graph is not None and trainer.global_step == 8


@pytest.mark.gpu
def test_graph_step_checkpoint_resumes_and_loads(tmp_path):
    module, trainer, _ = _fit_on_gpu(tmp_path, graph_step=True, ema=0.99)
    path = tmp_path / "graph.ckpt"
    trainer.save_checkpoint(path)
    loaded = load_checkpoint(path, attention="sdpa")  # the EMA's weights, on the CPU
    x = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(loaded.eval()(x), module.ema.module.set_attention("sdpa").cpu().eval()(x))
    # resumed without the graph: the optimizer's tensor learning rates load into an eager fused AdamW
    resumed = L.Trainer(accelerator="gpu", devices=1, precision="bf16-mixed", max_steps=12, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        limit_val_batches=0, default_root_dir=tmp_path)
    again = ViTModule("vit_micro_patch4_32", num_classes=10, attention="flash", compile=False, ema_decay=0.99,
                      graph_step=False)
    resumed.fit(again, loaders()[0], ckpt_path=path)
    assert resumed.global_step == 12


@pytest.mark.gpu
def test_graph_step_says_what_to_change_when_the_capture_fails():
    """A step that cannot be captured (here a loss that reads a value on the host) stops with a
    message naming the settings to change, after the eager warm-up steps ran."""
    from vitflash.graph_step import WARMUP_STEPS, WholeStepGraph

    model = torch.nn.Linear(8, 4).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True, capturable=True)

    def host_reading_loss(logits, target):
        return torch.nn.functional.cross_entropy(logits, target) * float(logits.abs().sum().item() > -1)

    whole = WholeStepGraph(model, host_reading_loss, optimizer, clip=None, precision="32-true")
    x, y = torch.randn(16, 8, device="cuda"), torch.randint(0, 4, (16,), device="cuda")
    for _ in range(WARMUP_STEPS):
        whole.step(x, y)
    state = torch.cuda.get_rng_state()
    with pytest.raises(RuntimeError, match="(?s)could not capture the training step.*model.graph_step=false"):
        whole.step(x, y)
    torch.cuda.synchronize()
    # the failed capture leaves the device's random generator usable, where it was
    drawn = torch.randn(8, device="cuda")  # raised "Offset increment outside graph capture ..."
    torch.cuda.set_rng_state(state)
    assert torch.equal(drawn, torch.randn(8, device="cuda"))
