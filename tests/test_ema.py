"""The EMA of the weights (model.ema_decay, timm's ModelEmaV3): its values against the formula,
once per optimizer step; training unchanged by it; validation, test, eval.py and the timm export
on its weights; resume with it, into it and out of it; bad values and FSDP refused."""
from __future__ import annotations

import logging
from functools import partial
from types import SimpleNamespace
from unittest import mock

import hydra
import lightning as L
import pytest
import safetensors.torch
import timm
import torch
import torch.nn.functional as F
from hydra.utils import instantiate
from lightning.pytorch.strategies import FSDPStrategy
from torch.utils.data import DataLoader, TensorDataset

from test_configs import compose_cfg
from test_faults import TINY
from test_module import HostReadTrap, SyncTrap, loaders, optimizer_of
from test_train import evaluate, train

from vitflash.module import ViTModule, load_checkpoint
from vitflash.pretrained import export_timm, read_checkpoint


def make(**kwargs) -> ViTModule:
    """vit_micro_patch4_32 for 10 classes, initialized from seed 0."""
    kwargs = {"compile": False, **kwargs}
    torch.manual_seed(0)
    return ViTModule("vit_micro_patch4_32", num_classes=10, attention="sdpa",
                     optimizer=partial(torch.optim.AdamW, lr=1e-2, weight_decay=0.05), **kwargs)


