"""Augmentation of uint8 image batches where they lie (the GPU), each sample drawing its own parameters.

    uint8 (B, H, W, 3) -> crop + flip -> float (B, 3, S, S) in [0, 1] -> RandAugment or color
    jitter -> normalize -> random erasing -> float32 (B, 3, S, S)

The recipe is `vitflash.data.Augment`'s, the one the cpu pipeline runs with timm and torchvision
on PIL images, here as batched tensor ops. Written by hand because the libraries lack it:
torchvision.transforms.v2 functionals take one parameter set per call (one crop box, one angle,
one brightness factor for the whole batch), timm's RandAugment works on PIL images and its
RandomErasing loops over the batch in Python, and kornia is not a dependency. Library code does
the work wherever it is batched: torchvision.ops.roi_align crops-and-resizes one box per sample,
v2 functionals give equalize and the greyscale that PIL's enhance ops blend with, and timm parses
the `auto_augment` string into its op list. Autocontrast and the sharpness blur are written here
because v2's versions cannot be captured into a CUDA graph (a boolean-mask assignment, which
waits on the device; a kernel built from a host list on every call).

Per-sample choices are `torch.where` masks or fixed slices of a shuffled batch (RandAugment),
so no shape depends on the data and nothing waits on the device (no host synchronisation per
batch). All random numbers come from the `torch.Generator` passed in, on the images' device.
"""
from __future__ import annotations

import itertools
import math
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as nnf
from torchvision.ops import roi_align
from torchvision.transforms.v2 import functional as TF

if TYPE_CHECKING:
    from vitflash.data import Augment


def _uniform(lo: float, hi: float, shape, g: torch.Generator) -> torch.Tensor:
    return lo + (hi - lo) * torch.rand(shape, generator=g, device=g.device)


