"""vitflash.pretrained: timm checkpoints in, timm files out, and clear errors.

Weights are random (perturbed so that biases, norms and the class token are not at their
init values); models are shrunk in depth where their width is kept, and timm and vitflash
are built with the same overrides.
"""
from __future__ import annotations

import functools

import importlib.util
import os
import re
from pathlib import Path

import huggingface_hub.constants
import pytest
import safetensors.torch
import timm
import torch
from timm.layers import resample_abs_pos_embed

import vitflash
import vitflash.pretrained
from vitflash.pretrained import CheckpointError, export_timm, read_checkpoint

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def hub_offline(monkeypatch, tmp_path_factory):
    """No test may reach the hub (a fetch fails at once) or read this machine's hub cache."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path_factory.mktemp("hub_cache")))


def _perturb_(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.02)
    return model.eval()


def _save(state_dict: dict, path: Path, fmt: str) -> Path:
    """Save as a .safetensors file, a torch state dict, or a Lightning-style checkpoint."""
    if fmt == "safetensors":
        safetensors.torch.save_file(state_dict, str(path.with_suffix(".safetensors")))
        return path.with_suffix(".safetensors")
    if fmt == "pth":
        torch.save(state_dict, path.with_suffix(".pth"))
        return path.with_suffix(".pth")
    ckpt = {
        "state_dict": {f"model.{k}": v for k, v in state_dict.items()},
        "hyper_parameters": {"model_name": fmt},
        "epoch": 3,
    }
    torch.save(ckpt, path.with_suffix(".ckpt"))
    return path.with_suffix(".ckpt")


def _timm_model(name: str, seed: int = 0, **kwargs) -> torch.nn.Module:
    torch.manual_seed(seed)
    return _perturb_(timm.create_model(name, **kwargs), seed)


# (timm name, overrides for both libraries, file format, batch)
TIMM_CASES = [
    ("vit_tiny_patch16_224", dict(), "safetensors", 2),  # full depth and width
    ("vit_small_patch16_224", dict(depth=4), "pth", 2),
    ("vit_base_patch16_224", dict(depth=2, global_pool="avg"), "safetensors", 2),  # fc_norm
    ("vit_base_patch32_224", dict(depth=2), "pth", 2),
    ("vit_base_patch16_384", dict(depth=1), "safetensors", 1),
    ("deit_small_patch16_224", dict(depth=3), "pth", 2),
    ("vit_large_patch16_224", dict(depth=1), "safetensors", 1),
    ("vit_small_patch16_224", dict(depth=2, init_values=1e-5), "pth", 2),  # layer scale
    ("vit_tiny_patch16_224", dict(depth=2, class_token=False, global_pool="avg"), "pth", 2),
]


@pytest.mark.parametrize(
    "name, overrides, fmt, batch", TIMM_CASES,
    ids=[f"{c[0]}-{'-'.join(f'{k}={v}' for k, v in c[1].items())}" for c in TIMM_CASES],
)  # fmt: skip
def test_timm_checkpoint_gives_timms_logits(tmp_path, name, overrides, fmt, batch):
    theirs = _timm_model(name, **overrides)
    path = _save(theirs.state_dict(), tmp_path / "timm", fmt)
    ours = vitflash.create_model(name, pretrained=path, **overrides).eval()
    size = ours.config["img_size"]
    x = torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = theirs(x)
        for impl in ("naive", "sdpa"):
            got = ours.set_attention(impl)(x)
            torch.testing.assert_close(got, expected, atol=1e-5, rtol=0, msg=impl)
    assert ours.num_classes == 1000


@pytest.mark.gpu
@pytest.mark.parametrize("name, overrides", [("vit_small_patch16_224", dict(depth=4)),
                                             ("vit_base_patch16_224", dict(depth=2,
                                                                            global_pool="avg"))])
def test_timm_checkpoint_on_the_flash_path_gpu(tmp_path, name, overrides):
    """bf16 autocast: flash logits are as close to timm's fp32 ones as PyTorch's attention
    paths in bf16 (the rule of the attention tests; yardstick the worse of naive and sdpa)."""
    theirs = _timm_model(name, **overrides)
    path = _save(theirs.state_dict(), tmp_path / "timm", "safetensors")
    ours = vitflash.create_model(name, pretrained=path, attention="flash", **overrides)
    theirs, ours = theirs.cuda(), ours.cuda().eval()
    x = torch.randn(32, 3, 224, 224, device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    with torch.no_grad():
        ref = theirs(x).double()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            got = ours(x).double()
            low = [ours.set_attention(impl)(x).double() for impl in ("naive", "sdpa")]
    err = (got - ref).abs().max().item()
    yardstick = max((v - ref).abs().max().item() for v in low)
    assert err <= 2 * yardstick + 1e-5, f"flash {err:.3g} > 2 x PyTorch bf16 {yardstick:.3g}"


@pytest.mark.parametrize("fmt", ["safetensors", "vit_small_patch16_224"])  # lightning ckpt
def test_finetune_from_224_to_another_size_and_head(tmp_path, fmt):
    theirs = _timm_model("vit_small_patch16_224", depth=2)
    path = _save(theirs.state_dict(), tmp_path / "src", fmt)
    ours = vitflash.create_model("vit_small_patch16_224", pretrained=path, img_size=96,
                                 num_classes=10, depth=2)  # fmt: skip
    src = theirs.state_dict()
    # position embedding resampled from 14x14 to 6x6 by timm; the class token's kept
    assert ours.pos_embed.shape == (1, 1 + 36, 384)
    expected = resample_abs_pos_embed(src["pos_embed"], new_size=(6, 6), num_prefix_tokens=1)
    torch.testing.assert_close(ours.pos_embed.data, expected)
    torch.testing.assert_close(ours.pos_embed.data[:, 0], src["pos_embed"][:, 0])
    # a fresh 10-way head; everything else is the checkpoint's
    assert ours.head.weight.shape == (10, 384)
    assert not torch.allclose(ours.head.weight.data, src["head.weight"][:10])
    for k, v in ours.state_dict().items():
        if k not in ("pos_embed", "head.weight", "head.bias"):
            assert torch.equal(v, src[k]), k
    # and it trains
    ours.train()(torch.randn(2, 3, 96, 96)).logsumexp(-1).sum().backward()
    assert ours.blocks[0].attn.qkv.weight.grad is not None


def test_same_head_size_keeps_the_head_at_another_img_size(tmp_path):
    theirs = _timm_model("vit_tiny_patch16_224", depth=1)
    path = _save(theirs.state_dict(), tmp_path / "src", "safetensors")
    ours = vitflash.create_model("vit_tiny_patch16_224", pretrained=path, img_size=384, depth=1)
    assert ours.pos_embed.shape == (1, 1 + 24 * 24, 192)
    assert torch.equal(ours.head.weight.data, theirs.head.weight.data)


def test_avg_pool_checkpoint_loads_without_naming_the_pooling(tmp_path):
    theirs = _timm_model("vit_small_patch16_224", depth=1, global_pool="avg", num_classes=7)
    path = _save(theirs.state_dict(), tmp_path / "src", "pth")
    ours = vitflash.create_model("vit_small_patch16_224", pretrained=path, depth=1).eval()
    assert ours.global_pool == "avg" and ours.num_classes == 7
    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x), atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    "name, overrides",
    [("vit_micro_patch4_32", dict(num_classes=10)),
     ("vit_small_patch16_224", dict(depth=2, global_pool="avg", num_classes=5))],
)  # fmt: skip
def test_round_trip_vitflash_timm_vitflash(tmp_path, name, overrides):
    torch.manual_seed(0)
    ours = _perturb_(vitflash.create_model(name, attention="naive", **overrides), seed=3)
    ckpt = _save(ours.state_dict(), tmp_path / "lightning", name)  # Lightning-style
    out = tmp_path / "exported.safetensors"
    timm_kwargs = export_timm(ckpt, out)
    assert timm_kwargs["pretrained_cfg_overlay"]["file"] == str(out)
    theirs = timm.create_model(**timm_kwargs).eval()
    back = vitflash.create_model(name, attention="naive", pretrained=out,
                                 **{k: v for k, v in overrides.items() if k == "depth"}).eval()
    size = ours.config["img_size"]
    x = torch.randn(2, 3, size, size)
    with torch.no_grad():
        logits = ours(x)
        torch.testing.assert_close(theirs(x), logits, atol=1e-5, rtol=0)
        assert torch.equal(back(x), logits)
    assert back.config == ours.config


def test_export_from_a_model_and_the_cli(tmp_path, capsys):
    torch.manual_seed(0)
    model = _perturb_(vitflash.create_model("vit_micro_patch4_32", num_classes=10), seed=4)
    torch.save(model.state_dict(), tmp_path / "weights.pth")
    spec = importlib.util.spec_from_file_location("export_timm", ROOT / "scripts/export_timm.py")
    cli = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cli)

    with pytest.raises(ValueError, match="does not say which model it holds.*--model"):
        cli.main([str(tmp_path / "weights.pth"), "--out", str(tmp_path / "a.safetensors")])
    cli.main([str(tmp_path / "weights.pth"), "--model", "vit_micro_patch4_32",
              "--out", str(tmp_path / "a.safetensors")])  # fmt: skip
    printed = capsys.readouterr().out
    assert "timm.create_model('vit_base_patch16_224'" in printed and "patch_size=4" in printed

    export_timm(model, tmp_path / "b.safetensors")
    a = safetensors.torch.load_file(str(tmp_path / "a.safetensors"))
    b = safetensors.torch.load_file(str(tmp_path / "b.safetensors"))
    assert a.keys() == b.keys() == model.state_dict().keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    # created like any file, with the user's umask (safetensors' save_file gives 0600)
    old_umask = os.umask(0o022)
    try:
        export_timm(model, tmp_path / "c.safetensors")
    finally:
        os.umask(old_umask)
    assert (tmp_path / "c.safetensors").stat().st_mode & 0o777 == 0o644
    assert safetensors.torch.load_file(str(tmp_path / "c.safetensors")).keys() == a.keys()


@pytest.mark.parametrize("pooling", [dict(global_pool="token", fc_norm=True),
                                     dict(global_pool="avg", fc_norm=False)])
def test_pooling_the_weights_leave_open_comes_from_the_file(tmp_path, pooling):
    """With a class token, fc_norm's presence does not say the pooling (token pooling may
    have fc_norm, the mean may go without): an exported file's metadata and a run's
    hyper-parameters say it, so loading, exporting and timm all give the model's logits."""
    name = "vit_micro_patch4_32"
    torch.manual_seed(0)
    ours = _perturb_(vitflash.create_model(name, attention="naive", num_classes=10, **pooling), seed=5)
    exported = tmp_path / "exported.safetensors"
    export_timm(ours, exported)
    lightning = _save(ours.state_dict(), tmp_path / "run", name)
    ckpt = torch.load(lightning, weights_only=True)
    ckpt["hyper_parameters"].update(pooling)
    torch.save(ckpt, lightning)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        want = ours(x)
        for path in (exported, lightning):
            back = vitflash.create_model(name, attention="naive", pretrained=path).eval()
            assert (back.global_pool, back.config["fc_norm"]) == (pooling["global_pool"], pooling["fc_norm"])
            assert torch.equal(back(x), want)
            timm_kwargs = export_timm(path, tmp_path / f"again_{path.suffix[1:]}.safetensors")
            torch.testing.assert_close(timm.create_model(**timm_kwargs).eval()(x), want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("overrides", [dict(init_values=1e-5), dict(init_values=0.0), dict(qkv_bias=False)])
def test_layer_scale_and_qkv_bias_come_from_the_weights(tmp_path, overrides):
    """A file with layer scale (also one that started at 0, which timm builds only for a
    nonzero init_values) or without qkv biases loads into the preset that has neither, and
    exports to timm, without naming them."""
    name = "vit_micro_patch4_32"
    torch.manual_seed(0)
    ours = _perturb_(vitflash.create_model(name, attention="naive", num_classes=10, **overrides), seed=6)
    path = _save(ours.state_dict(), tmp_path / "weights", "pth")
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        want = ours(x)
        back = vitflash.create_model(name, attention="naive", pretrained=path).eval()
        assert torch.equal(back(x), want)
        timm_kwargs = export_timm(ours, tmp_path / "exported.safetensors")
        assert Path(timm_kwargs["pretrained_cfg_overlay"]["file"]).is_absolute()
        torch.testing.assert_close(timm.create_model(**timm_kwargs).eval()(x), want, atol=1e-5, rtol=0)


def test_export_refuses_a_preset_other_than_the_checkpoints(tmp_path):
    """The preset gives num_heads, which the weights do not show: a model_name other than the
    one a checkpoint records, or one whose heads do not divide the width, is refused by name."""
    torch.manual_seed(0)
    model = vitflash.create_model("vit_micro_patch4_32", num_classes=10)
    ckpt = _save(model.state_dict(), tmp_path / "run", "vit_micro_patch4_32")
    with pytest.raises(ValueError, match="holds a vit_micro_patch4_32 model .*not vit_wide_h16_patch4_32"):
        export_timm(ckpt, tmp_path / "a.safetensors", model_name="vit_wide_h16_patch4_32")
    export_timm(ckpt, tmp_path / "b.safetensors", model_name="vit_micro_patch4_32")  # the same name: fine
    weights = _save(model.state_dict(), tmp_path / "weights", "pth")
    with pytest.raises(ValueError, match="the preset vit_tiny_patch4_32 does not fit the weights of .*weights.pth"):
        export_timm(weights, tmp_path / "c.safetensors", model_name="vit_tiny_patch4_32")


def test_read_checkpoint_unwraps_lightning_and_reports_hyper_parameters(tmp_path):
    sd = {"w": torch.ones(2)}
    ckpt = {"state_dict": {"model.w": sd["w"], "train_acc.total": torch.zeros(())},
            "hyper_parameters": {"model_name": "vit_micro_patch4_32", "lr": 1e-3}}  # fmt: skip
    torch.save(ckpt, tmp_path / "x.ckpt")
    got, hparams = read_checkpoint(tmp_path / "x.ckpt")
    assert list(got) == ["w"] and hparams["model_name"] == "vit_micro_patch4_32"


def test_timm_tag_goes_through_timms_hub_loader(monkeypatch):
    """The download itself is replaced (tests stay offline); tag resolution, timm's
    pretrained_cfg, its loader and the head handling are the real ones."""
    source = _timm_model("vit_tiny_patch16_224", depth=1, num_classes=21843)
    fetched = []

    def fake_hub_download(hub_id, *args, **kwargs):
        fetched.append(hub_id)
        return {k: v.clone() for k, v in source.state_dict().items()}

    monkeypatch.setattr(timm.models._builder, "load_state_dict_from_hf", fake_hub_download)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)  # the hub is faked:
    monkeypatch.setattr(vitflash.pretrained, "_hub_reachable", lambda: True)  # no traffic
    full = vitflash.create_model("vit_tiny_patch16_224", pretrained="augreg_in21k", depth=1)
    tuned = vitflash.create_model("vit_tiny_patch16_224", depth=1, num_classes=10,
                                  pretrained="vit_tiny_patch16_224.augreg_in21k")  # fmt: skip
    assert fetched == ["timm/vit_tiny_patch16_224.augreg_in21k"] * 2
    assert full.num_classes == 21843 and torch.equal(full.head.weight.data, source.head.weight.data)
    assert full.pretrained_cfg["mean"] == (0.5, 0.5, 0.5)  # for the data pipeline
    assert tuned.head.weight.shape == (10, 192)
    src = source.state_dict()
    assert all(torch.equal(v, src[k]) for k, v in tuned.state_dict().items() if not k.startswith("head."))


