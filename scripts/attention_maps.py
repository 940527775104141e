"""Where a trained ViT looks: the attention weights of a checkpoint of scripts/train.py on one image.

    python scripts/attention_maps.py <run>/checkpoints/last.ckpt photo.jpg --out attention.png

The flash kernel never writes the N x N attention weights out; the same weights, computed here
as naive attention computes them (softmax(q k^T * scale) from each block's own tokens), show
what it attends to. The image goes through the checkpoint's eval transform; the figure shows
the input as the model sees it, the attention rollout over all blocks (Abnar and Zuidema,
arXiv 2005.00928: each block's head-mean weights, with the residual as half of each row,
multiplied from the first block up), and each head of one block (--block, default the last):
the class token's attention over the patches, or, for a model without one (global_pool=avg),
the patches' mean attention. The arrays go into a .npz beside the figure (`rollout`
(grid, grid), `heads` (H, grid, grid), `probs` (H, N, N) of the block shown). Needs matplotlib
(`pip install -e ".[report]"`).
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from vitflash.cli import quiet, short_errors
from vitflash.data import eval_transform_of
from vitflash.files import written_whole
from vitflash.module import checkpoint_inputs, load_checkpoint


def rollout(probs: list[torch.Tensor]) -> torch.Tensor:
    """Attention rollout of one image's blocks, each (H, N, N): (N, N), row i the share of
    each input token in token i's features after the last block."""
    n = probs[0].shape[-1]
    eye = torch.eye(n, dtype=probs[0].dtype)
    total = eye
    for block in probs:
        mixed = 0.5 * block.mean(0) + 0.5 * eye  # the residual keeps half of each token
        total = (mixed / mixed.sum(-1, keepdim=True)) @ total
    return total


def patch_maps(rows: torch.Tensor, prefix: int, grid: tuple[int, int]) -> torch.Tensor:
    """(..., N, N) weights -> (..., gh, gw) over the patches: the class token's row where the
    model has one (prefix 1), else the mean of the patch rows."""
    read = rows[..., 0, prefix:] if prefix else rows[..., prefix:, prefix:].mean(-2)
    read = read / read.sum(-1, keepdim=True)
    return read.reshape(*read.shape[:-1], *grid)


def attention_maps(ckpt: Path, image: Path, block: int = -1) -> dict:
    """The maps of `image` under checkpoint `ckpt` (see the module docstring), the model's
    top class and its probability, and the input the model saw."""
    module = load_checkpoint(ckpt, attention="sdpa")
    model = module.model.eval().float()
    spec = checkpoint_inputs(module, ckpt)
    try:
        with Image.open(image) as img:
            pixels = eval_transform_of(spec)(img.convert("RGB")).unsqueeze(0)  # (1, 3, S, S)
    except OSError as e:
        raise ValueError(f"{image} is not an image that PIL can read ({e})") from None
    depth = len(model.blocks)
    if not -depth <= block < depth:
        raise ValueError(f"--block {block}: the model has {depth} blocks (0 to {depth - 1}, or -1 for the last)")
    with torch.no_grad():
        probs = [p[0].float() for p in model.attention_probs(pixels)]  # each (H, N, N)
        p = module.eval_logits(pixels).float().softmax(-1)[0]
    prefix, grid = model.num_prefix_tokens, tuple(model.patch_embed.grid_size)
    top = int(p.argmax())
    classes = spec.get("classes")
    mean, std = (torch.tensor(spec[k]).view(3, 1, 1) for k in ("mean", "std"))
    return {"rollout": patch_maps(rollout(probs), prefix, grid), "heads": patch_maps(probs[block], prefix, grid),
            "probs": probs[block], "block": block % depth, "label": classes[top] if classes else str(top),
            "p": float(p[top]), "image": (pixels[0] * std + mean).clamp(0, 1).permute(1, 2, 0)}


def plot(maps: dict, out: Path) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ValueError("the figure needs matplotlib: pip install matplotlib (or pip install -e \".[report]\")") from None
    heads = maps["heads"]
    size = maps["image"].shape[:2]

    def up(a: torch.Tensor) -> np.ndarray:  # a patch grid at the image's size
        return F.interpolate(a[None, None], size=size, mode="bilinear", align_corners=False)[0, 0].numpy()

    panels = 2 + len(heads)
    cols = min(panels, 6)
    rows = -(-panels // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(2.2 * cols, 2.4 * rows), squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    axes.flat[0].imshow(maps["image"].numpy())
    axes.flat[0].set_title(f"{maps['label']} {maps['p']:.2f}", fontsize=9)
    for ax, grid, title in [(axes.flat[1], maps["rollout"], "rollout"),
                            *[(axes.flat[2 + h], heads[h], f"block {maps['block']} head {h}") for h in range(len(heads))]]:
        ax.imshow(maps["image"].numpy())
        ax.imshow(up(grid), cmap="inferno", alpha=0.6)
        ax.set_title(title, fontsize=9)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", type=Path, help="a .ckpt of scripts/train.py (<run>/checkpoints/...)")
    parser.add_argument("image", type=Path)
    parser.add_argument("--block", type=int, default=-1, help="the block whose heads are shown (default: the last)")
    parser.add_argument("--out", type=Path, default=Path("attention.png"), help="the figure; the .npz goes beside it")
    args = parser.parse_args(argv)

    quiet()
    maps = attention_maps(args.checkpoint, args.image, args.block)
    plot(maps, args.out)
    with written_whole(args.out.with_suffix(".npz")) as tmp:
        np.savez(tmp, **{k: maps[k].numpy() for k in ("rollout", "heads", "probs")})
    print(f"{args.image}: {maps['label']} {maps['p']:.3f}; wrote {args.out} and {args.out.with_suffix('.npz')}")


if __name__ == "__main__":
    short_errors(main)()  # a path, checkpoint or image the user can fix: one line, exit status 1