def _first_valid(ok: torch.Tensor, *values: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Of (B, tries) candidates, each row's first valid one (row 0 where none is valid)."""
    first = ok.int().argmax(1, keepdim=True)  # argmax returns the first maximum
    return tuple(v.gather(1, first).squeeze(1) for v in values)


def _reflect(i: torch.Tensor, n: int) -> torch.Tensor:
    """Indices into a side of n pixels as padding_mode="reflect" reads them (edge not repeated)."""
    i = i.abs()
    return torch.where(i >= n, 2 * (n - 1) - i, i)


def pad_crop_flip(x: torch.Tensor, size: int, pad: int, hflip: float, g: torch.Generator) -> torch.Tensor:
    """torchvision's RandomCrop(size, padding=pad, padding_mode="reflect") + RandomHorizontalFlip.

    x (B, H, W, C) uint8 -> (B, size, size, C) uint8: one integer gather, no resampling.
    """
    B, H, W, _ = x.shape
    if pad >= min(H, W) or min(H, W) + 2 * pad < size:
        raise ValueError(f"a {size}px crop with padding {pad} does not fit images of {H}x{W}")
    dev = x.device
    top = torch.randint(0, H + 2 * pad - size + 1, (B, 1), generator=g, device=dev) - pad
    left = torch.randint(0, W + 2 * pad - size + 1, (B, 1), generator=g, device=dev) - pad
    ar = torch.arange(size, device=dev)
    flip = torch.rand(B, 1, generator=g, device=dev) < hflip
    rows = _reflect(top + ar, H)
    cols = _reflect(left + torch.where(flip, ar.flip(0), ar), W)
    return x[torch.arange(B, device=dev)[:, None, None], rows[:, :, None], cols[:, None, :]]


def rrc_boxes(B: int, H: int, W: int, scale, ratio, g: torch.Generator) -> torch.Tensor:
    """torchvision's RandomResizedCrop.get_params for B samples at once: 10 tries each, the first
    that fits, else the central crop of the clamped aspect ratio. Returns (B, 4) boxes x1, y1, x2, y2
    in pixels."""
    area = H * W
    target = area * _uniform(scale[0], scale[1], (B, 10), g)
    aspect = torch.exp(_uniform(math.log(ratio[0]), math.log(ratio[1]), (B, 10), g))
    w = torch.sqrt(target * aspect).round()
    h = torch.sqrt(target / aspect).round()
    ok = (w > 0) & (h > 0) & (w <= W) & (h <= H)
    w, h = _first_valid(ok, w, h)
    found = ok.any(1)
    # the fallback of torchvision, for all samples (the image size is one for the batch)
    in_ratio = W / H
    if in_ratio < min(ratio):
        fw, fh = W, round(W / min(ratio))
    elif in_ratio > max(ratio):
        fw, fh = round(H * max(ratio)), H
    else:
        fw, fh = W, H
    w = torch.where(found, w, torch.full_like(w, fw))
    h = torch.where(found, h, torch.full_like(h, fh))
    u = torch.rand(B, 2, generator=g, device=g.device)
    top = torch.where(found, (u[:, 0] * (H - h + 1)).floor(), torch.full_like(h, (H - fh) // 2))
    left = torch.where(found, (u[:, 1] * (W - w + 1)).floor(), torch.full_like(w, (W - fw) // 2))
    return torch.stack([left, top, left + w, top + h], 1)


def affine_grid(theta: torch.Tensor, H: int, W: int) -> torch.Tensor:
    """`nnf.affine_grid(theta, (b, C, H, W), align_corners=False)` as broadcast multiply-adds:
    theta (b, 2, 3) -> grid (b, H, W, 2). affine_grid runs a batched matrix product with an inner
    dimension of 3, which on the H200 took 0.2 ms per call, longer than the resampling itself."""
    xs = (2 * torch.arange(W, device=theta.device, dtype=theta.dtype) + 1) / W - 1  # pixel centres in [-1, 1]
    ys = (2 * torch.arange(H, device=theta.device, dtype=theta.dtype) + 1) / H - 1
    t = theta[:, :, :, None, None]  # (b, 2, 3, 1, 1)
    grid = t[:, :, 0] * xs.view(1, 1, 1, W) + t[:, :, 1] * ys.view(1, 1, H, 1) + t[:, :, 2]  # (b, 2, H, W)
    return grid.permute(0, 2, 3, 1)


def crop_resize(x: torch.Tensor, boxes: torch.Tensor, size: int, flip: torch.Tensor | None = None) -> torch.Tensor:
    """Crop box i of image i and resize it to size x size: x (B, C, H, W) float, boxes (B, 4)
    x1, y1, x2, y2 -> (B, C, size, size). Bilinear; a box larger than the output averages
    ceil(box/size)^2 samples per pixel (roi_align's adaptive sampling), which anti-aliases.
    Where no box can be larger than the output (images of at most size x size), roi_align
    takes one sample per pixel, and the same bilinear samples come from grid_sample, which is
    faster: on the H200 roi_align took 0.5 ms for a batch of 256 at 224 px, grid_sample 0.08 ms
    for about a third of such a batch (the geometric RandAugment ops, in the same profile).
    flip (B,) bool: mirror those crops left to right (in grid_sample's case by mirroring the
    sampling grid, which costs nothing)."""
    B, _, H, W = x.shape
    if H <= size and W <= size:
        b = boxes.to(x.dtype)
        # output pixel j samples the box at x1 + (j + 0.5) * w / size (pixel centres at k + 0.5),
        # in affine_grid's normalized coordinates: a scale and a shift per sample and axis
        sx, sy = (b[:, 2] - b[:, 0]) / W, (b[:, 3] - b[:, 1]) / H
        if flip is not None:  # output column j samples x2 - (j + 0.5) * w / size instead
            sx = torch.where(flip, -sx, sx)
        cx, cy = (b[:, 0] + b[:, 2]) / W - 1, (b[:, 1] + b[:, 3]) / H - 1
        zero = torch.zeros_like(sx)
        theta = torch.stack([sx, zero, cx, zero, sy, cy], 1).view(B, 2, 3)
        return nnf.grid_sample(x, affine_grid(theta, size, size), mode="bilinear", padding_mode="border",
                               align_corners=False)
    idx = torch.arange(len(boxes), device=x.device, dtype=boxes.dtype)[:, None]
    out = roi_align(x, torch.cat([idx, boxes.to(x.dtype)], 1), output_size=size, spatial_scale=1.0,
                    sampling_ratio=-1, aligned=True)
    return out if flip is None else torch.where(flip.view(-1, 1, 1, 1), out.flip(-1), out)


def random_erasing(x: torch.Tensor, prob: float, g: torch.Generator, min_area: float = 0.02,
                   max_area: float = 1 / 3, min_aspect: float = 0.3) -> torch.Tensor:
    """timm's RandomErasing(mode="pixel", max_count=1) per sample: with probability prob, a box
    of area in [min_area, max_area] of the image and log-uniform aspect is replaced by N(0, 1)
    noise. x (B, C, H, W) normalized -> same."""
    B, C, H, W = x.shape
    target = H * W * _uniform(min_area, max_area, (B, 10), g)
    aspect = torch.exp(_uniform(math.log(min_aspect), -math.log(min_aspect), (B, 10), g))
    h = torch.sqrt(target * aspect).round()
    w = torch.sqrt(target / aspect).round()
    ok = (w < W) & (h < H)
    h, w = _first_valid(ok, h, w)
    erase = (torch.rand(B, generator=g, device=x.device) < prob) & ok.any(1)
    u = torch.rand(B, 2, generator=g, device=x.device)
    top, left = (u[:, 0] * (H - h + 1)).floor(), (u[:, 1] * (W - w + 1)).floor()
    ys = torch.arange(H, device=x.device)
    xs = torch.arange(W, device=x.device)
    in_rows = (ys >= top[:, None]) & (ys < (top + h)[:, None])  # (B, H)
    in_cols = (xs >= left[:, None]) & (xs < (left + w)[:, None])  # (B, W)
    mask = erase[:, None, None] & in_rows[:, :, None] & in_cols[:, None, :]  # (B, H, W)
    noise = torch.randn(x.shape, generator=g, device=x.device, dtype=x.dtype)
    return torch.where(mask[:, None], noise, x)


def to_float(images: torch.Tensor) -> torch.Tensor:
    """uint8 (B, H, W, C) -> float32 (B, C, H, W) in [0, 1], contiguous (one multiply kernel
    converts, scales and transposes, so every batch has the strides of the cpu pipeline's)."""
    B, H, W, C = images.shape
    x = torch.empty((B, C, H, W), dtype=torch.float32, device=images.device)
    return torch.mul(images.permute(0, 3, 1, 2), 1 / 255, out=x)


def _blend(x: torch.Tensor, degenerate: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """PIL's ImageEnhance: degenerate + factor * (x - degenerate), factor (B,), clamped to [0, 1]
    (one lerp kernel, which extrapolates for factors above 1)."""
    return torch.lerp(degenerate, x, factor.view(-1, 1, 1, 1)).clamp_(0, 1)


def _brighten(x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """ImageEnhance.Brightness: the blend with black, x * factor clamped."""
    return (x * factor.view(-1, 1, 1, 1)).clamp_(0, 1)


def _contrast_mean(x: torch.Tensor) -> torch.Tensor:
    return TF.rgb_to_grayscale(x).mean((-3, -2, -1), keepdim=True)


def autocontrast(x: torch.Tensor) -> torch.Tensor:
    """PIL's ImageOps.autocontrast per image and channel (as v2's `autocontrast`): x (b, C, H, W)
    in [0, 1] stretched to span [0, 1]; a constant channel stays as it is."""
    lo, hi = x.amin((-2, -1), keepdim=True), x.amax((-2, -1), keepdim=True)
    flat = hi == lo
    return ((x - torch.where(flat, 0.0, lo)) / torch.where(flat, 1.0, hi - lo)).clamp_(0, 1)


_SMOOTH: dict[tuple, torch.Tensor] = {}


def smoothed(x: torch.Tensor) -> torch.Tensor:
    """PIL's ImageFilter.SMOOTH (3x3, 5 in the centre, 1 around, /13) inside the 1-pixel border,
    the border as it was: the degenerate image of ImageEnhance.Sharpness (v2's
    `adjust_sharpness(x, 0)`). x (b, C, H, W) float."""
    C = x.shape[1]
    key = (x.device, x.dtype, C)
    if key not in _SMOOTH:  # made once per device: not a host-to-device copy per call
        k = torch.tensor([[1.0, 1, 1], [1, 5, 1], [1, 1, 1]]) / 13
        _SMOOTH[key] = k.to(x.device, x.dtype).expand(C, 1, 3, 3).contiguous()
    out = x.clone()
    out[..., 1:-1, 1:-1] = nnf.conv2d(x, _SMOOTH[key], groups=C).clamp_(0, 1)
    return out


# ---------------------------------------------------------------------------------------------
# RandAugment with timm's op set and magnitudes, one op draw and magnitude per sample


@dataclass(frozen=True)
class _Op:
    """One of timm's RandAugment ops: its kind and timm's LEVEL_TO_ARG mapping written as
    arg = clamp(a + c * sign * round_down?(b * magnitude / 10), lo, hi), so that the argument of
    every sample comes out of one vectorized expression (timm's level functions take one float)."""

    kind: str
    a: float = 0.0
    b: float = 0.0
    c: float = 1.0
    signed: bool = False
    floor: bool = False
    lo: float = -math.inf
    hi: float = math.inf


_ENHANCE = dict(a=0.1, b=1.8)  # [0.1, 1.9]
_ENHANCE_INC = dict(a=1.0, b=0.9, signed=True, lo=0.1)  # 1 -/+ up to 0.9
OPS = {
    "AutoContrast": _Op("autocontrast"),
    "Equalize": _Op("equalize"),
    "Invert": _Op("invert"),
    "Rotate": _Op("rotate", b=30.0, signed=True),  # degrees
    "ShearX": _Op("shear_x", b=0.3, signed=True),
    "ShearY": _Op("shear_y", b=0.3, signed=True),
    "TranslateXRel": _Op("translate_x", b=0.45, signed=True),  # fraction of the side (translate_pct)
    "TranslateYRel": _Op("translate_y", b=0.45, signed=True),
    "Posterize": _Op("posterize", b=4.0, floor=True),  # bits kept
    "PosterizeIncreasing": _Op("posterize", a=4.0, b=4.0, c=-1.0, floor=True),
    "Solarize": _Op("solarize", b=256.0, floor=True, hi=256.0),  # threshold on 0..255
    "SolarizeIncreasing": _Op("solarize", a=256.0, b=256.0, c=-1.0, floor=True, lo=0.0),
    "SolarizeAdd": _Op("solarize_add", b=110.0, floor=True, hi=128.0),
    "Color": _Op("color", **_ENHANCE),
    "ColorIncreasing": _Op("color", **_ENHANCE_INC),
    "Contrast": _Op("contrast", **_ENHANCE),
    "ContrastIncreasing": _Op("contrast", **_ENHANCE_INC),
    "Brightness": _Op("brightness", **_ENHANCE),
    "BrightnessIncreasing": _Op("brightness", **_ENHANCE_INC),
    "Sharpness": _Op("sharpness", **_ENHANCE),
    "SharpnessIncreasing": _Op("sharpness", **_ENHANCE_INC),
}
KINDS = sorted({op.kind for op in OPS.values()})


def _affine(x: torch.Tensor, theta: torch.Tensor, fill: torch.Tensor) -> torch.Tensor:
    """x (b, C, H, W) resampled through theta (b, 2, 3) (normalized coordinates, output -> input);
    what falls outside is fill (1, C, 1, 1)."""
    grid = affine_grid(theta, x.shape[-2], x.shape[-1])
    # zero padding of (x - fill) fills the uncovered area with the fill colour
    return nnf.grid_sample(x - fill, grid, mode="bilinear", padding_mode="zeros", align_corners=False) + fill


_GEOMETRIC = ("rotate", "shear_x", "shear_y", "translate_x", "translate_y")


def _geometric(x: torch.Tensor, kind: torch.Tensor, arg: torch.Tensor, fill: torch.Tensor) -> torch.Tensor:
    """The geometric ops, mixed in one batch: sample i rotates (arg degrees, counter-clockwise),
    shears (arg) or translates (arg x the side) by its kind (b,) (an index into KINDS), about the
    centre, in one affine_grid + grid_sample."""

    def of(name):
        return torch.where(kind == KINDS.index(name), arg, 0.0)

    rad = torch.deg2rad(of("rotate"))
    cos, sin = torch.cos(rad), torch.sin(rad)
    theta = torch.stack([cos, -sin + of("shear_x"), 2 * of("translate_x"),
                         sin + of("shear_y"), cos, 2 * of("translate_y")], -1).view(-1, 2, 3)
    return _affine(x, theta, fill)


def _one_geometric(name: str):
    return lambda x, arg, fill: _geometric(x, torch.full_like(arg, KINDS.index(name), dtype=torch.long), arg, fill)


# kind -> f(x (b, 3, H, W) in [0, 1], arg (b,), fill (1, 3, 1, 1)) -> (b, 3, H, W), as PIL's ops
OP_FNS = {
    "autocontrast": lambda x, arg, fill: autocontrast(x),
    "equalize": lambda x, arg, fill: TF.equalize(x),
    "invert": lambda x, arg, fill: 1 - x,
    "posterize": lambda x, bits, fill: (  # keep the high `bits` bits of the 8-bit value
        (x * 255).round_().to(torch.int32) & (256 - torch.exp2(8 - bits)).to(torch.int32).view(-1, 1, 1, 1)
    ).to(x.dtype) / 255,
    "solarize": lambda x, thresh, fill: torch.where(x * 255 >= thresh.view(-1, 1, 1, 1), 1 - x, x),
    "solarize_add": lambda x, add, fill: torch.where(x * 255 < 128, (x + add.view(-1, 1, 1, 1) / 255).clamp_(max=1), x),
    # PIL's enhance ops blend with a degenerate image: black, mean grey, greyscale, smoothed
    "brightness": lambda x, f, fill: _brighten(x, f),
    "contrast": lambda x, f, fill: _blend(x, _contrast_mean(x), f),
    "color": lambda x, f, fill: _blend(x, TF.rgb_to_grayscale(x), f),
    "sharpness": lambda x, f, fill: _blend(x, smoothed(x), f),
    # geometric ops about the centre (RandAugment runs them together, see _geometric)
    **{name: _one_geometric(name) for name in _GEOMETRIC},
}


def _warn_idle(names: list[str], counts: np.ndarray, B: int, what: str) -> None:
    """Warn where a batch of B leaves some of the choices `names` (ops, sub-policies) an empty
    slice (`counts`: each one's slots): those never run in training."""
    idle = [name for name, count in zip(names, counts) if count == 0]
    if idle:
        warnings.warn(
            f"a batch of {B} images per device leaves {len(idle)} of the {len(names)} {what} without a slot "
            f"of the gpu pipeline's fixed slices, so they never run ({', '.join(idle)}): raise data.batch_size "
            f"until each has one (at least {len(names)} per device), or set data.pipeline=cpu")


class RandAugment:
    """timm's RandAugment (`rand_augment_transform(config)`: e.g. "rand-m9-mstd0.5-inc1"; "n1" with
    "mstd101" is TrivialAugment-like) on a batch, every sample drawing whether each op applies
    (timm's p=0.5) and its magnitude. Geometric ops fill with the mean colour (timm's img_mean)
    and resample bilinearly.

    Each op runs on its own samples only, without a data-dependent shape, so that the whole
    augmentation can be captured in one CUDA graph: every layer shuffles the batch and gives op k
    a fixed slice of it, its weight's share of the batch rounded to whole samples (the geometric
    ops' slices form one block, resampled in one call). A sample's op is thus random, op k with
    probability (its slice) / B, and the ops of one batch are balanced rather than drawn apart as
    timm draws them. That probability is timm's only where B times each weight is whole: the 15
    equally weighted ops of "rand-m9-mstd0.5-inc1" get 8 or 9 samples each of 128, but a batch
    smaller than the number of ops leaves some ops no slot, and they never run (a warning says
    so, once per batch size). Running every op on the whole batch and keeping a mask's worth
    would cost ~15x the work; selecting the samples of each op by a mask would wait on the
    device for their number.
    """

    def __init__(self, config: str):
        from timm.data.auto_augment import rand_augment_transform

        if not config.startswith("rand"):
            raise ValueError(f"auto_augment={config!r}: the gpu pipeline runs timm's RandAugment "
                             "('rand-...', e.g. 'rand-m9-mstd0.5-inc1') and torchvision's CIFAR-10 AutoAugment "
                             f"('{AUTOAUGMENT_CIFAR10}'); for other policies set data.pipeline=cpu")
        ra = rand_augment_transform(config, {})
        missing = sorted({op.name for op in ra.ops} - set(OPS))
        if missing:
            raise ValueError(f"auto_augment={config!r} uses {', '.join(missing)}, which the gpu pipeline "
                             f"lacks (it has {', '.join(sorted(OPS))}): set data.pipeline=cpu")
        self.num_layers = ra.num_layers
        weights = [1.0] * len(ra.ops) if ra.choice_weights is None else list(ra.choice_weights)
        # the geometric ops last, so their slots form one block resampled in one call
        order = sorted(range(len(ra.ops)), key=lambda i: OPS[ra.ops[i].name].kind in _GEOMETRIC)
        timm_ops, weights = [ra.ops[i] for i in order], [weights[i] for i in order]
        self.cumulative = np.cumsum(weights) / np.sum(weights)  # slice ends as fractions of the batch
        ops = [OPS[op.name] for op in timm_ops]
        self.kinds = [op.kind for op in ops]
        self.names = [op.name for op in timm_ops]
        self.n_pointwise = sum(k not in _GEOMETRIC for k in self.kinds)  # ops before the geometric block
        hp = ra.ops[0].hparams  # one config string: every op shares magnitude, std and bound
        self.mstd = hp.get("magnitude_std", 0.0)
        self.mmax = hp.get("magnitude_max") or 10.0
        self._table = torch.tensor([[op.a, op.b, op.c, float(op.signed), float(op.floor), op.lo, op.hi, o.prob,
                                     o.magnitude, float(KINDS.index(op.kind))] for op, o in zip(ops, timm_ops)])
        self._slots: dict[tuple[int, torch.device], tuple[list[int], torch.Tensor]] = {}

    def _slices(self, B: int, device: torch.device) -> tuple[list[int], torch.Tensor]:
        """(bounds: op k owns slots bounds[k]:bounds[k+1] of a shuffled batch, (B, 10) table rows)."""
        if (B, device) not in self._slots:
            bounds = [0, *np.round(self.cumulative * B).astype(int).tolist()]
            _warn_idle(self.names, np.diff(bounds), B, "RandAugment ops")
            op = torch.repeat_interleave(torch.arange(len(self.kinds)), torch.tensor(np.diff(bounds)))
            self._slots[B, device] = bounds, self._table[op].to(device)
        return self._slots[B, device]

    def params(self, B: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """(kind (B, layers): index into KINDS of slot b's op, or -1 where it does not apply; arg
        (B, layers) the op's argument from its magnitude, as timm's level functions)."""
        dev, L = g.device, self.num_layers
        _, table = self._slices(B, dev)
        a, b, c, signed, floor, lo, hi, prob, mag, kind = (t[:, None] for t in table.unbind(-1))  # each (B, 1)
        u = torch.rand(3, B, L, generator=g, device=dev)
        if self.mstd == math.inf:
            mag = u[0] * mag
        elif self.mstd > 0:
            mag = mag + self.mstd * torch.randn(B, L, generator=g, device=dev)
        level = b * mag.clamp(0, self.mmax) / 10
        level = torch.where(floor > 0, level.floor(), level)
        sign = torch.where((signed > 0) & (u[1] > 0.5), -1.0, 1.0)
        arg = torch.maximum(torch.minimum(a + c * sign * level, hi), lo)
        return torch.where(u[2] < prob, kind, -1.0).long(), arg

    def __call__(self, x: torch.Tensor, fill: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        """x (B, 3, H, W) float in [0, 1]; fill (1, 3, 1, 1) -> same shape."""
        B = x.shape[0]
        bounds, _ = self._slices(B, x.device)
        kinds, args = self.params(B, g)
        y, slot_of = x, None  # slot_of[k]: where sample k lies in y (None: y is x, in sample order)
        for layer in range(self.num_layers):
            perm = torch.randperm(B, generator=g, device=x.device)
            # slot j takes sample perm[j], gathered from the previous layer's order: one gather
            # per layer and one scatter back at the end, not a round trip per layer
            y = y[perm if slot_of is None else slot_of[perm]]
            n = self.n_pointwise
            blocks = [(name, slice(bounds[k], bounds[k + 1])) for k, name in enumerate(self.kinds[:n])]
            blocks.append(("geometric", slice(bounds[n], bounds[-1])))
            for name, s in blocks:
                if s.start == s.stop:
                    continue
                kind, arg, ys = kinds[s, layer], args[s, layer], y[s]  # ys: a view of y
                out = _geometric(ys, kind, arg, fill) if name == "geometric" else OP_FNS[name](ys, arg, fill)
                # where the op applies, its result goes straight into y: one kernel
                torch.where((kind >= 0).view(-1, 1, 1, 1), out, ys, out=ys)
            if layer + 1 < self.num_layers:
                slot_of = torch.empty_like(perm).index_copy_(0, perm, torch.arange(B, device=x.device))
        return torch.empty_like(y).index_copy_(0, perm, y) if self.num_layers else x


AUTOAUGMENT_CIFAR10 = "autoaugment-cifar10"  # the auto_augment value of torchvision's CIFAR-10 policy

# torchvision's AutoAugment op name -> the kind of OP_FNS that does it
_TV_OPS = {
    "ShearX": "shear_x", "ShearY": "shear_y", "TranslateX": "translate_x", "TranslateY": "translate_y",
    "Rotate": "rotate", "Brightness": "brightness", "Color": "color", "Contrast": "contrast",
    "Sharpness": "sharpness", "Posterize": "posterize", "Solarize": "solarize",
    "AutoContrast": "autocontrast", "Equalize": "equalize", "Invert": "invert",
}


class CIFAR10AutoAugment:
    """torchvision's AutoAugment with its CIFAR-10 policy (`AutoAugmentPolicy.CIFAR10`, the
    learned policy of Cubuk et al.) on a batch: each sample runs one of the 25 sub-policies,
    each of its two ops with the sub-policy's probability, signed magnitudes with a random sign
    per sample. The policy and the magnitude bins are read from torchvision; the ops are
    OP_FNS. As in RandAugment here, the batch is shuffled and each sub-policy owns a fixed
    slice of it (no data-dependent shapes, for one CUDA graph): a sample's sub-policy is random,
    sub-policy k with probability (its slice) / B, torchvision's uniform 1/25 where B is a
    multiple of 25; a batch smaller than 25 leaves some sub-policies out (`bounds`). Differences from
    torchvision's per-image op: shears are about the centre (torchvision's about the top-left
    corner), resampling is bilinear, and the uncovered area takes the fill passed in.

    Each op kind runs once per op position, not once per sub-policy: the slots are gathered so
    that those whose sub-policy has the same kind at that position lie together (an order fixed
    per batch size), and the geometric kinds form one block resampled in one call: 19 op calls a
    batch instead of 50, 246 operators for a batch of 512 against 306 for RandAugment (on the
    CPU, benchmarks/probes/augment_ops.py). On an H200 the per-sub-policy loop held the best
    CIFAR-10 recipe's training loop to 67.6k img/s, against 79.6k with RandAugment in its
    place; this version gives 79.6k
    (`benchmarks/results/loop_autoaugment_aba526a/`). Every op is per sample, so the batch is
    the one the per-sub-policy loop makes from the same random draws."""

    def __init__(self, img_size: int):
        from torchvision.transforms import AutoAugment, AutoAugmentPolicy

        policy = AutoAugment(AutoAugmentPolicy.CIFAR10)
        # the magnitude bins torchvision draws from (a private method, the one source of them)
        space = policy._augmentation_space(10, (img_size, img_size))
        self.subpolicies = []  # per sub-policy, per op: (kind, probability, base, signed magnitude)
        for sub in policy.policies:
            ops = []
            for name, prob, bin_ in sub:
                magnitudes, signed = space[name]
                m = float(magnitudes[bin_]) if bin_ is not None and magnitudes.ndim else 0.0
                kind = _TV_OPS[name]
                if kind in ("translate_x", "translate_y"):
                    m = int(m) / img_size  # torchvision shifts by int(m) pixels; OP_FNS by a fraction
                base = 1.0 if kind in ("brightness", "color", "contrast", "sharpness") else 0.0  # factor 1 -/+ m
                ops.append((kind, prob, base, m) if signed else (kind, prob, base + m, 0.0))
            self.subpolicies.append(ops)
        self.num_ops = len(self.subpolicies[0])
        if any(len(sub) != self.num_ops for sub in self.subpolicies):
            raise ValueError("every sub-policy of the CIFAR-10 AutoAugment policy should hold the same number of ops")
        self._plans: dict[tuple[int, torch.device], list[tuple]] = {}

    def bounds(self, B: int) -> list[int]:
        """Sub-policy k owns slots bounds[k]:bounds[k + 1] of the shuffled batch: B / 25 rounded to
        whole slots, so in a batch smaller than 25 some sub-policies own none and never run."""
        n = len(self.subpolicies)
        return [round(k * B / n) for k in range(n + 1)]

    def _plan(self, B: int, device: torch.device) -> list[tuple]:
        """Per op position j: (order (B,): the slots in the order op j runs them, kinds grouped
        and the geometric ones last; blocks: (name, slice of that order); per position of the
        order, the op's kind (an index into KINDS), probability, base and magnitude)."""
        if (B, device) in self._plans:
            return self._plans[B, device]
        _warn_idle([f"sub-policy {k}" for k in range(len(self.subpolicies))], np.diff(self.bounds(B)), B,
                   "AutoAugment sub-policies")
        sub = np.repeat(np.arange(len(self.subpolicies)), np.diff(self.bounds(B)))  # each slot's sub-policy
        plan = []
        for j in range(self.num_ops):
            ops = [self.subpolicies[k][j] for k in sub]
            order = sorted(range(B), key=lambda slot: (ops[slot][0] in _GEOMETRIC, KINDS.index(ops[slot][0])))
            names = ["geometric" if ops[slot][0] in _GEOMETRIC else ops[slot][0] for slot in order]
            runs = [(name, len(list(run))) for name, run in itertools.groupby(names)]  # (name, length), in order
            ends = np.cumsum([length for _, length in runs]).tolist()
            blocks = [(name, slice(end - length, end)) for (name, length), end in zip(runs, ends)]
            columns = [[KINDS.index(ops[slot][0]) for slot in order],
                       *([float(ops[slot][c]) for slot in order] for c in (1, 2, 3))]
            kind, prob, base, magnitude = (torch.tensor(col, device=device) for col in columns)
            plan.append((torch.tensor(order, device=device), blocks, kind, prob, base, magnitude))
        self._plans[B, device] = plan
        return plan

    def __call__(self, x: torch.Tensor, fill: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        """x (B, 3, H, W) float in [0, 1]; fill (1, 3, 1, 1) -> same shape."""
        B = x.shape[0]
        plan = self._plan(B, x.device)
        perm = torch.randperm(B, generator=g, device=x.device)  # slot s holds sample perm[s]
        applies = torch.rand(self.num_ops, B, generator=g, device=x.device)  # per op position, per slot
        signs = torch.where(torch.rand(self.num_ops, B, generator=g, device=x.device) < 0.5, -1.0, 1.0)
        y, where = x, None  # where[s]: the row of y that holds slot s (None: y is x, in sample order)
        for j, (order, blocks, kind, prob, base, magnitude) in enumerate(plan):
            y = y[perm[order] if where is None else where[order]]  # row i: slot order[i]
            arg = base + signs[j, order] * magnitude
            apply = (applies[j, order] < prob).view(-1, 1, 1, 1)
            for name, s in blocks:
                ys = y[s]  # a view: the op's result goes straight into y where it applies
                out = _geometric(ys, kind[s], arg[s], fill) if name == "geometric" else OP_FNS[name](ys, arg[s], fill)
                torch.where(apply[s], out, ys, out=ys)
            if j + 1 < len(plan):
                where = torch.empty_like(order).index_copy_(0, order, torch.arange(B, device=x.device))
        return torch.empty_like(y).index_copy_(0, perm[order], y)


def policy(config: str, img_size: int):
    """The batched augmentation policy that `auto_augment` names: timm's RandAugment ("rand-...")
    or torchvision's CIFAR-10 AutoAugment (AUTOAUGMENT_CIFAR10)."""
    if config == AUTOAUGMENT_CIFAR10:
        return CIFAR10AutoAugment(img_size)
    return RandAugment(config)


# ---------------------------------------------------------------------------------------------


class GPUAugment:
    """`Augment` (the cpu pipeline's recipe) as batched ops on uint8 batches, on their device.

    train: crop ("pad": padded random crop, or "rrc": random-resized crop over scale/ratio) and
    flip with probability hflip, then RandAugment or the CIFAR-10 AutoAugment (auto_augment) or else color jitter
    (brightness/contrast/saturation, in that order), normalize, random erasing (re_prob).
    evaluate: resize the short side to img_size / crop_pct and center-crop img_size (one box,
    resampled once), normalize.
    """

    def __init__(self, augment: Augment, img_size: int):
        self.augment, self.img_size = augment, img_size
        self.rand_augment = policy(augment.auto_augment, img_size) if augment.auto_augment else None
        # as timm's create_transform: color jitter is off when an auto-augment policy is on
        self.jitter = 0.0 if augment.auto_augment else float(augment.color_jitter or 0.0)
        self._consts: dict[torch.device, tuple[torch.Tensor, ...]] = {}
        self._boxes: dict[tuple, torch.Tensor] = {}

    def _mean_std(self, device: torch.device) -> tuple[torch.Tensor, ...]:
        """(mean, 1 / std, -mean / std), each (1, 3, 1, 1) float32 on device: the fill colour
        of the geometric ops and the normalization's scale and shift."""
        if device not in self._consts:  # once per device: no copy per batch
            mean, std = (torch.tensor(v, dtype=torch.float32).view(1, 3, 1, 1)
                         for v in (self.augment.mean, self.augment.std))
            self._consts[device] = tuple(t.to(device) for t in (mean, 1 / std, -mean / std))
        return self._consts[device]

    def _normalize(self, x: torch.Tensor) -> torch.Tensor:
        """(x - mean) / std as one multiply-add kernel."""
        _, scale, shift = self._mean_std(x.device)
        return torch.addcmul(shift, x, scale)

    def train(self, images: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        """images (B, H, W, 3) uint8 -> (B, 3, img_size, img_size) float32, augmented and normalized.
        g: a generator on images.device."""
        a, S = self.augment, self.img_size
        B, H, W, _ = images.shape
        mean = self._mean_std(images.device)[0]
        if a.train_crop == "pad":
            x = to_float(pad_crop_flip(images, S, S // 8, a.hflip, g))
        else:
            x = to_float(images)
            boxes = rrc_boxes(B, H, W, a.scale, a.ratio, g)
            flip = torch.rand(B, generator=g, device=x.device) < a.hflip
            x = crop_resize(x, boxes, S, flip)
        if self.rand_augment is not None:
            x = self.rand_augment(x, mean, g)
        elif self.jitter > 0:
            f = _uniform(max(0.0, 1 - self.jitter), 1 + self.jitter, (3, B), g)
            x = _brighten(x, f[0])
            x = _blend(x, _contrast_mean(x), f[1])
            x = _blend(x, TF.rgb_to_grayscale(x), f[2])
        x = self._normalize(x)
        if a.re_prob > 0:
            x = random_erasing(x, a.re_prob, g)
        return x

    def evaluate(self, images: torch.Tensor) -> torch.Tensor:
        """images (B, H, W, 3) uint8 -> (B, 3, img_size, img_size) float32, normalized."""
        S = self.img_size
        B, H, W, _ = images.shape
        x = to_float(images)
        # timm's eval transform: Resize(floor(S / crop_pct)) of the short side, then CenterCrop(S)
        # at torchvision's whole-pixel offsets in the resized image; as one box of the source
        # image resized once
        R = math.floor(S / self.augment.crop_pct)
        if not (H == W == S and R == S):
            key = (H, W, x.device)
            if key not in self._boxes:  # made once: no copy to the device per batch
                rh, rw = (R, int(R * W / H)) if H <= W else (int(R * H / W), R)  # torchvision's Resize(R)
                top, left = int(round((rh - S) / 2.0)), int(round((rw - S) / 2.0))  # its CenterCrop(S)
                sy, sx = H / rh, W / rw
                self._boxes[key] = torch.tensor([left * sx, top * sy, (left + S) * sx, (top + S) * sy],
                                                device=x.device)
            x = crop_resize(x, self._boxes[key].expand(B, 4), S)
        return self._normalize(x)