# ---------------------------------------------------------------------------------------
# Bad input


def test_checkpoint_of_another_architecture(tmp_path):
    torch.manual_seed(0)
    resnet = timm.create_model("resnet10t", num_classes=10)
    path = _save(resnet.state_dict(), tmp_path / "resnet", "pth")
    with pytest.raises(CheckpointError) as e:
        vitflash.create_model("vit_micro_patch4_32", pretrained=path)
    msg = str(e.value)
    assert str(path) in msg and "is not a timm/vitflash VisionTransformer" in msg
    assert "patch_embed.proj.weight" in msg and "conv1" in msg  # what it lacks, what it has


def test_rgb_weights_into_a_model_of_other_channels(tmp_path):
    """As timm does, RGB weights load into a model with in_chans=1 (the first layer's kernels
    summed over their colours) or 2, and the rest of the weights as they are."""
    torch.manual_seed(0)
    rgb = _perturb_(vitflash.create_model("vit_micro_patch4_32", num_classes=10), seed=7)
    path = _save(rgb.state_dict(), tmp_path / "rgb", "pth")
    grey = vitflash.create_model("vit_micro_patch4_32", in_chans=1, pretrained=path)
    source = rgb.state_dict()
    assert torch.allclose(grey.patch_embed.proj.weight, source["patch_embed.proj.weight"].sum(1, keepdim=True))
    assert all(torch.equal(v, source[k]) for k, v in grey.state_dict().items() if k != "patch_embed.proj.weight")
    assert vitflash.create_model("vit_micro_patch4_32", in_chans=2, pretrained=path).patch_embed.proj.weight.shape[1] == 2


