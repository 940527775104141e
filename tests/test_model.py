"""vitflash.model: timm's names and shapes, the attention switch, shapes and errors."""
from __future__ import annotations

import pytest
import timm
import timm.optim
import torch

import vitflash
from vitflash.ops import check_head_dim
import vitflash.model as vm
from vitflash.model import PRESETS, VisionTransformer, build_model, list_models
from vitflash.pretrained import timm_args

TIMM_PRESETS = [n for n in PRESETS if not n.endswith("_patch4_32")]
CIFAR_PRESETS = [n for n in PRESETS if n.endswith("_patch4_32")]


def _shapes(model: torch.nn.Module) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


@pytest.mark.parametrize("name", TIMM_PRESETS)
def test_preset_has_timms_parameter_names_and_shapes(name):
    with torch.device("meta"):  # full size, no memory
        ours, theirs = build_model(name), timm.create_model(name)
    assert list(_shapes(ours).items()) == list(_shapes(theirs).items())


@pytest.mark.parametrize(
    "overrides",
    [dict(), dict(global_pool="avg"), dict(init_values=1e-5),
     dict(class_token=False, global_pool="avg", fc_norm=False), dict(num_classes=0)],
    ids=["token", "avg_fc_norm", "layer_scale", "no_cls_avg", "no_head"],
)  # fmt: skip
@pytest.mark.parametrize("name", CIFAR_PRESETS)
def test_variants_have_timms_names_and_shapes(name, overrides):
    with torch.device("meta"):
        ours = build_model(name, **overrides)
        arch, kwargs = timm_args(ours)
        theirs = timm.create_model(arch, **kwargs)
    assert list(_shapes(ours).items()) == list(_shapes(theirs).items())
    if overrides.get("init_values"):
        assert "blocks.0.ls1.gamma" in _shapes(ours) and "blocks.0.ls2.gamma" in _shapes(ours)
    if overrides.get("global_pool") == "avg" and overrides.get("fc_norm", True):
        assert "fc_norm.weight" in _shapes(ours) and "norm.weight" not in _shapes(ours)


def test_docstring_table_is_current():
    """The preset table in the module docstring is what `python -m vitflash.model` prints."""
    documented = [line.strip() for line in vm.__doc__.splitlines() if line.startswith("    ")]
    table = [line.strip() for line in vm._table().splitlines()]
    assert all(row in documented for row in table), "rerun `python -m vitflash.model`"
    assert list_models() == list(PRESETS) and len(list_models()) == len(table) - 1


@pytest.mark.parametrize("name", list_models())
def test_presets_fit_the_flash_kernel(name):
    kw = PRESETS[name]
    head_dim, rem = divmod(kw["embed_dim"], kw["num_heads"])
    assert rem == 0
    check_head_dim(head_dim)  # raises for a head dim the kernel does not take


def test_cifar_presets_take_32px_images_and_give_shapes():
    torch.manual_seed(0)
    model = vitflash.create_model("vit_micro_patch4_32", num_classes=10).eval()
    x = torch.randn(3, 3, 32, 32)
    feats = model.forward_features(x)
    assert feats.shape == (3, 1 + 64, 128)  # class token + 8x8 patches
    assert model.forward_head(feats, pre_logits=True).shape == (3, 128)
    assert model(x).shape == (3, 10)
    headless = build_model("vit_micro_patch4_32", num_classes=0).eval()
    assert headless(x).shape == (3, 128)


def test_avg_pool_uses_patch_tokens_and_fc_norm():
    torch.manual_seed(0)
    model = build_model("vit_micro_patch4_32", global_pool="avg", num_classes=5).eval()
    feats = torch.randn(2, 65, 128)
    pooled = model.forward_head(feats, pre_logits=True)
    expected = torch.nn.functional.layer_norm(feats[:, 1:].mean(1), (128,), eps=1e-6)
    torch.testing.assert_close(pooled, expected)


def test_attention_switch_changes_every_block_and_keeps_logits():
    torch.manual_seed(0)
    model = vitflash.create_model("vit_micro_patch4_32", attention="naive", num_classes=10).eval()
    x = torch.randn(2, 3, 32, 32)
    assert model.attention == "naive"
    with torch.no_grad():
        naive = model(x)
        assert model.set_attention("sdpa") is model
        assert model.attention == "sdpa"
        assert all(blk.attn.impl == "sdpa" for blk in model.blocks)
        sdpa = model(x)
    torch.testing.assert_close(naive, sdpa, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="unknown attention path 'fast'.*flash, naive, sdpa"):
        model.set_attention("fast")
    assert model.attention == "sdpa"


