"""The Vision Transformer (Dosovitskiy et al., arXiv 2010.11929), read top to bottom.

    image (B, C, H, W) -> PatchEmbed -> [cls token] + pos embed -> Block x depth -> norm
    -> pool (class token, or mean of the patch tokens + fc_norm) -> head -> logits (B, classes)

Every Attention sends the views of its fused qkv projection to the one attention dispatch,
`vitflash.ops.attention_qkvpacked`, on the path the model was built with ("flash", "naive"
or "sdpa"); `model.set_attention(...)` switches all blocks of a built model, so one set of
weights runs on every path.

Parameter names and shapes are those of timm's `VisionTransformer`, so a timm state dict
loads with `strict=True`; `vitflash/pretrained.py` is the one place that knows timm's files.

Presets (`list_models()`); the first nine are timm's architectures under timm's names, the
`_patch4_32` ones are for 32x32 images (CIFAR). Regenerate the table with
`python -m vitflash.model`.

    name                     img  patch  dim  depth  heads  head_dim  pool  params (1000 classes)  (10 classes)
    vit_tiny_patch16_224      224     16  192     12      3        64  token              5,717,416     5,526,346
    vit_small_patch16_224     224     16  384     12      6        64  token             22,050,664    21,669,514
    vit_base_patch16_224      224     16  768     12     12        64  token             86,567,656    85,806,346
    vit_large_patch16_224     224     16 1024     24     16        64  token            304,326,632   303,311,882
    vit_base_patch16_384      384     16  768     12     12        64  token             86,859,496    86,098,186
    vit_base_patch32_224      224     32  768     12     12        64  token             88,224,232    87,462,922
    deit_tiny_patch16_224     224     16  192     12      3        64  token              5,717,416     5,526,346
    deit_small_patch16_224    224     16  384     12      6        64  token             22,050,664    21,669,514
    deit_base_patch16_224     224     16  768     12     12        64  token             86,567,656    85,806,346
    vit_micro_patch4_32        32      4  128      4      4        32  token                937,064       809,354
    vit_tiny_patch4_32         32      4  192      9      3        64  token              4,219,240     4,028,170
    vit_small_patch4_32        32      4  384     12      6        64  token             21,723,496    21,342,346
    vit_tiny_h12_patch4_32     32      4  192      9     12        16  token              2,888,680     2,697,610
    vit_wide_h16_patch4_32     32      4  256      9     16        16  token              5,030,888     4,776,458
    vit_lite7_patch4_32        32      4  256      7      4        64  token              3,976,680     3,722,250

"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.layers import DropPath
from torch.utils.checkpoint import checkpoint

from vitflash.ops import attention_probs, attention_qkvpacked, check_attention_impl


class PatchEmbed(nn.Module):
    """Cut the image into non-overlapping patch_size x patch_size patches and project each to
    embed_dim: one strided convolution."""

    def __init__(self, img_size: int, patch_size: int, in_chans: int, embed_dim: int):
        super().__init__()
        if img_size % patch_size != 0:
            raise ValueError(
                f"image size {img_size} is not divisible by patch size {patch_size}: pick an "
                f"img_size that is a multiple of {patch_size} (e.g. "
                f"{max(1, round(img_size / patch_size)) * patch_size})"
            )
        self.img_size = (img_size, img_size)
        self.patch_size = (patch_size, patch_size)
        self.grid_size = (img_size // patch_size, img_size // patch_size)
        self.num_patches = self.grid_size[0] * self.grid_size[1]
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=patch_size, stride=patch_size)

    def check_size(self, x: torch.Tensor) -> None:
        H, W = x.shape[-2:]
        if (H, W) != self.img_size:
            raise ValueError(
                f"input image is {H}x{W} but this model was built for "
                f"{self.img_size[0]}x{self.img_size[1]}: resize the input, or build the "
                f"model with img_size={H} (position embeddings are resampled when loading)"
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.check_size(x)
        x = self.proj(x)  # (B, C, H/p, W/p)
        return x.flatten(2).transpose(1, 2)  # (B, N, C), N = H/p * W/p


class ShiftedPatchEmbed(PatchEmbed):
    """Shifted patch tokenization (Lee et al., "Vision Transformer for Small-Size Datasets",
    arXiv 2112.13492): the image and four copies of it shifted by half a patch along the
    diagonals (zeros where a copy moved away) are stacked on the channels, cut into the
    same patches, and each patch vector (5 x in_chans x p x p values) is layer-normed and
    projected. A token then sees the borders of its neighbours' patches as well as its own,
    which helps ViTs that train on small datasets. Still one linear map per patch, no
    convolution; timm's ViT has no such layer, so these models do not export to timm."""

    SHIFTS = ((-1, -1), (-1, 1), (1, -1), (1, 1))  # (rows, columns), in half patches

    def __init__(self, img_size: int, patch_size: int, in_chans: int, embed_dim: int):
        super().__init__(img_size, patch_size, in_chans, embed_dim)
        if patch_size < 2:
            raise ValueError("shifted patches need patch_size >= 2 (a shift of half a patch); "
                             "use the plain patch embedding (shifted_patches=False)")
        patch_dim = (1 + len(self.SHIFTS)) * in_chans * patch_size * patch_size
        self.norm = nn.LayerNorm(patch_dim, eps=1e-6)
        self.proj = nn.Linear(patch_dim, embed_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.check_size(x)
        B, C, H, W = x.shape
        p, s = self.patch_size[0], self.patch_size[0] // 2
        padded = F.pad(x, (s, s, s, s))  # (B, C, H + 2s, W + 2s)
        # copy (dy, dx) holds x[i + dy*s, j + dx*s] at (i, j): the image moved by -(dy, dx)*s
        views = [x] + [padded[:, :, s + dy * s: s + dy * s + H, s + dx * s: s + dx * s + W]
                       for dy, dx in self.SHIFTS]
        x = torch.cat(views, dim=1)  # (B, 5C, H, W)
        gh, gw = self.grid_size
        x = x.view(B, x.shape[1], gh, p, gw, p).permute(0, 2, 4, 1, 3, 5)  # (B, H/p, W/p, 5C, p, p)
        return self.proj(self.norm(x.reshape(B, gh * gw, -1)))  # (B, N, embed_dim)


class Attention(nn.Module):
    """Multi-head self-attention. q, k and v stay views of one fused projection.

    locality: locality self-attention (Lee et al., arXiv 2112.13492): no token attends to
    itself (the attention op's mask_diagonal) and the softmax scale is learned, one per
    layer, from 1/sqrt(head_dim) (`log_scale`, its logarithm). The learned scale multiplies
    the q rows of the fused projection's weights, so every attention path runs it with a
    plain scale of 1."""

    def __init__(self, dim: int, num_heads: int, qkv_bias: bool, proj_drop: float, impl: str,
                 attn_drop: float = 0.0, locality: bool = False):
        super().__init__()
        if dim % num_heads != 0:
            raise ValueError(f"embed_dim {dim} is not divisible by num_heads {num_heads}")
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.impl = impl  # validated by VisionTransformer.set_attention
        self.qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)
        self.attn_drop = attn_drop  # dropout of the attention weights, inside the attention op
        self.locality = locality
        if locality:
            # shape (1,), not a scalar: FSDP refuses 0-d parameters
            self.log_scale = nn.Parameter(torch.full((1,), -0.5 * math.log(self.head_dim)))

    def _qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, dict]:
        """(B, N, C) tokens -> the (B, N, 3, H, D) fused projection and the attention op's
        locality arguments."""
        B, N, C = x.shape
        if not self.locality:
            return self.qkv(x).view(B, N, 3, self.num_heads, self.head_dim), {}
        # q = (x W_q^T + b_q) * exp(log_scale): the learned scale on q's rows
        scale, w, b = self.log_scale.exp(), self.qkv.weight, self.qkv.bias
        w = torch.cat([w[:C] * scale, w[C:]])  # (3C, C)
        b = torch.cat([b[:C] * scale, b[C:]]) if b is not None else None
        qkv = F.linear(x, w, b).view(B, N, 3, self.num_heads, self.head_dim)
        return qkv, dict(softmax_scale=1.0, mask_diagonal=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, N, C = x.shape
        drop = self.attn_drop if self.training else 0.0
        qkv, locality = self._qkv(x)  # (B, N, 3, H, D)
        o = attention_qkvpacked(qkv, self.impl, dropout_p=drop, **locality)  # (B, N, H, D), contiguous
        return self.proj_drop(self.proj(o.reshape(B, N, C)))  # (B, N, C)

    def probs(self, x: torch.Tensor) -> torch.Tensor:
        """The attention weights this module applies to tokens `x` (B, N, C): (B, H, N, N),
        whichever path it runs (they are the same weights; only naive writes them out)."""
        qkv, locality = self._qkv(x)
        q, k, _ = qkv.unbind(2)
        return attention_probs(q, k, **locality)


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden_dim: int, drop: float):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden_dim)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden_dim, dim)
        self.drop = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.fc2(self.drop(self.act(self.fc1(x)))))