@pytest.mark.parametrize("kind", ["reg_tokens", "no_embed_class", "distilled"])
def test_vits_with_other_tokens_are_refused_by_name(tmp_path, kind):
    """timm ViTs whose tokens vitflash's ViT does not have (registers, a distillation token,
    a class token outside pos_embed) fail with a CheckpointError saying so, not inside the
    position-embedding resampling."""
    if kind == "distilled":
        model = _timm_model("deit_tiny_distilled_patch16_224", depth=1, img_size=64)
    else:
        model = _timm_model("vit_tiny_patch16_224", depth=1, img_size=64, **{kind: 4 if kind == "reg_tokens" else True})
    path = _save(model.state_dict(), tmp_path / kind, "pth")
    want = {"reg_tokens": "register tokens", "no_embed_class": "not a class token and a square grid",
            "distilled": "a distillation token"}[kind]
    with pytest.raises(CheckpointError, match=want):
        vitflash.create_model("vit_tiny_patch16_224", depth=1, img_size=64, pretrained=path)
    with pytest.raises(CheckpointError, match=want):
        export_timm(path, tmp_path / "out.safetensors", model_name="vit_tiny_patch16_224")


def test_vit_of_another_width(tmp_path):
    theirs = _timm_model("vit_tiny_patch16_224", depth=2)
    path = _save(theirs.state_dict(), tmp_path / "tiny", "safetensors")
    with pytest.raises(CheckpointError) as e:
        vitflash.create_model("vit_small_patch16_224", pretrained=path, depth=2)
    msg = str(e.value)
    assert str(path) in msg and "does not fit vit_small_patch16_224" in msg
    assert "The checkpoint has embed_dim 192, depth 2" in msg
    assert "shape (checkpoint vs model): cls_token (1, 1, 192) vs (1, 1, 384)" in msg