def fit(module: ViTModule, tmp_path, batches: int = 8, accumulate: int = 2, **trainer_kwargs):
    """Fit `module` for `batches` batches of 16, accumulating gradients over `accumulate` of them;
    returns the trainer, the per-batch losses, and the network's weights after each optimizer
    step (float32 copies, by name)."""
    losses, after_step = [], []

    class Record(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            losses.append(outputs["loss"].detach().clone())
            if trainer.global_step > len(after_step):  # an optimizer step ended this batch
                after_step.append({k: v.detach().clone() for k, v in pl_module.model.state_dict().items()})

    L.seed_everything(0)
    trainer = L.Trainer(accelerator="cpu", max_steps=batches // accumulate, accumulate_grad_batches=accumulate,
                        callbacks=[Record()], logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, limit_val_batches=1, num_sanity_val_steps=0,
                        gradient_clip_val=1.0, default_root_dir=tmp_path, **trainer_kwargs)
    trainer.fit(module, *loaders())
    return trainer, torch.stack(losses), after_step


def timm_decay(decay: float, step: int, warmup: bool) -> float:
    """ModelEmaV3's decay at optimizer step `step` (1 = the first), written out from its
    docstring: 0 at the first step; with warmup 1 - (1 + n) ** (-2/3) for n = step - 1,
    capped at `decay`."""
    n = step - 1
    if n <= 0:
        return 0.0
    return min(decay, 1 - (1 + n) ** (-2 / 3)) if warmup else decay


@pytest.mark.parametrize("warmup", [False, True])
def test_ema_is_the_average_of_the_weights_after_each_optimizer_step(tmp_path, warmup):
    """8 batches accumulated in pairs: 4 optimizer steps, 4 EMA updates (one torch._foreach_lerp_
    each), e_1 = w_1 and e_k = d_k e_(k-1) + (1 - d_k) w_k, computed here from the recorded weights."""
    module = make(ema_decay=0.6, ema_warmup=warmup)
    assert not list(module.model.buffers())  # ViTModule's exclude_buffers=True would copy them, not average
    ema_tensors = {t.data_ptr() for t in module.ema.module.state_dict().values()}
    with mock.patch("torch._foreach_lerp_", wraps=torch._foreach_lerp_) as lerp:
        _, _, after_step = fit(module, tmp_path)
    names = list(after_step[0])
    # (AdamW's lerps are CPU AdamW's own, on its moments)
    ema_calls = [call.args[0] for call in lerp.call_args_list if call.args[0][0].data_ptr() in ema_tensors]
    assert len(after_step) == 4 and len(ema_calls) == 4
    assert all({t.data_ptr() for t in tensors} == ema_tensors for tensors in ema_calls)  # every tensor in the one op
    expected = {k: v.double() for k, v in after_step[0].items()}
    for step, weights in enumerate(after_step[1:], start=2):
        d = timm_decay(0.6, step, warmup)
        expected = {k: d * expected[k] + (1 - d) * weights[k].double() for k in names}
    ema = module.ema.module.state_dict()
    for k in names:
        torch.testing.assert_close(ema[k].double(), expected[k], rtol=1e-5, atol=1e-6)
    # the average is not the last weights (it would be, were the decay 0 or the updates per batch)
    assert not torch.allclose(ema["head.weight"], after_step[-1]["head.weight"], atol=1e-4)


def test_ema_update_is_model_ema_v3s_update_bit_for_bit():
    """The module's update (tensor lists made once) gives what ModelEmaV3.update gives, at the
    first step (a copy), during the warm-up and at the cap, and follows weights changed in place."""
    ours, theirs = make(ema_decay=0.9, ema_warmup=True), make(ema_decay=0.9, ema_warmup=True)
    torch.manual_seed(1)
    for step in (1, 2, 5, 400):
        with torch.no_grad():
            for a, b in zip(ours.model.parameters(), theirs.model.parameters()):
                a.add_(torch.randn_like(a))
                b.copy_(a)
        ours._update_ema(step)
        theirs.ema.update(theirs.model, step=step)
        for (name, a), b in zip(ours.ema.module.state_dict().items(), theirs.ema.module.state_dict().values()):
            assert torch.equal(a, b), (step, name)
    assert not torch.equal(ours.ema.module.head.weight, ours.model.head.weight)  # an average, not a copy
    assert ours._ema_tensors is not None and theirs._ema_tensors is None
    # outside autograd: an EMA that recorded the lerp would chain every step's graph onto its
    # weights (and fail the capture of a whole-step CUDA graph)
    assert all(p.is_leaf and p.grad_fn is None for p in ours.ema.module.parameters())


def test_ema_is_not_trained_clipped_or_compiled(tmp_path):
    module = make(ema_decay=0.9)
    optimizer, _ = optimizer_of(module, precision="32-true")
    in_optimizer = {id(p) for g in optimizer.param_groups for p in g["params"]}
    ema_params = list(module.ema.parameters())
    assert ema_params and not in_optimizer & {id(p) for p in ema_params}
    assert in_optimizer == {id(p) for p in module.model.parameters()}
    assert not any(p.requires_grad for p in ema_params)
    # the fused path's clipping lists the trained parameters only
    for p in module.model.parameters():
        p.grad = torch.ones_like(p)
    optimizer.defaults["fused"] = True
    with mock.patch.object(ViTModule, "trainer", new_callable=mock.PropertyMock,
                           return_value=SimpleNamespace(model=module)):
        module.configure_gradient_clipping(optimizer, gradient_clip_val=1.0, gradient_clip_algorithm="norm")
    assert [id(p) for p in module._clip_params] == [id(p) for p in module.model.parameters()]
    # setup compiles self.model in place (nn.Module.compile), never the EMA's copy
    compiled = make(ema_decay=0.9, compile="default")
    fake = SimpleNamespace(strategy=SimpleNamespace(root_device=torch.device("cpu")), precision="32-true",
                           accumulate_grad_batches=1, world_size=1)
    with mock.patch.object(ViTModule, "trainer", new_callable=mock.PropertyMock, return_value=fake):
        compiled.setup("fit")
    assert compiled.compile_mode == "default"
    assert compiled.model._compiled_call_impl is not None and compiled.ema.module._compiled_call_impl is None


def test_ema_changes_nothing_in_training_and_off_leaves_no_trace(tmp_path):
    """Training with the EMA has the same losses and weights, bit for bit, as without; without
    it the module holds no EMA (its state_dict and parameters are the network's alone)."""
    _, losses_off, steps_off = fit(make(), tmp_path)
    on = make(ema_decay=0.9)
    _, losses_on, steps_on = fit(on, tmp_path)
    assert torch.equal(losses_on, losses_off)
    assert all(torch.equal(a[k], b[k]) for a, b in zip(steps_on, steps_off) for k in a)
    off = make()
    assert off.ema is None
    assert set(off.state_dict()) == {f"model.{k}" for k in off.model.state_dict()}
    assert set(on.state_dict()) == {f"{p}.{k}" for p in ("model", "ema.module") for k in on.model.state_dict()}


def test_validation_evaluates_the_ema_and_says_so(tmp_path, caplog):
    module = make(ema_decay=0.5)
    with caplog.at_level(logging.INFO, logger="vitflash.module"):
        trainer, _, _ = fit(module, tmp_path)
        x, y = loaders()[1].dataset.tensors
        (metrics,) = trainer.validate(module, loaders()[1], verbose=False)
    assert caplog.text.count("validation and test evaluate the EMA of the weights") == 1  # fit, then validate
    module.eval()
    with torch.no_grad():
        ema_loss = F.cross_entropy(module.ema.module(x), y).item()
        raw_loss = F.cross_entropy(module.model(x), y).item()
    assert abs(ema_loss - raw_loss) > 1e-3  # the two weights are told apart
    assert metrics["val/loss"] == pytest.approx(ema_loss, rel=1e-5)
    (test,) = trainer.test(module, loaders()[1], verbose=False)
    assert test["test/loss"] == pytest.approx(ema_loss, rel=1e-5)


def test_training_steps_with_ema_read_nothing_on_the_host(tmp_path, monkeypatch):
    trap = HostReadTrap(every=4)
    trainer = L.Trainer(accelerator="cpu", max_steps=8, log_every_n_steps=4, callbacks=[trap], logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, limit_val_batches=0,
                        gradient_clip_val=1.0, default_root_dir=tmp_path)
    # fused: PyTorch's CPU single-tensor AdamW reads its step count with .item()
    module = ViTModule("vit_micro_patch4_32", num_classes=10, attention="sdpa", ema_decay=0.9, ema_warmup=True,
                       optimizer=partial(torch.optim.AdamW, lr=1e-3, fused=True))
    trap.patch(monkeypatch)
    with mock.patch.object(module, "_update_ema", wraps=module._update_ema) as update:
        trainer.fit(module, *loaders())  # (no validation: limit_val_batches=0)
    assert trap.armed_steps == 6 and update.call_count == 8


@pytest.mark.gpu
def test_ema_under_cuda_graphs_syncs_nothing_and_stays_eager(tmp_path):
    """On the GPU as trainer=gpu trains (bf16 autocast, CUDA graphs, fused AdamW, clipping): the
    EMA update makes no host sync, the EMA copy stays fp32 and uncompiled (validation compiles
    nothing), and it is the average of the weights after each optimizer step."""
    trap = SyncTrap(every=4)
    after_step, ema_kinds = [], set()

    class Record(L.Callback):  # device-side copies: no sync
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if trainer.global_step > len(after_step):
                after_step.append({k: v.detach().clone() for k, v in pl_module.model.state_dict().items()})

        def on_train_end(self, trainer, pl_module):  # before Lightning moves the module to the CPU
            ema_kinds.update((v.device.type, v.dtype) for v in pl_module.ema.module.state_dict().values())

    trainer = L.Trainer(accelerator="gpu", devices=1, precision="bf16-mixed", max_steps=16, log_every_n_steps=4,
                        callbacks=[trap, Record()], logger=False, enable_checkpointing=False, val_check_interval=8,
                        num_sanity_val_steps=0, gradient_clip_val=1.0, default_root_dir=tmp_path)
    module = ViTModule("vit_micro_patch4_32", num_classes=10, attention="flash", ema_decay=0.8, ema_warmup=True,
                       graph_step=False)  # the compiled step with CUDA graphs (auto would capture the whole step)
    train, _ = loaders(n_train=512)
    train = DataLoader(train.dataset, batch_size=16, shuffle=True, drop_last=True, pin_memory=True)
    val = DataLoader(TensorDataset(*(t[:40] for t in train.dataset.tensors)), batch_size=16, pin_memory=True)
    torch._dynamo.reset()
    trainer.fit(module, train, val)
    assert module.compile_mode == "reduce-overhead" and trainer.optimizers[0].defaults["fused"] is True
    assert trap.armed_steps == 8 and trap.graphs_in_validation == 0
    assert module.ema.module._compiled_call_impl is None
    assert ema_kinds == {("cuda", torch.float32)}
    ema = module.ema.module.state_dict()
    assert len(after_step) == 16
    expected = {k: v.cpu().double() for k, v in after_step[0].items()}
    for step, weights in enumerate(after_step[1:], start=2):
        d = timm_decay(0.8, step, warmup=True)
        expected = {k: d * expected[k] + (1 - d) * weights[k].cpu().double() for k in expected}
    for k, v in expected.items():
        torch.testing.assert_close(ema[k].cpu().double(), v, rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------------------
# Checkpoints: what eval.py, export and fine-tuning read; resume into and out of the EMA


@pytest.fixture(scope="module")
def ema_run(tmp_path_factory):
    """A 1-epoch (3-step) run of the TINY config with model.ema_decay=0.5, tested on its best
    checkpoint: (run folder, metrics)."""
    out = tmp_path_factory.mktemp("ema")
    metrics = train(compose_cfg(out, [*TINY, "model.ema_decay=0.5", "model.optimizer.lr=1e-2"]))
    return out / "out", metrics


def test_checkpoint_gives_the_ema_weights(ema_run, tmp_path):
    run, metrics = ema_run
    path = run / "checkpoints" / "last.ckpt"
    stored = torch.load(path, map_location="cpu", weights_only=True)["state_dict"]
    state_dict, hparams = read_checkpoint(path)
    assert hparams["ema_decay"] == 0.5
    assert set(state_dict) == {k[len("model."):] for k in stored if k.startswith("model.")}
    assert all(torch.equal(v, stored[f"ema.module.{k}"]) for k, v in state_dict.items())
    assert not torch.equal(stored["ema.module.head.weight"], stored["model.head.weight"])

    # eval.py scores the EMA weights: the test score train.py reported
    result = evaluate(compose_cfg(tmp_path, [f"ckpt_path={path}", *TINY[:5], "trainer=cpu"], "eval"))
    assert result["loss"] == pytest.approx(metrics["test/loss"], rel=1e-5)
    assert result["top1"] == pytest.approx(metrics["test/top1"])
    loaded = load_checkpoint(path)
    assert loaded.ema is None and all(torch.equal(v, state_dict[k]) for k, v in loaded.model.state_dict().items())
    # the same checkpoint without its EMA: the trained weights, another score
    raw = tmp_path / "raw.ckpt"
    torch.save({**torch.load(path, weights_only=True),
                "state_dict": {k: v for k, v in stored.items() if not k.startswith("ema.")}}, raw)
    raw_weights, _ = read_checkpoint(raw)
    assert all(torch.equal(v, stored[f"model.{k}"]) for k, v in raw_weights.items())
    assert evaluate(compose_cfg(tmp_path, [f"ckpt_path={raw}", *TINY[:5], "trainer=cpu"], "eval"))["loss"] \
        != pytest.approx(result["loss"], rel=1e-5)

    # the timm export: the EMA weights under timm's names, nothing of the EMA's own
    out = tmp_path / "vit.safetensors"
    kwargs = export_timm(path, out)
    exported = safetensors.torch.load_file(out)
    model = timm.create_model(**kwargs)
    assert set(exported) == set(model.state_dict()) == set(state_dict)
    assert all(torch.equal(exported[k], state_dict[k]) for k in exported)
    assert all(torch.equal(v, state_dict[k]) for k, v in model.state_dict().items())


@pytest.mark.parametrize("before, after", [(None, 0.5), (0.5, None)])
def test_resume_turning_the_ema_on_or_off(ema_run, tmp_path, caplog, before, after):
    """EMA turned on at resume: it starts from the checkpoint's weights; turned off: the
    checkpoint's EMA is dropped and training goes on from its trained weights."""
    if before is None:  # a checkpoint without EMA: the run's, less its EMA
        ckpt = torch.load(ema_run[0] / "checkpoints" / "last.ckpt", weights_only=True)
        raw_state = {k: v for k, v in ckpt["state_dict"].items() if not k.startswith("ema.")}
        ckpt["state_dict"] = raw_state
        ckpt["hyper_parameters"]["ema_decay"] = None
        path = tmp_path / "noema.ckpt"
        torch.save(ckpt, path)
    else:
        path = ema_run[0] / "checkpoints" / "last.ckpt"
    override = "model.ema_decay=null" if after is None else f"model.ema_decay={after}"
    with caplog.at_level(logging.INFO, logger="vitflash.module"):
        train(compose_cfg(tmp_path, [*TINY, "trainer.max_epochs=2", "test=false", override, f"ckpt_path={path}"]))
    resumed = torch.load(tmp_path / "out" / "checkpoints" / "last.ckpt", weights_only=True)
    assert resumed["global_step"] == 6
    has_ema = any(k.startswith("ema.") for k in resumed["state_dict"])
    if after is None:
        assert "the checkpoint's EMA of the weights is dropped" in caplog.text and not has_ema
    else:
        assert "the checkpoint has no EMA of the weights: the EMA starts from its weights" in caplog.text
        assert has_ema


# --------------------------------------------------------------------------------------
# Bad values


@pytest.mark.parametrize("decay", [0, 1, 1.5, -0.1, float("nan"), True, "abc"])
def test_bad_decay_is_refused_before_building(decay):
    with mock.patch("vitflash.create_model") as create:
        with pytest.raises(ValueError, match=r"model.ema_decay=.* is not a number in \(0, 1\).*model.ema_decay=0.9998"):
            make(ema_decay=decay)
    create.assert_not_called()


def test_bad_values_in_the_config(tmp_path):
    cfg = compose_cfg(tmp_path, ["model.ema_decay=1.0"])
    with pytest.raises(hydra.errors.InstantiationException, match=r"model.ema_decay=1.0 is not a number in \(0, 1\)"):
        instantiate(cfg.model, _convert_="all")
    with pytest.raises(ValueError, match="model.ema_warmup='yes' is not true or false"):
        make(ema_decay=0.9, ema_warmup="yes")
    defaults = compose_cfg(tmp_path, []).model
    assert defaults.ema_decay is None and defaults.ema_warmup is False


def test_fsdp_and_half_precision_weights_are_refused(tmp_path):
    # train.py: before any data is read (trainer=fsdp needs CUDA; this stops it first)
    with pytest.raises(ValueError, match=r"model.ema_decay=0.999 cannot run under trainer=fsdp.*model.ema_decay=null"):
        train(compose_cfg(tmp_path, ["data=synthetic", "trainer=fsdp", "test=false", "model.ema_decay=0.999"]))
    assert not (tmp_path / "out").exists()
    # the module, for a Trainer built by hand
    module = make(ema_decay=0.999)
    for strategy, precision, message in [
        (mock.MagicMock(spec=FSDPStrategy, root_device=torch.device("cpu")), "32-true", "cannot run under trainer=fsdp"),
        (SimpleNamespace(root_device=torch.device("cpu")), "bf16-true", "trainer.precision=bf16-true: .*bf16-mixed"),
    ]:
        fake = SimpleNamespace(strategy=strategy, precision=precision, accumulate_grad_batches=1, world_size=1)
        with mock.patch.object(ViTModule, "trainer", new_callable=mock.PropertyMock, return_value=fake):
            with pytest.raises(ValueError, match=message):
                module.setup("fit")