class LayerScale(nn.Module):
    """Per-channel scale of a residual branch (CaiT, arXiv 2103.17239), started small."""

    def __init__(self, dim: int, init_values: float):
        super().__init__()
        self.gamma = nn.Parameter(torch.full((dim,), float(init_values)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma


class Block(nn.Module):
    """Pre-norm transformer block: two residual lines."""

    def __init__(
        self,
        dim: int,
        num_heads: int,
        mlp_ratio: float,
        qkv_bias: bool,
        init_values: float | None,
        proj_drop: float,
        drop_path: float,
        impl: str,
        attn_drop: float = 0.0,
        locality: bool = False,
    ):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = Attention(dim, num_heads, qkv_bias, proj_drop, impl, attn_drop, locality)
        self.ls1 = LayerScale(dim, init_values) if init_values is not None else nn.Identity()
        self.drop_path1 = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), proj_drop)
        self.ls2 = LayerScale(dim, init_values) if init_values is not None else nn.Identity()
        self.drop_path2 = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop_path1(self.ls1(self.attn(self.norm1(x))))
        x = x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))
        return x


def _check_sizes(**values) -> None:
    """Raise a ValueError for a size or rate no ViT can have, before anything is built
    (num_classes=-1 would silently build a head-less model; img_size=0 fails only in forward)."""
    for name, value in values.items():
        if name.endswith("rate"):
            ok, want = isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < 1, "in [0, 1)"
        elif name == "mlp_ratio":
            ok, want = isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0, "a number > 0"
        else:
            least = 0 if name == "num_classes" else 1
            ok, want = isinstance(value, int) and not isinstance(value, bool) and value >= least, f"a whole number >= {least}"
        if not ok:
            hint = " (0 leaves the head out)" if name == "num_classes" else ""
            raise ValueError(f"{name}={value!r} is not {want}{hint}: pass a valid {name}, or leave it out to "
                             f"keep the preset's value")


