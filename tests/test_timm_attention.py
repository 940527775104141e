"""vitflash.patch_timm_attention: timm's own ViTs run vitflash's attention paths."""
from __future__ import annotations

import pytest
import timm
import torch

import vitflash
import vitflash.timm_attention


def timm_vit(**kwargs) -> torch.nn.Module:
    """A small timm ViT of timm's own classes: 32 px in 8 px patches (17 tokens with the class
    token), 2 blocks of 3 heads of 64."""
    torch.manual_seed(0)
    return timm.create_model("vit_small_patch16_224", pretrained=False, img_size=32, patch_size=8, depth=2,
                             embed_dim=192, num_heads=3, num_classes=10, **kwargs).eval()


@pytest.mark.parametrize("impl", ["naive", "sdpa"])
@pytest.mark.parametrize("qk_norm", [False, True])
def test_patched_paths_give_timms_logits_in_fp32(impl, qk_norm):
    model = timm_vit(qk_norm=qk_norm)
    x = torch.randn(4, 3, 32, 32)
    keys = list(model.state_dict())
    with torch.no_grad():
        ref = model(x)
        assert vitflash.patch_timm_attention(model, impl) == 2
        got = model(x)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
    assert list(model.state_dict()) == keys  # weights and names untouched


@pytest.mark.parametrize("qk_norm", [False, True])
def test_flash_in_a_timm_model_is_within_bf16_tolerance_and_trains(qk_norm):
    """As tests/test_model.py holds vitflash's own model: under bf16 autocast flash's logits are
    as close to the fp32 ones as PyTorch's attention paths in bf16 (CPU: Triton's interpreter)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = timm_vit(qk_norm=qk_norm).to(device)
    x = torch.randn(4, 3, 32, 32, device=device)
    with torch.no_grad():
        ref = model(x).double()
        low = []
        for impl in ("naive", "sdpa"):
            vitflash.patch_timm_attention(model, impl)
            with torch.autocast(device, dtype=torch.bfloat16):
                low.append(model(x).double())
        vitflash.patch_timm_attention(model, "flash")
        with torch.autocast(device, dtype=torch.bfloat16):
            got = model(x).double()
    err = (got - ref).abs().max().item()
    yardstick = max((v - ref).abs().max().item() for v in low)
    assert torch.isfinite(got).all() and err <= 2 * yardstick + 1e-5, (err, yardstick)
    # the backward reaches every block's qkv projection (and the norms of q and k)
    model.train()
    with torch.autocast(device, dtype=torch.bfloat16):
        model(x).float().logsumexp(-1).sum().backward()
    for block in model.blocks:
        assert block.attn.qkv.weight.grad is not None and block.attn.qkv.weight.grad.abs().sum() > 0
        if qk_norm:
            assert block.attn.q_norm.weight.grad.abs().sum() > 0


def test_none_restores_timms_attention_and_a_mask_runs_timms():
    model = timm_vit()
    attn = model.blocks[0].attn
    x = torch.randn(2, 17, 192)
    with torch.no_grad():
        ref = attn(x)
        vitflash.patch_timm_attention(model, "naive")
        assert "forward" in vars(attn)
        # a mask is timm's to apply: the patched module hands the call to timm's forward
        mask = torch.zeros(17, 17, dtype=torch.bool)
        mask[:, :9] = True
        torch.testing.assert_close(attn(x, attn_mask=mask), type(attn).forward(attn, x, attn_mask=mask))
        assert not torch.allclose(attn(x, attn_mask=mask), ref)  # the mask changed the result
        vitflash.patch_timm_attention(model, None)
        assert "forward" not in vars(attn)
        torch.testing.assert_close(attn(x), ref)


def test_auto_takes_sdpa_off_the_gpu_and_in_fp32(monkeypatch):
    model = timm_vit()
    taken = []
    real = vitflash.timm_attention.attention_qkvpacked
    monkeypatch.setattr(vitflash.timm_attention, "attention_qkvpacked",
                        lambda qkv, impl, **kw: taken.append(impl) or real(qkv, impl, **kw))
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        ref = model(x)
        assert vitflash.patch_timm_attention(model) == 2  # "auto"
        torch.testing.assert_close(model(x), ref, atol=1e-5, rtol=1e-5)
    assert taken == ["sdpa", "sdpa"]  # CPU tensors (a CUDA tensor in bf16/fp16 takes flash)


def test_bad_models_and_paths_are_refused():
    with pytest.raises(ValueError, match="has no timm ViT Attention module to patch"):
        vitflash.patch_timm_attention(torch.nn.Linear(2, 2), "flash")
    with pytest.raises(ValueError, match="unknown attention path 'flsh'"):
        vitflash.patch_timm_attention(timm_vit(), "flsh")
    odd = timm.create_model("vit_small_patch16_224", pretrained=False, img_size=32, patch_size=8, depth=1,
                            embed_dim=90, num_heads=3, num_classes=10)  # heads of 30
    with pytest.raises(ValueError, match="head dim 30 is not supported by flash attention"):
        vitflash.patch_timm_attention(odd, "flash")
    assert "forward" not in vars(odd.blocks[0].attn)  # nothing was patched


@pytest.mark.parametrize("impl", ["flash", "sdpa"])
def test_a_patched_model_traces_into_one_graph(impl):
    device = "cuda" if torch.cuda.is_available() else "cpu"  # CPU: flash in Triton's interpreter
    model = timm_vit().to(device)
    vitflash.patch_timm_attention(model, impl)
    x = torch.randn(2, 3, 32, 32, device=device)
    with torch.autocast(device, dtype=torch.bfloat16, enabled=impl == "flash"):
        explained = torch._dynamo.explain(model)(x)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0)


def _grads(model: torch.nn.Module, x: torch.Tensor, low: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Logits and every qkv projection's weight gradient of one backward (bf16 autocast if low)."""
    model.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=low):
        logits = model(x)
    logits.float().logsumexp(-1).sum().backward()
    return logits.detach().double(), [b.attn.qkv.weight.grad.double() for b in model.blocks]