@pytest.mark.parametrize("fmt", ["safetensors", "pth"])
def test_truncated_file(tmp_path, fmt):
    theirs = _timm_model("vit_tiny_patch16_224", depth=1)
    path = _save(theirs.state_dict(), tmp_path / "cut", fmt)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="cannot read checkpoint .*truncated, corrupt") as e:
        vitflash.create_model("vit_tiny_patch16_224", pretrained=path, depth=1)
    assert str(path) in str(e.value)


def test_garbage_file_is_reported_without_torchs_weights_only_advice(tmp_path):
    """A file of text where a checkpoint should be: the error says it is damaged and keeps the
    unpickler's finding, not torch's advice to load it with weights_only=False (which would
    run whatever a pickle holds, and cannot mend a damaged file)."""
    path = tmp_path / "notes.ckpt"
    path.write_text("not a checkpoint\n")
    with pytest.raises(CheckpointError, match=r"cannot read checkpoint .*notes.ckpt: it is truncated, corrupt") as e:
        vitflash.create_model("vit_micro_patch4_32", pretrained=path)
    message = str(e.value)
    assert "weights_only" not in message and "In PyTorch 2.6" not in message
    assert re.search(r"\(UnpicklingError: \S", message)  # the finding itself, whatever its wording


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="does_not_exist.safetensors does not exist"):
        vitflash.create_model("vit_micro_patch4_32", pretrained=tmp_path / "does_not_exist.safetensors")