class VisionTransformer(nn.Module):
    """A ViT classifier with timm's parameter names.

    Args:
        img_size: side of the square input image; must be a multiple of patch_size.
        patch_size: side of a square patch.
        in_chans: input channels.
        num_classes: classifier outputs; 0 leaves the head out (forward returns features).
        embed_dim, depth, num_heads, mlp_ratio, qkv_bias: the transformer's shape.
        init_values: layer scale start value (e.g. 1e-5), None for no layer scale.
        class_token: prepend a learned class token.
        global_pool: "token" (class token) or "avg" (mean of the patch tokens).
        fc_norm: norm after pooling instead of before it; None means "avg" pooling gets it,
            as in timm.
        drop_rate: dropout before the head. pos_drop_rate: dropout of the embedded tokens
            (with their position embedding), as timm's. proj_drop_rate: dropout after the
            attention projection and in the MLP. drop_path_rate: stochastic depth, rising linearly to
            this value over the blocks. attn_drop_rate: dropout of the attention weights
            in training, done inside each attention path (the flash kernels regenerate
            its mask in the backward).
        attention: "flash", "naive" or "sdpa".
        shifted_patches: tokenize with ShiftedPatchEmbed (a layer-normed linear map of each
            patch and its half-patch diagonal shifts) instead of the one strided
            convolution; such a model has no timm equivalent and does not export to timm.
        locality_attention: locality self-attention in every block (see Attention): no token
            attends to itself, and each layer learns its softmax scale. Together with
            shifted_patches this is Lee et al.'s recipe for ViTs on small datasets. No timm
            equivalent either.
        attn_init: "default" (timm's truncated normal, as every other linear layer) or
            "mimetic": each attention layer's weights drawn so that the query-key product
            starts near the identity and the value-projection product near minus the identity
            (`mimetic_init_`).
    """

    def __init__(
        self,
        *,
        img_size: int = 224,
        patch_size: int = 16,
        in_chans: int = 3,
        num_classes: int = 1000,
        embed_dim: int = 768,
        depth: int = 12,
        num_heads: int = 12,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        init_values: float | None = None,
        class_token: bool = True,
        global_pool: str = "token",
        fc_norm: bool | None = None,
        drop_rate: float = 0.0,
        pos_drop_rate: float = 0.0,
        proj_drop_rate: float = 0.0,
        drop_path_rate: float = 0.0,
        attn_drop_rate: float = 0.0,
        attention: str = "sdpa",
        shifted_patches: bool = False,
        locality_attention: bool = False,
        attn_init: str = "default",
    ):
        super().__init__()
        _check_sizes(img_size=img_size, patch_size=patch_size, in_chans=in_chans, embed_dim=embed_dim,
                     depth=depth, num_heads=num_heads, num_classes=num_classes, mlp_ratio=mlp_ratio,
                     drop_rate=drop_rate, pos_drop_rate=pos_drop_rate, proj_drop_rate=proj_drop_rate,
                     drop_path_rate=drop_path_rate, attn_drop_rate=attn_drop_rate)
        for name, flag in (("shifted_patches", shifted_patches), ("locality_attention", locality_attention)):
            if not isinstance(flag, bool):
                raise ValueError(f"{name}={flag!r} is not True or False")
        if global_pool not in ("token", "avg"):
            raise ValueError(f"global_pool must be 'token' or 'avg', got {global_pool!r}")
        if attn_init not in ATTN_INITS:
            raise ValueError(f"attn_init={attn_init!r}: choose one of {', '.join(ATTN_INITS)}")
        if global_pool == "token" and not class_token:
            raise ValueError("global_pool='token' needs class_token=True; use global_pool='avg'")
        check_attention_impl(attention, embed_dim // num_heads)
        use_fc_norm = global_pool == "avg" if fc_norm is None else fc_norm
        # The architecture as built; vitflash.pretrained turns it into timm's arguments
        # (shifted patches and locality attention aside: timm has neither).
        self.config = dict(
            img_size=img_size, patch_size=patch_size, in_chans=in_chans,
            num_classes=num_classes, embed_dim=embed_dim, depth=depth, num_heads=num_heads,
            mlp_ratio=mlp_ratio, qkv_bias=qkv_bias, init_values=init_values,
            class_token=class_token, global_pool=global_pool, fc_norm=use_fc_norm,
        )  # fmt: skip
        self.preset: str | None = None  # set by build_model
        self.num_classes = num_classes
        self.in_chans = in_chans
        self.global_pool = global_pool
        self.embed_dim = self.num_features = embed_dim
        self.num_prefix_tokens = 1 if class_token else 0
        self.no_embed_class = False  # pos_embed covers the class token too (timm's default)

        self.shifted_patches, self.locality_attention = shifted_patches, locality_attention
        embed = ShiftedPatchEmbed if shifted_patches else PatchEmbed
        self.patch_embed = embed(img_size, patch_size, in_chans, embed_dim)
        num_tokens = self.patch_embed.num_patches + self.num_prefix_tokens
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim)) if class_token else None
        self.pos_embed = nn.Parameter(torch.zeros(1, num_tokens, embed_dim))
        self.pos_drop = nn.Dropout(pos_drop_rate)
        dpr = [drop_path_rate * i / max(depth - 1, 1) for i in range(depth)]
        self.blocks = nn.Sequential(*[
            Block(embed_dim, num_heads, mlp_ratio, qkv_bias, init_values, proj_drop_rate,
                  dpr[i], attention, attn_drop_rate, locality_attention)
            for i in range(depth)
        ])  # fmt: skip
        # With fc_norm the final norm moves after pooling, as in timm (and MAE/BEiT).
        self.norm = nn.LayerNorm(embed_dim, eps=1e-6) if not use_fc_norm else nn.Identity()
        self.fc_norm = nn.LayerNorm(embed_dim, eps=1e-6) if use_fc_norm else nn.Identity()
        self.head_drop = nn.Dropout(drop_rate)
        self.head = nn.Linear(embed_dim, num_classes) if num_classes > 0 else nn.Identity()
        self.grad_checkpointing = False  # set_grad_checkpointing
        self.init_weights()
        if attn_init == "mimetic":
            mimetic_init_(self)

    @torch.no_grad()
    def init_weights(self) -> None:
        """timm's default ViT init: truncated normal(0.02) linears and position embedding,
        a near-zero class token; convolution, norms and layer scale keep their own init."""
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        if self.cls_token is not None:
            nn.init.normal_(self.cls_token, std=1e-6)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)

    @property
    def attention(self) -> str:
        """The attention path every block runs: "flash", "naive" or "sdpa"."""
        impls = {blk.attn.impl for blk in self.blocks}
        return impls.pop() if len(impls) == 1 else ",".join(sorted(impls))

    def set_attention(self, impl: str) -> VisionTransformer:
        """Switch every block to attention path `impl`; returns the model."""
        check_attention_impl(impl, self.embed_dim // self.config["num_heads"])
        for blk in self.blocks:
            blk.attn.impl = impl
        return self

    def set_grad_checkpointing(self, enable: bool = True) -> VisionTransformer:
        """Activation checkpointing (timm's name and signature for it): while gradients are
        recorded, each block keeps only its input for the backward and runs its forward again
        there, so what the backward holds falls from every block's activations to the blocks'
        inputs and one block's activations, at the cost of a second forward of every block.
        Dropout, stochastic depth and the flash kernels' dropout draw the same masks in the
        rerun (torch's RNG state is restored for it). Returns the model."""
        if not isinstance(enable, bool):
            raise ValueError(f"grad_checkpointing={enable!r} is not True or False")
        self.grad_checkpointing = enable
        return self

    def no_weight_decay(self) -> set[str]:
        """Parameters to keep out of weight decay (timm's optimizer helpers ask for this)."""
        return {"pos_embed", "cls_token"}

    def group_matcher(self, coarse: bool = False) -> dict:
        """Parameter groups by depth for timm's layer-wise LR decay: embeddings first, then
        one group per block, then the final norm and head."""
        return dict(stem=r"^cls_token|pos_embed|patch_embed",
                    blocks=[(r"^blocks\.(\d+)", None), (r"^norm", (99999,))])  # fmt: skip

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) images -> (B, prefix + N, embed_dim) normed tokens."""
        x = self.patch_embed(x)  # (B, N, C)
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)  # (B, 1+N, C)
        x = self.pos_drop(x + self.pos_embed)
        if self.grad_checkpointing and torch.is_grad_enabled():
            for block in self.blocks:
                x = checkpoint(block, x, use_reentrant=False)
        else:
            x = self.blocks(x)
        return self.norm(x)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """(B, prefix + N, embed_dim) tokens -> (B, num_classes) logits, or the (B, embed_dim)
        pooled features when pre_logits."""
        if self.global_pool == "avg":
            x = x[:, self.num_prefix_tokens :].mean(dim=1)  # (B, C)
        else:
            x = x[:, 0]  # (B, C), the class token
        x = self.head_drop(self.fc_norm(x))
        return x if pre_logits else self.head(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))

    @torch.no_grad()
    def attention_probs(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Every block's attention weights for images `x` (B, C, H, W): a list of (B, H, N, N),
        first block first, N = prefix + patch tokens. One forward, each block's weights computed
        from the tokens that reach its attention."""
        found: list[torch.Tensor] = []
        hooks = [block.attn.register_forward_pre_hook(lambda m, args: found.append(m.probs(args[0])))
                 for block in self.blocks]
        try:
            self.forward_features(x)
        finally:
            for hook in hooks:
                hook.remove()
        return found