@pytest.mark.gpu
@pytest.mark.parametrize("qk_norm", [False, True])
def test_auto_runs_flash_in_a_full_size_timm_vit_on_the_gpu(monkeypatch, qk_norm):
    """On the GPU, "auto" takes flash in a timm ViT-S/16 at 224 (197 tokens, 6 heads of 64: the
    general kernels, not the short ones), eager and compiled. Under bf16 autocast its logits and
    qkv gradients are as close to timm's own fp32 model as timm's own attention under bf16."""
    torch.manual_seed(0)
    model = timm.create_model("vit_small_patch16_224", pretrained=False, num_classes=10,
                              qk_norm=qk_norm).cuda().train()
    x = torch.randn(8, 3, 224, 224, device="cuda")
    ref, ref_g = _grads(model, x, low=False)
    timm_low, timm_g = _grads(model, x, low=True)  # timm's own attention (SDPA) in bf16
    taken = []
    real = vitflash.timm_attention.attention_qkvpacked
    monkeypatch.setattr(vitflash.timm_attention, "attention_qkvpacked",
                        lambda qkv, impl, **kw: taken.append(impl) or real(qkv, impl, **kw))
    assert vitflash.patch_timm_attention(model) == 12  # "auto"
    got, got_g = _grads(model, x, low=True)
    assert taken == ["flash"] * 12
    yard = (timm_low - ref).abs().max().item()
    err = (got - ref).abs().max().item()
    assert torch.isfinite(got).all() and err <= 2 * yard + 1e-5, (err, yard)
    for g, t, r in zip(got_g, timm_g, ref_g):
        yard_g = (t - r).abs().max().item()
        err_g = (g - r).abs().max().item()
        assert err_g <= 2 * yard_g + 1e-6, (err_g, yard_g)
    # compiled (one graph, the flash ops as custom ops): its logits held to the same bound
    compiled = torch.compile(model)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = compiled(x).double()
    assert (out - ref).abs().max().item() <= 2 * yard + 1e-5