def test_attention_gets_views_of_the_fused_qkv(monkeypatch):
    seen = []

    def spy(qkv, impl, softmax_scale=None, dropout_p=0.0):
        seen.append((tuple(qkv.shape), qkv._base is not None, impl))
        return real(qkv, impl, softmax_scale, dropout_p)

    real = vm.attention_qkvpacked
    monkeypatch.setattr(vm, "attention_qkvpacked", spy)
    model = build_model("vit_micro_patch4_32", attention="naive")
    model(torch.randn(2, 3, 32, 32))
    assert seen == [((2, 65, 3, 4, 32), True, "naive")] * 4


def test_flash_path_on_a_built_model_matches_within_bf16_tolerance():
    """Under bf16 autocast the flash logits are as close to the fp32 ones as PyTorch's own
    attention paths in bf16 (the rule of the attention tests, yardstick: the worse of naive
    and sdpa, since at the level of logits either can be luckily close on a small batch)."""
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"  # CPU: Triton's interpreter
    model = build_model("vit_micro_patch4_32", num_classes=10, depth=2).to(device).eval()
    x = torch.randn(16, 3, 32, 32, device=device)
    with torch.no_grad():
        ref = model.set_attention("naive")(x).double()
        with torch.autocast(device, dtype=torch.bfloat16):
            low = {impl: model.set_attention(impl)(x).double() for impl in ("naive", "sdpa")}
            got = model.set_attention("flash")(x).double()
    assert torch.isfinite(got).all()
    err = (got - ref).abs().max().item()
    yardstick = max((v - ref).abs().max().item() for v in low.values())
    assert err <= 2 * yardstick + 1e-5, f"flash {err:.3g} > 2 x PyTorch bf16 {yardstick:.3g}"


def test_backward_reaches_every_parameter_with_drop_path_and_layer_scale():
    torch.manual_seed(0)
    model = build_model("vit_micro_patch4_32", num_classes=10, drop_path_rate=0.1,
                        init_values=1e-5, attention="sdpa").train()  # fmt: skip
    assert model.blocks[-1].drop_path1.drop_prob == pytest.approx(0.1)
    assert isinstance(model.blocks[0].drop_path1, torch.nn.Identity)  # rate 0 in block 0
    model(torch.randn(4, 3, 32, 32)).logsumexp(-1).sum().backward()
    no_grad = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.any()]
    assert no_grad == []


@pytest.mark.parametrize("attention", ["naive", "sdpa", "flash"])
def test_grad_checkpointing_reruns_each_block_to_the_same_gradients(attention):
    """With set_grad_checkpointing the backward runs each block's forward again: the loss and
    every gradient are the plain model's, dropout, stochastic depth and attention dropout (the
    flash kernels' seed, drawn from torch's generator) drawing the same masks in the rerun."""
    device = "cuda" if attention == "flash" and torch.cuda.is_available() else "cpu"  # CPU: the interpreter
    torch.manual_seed(0)
    model = build_model("vit_micro_patch4_32", num_classes=10, depth=2, attention=attention, drop_path_rate=0.3,
                        proj_drop_rate=0.1, attn_drop_rate=0.2).to(device).train()
    x = torch.randn(4, 3, 32, 32, device=device)
    calls = []
    model.blocks[1].register_forward_pre_hook(lambda *args: calls.append(torch.is_grad_enabled()))

    def run(checkpointed: bool):
        assert model.set_grad_checkpointing(checkpointed) is model
        model.zero_grad(set_to_none=True)
        calls.clear()
        torch.manual_seed(1)
        with torch.autocast(device, dtype=torch.bfloat16, enabled=attention == "flash"):
            loss = model(x).float().logsumexp(-1).sum()
        loss.backward()
        return loss.detach(), {n: p.grad for n, p in model.named_parameters()}

    loss, grads = run(False)
    assert calls == [True]
    loss_ckpt, grads_ckpt = run(True)
    assert calls == [True, True]  # the forward, then its rerun in the backward
    assert torch.equal(loss_ckpt, loss)
    for name, grad in grads.items():
        torch.testing.assert_close(grads_ckpt[name], grad, msg=name)
    calls.clear()
    with torch.no_grad(), torch.autocast(device, dtype=torch.bfloat16, enabled=attention == "flash"):
        model(x)  # nothing to rerun without gradients: the plain forward
    assert calls == [False]
    with pytest.raises(ValueError, match="grad_checkpointing='yes' is not True or False"):
        model.set_grad_checkpointing("yes")


