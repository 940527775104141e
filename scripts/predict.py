"""Classify image files with a checkpoint of scripts/train.py.

    python scripts/predict.py <run>/checkpoints/last.ckpt photo.jpg more_photos/ --top 3
    python scripts/predict.py <ckpt> images/ --out predictions.csv --attention naive

Each image (a file, or every image under a folder) goes through the eval transform the model
was trained with (resize, centre crop, normalization: saved in the checkpoint) and the
model's evaluation forward (its EMA, flip or shift views where the run used them). Prints the
top classes and probabilities of each image (ImageNet class folders, such as Imagenette's
n01440764, by their words: tench); `--out` also writes them as CSV (image, rank, class, index,
probability, description). Lightning's predict loop runs it: on a CUDA GPU in bf16 autocast
(flash attention under `--attention auto`), else on the CPU (SDPA). A file that PIL cannot read
costs only its own prediction: the others are printed and written, and the unreadable ones are
listed on stderr at the end (exit status 0; 1 when no file could be read).
"""
from __future__ import annotations

import argparse
import csv
import os
import sys
from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import BasePredictionWriter
import torch
from PIL import Image, UnidentifiedImageError
from torch.utils.data import DataLoader, Dataset
from torchvision.datasets.folder import IMG_EXTENSIONS

from vitflash.cli import quiet, short_errors
from vitflash.data import eval_transform_of, imagenet_words
from vitflash.files import written_whole
from vitflash.module import checkpoint_inputs, load_checkpoint
from vitflash.ops import ATTENTION_IMPLS


def image_files(inputs: list[str]) -> list[Path]:
    """The image files named in `inputs`, and those under its folders (recursively, sorted)."""
    files: list[Path] = []
    for name in inputs:
        path = Path(name)
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in IMG_EXTENSIONS)
            if not found:
                raise FileNotFoundError(f"no image files under {path} (looked for {', '.join(IMG_EXTENSIONS)})")
            files.extend(found)
        elif path.is_file():
            files.append(path)
        else:
            raise FileNotFoundError(f"{path} does not exist: pass image files or folders of them")
    return files


class ImageFiles(Dataset):
    """(transformed image, position, "") of each file, read as RGB; for a file that PIL cannot
    read, (a blank image of the same size, position, the reason), so that the batch goes on."""

    def __init__(self, files: list[Path], transform, img_size: int):
        self.files, self.transform = files, transform
        self.blank = transform(Image.new("RGB", (img_size, img_size)))

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int):
        try:
            with Image.open(self.files[i]) as img:
                image = img.convert("RGB")
        except (UnidentifiedImageError, OSError) as e:
            return self.blank, i, str(e) or type(e).__name__
        return self.transform(image), i, ""


class Collected(BasePredictionWriter):
    """Each batch's class probabilities, and the reason of each file in it that could not be read."""

    def __init__(self):
        super().__init__(write_interval="batch")
        self.probs: list[torch.Tensor] = []
        self.unreadable: dict[int, str] = {}

    def write_on_batch_end(self, trainer, pl_module, prediction, batch_indices, batch, batch_idx, dataloader_idx=0):
        self.probs.append(prediction.cpu())
        self.unreadable.update((int(i), why) for i, why in zip(batch[1], batch[2]) if why)