def test_unknown_preset_fails_before_reading_weights(tmp_path):
    with pytest.raises(ValueError, match="unknown model 'vit_base_patch4_32'.*vit_micro_patch4_32"):
        vitflash.create_model("vit_base_patch4_32", pretrained=tmp_path / "absent.pth")


def test_indivisible_img_size_with_weights(tmp_path):
    path = _save(_timm_model("vit_tiny_patch16_224", depth=1).state_dict(), tmp_path / "t", "pth")
    with pytest.raises(ValueError, match="image size 200 is not divisible by patch size 16"):
        vitflash.create_model("vit_tiny_patch16_224", pretrained=path, img_size=200, depth=1)


def test_timm_tag_offline_says_how_to_pass_a_file():
    assert os.environ["HF_HUB_OFFLINE"] == "1"
    with pytest.raises(RuntimeError) as e:
        vitflash.create_model("vit_tiny_patch16_224", pretrained="augreg_in21k_ft_in1k", depth=1)
    msg = str(e.value)
    assert "HF_HUB_OFFLINE is set and timm weights 'vit_tiny_patch16_224.augreg_in21k_ft_in1k'" in msg
    assert "huggingface.co/timm/vit_tiny_patch16_224.augreg_in21k_ft_in1k" in msg
    assert "model.pretrained=/path/to/model.safetensors" in msg
    assert msg.count("\n") == 0  # one line, not the hub's multi-line explanation