ATTN_INITS = ("default", "mimetic")


def _split_top(a: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """U_k S_k^1/2 and V_k S_k^1/2 of the top k singular triplets of square `a`, largest first,
    whose product U_k S_k V_k^T is a's best rank-k approximation (all of a for k = its size).
    Found as the top eigenvectors of a^T a in float32: several times faster than a full SVD,
    and exact to float32's rounding, ample for an init. The order matters: in W_v W_o head h
    takes the h-th block of D singular directions."""
    a = a.float()
    s2, v = torch.linalg.eigh(a.T @ a)  # ascending: take the last k, largest first as an SVD lists them
    v, root = v[:, -k:].flip(-1), s2[-k:].flip(-1).clamp_min(0).sqrt().sqrt()  # (C, k), S_k^1/2
    return a @ v / root, v * root


@torch.no_grad()
def mimetic_init_(model: VisionTransformer, qk: tuple[float, float] = (0.7, 0.7),
                  vo: tuple[float, float] = (0.4, 0.4)) -> VisionTransformer:
    """Mimetic initialization (Trockman and Kolter, "Mimetic Initialization of Self-Attention
    Layers", arXiv 2305.09828), in place; returns the model.

    Trained ViTs have query-key products W_q W_k^T near a positive multiple of the identity
    (a token attends to tokens like itself, which the position embedding makes its
    neighbours) and value-projection products W_v W_o near a negative multiple. Drawing the
    weights that way lets a ViT trained from scratch on a small dataset start from that
    structure instead of learning it. With d the width, k the head dim and Z a d x d matrix
    of N(0, 1/d) entries:

    - each head h: W_q^h W_k^h^T is the best rank-k approximation of a qk[0] Z_h + qk[1] I
      (its own Z_h), split by its top k singular triplets U_k S_k V_k^T as
      W_q^h = U_k S_k^1/2, W_k^h = V_k S_k^1/2;
    - each layer: W_v W_o, summed over the heads, is vo[0] Z - vo[1] I exactly, split the
      same way with the heads taking consecutive blocks of the singular vectors.

    Here x W means x @ W: the weights of `qkv` and `proj` (out x in) hold the transposes.
    Biases keep their zeros. Draws from torch's default generator, so a seeded run draws the
    same weights. The learned softmax scale of locality attention multiplies the query as
    before."""
    for blk in model.blocks:
        attn = blk.attn
        C, H, D = attn.qkv.in_features, attn.num_heads, attn.head_dim
        w = attn.qkv.weight  # (3C, C): rows q, k, v, each head's rows a block of D
        eye = torch.eye(C, dtype=torch.float64)
        for h in range(H):
            a = qk[0] * torch.randn(C, C, dtype=torch.float64) / math.sqrt(C) + qk[1] * eye
            u_root, v_root = _split_top(a, D)
            w[h * D:(h + 1) * D].copy_(u_root.T)  # W_q^h^T: (D, C)
            w[C + h * D:C + (h + 1) * D].copy_(v_root.T)  # W_k^h^T
        a = vo[0] * torch.randn(C, C, dtype=torch.float64) / math.sqrt(C) - vo[1] * eye
        u_root, v_root = _split_top(a, C)
        w[2 * C:].copy_(u_root.T)  # W_v^T (C, C): head h's rows pair with W_o's columns h
        attn.proj.weight.copy_(v_root)  # W_o^T: (C out, C in), so W_o = v_root^T
    return model


# Presets: VisionTransformer keyword arguments under timm's names where timm has the model.
_TI = dict(embed_dim=192, depth=12, num_heads=3)
_S = dict(embed_dim=384, depth=12, num_heads=6)
_B = dict(embed_dim=768, depth=12, num_heads=12)
PRESETS: dict[str, dict] = {
    "vit_tiny_patch16_224": dict(img_size=224, patch_size=16, **_TI),
    "vit_small_patch16_224": dict(img_size=224, patch_size=16, **_S),
    "vit_base_patch16_224": dict(img_size=224, patch_size=16, **_B),
    "vit_large_patch16_224": dict(img_size=224, patch_size=16, embed_dim=1024, depth=24,
                                  num_heads=16),
    "vit_base_patch16_384": dict(img_size=384, patch_size=16, **_B),
    "vit_base_patch32_224": dict(img_size=224, patch_size=32, **_B),
    # DeiT (arXiv 2012.12877) is the ViT architecture trained differently; the names let
    # its weights be fetched by tag.
    "deit_tiny_patch16_224": dict(img_size=224, patch_size=16, **_TI),
    "deit_small_patch16_224": dict(img_size=224, patch_size=16, **_S),
    "deit_base_patch16_224": dict(img_size=224, patch_size=16, **_B),
    # 32x32 inputs, 4x4 patches: 64 patch tokens + the class token.
    "vit_micro_patch4_32": dict(img_size=32, patch_size=4, embed_dim=128, depth=4, num_heads=4),
    "vit_tiny_patch4_32": dict(img_size=32, patch_size=4, embed_dim=192, depth=9, num_heads=3),
    "vit_small_patch4_32": dict(img_size=32, patch_size=4, embed_dim=384, depth=12,
                                num_heads=6),
    # vit_tiny_patch4_32's width and depth with 12 heads of 16 and an MLP ratio of 2: the
    # baseline ViT of "Vision Transformer for Small-Size Datasets" (Lee et al., arXiv
    # 2112.13492), which on CIFAR-10 trains to a higher accuracy than fewer, wider heads
    "vit_tiny_h12_patch4_32": dict(img_size=32, patch_size=4, embed_dim=192, depth=9,
                                   num_heads=12, mlp_ratio=2.0),
    # vit_tiny_h12_patch4_32 at width 256: 9 blocks, 16 heads of 16, an MLP ratio of 2 (1.8x
    # the parameters); the wider model tried for cifar10_vit_h12_10min's plateau, where it
    # ended 0.8 pt below the h12 model in the same time (README, Results)
    "vit_wide_h16_patch4_32": dict(img_size=32, patch_size=4, embed_dim=256, depth=9,
                                   num_heads=16, mlp_ratio=2.0),
    # 7 blocks of width 256, 4 heads of 64, an MLP ratio of 2: ViT-Lite-7/4 of "Escaping the
    # Big Data Paradigm with Compact Transformers" (Hassani et al., arXiv 2104.05704), the
    # plain ViT of that paper's CIFAR tables
    "vit_lite7_patch4_32": dict(img_size=32, patch_size=4, embed_dim=256, depth=7, num_heads=4,
                                mlp_ratio=2.0),
}  # fmt: skip


def list_models() -> list[str]:
    """Names of the presets, in the order of the table in this module's docstring."""
    return list(PRESETS)


def preset_kwargs(name: str) -> dict:
    """A copy of the VisionTransformer keyword arguments of preset `name`."""
    if name not in PRESETS:
        raise ValueError(f"unknown model {name!r}: choose one of {', '.join(PRESETS)}")
    return dict(PRESETS[name])


def build_model(name: str, attention: str = "sdpa", **overrides) -> VisionTransformer:
    """A randomly initialised preset; `overrides` are VisionTransformer keyword arguments
    (num_classes=10, img_size=64, depth=2, drop_path_rate=0.1, ...). For pretrained weights
    use `vitflash.create_model`."""
    kwargs = preset_kwargs(name)
    kwargs.update(overrides)
    model = VisionTransformer(attention=attention, **kwargs)
    model.preset = name
    return model


def _table() -> str:
    """The preset table of the module docstring, parameters counted on the meta device."""
    rows = ["name                     img  patch  dim  depth  heads  head_dim  pool  "
            "params (1000 classes)  (10 classes)"]  # fmt: skip
    for name in PRESETS:
        with torch.device("meta"):  # count parameters without allocating them
            counts = [sum(p.numel() for p in build_model(name, num_classes=k).parameters())
                      for k in (1000, 10)]  # fmt: skip
        c = preset_kwargs(name)
        rows.append(
            f"{name:<24} {c['img_size']:>4} {c['patch_size']:>6} {c['embed_dim']:>4} "
            f"{c['depth']:>6} {c['num_heads']:>6} {c['embed_dim'] // c['num_heads']:>9}  "
            f"{c.get('global_pool', 'token'):<5} {counts[0]:>22,} {counts[1]:>13,}"
        )
    return "\n".join(rows)


if __name__ == "__main__":
    print(_table())