def test_timm_optimizer_helpers_group_by_depth():
    model = build_model("vit_micro_patch4_32", num_classes=10)
    groups = timm.optim.param_groups_layer_decay(
        model, weight_decay=0.05, no_weight_decay_list=model.no_weight_decay(), layer_decay=0.5)
    by_param = {id(p): g for g in groups for p in g["params"]}
    scale = {n: by_param[id(p)]["lr_scale"] for n, p in model.named_parameters()}
    decay = {n: by_param[id(p)]["weight_decay"] for n, p in model.named_parameters()}
    assert scale["patch_embed.proj.weight"] == scale["pos_embed"] == 0.5**5
    assert [scale[f"blocks.{i}.attn.qkv.weight"] for i in range(4)] == [0.5**4, 0.5**3, 0.5**2, 0.5]
    assert scale["norm.weight"] == 0.5 and scale["head.weight"] == 1.0  # norm joins the last block
    assert decay["pos_embed"] == decay["cls_token"] == decay["blocks.0.norm1.weight"] == 0.0
    assert decay["blocks.0.attn.qkv.weight"] == 0.05


def test_init_is_timms():
    torch.manual_seed(0)
    model = build_model("vit_small_patch4_32")
    qkv = model.blocks[0].attn.qkv
    assert 0.018 < qkv.weight.std().item() < 0.022
    assert not qkv.bias.any() and not model.head.bias.any()
    assert 0.015 < model.pos_embed.std().item() < 0.025
    assert model.cls_token.abs().max() < 1e-4


def test_unknown_preset_lists_the_known_ones():
    with pytest.raises(ValueError, match="unknown model 'vit_huge_patch4_32'") as e:
        vitflash.create_model("vit_huge_patch4_32")
    assert all(name in str(e.value) for name in list_models())


def test_image_size_must_be_divisible_by_patch_size():
    with pytest.raises(ValueError, match="image size 30 is not divisible by patch size 4.*multiple of 4"):
        vitflash.create_model("vit_micro_patch4_32", img_size=30)


def test_input_of_another_size_is_refused():
    model = build_model("vit_micro_patch4_32")
    with pytest.raises(ValueError, match="input image is 64x64 but this model was built for 32x32"):
        model(torch.randn(1, 3, 64, 64))


def test_flash_rejects_head_dims_the_kernel_lacks():
    with pytest.raises(ValueError, match="head dim 30 is not supported by flash attention"):
        VisionTransformer(img_size=32, patch_size=4, embed_dim=120, num_heads=4, depth=1,
                          attention="flash")  # fmt: skip
    model = VisionTransformer(img_size=32, patch_size=4, embed_dim=120, num_heads=4, depth=1)
    with pytest.raises(ValueError, match="head dim 30"):
        model.set_attention("flash")
    assert model.attention == "sdpa"


def test_token_pooling_needs_a_class_token():
    with pytest.raises(ValueError, match="global_pool='token' needs class_token=True"):
        build_model("vit_micro_patch4_32", class_token=False)


@pytest.mark.parametrize("attention", ["naive", "sdpa"])
def test_attention_dropout_only_in_training(attention):
    """attn_drop_rate drops attention weights in train mode only; eval is the model without it."""
    torch.manual_seed(0)
    dropped = build_model("vit_micro_patch4_32", attention=attention, attn_drop_rate=0.5)
    plain = build_model("vit_micro_patch4_32", attention=attention)
    plain.load_state_dict(dropped.state_dict())  # the rate is no weight: the same state_dict
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(dropped.eval()(x), plain.eval()(x))
        dropped.train(), plain.train()
        a, b = dropped(x), dropped(x)
        assert not torch.allclose(a, b) and torch.equal(plain(x), plain(x))
    assert all(blk.attn.attn_drop == 0.5 for blk in dropped.blocks)
    with pytest.raises(ValueError, match=r"attn_drop_rate=1\.0 is not in \[0, 1\)"):
        build_model("vit_micro_patch4_32", attn_drop_rate=1.0)