def test_unreachable_hub_fails_at_once(monkeypatch):
    """Online mode with the hub unreachable: one connect attempt (faked here: no traffic),
    then the error names the override and the exact hub file, with no retries."""
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    attempts = []

    def unreachable(address, timeout):
        attempts.append((address, timeout))
        raise OSError("Name or service not known")

    monkeypatch.setattr(vitflash.pretrained.socket, "create_connection", unreachable)
    monkeypatch.setattr(timm.models._builder, "load_state_dict_from_hf",
                        lambda *a, **k: pytest.fail("timm must not be asked to fetch from an unreachable hub"))
    with pytest.raises(RuntimeError) as e:
        vitflash.create_model("vit_small_patch16_224", pretrained="augreg_in21k", depth=1)
    assert attempts == [(("huggingface.co", 443), 2.0)]
    msg = str(e.value)
    assert "cannot reach the Hugging Face hub" in msg and "'vit_small_patch16_224.augreg_in21k'" in msg
    assert "fetch model.safetensors of the hub repository timm/vit_small_patch16_224.augreg_in21k" in msg
    assert "model.pretrained=/path/to/model.safetensors" in msg


def test_weights_in_the_hub_cache_load_without_the_hub(tmp_path, monkeypatch):
    """A file huggingface_hub cached earlier is read directly: no connect check, no request."""
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(vitflash.pretrained, "_hub_reachable", lambda: pytest.fail("the hub was contacted"))
    source = _timm_model("vit_tiny_patch16_224", depth=1, num_classes=21843)
    repo = tmp_path / "models--timm--vit_tiny_patch16_224.augreg_in21k"  # huggingface_hub's cache layout
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("0" * 40)
    (repo / "snapshots" / ("0" * 40)).mkdir(parents=True)
    _save(source.state_dict(), repo / "snapshots" / ("0" * 40) / "model", "safetensors")
    model = vitflash.create_model("vit_tiny_patch16_224", pretrained="augreg_in21k", depth=1)
    assert all(torch.equal(v, source.state_dict()[k]) for k, v in model.state_dict().items())
    # weights that are there but do not load are reported as such, not as a failed fetch
    def refuse(state_dict, model):
        raise RuntimeError("size mismatch for pos_embed")

    monkeypatch.setattr(vitflash.pretrained, "checkpoint_filter_fn", refuse)
    with pytest.raises(CheckpointError, match="do not load into vit_tiny_patch16_224 .RuntimeError: "
                                              "size mismatch for pos_embed"):
        vitflash.create_model("vit_tiny_patch16_224", pretrained="augreg_in21k", depth=1)


def test_unknown_timm_tag_lists_the_known_ones():
    with pytest.raises(ValueError, match="no pretrained weights 'vit_tiny_patch16_224.in22k'") as e:
        vitflash.create_model("vit_tiny_patch16_224", pretrained="in22k")
    assert "augreg_in21k_ft_in1k" in str(e.value)
    with pytest.raises(ValueError, match="not a timm architecture"):
        vitflash.create_model("vit_micro_patch4_32", pretrained="augreg_in21k")


def test_checkpoint_with_pickled_objects_is_refused_not_unpickled(tmp_path):
    """vitflash never unpickles a file in full (that can run code): it says how to re-save."""
    model = vitflash.build_model("vit_micro_patch4_32", num_classes=10)
    path = tmp_path / "foreign.ckpt"
    torch.save({"state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
                "hyper_parameters": {"optimizer": functools.partial(torch.optim.AdamW, lr=1e-3)}},
               path)
    with pytest.raises(CheckpointError, match="pickled Python objects.*If you trust the file"):
        vitflash.create_model("vit_micro_patch4_32", num_classes=10, pretrained=str(path))