def predict(ckpt: Path, inputs: list[str], top: int = 5, attention: str = "auto", batch_size: int = 64,
            num_workers: int | None = None, device: str = "auto") -> list[dict]:
    """One row per image: {"image": path, "top": [(class name, class index, probability), ...]},
    the `top` likeliest classes first, or for a file PIL cannot read {"image": path, "top": [],
    "unreadable": the reason}; ValueError when no file could be read. `device`: "cuda" (bf16
    autocast), "cpu" (fp32) or "auto" (cuda when there is one). `num_workers`: DataLoader
    processes that decode the files; None: on CUDA with more files than one batch, one per CPU
    core but one (up to 8), so that decoding keeps up with the GPU; else none."""
    if device not in ("auto", "cuda", "cpu"):
        raise ValueError(f"--device {device}: choose auto, cuda or cpu")
    cuda = torch.cuda.is_available() if device == "auto" else device == "cuda"
    if cuda and not torch.cuda.is_available():
        raise ValueError("--device cuda: PyTorch sees no CUDA GPU here; use --device cpu (or auto)")
    if top < 1:
        raise ValueError(f"--top {top}: pass a whole number >= 1")
    if batch_size < 1:
        raise ValueError(f"--batch-size {batch_size}: pass a whole number >= 1")
    files = image_files(inputs)
    if num_workers is None:
        num_workers = min(8, len(os.sched_getaffinity(0)) - 1) if cuda and len(files) > batch_size else 0
    if num_workers < 0:
        raise ValueError(f"--num-workers {num_workers}: pass a whole number >= 0")
    module = load_checkpoint(ckpt, attention=attention)
    spec = checkpoint_inputs(module, ckpt)
    loader = DataLoader(ImageFiles(files, eval_transform_of(spec), spec["img_size"]), batch_size=batch_size,
                        num_workers=num_workers, pin_memory=cuda)
    collected = Collected()
    trainer = L.Trainer(accelerator="gpu" if cuda else "cpu", devices=1, precision="bf16-mixed" if cuda else "32-true",
                        logger=False, enable_checkpointing=False, enable_model_summary=False,
                        enable_progress_bar=len(files) > batch_size, callbacks=[collected])
    trainer.predict(module, loader, return_predictions=False)
    unreadable = collected.unreadable
    if len(unreadable) == len(files):
        listed = "; ".join(f"{files[i]} ({why})" for i, why in sorted(unreadable.items())[:3])
        raise ValueError(f"no file could be read as an image by PIL: {listed}" + (" ..." if len(files) > 3 else "")
                         + ": pass image files (JPEG, PNG, ...) or folders of them")
    probs = torch.cat(collected.probs)
    classes = spec.get("classes")
    if classes is not None and len(classes) != probs.shape[1]:
        raise ValueError(f"{ckpt} names {len(classes)} classes but its head has {probs.shape[1]} outputs")
    values, indices = probs.topk(min(top, probs.shape[1]), dim=1)
    return [{"image": str(path), "top": [], "unreadable": unreadable[n]} if n in unreadable else
            {"image": str(path), "top": [(classes[j] if classes else str(j), j, p) for p, j in zip(v.tolist(), i.tolist())]}
            for n, (path, v, i) in enumerate(zip(files, values, indices))]


def write_csv(rows: list[dict], out: Path, described: dict[str, str]) -> None:
    """The rows as CSV (image, rank, class, index, probability, description), the unreadable
    files left out: a whole file or none."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with written_whole(out) as tmp, open(tmp, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["image", "rank", "class", "index", "probability", "description"])
        for row in rows:
            for rank, (name, index, p) in enumerate(row["top"], 1):
                writer.writerow([row["image"], rank, name, index, f"{p:.6f}", described.get(name, "")])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", type=Path, help="a .ckpt of scripts/train.py (<run>/checkpoints/...)")
    parser.add_argument("images", nargs="+", help="image files, or folders of them (searched recursively)")
    parser.add_argument("--top", type=int, default=5, help="classes shown per image (default 5)")
    parser.add_argument("--attention", choices=["auto", *ATTENTION_IMPLS], default="auto",
                        help="the attention path (default auto: flash on a CUDA GPU, else sdpa)")
    parser.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto",
                        help="auto (default): the CUDA GPU when there is one, else the CPU")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--num-workers", type=int,
                        help="DataLoader processes that decode images (default: on a GPU with more images than one "
                             "batch, one per CPU core but one, up to 8; else 0)")
    parser.add_argument("--out", type=Path, help="also write the predictions to this CSV file")
    args = parser.parse_args(argv)

    quiet()
    rows = predict(args.checkpoint, args.images, args.top, args.attention, args.batch_size, args.num_workers,
                   args.device)
    described = imagenet_words({name for row in rows for name, *_ in row["top"]})  # n01440764: tench
    read = [row for row in rows if row["top"]]
    width = max(len(row["image"]) for row in read)
    for row in read:
        print(f"{row['image']:<{width}}  " + "  ".join(f"{described.get(name, name)} {p:.3f}"
                                                       for name, _, p in row["top"]))
    if args.out:
        write_csv(rows, args.out, described)
        print(f"wrote {args.out}")
    skipped = [row for row in rows if not row["top"]]
    if skipped:
        print(f"skipped {len(skipped)} of {len(rows)} files that PIL cannot read as images:", file=sys.stderr)
        for row in skipped:
            print(f"  {row['image']}: {row['unreadable']}", file=sys.stderr)


if __name__ == "__main__":
    short_errors(main)()  # a path, checkpoint or image the user can fix: one line, exit status 1