def test_shifted_patches_hold_each_patch_and_its_four_diagonal_shifts():
    """ShiftedPatchEmbed's patch vectors, before its norm and projection: at every token,
    the image's patch and the same patch of the image moved by half a patch along each
    diagonal, zeros where the moved image left no pixel."""
    p, s, side, chans = 4, 2, 8, 2
    embed = vm.ShiftedPatchEmbed(side, p, chans, embed_dim=16)
    embed.norm, embed.proj = torch.nn.Identity(), torch.nn.Identity()  # the raw patch vectors
    x = torch.arange(2 * chans * side * side, dtype=torch.float32).view(2, chans, side, side) + 1
    tokens = embed(x)  # (B, N, 5 * C * p * p)
    assert tokens.shape == (2, (side // p) ** 2, 5 * chans * p * p)
    copies = tokens.view(2, side // p, side // p, 5, chans, p, p)
    shifts = ((0, 0), (-1, -1), (-1, 1), (1, -1), (1, 1))  # the image, then the four diagonals
    for k, (dy, dx) in enumerate(shifts):
        for y in range(side):
            for xx in range(side):
                src = (y + dy * s, xx + dx * s)
                want = x[:, :, src[0], src[1]] if 0 <= src[0] < side and 0 <= src[1] < side else torch.zeros(2, chans)
                got = copies[:, y // p, xx // p, k, :, y % p, xx % p]
                assert torch.equal(got, want), (k, y, xx)
    assert (copies[:, :, :, 1:] == 0).any() and (copies[:, :, :, 0] != 0).all()


def test_shifted_patch_model_trains_every_parameter_and_refuses_timm_export():
    model = build_model("vit_micro_patch4_32", num_classes=10, shifted_patches=True)
    assert isinstance(model.patch_embed, vm.ShiftedPatchEmbed)
    assert {k for k in model.state_dict() if k.startswith("patch_embed.")} == {
        "patch_embed.proj.weight", "patch_embed.proj.bias", "patch_embed.norm.weight", "patch_embed.norm.bias"}
    assert model.patch_embed.proj.in_features == 5 * 3 * 4 * 4
    logits = model(torch.randn(3, 3, 32, 32))
    assert logits.shape == (3, 10)
    logits.sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
    with pytest.raises(ValueError, match="shifted patches.*cannot be exported to timm"):
        timm_args(model)
    with pytest.raises(ValueError, match="input image is 64x64 but this model was built for 32x32"):
        model(torch.randn(1, 3, 64, 64))


def test_shifted_patches_bad_values():
    with pytest.raises(ValueError, match="shifted_patches='yes' is not True or False"):
        build_model("vit_micro_patch4_32", shifted_patches="yes")
    with pytest.raises(ValueError, match="shifted patches need patch_size >= 2"):
        build_model("vit_micro_patch4_32", patch_size=1, shifted_patches=True)


def test_locality_attention_masks_self_and_learns_the_scale():
    """Locality self-attention by hand for one block: q k^T times the layer's learned scale
    exp(log_scale), each token's own key left out, softmax, v, projection; the scale starts at
    1/sqrt(head_dim) and gets a gradient; every path gives the same output (flash in fp16)."""
    torch.manual_seed(0)
    attn = vm.Attention(32, 4, qkv_bias=True, proj_drop=0.0, impl="naive", locality=True)
    assert attn.log_scale.item() == pytest.approx(-0.5 * torch.log(torch.tensor(8.0)).item())
    with torch.no_grad():
        attn.log_scale.fill_(-1.0)  # not the default, so the test sees the learned value used
    x = torch.randn(2, 5, 32)
    q, k, v = attn.qkv(x).view(2, 5, 3, 4, 8).unbind(2)  # (B, N, H, D)
    scores = torch.einsum("bnhd,bmhd->bhnm", q, k) * torch.exp(torch.tensor(-1.0))
    scores = scores.masked_fill(torch.eye(5, dtype=torch.bool), float("-inf"))
    o = torch.einsum("bhnm,bmhd->bnhd", scores.softmax(-1), v).reshape(2, 5, 32)
    want = attn.proj(o)
    got = attn(x)
    assert torch.allclose(got, want, atol=1e-5)
    got.sum().backward()
    assert attn.log_scale.grad is not None and attn.log_scale.grad.abs() > 0
    attn.impl = "sdpa"
    assert torch.allclose(attn(x), want, atol=1e-5)
    with torch.no_grad():
        flash = vm.Attention(32, 4, True, 0.0, "flash", locality=True).half()
        flash.load_state_dict(attn.state_dict())
        assert (flash(x.half()).float() - want).abs().max() < 2e-2


def test_locality_attention_model_refuses_timm_export_and_bad_values():
    model = build_model("vit_micro_patch4_32", num_classes=10, locality_attention=True)
    assert all(blk.attn.locality for blk in model.blocks)
    assert {k for k in model.state_dict() if "log_scale" in k} == {f"blocks.{i}.attn.log_scale" for i in range(4)}
    assert "blocks.0.attn.log_scale" not in build_model("vit_micro_patch4_32").state_dict()
    with pytest.raises(ValueError, match="locality self-attention.*cannot be exported to timm"):
        timm_args(model)
    with pytest.raises(ValueError, match="locality_attention='yes' is not True or False"):
        build_model("vit_micro_patch4_32", locality_attention="yes")


def _qk_vo(model: VisionTransformer, block: int) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Per head W_q^h W_k^h^T, and the layer's W_v W_o, in the x @ W convention (float64)."""
    attn = model.blocks[block].attn
    C, D = attn.qkv.in_features, attn.head_dim
    w = attn.qkv.weight.double()
    wq, wk, wv = w[:C].T, w[C:2 * C].T, w[2 * C:].T
    qk = [wq[:, h * D:(h + 1) * D] @ wk[:, h * D:(h + 1) * D].T for h in range(attn.num_heads)]
    return qk, wv @ attn.proj.weight.double().T


def test_mimetic_init_draws_near_identity_query_key_and_negative_value_projection():
    """Trockman and Kolter's structure: each head's W_q W_k^T is a rank-head_dim matrix whose
    diagonal stands out (a token scores tokens like itself highest), the layer's W_v W_o is
    -0.4 I plus N(0, 0.4^2/d) noise, its singular directions handed to the heads largest
    first; timm's default init has neither."""
    torch.manual_seed(0)
    mimetic = build_model("vit_tiny_h12_patch4_32", attn_init="mimetic", num_classes=10)
    torch.manual_seed(0)
    default = build_model("vit_tiny_h12_patch4_32", num_classes=10)
    C = 192
    for block in (0, 8):
        qk, vo = _qk_vo(mimetic, block)
        for p in qk:
            assert torch.linalg.matrix_rank(p).item() == 16
            off = p - torch.diag(p.diag())
            assert p.diag().mean() > 3 * off.abs().mean()
        noise = vo + 0.4 * torch.eye(C, dtype=torch.float64)
        assert abs(vo.diag().mean().item() + 0.4) < 0.02
        assert abs(noise.std().item() / (0.4 / C**0.5) - 1) < 0.1
        qk0, vo0 = _qk_vo(default, block)
        assert abs(qk0[0].diag().mean().item()) < 3 * (qk0[0] - torch.diag(qk0[0].diag())).abs().mean()
        assert abs(vo0.diag().mean().item()) < 0.01
    # the value-projection directions go to the heads largest first, as an SVD lists them
    attn = mimetic.blocks[0].attn
    wv, wo = attn.qkv.weight[2 * C:].T, attn.proj.weight.T
    norms = [torch.linalg.matrix_norm(wv[:, h * 16:(h + 1) * 16] @ wo[h * 16:(h + 1) * 16]).item() for h in range(12)]
    assert norms == sorted(norms, reverse=True)
    # biases, norms and everything outside attention keep the default init
    assert torch.equal(mimetic.blocks[0].attn.qkv.bias, torch.zeros(3 * C))
    assert mimetic.blocks[0].mlp.fc1.weight.std().item() == pytest.approx(0.02, rel=0.1)


@pytest.mark.parametrize("k", [16, 64])
def test_mimetic_split_is_the_best_rank_k_approximation(k):
    """The factors mimetic init writes multiply to the truncated SVD of the drawn matrix (the
    best rank-k approximation), and for k = the width to the matrix itself."""
    torch.manual_seed(0)
    a = 0.4 * torch.randn(64, 64, dtype=torch.float64) / 8 - 0.4 * torch.eye(64, dtype=torch.float64)
    left, right = vm._split_top(a, k)
    u, s, vt = torch.linalg.svd(a)
    best = (u[:, :k] * s[:k]) @ vt[:k]
    torch.testing.assert_close((left @ right.T).double(), best, atol=2e-5, rtol=0)
    assert left.shape == right.shape == (64, k)


def test_mimetic_init_makes_tokens_attend_to_tokens_like_themselves():
    """What the structure is for: for 65 random layer-normed tokens, each token's own score is
    its row's largest in most rows (about 88% over three seeds), where the default init is at
    chance (1 in 65). The same seed draws the same weights."""
    def self_is_top(model: VisionTransformer) -> float:
        attn = model.blocks[0].attn
        x = model.blocks[0].norm1(torch.randn(1, 65, 192))
        q, k, _ = attn.qkv(x).view(1, 65, 3, 12, 16).unbind(2)
        scores = torch.einsum("bnhd,bmhd->bhnm", q, k)
        return (scores.argmax(-1) == torch.arange(65)).float().mean().item()

    torch.manual_seed(1)
    mimetic = build_model("vit_tiny_h12_patch4_32", attn_init="mimetic", num_classes=10)
    torch.manual_seed(1)
    again = build_model("vit_tiny_h12_patch4_32", attn_init="mimetic", num_classes=10)
    torch.manual_seed(1)
    default = build_model("vit_tiny_h12_patch4_32", num_classes=10)
    with torch.no_grad():
        assert self_is_top(mimetic) > 0.5
        assert self_is_top(default) < 0.2
    assert all(torch.equal(a, b) for a, b in zip(mimetic.state_dict().values(), again.state_dict().values()))


def test_mimetic_init_with_locality_attention_trains_and_bad_values():
    model = build_model("vit_micro_patch4_32", attn_init="mimetic", locality_attention=True, num_classes=10)
    model(torch.randn(2, 3, 32, 32)).sum().backward()
    assert all(p.grad is not None for p in model.parameters())
    with pytest.raises(ValueError, match="attn_init='xavier': choose one of default, mimetic"):
        build_model("vit_micro_patch4_32", attn_init="xavier")


def test_position_dropout_is_its_own_rate_as_in_timm():
    """pos_drop_rate drops the embedded tokens, as timm's; proj_drop_rate stays in the blocks."""
    model = build_model("vit_micro_patch4_32", proj_drop_rate=0.25)
    assert model.pos_drop.p == 0.0 and model.blocks[0].mlp.drop.p == 0.25
    assert build_model("vit_micro_patch4_32", pos_drop_rate=0.1).pos_drop.p == 0.1
    with pytest.raises(ValueError, match="pos_drop_rate=1.5 is not in \\[0, 1\\)"):
        build_model("vit_micro_patch4_32", pos_drop_rate=1.5)


@pytest.mark.parametrize("locality", [False, True])
def test_attention_probs_are_the_weights_every_path_applies(locality):
    """VisionTransformer.attention_probs: each block's (B, H, N, N) weights, computed from the
    tokens that reach its attention; times v they give the attention output (naive's)."""
    torch.manual_seed(0)
    model = build_model("vit_micro_patch4_32", num_classes=10, depth=2, attention="naive",
                        locality_attention=locality).eval()
    x = torch.randn(2, 3, 32, 32)
    probs = model.attention_probs(x)
    assert len(probs) == 2 and probs[0].shape == (2, model.blocks[0].attn.num_heads, 65, 65)
    for p in probs:
        torch.testing.assert_close(p.sum(-1), torch.ones(p.shape[:-1]))
    if locality:  # no token attends to itself
        assert probs[0].diagonal(dim1=-2, dim2=-1).abs().max() == 0
    # block 0's tokens, as forward_features makes them: its output is these weights times v
    tokens = model.pos_drop(torch.cat([model.cls_token.expand(2, -1, -1), model.patch_embed(x)], 1) + model.pos_embed)
    attn = model.blocks[0].attn
    normed = model.blocks[0].norm1(tokens)
    qkv, _ = attn._qkv(normed)
    expected = (probs[0] @ qkv[:, :, 2].transpose(1, 2)).transpose(1, 2).reshape(2, 65, -1)
    with torch.no_grad():
        torch.testing.assert_close(attn.proj(expected), attn(normed), atol=1e-5, rtol=1e-5)
