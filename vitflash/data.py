"""DataModules: CIFAR-10/100, ImageFolder trees (the ImageNet layout) and synthetic images.

Every DataModule yields batches `(images, labels)`: images (B, 3, H, W) float32, normalized;
labels (B,) int64. Augmentation comes from timm (`create_transform`: random-resized crop,
RandAugment, random erasing) and torchvision (the padded crop used on CIFAR).

Small datasets of fixed-size images (CIFAR) are decoded once into uint8 arrays (N, H, W, 3)
kept in memory; the arrays of a JPEG tree are cached as `<split>-uint8.npz` beside the split
folder, so only the first run pays for decoding.

`pipeline="gpu"` replaces the DataLoader: the uint8 arrays go to the training device (ImageFolder
trees through a cache of fixed-size squares, `cache_image_folder`) and vitflash.gpu_data's
loaders yield batches augmented there by vitflash.gpu_augment, with the same recipe (`Augment`).
"""
from __future__ import annotations

import logging
from concurrent.futures import ProcessPoolExecutor
import random
import re
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Callable, Sequence

import lightning as L
import numpy as np
import torch
from PIL import Image
from timm.data import auto_augment as timm_auto_augment
from timm.data import create_transform
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Subset, get_worker_info
from torchvision import datasets
from torchvision import transforms as T
from tqdm.auto import tqdm

from vitflash.files import written_whole
from vitflash.gpu_augment import AUTOAUGMENT_CIFAR10, GPUAugment
from vitflash.gpu_data import STORAGES, GPUArrays, GPULoader, choose_storage, require_batches

log = logging.getLogger(__name__)

CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR_STD = (0.2470, 0.2435, 0.2616)
PIPELINES = ("cpu", "gpu")


# where the project's data archives sit beside a checkout; a hint names it only where it has the archive
SHARED_DATA = Path("../shared/data")


def _prepare_hint(data_root: Path, archive: str) -> str:
    """How to unpack `archive` into data_root: from SHARED_DATA where it is there, else from
    the user's own copy."""
    path = SHARED_DATA / archive if (SHARED_DATA / archive).is_file() else f"<path to {archive}>"
    return f"Unpack the data first: `python scripts/prepare_data.py --archive {path} --root {data_root}`"


def _posterize(img: Image.Image, bits_to_keep: int, **kwargs) -> Image.Image:
    """timm's posterize, keeping 0 bits too: RandAugment's PosterizeIncreasing reaches 0 bits at
    magnitude 10 (and Posterize at 0), which Pillow >= 13 refuses where older Pillow gave a black
    image. Black is what the gpu pipeline gives as well."""
    if bits_to_keep <= 0:
        return Image.new(img.mode, img.size)
    return timm_auto_augment.posterize(img, bits_to_keep, **kwargs)


def _keep_zero_bit_posterize(transform: T.Compose) -> None:
    """Point the posterize ops of timm's auto-augment transforms in `transform` at `_posterize`
    (a module-level function, so DataLoader workers can still unpickle the transform)."""
    for t in transform.transforms:
        # RandAugment's and AugMix's op list; AutoAugment's sub-policies
        ops = [*getattr(t, "ops", ()), *(op for sub in getattr(t, "policy", ()) for op in sub)]
        for op in ops:
            if getattr(op, "aug_fn", None) is timm_auto_augment.posterize:
                op.aug_fn = _posterize


@dataclass
class Augment:
    """How images become (3, img_size, img_size) normalized tensors.

    Training: train_crop "rrc" (timm's random-resized crop over `scale` and aspect `ratio`, the ImageNet recipe)
    or "pad" (a random crop of the image padded by img_size/8, the CIFAR recipe), a flip with
    probability hflip, then timm's RandAugment (`auto_augment`, e.g. "rand-m9-mstd0.5-inc1") or
    torchvision's AutoAugment with its CIFAR-10 policy (`auto_augment="autoaugment-cifar10"`),
    color jitter (off under either policy, as timm does) and random erasing (`re_prob`). Evaluation resizes to img_size / crop_pct and
    center-crops img_size.
    """

    train_crop: str = "rrc"
    scale: Sequence[float] = (0.08, 1.0)
    ratio: Sequence[float] = (3 / 4, 4 / 3)
    hflip: float = 0.5
    color_jitter: float = 0.0
    auto_augment: str | None = None
    re_prob: float = 0.0
    interpolation: str = "bicubic"
    crop_pct: float = 1.0
    mean: Sequence[float] = CIFAR_MEAN
    std: Sequence[float] = CIFAR_STD

    def __post_init__(self):
        if self.train_crop not in ("rrc", "pad"):
            raise ValueError(f"train_crop={self.train_crop!r}: choose 'rrc' (random-resized) or 'pad'")

    def train_transform(self, img_size: int) -> Callable[[Image.Image], torch.Tensor]:
        cifar_policy = self.auto_augment == AUTOAUGMENT_CIFAR10  # torchvision's, which timm lacks
        primary, secondary, final = create_transform(
            img_size, is_training=True, scale=tuple(self.scale), ratio=tuple(self.ratio), hflip=self.hflip,
            color_jitter=0.0 if cifar_policy else self.color_jitter,
            auto_augment=None if cifar_policy else self.auto_augment, re_prob=self.re_prob,
            re_mode="pixel", interpolation=self.interpolation, mean=tuple(self.mean),
            std=tuple(self.std), separate=True,
        )
        _keep_zero_bit_posterize(secondary)
        if cifar_policy:  # bilinear and the mean colour's fill, as the gpu pipeline's
            secondary = T.AutoAugment(T.AutoAugmentPolicy.CIFAR10, T.InterpolationMode.BILINEAR,
                                      fill=[round(255 * m) for m in self.mean])
        if self.train_crop == "pad":
            primary = T.Compose([
                T.RandomCrop(img_size, padding=img_size // 8, padding_mode="reflect"),
                T.RandomHorizontalFlip(self.hflip),
            ])
        return T.Compose([primary, secondary, final])

    def eval_transform(self, img_size: int) -> Callable[[Image.Image], torch.Tensor]:
        return create_transform(img_size, is_training=False, crop_pct=self.crop_pct,
                                interpolation=self.interpolation, mean=tuple(self.mean), std=tuple(self.std))


def eval_inputs(augment: Augment, img_size: int, classes: Sequence[str] | None = None) -> dict:
    """The eval transform's settings (`eval_transform_of` builds it again from them) and the class
    names in label order (None: unknown), as plain values a checkpoint holds."""
    return {"img_size": int(img_size), "crop_pct": float(augment.crop_pct), "interpolation": augment.interpolation,
            "mean": [float(m) for m in augment.mean], "std": [float(v) for v in augment.std],
            "classes": None if classes is None else [str(c) for c in classes]}


def eval_transform_of(inputs: dict) -> Callable[[Image.Image], torch.Tensor]:
    """The eval transform that `eval_inputs` describes."""
    augment = Augment(crop_pct=inputs["crop_pct"], interpolation=inputs["interpolation"],
                      mean=tuple(inputs["mean"]), std=tuple(inputs["std"]))
    return augment.eval_transform(inputs["img_size"])


def imagenet_words(names) -> dict[str, str]:
    """ImageNet's short description of each of `names` that is an ImageNet WordNet ID (the class
    folders of ImageNet and Imagenette, e.g. n01440764: "tench, Tinca tinca"), by timm's tables;
    other names are left out."""
    from timm.data import ImageNetInfo

    wnids = {name for name in names if re.fullmatch(r"n\d{8}", name)}
    if not wnids:
        return {}
    info = ImageNetInfo()
    known = set(info.label_names())
    return {name: info.label_name_to_description(name) for name in wnids if name in known}


class ArrayDataset(Dataset):
    """Decoded images held in memory: images (N, H, W, 3) uint8, labels (N,) int."""

    def __init__(self, images: np.ndarray, labels: np.ndarray, transform: Callable | None = None):
        self.images, self.labels, self.transform = images, labels, transform

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        img = Image.fromarray(self.images[i])
        return (self.transform(img) if self.transform else img), int(self.labels[i])


def batch_size(batch: tuple[torch.Tensor, torch.Tensor]) -> int:
    """Images in a batch `(images, labels)`; Lightning's ThroughputMonitor counts with it."""
    return batch[0].shape[0]


def _cached_labels(path: Path, tree: datasets.ImageFolder):
    """The labels file `path` (labels, classes) as np.load opened it, if it matches `tree`'s
    class list and file count; None when it is missing or stale (the caller closes it)."""
    if not path.exists():
        return None
    z = np.load(path)
    if list(z["classes"]) == tree.classes and len(z["labels"]) == len(tree):
        return z
    z.close()
    log.info("%s is stale (the folder changed): decoding again", path)
    return None


def _damaged(path: str, e: Exception) -> ValueError:
    """The error for an image file that PIL cannot decode (empty, truncated, not an image)."""
    return ValueError(f"cannot decode {path} ({e}): the copy is damaged or half-unpacked. "
                      "Unpack it again with scripts/prepare_data.py")


def _decode(path: str) -> np.ndarray:
    """One image file -> (H, W, 3) uint8, greyscale and palette images converted to RGB."""
    try:
        with Image.open(path) as img:
            return np.asarray(img.convert("RGB"))
    except OSError as e:  # PIL's errors, raised in a worker process, would not name the file
        raise _damaged(path, e) from e


def _decode_square(path: str, size: int) -> np.ndarray:
    """One image file -> (size, size, 3) uint8: the short side resized to size, the centre cropped."""
    try:
        with Image.open(path) as img:
            img.draft("RGB", (size, size))  # JPEG: decode at the smallest DCT scale still covering size
            img = img.convert("RGB")
            w, h = img.size
            nw, nh = max(size, round(w * size / min(w, h))), max(size, round(h * size / min(w, h)))
            img = img.resize((nw, nh), Image.Resampling.BICUBIC)  # PIL's resize filters (anti-aliases) when shrinking
            left, top = (nw - size) // 2, (nh - size) // 2
            return np.asarray(img.crop((left, top, left + size, top + size)))
    except OSError as e:
        raise _damaged(path, e) from e


def _decoded(pool, decode: Callable[[str], np.ndarray], paths: list[str], desc: str):
    """decode(path) of every path in order, from `pool`'s processes, with a progress bar."""
    return tqdm(pool.map(decode, paths, chunksize=64), total=len(paths), desc=desc, unit="img")


def _pool(num_workers: int):
    return ProcessPoolExecutor(num_workers) if num_workers > 0 else _Inline()


_IN_MEMORY_FIX = "set data.in_memory=false to decode them on the fly"


def load_image_folder(folder: Path, num_workers: int = 0,
                      mixed_sizes_fix: str = _IN_MEMORY_FIX) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Decode an ImageFolder split of same-sized images into (N, H, W, 3) uint8 + labels, in
    `num_workers` processes with a progress bar.

    The arrays are cached as `<folder>-uint8.npz`; the cache is reused while the class list
    and the number of files match the folder. Images of another size than the first raise a
    ValueError ending with `mixed_sizes_fix`, what the caller's user can do about it.
    """
    tree = datasets.ImageFolder(str(folder))  # lists the files; nothing is decoded here
    cache = folder.parent / f"{folder.name}-uint8.npz"
    if (z := _cached_labels(cache, tree)) is not None:
        with z:
            return z["images"], z["labels"], tree.classes
    paths = [p for p, _ in tree.samples]
    images = None
    with _pool(num_workers) as pool:
        for i, img in enumerate(_decoded(pool, _decode, paths, f"decoding {folder}")):
            if images is None:  # one array, filled in place: no second copy to concatenate
                images = np.empty((len(paths), *img.shape), np.uint8)
            elif img.shape != images.shape[1:]:
                (h0, w0), (h, w) = images.shape[1:3], img.shape[:2]
                raise ValueError(f"{folder} holds images of different sizes ({paths[0]} is {w0}x{h0}, "
                                 f"{paths[i]} is {w}x{h}), which cannot be kept as one array: {mixed_sizes_fix}")
            images[i] = img
    labels = np.asarray(tree.targets, np.int64)
    with written_whole(cache) as tmp:
        np.savez(tmp, images=images, labels=labels, classes=np.asarray(tree.classes))
    log.info("decoded %d images of %s into %s", len(labels), folder, cache)
    return images, labels, tree.classes


def cache_image_folder(folder: Path, size: int, num_workers: int = 0) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Decode an ImageFolder split of any image sizes once into (N, size, size, 3) uint8 (short
    side resized to size, centre-cropped square), in `num_workers` processes with a progress bar.

    The cache lies beside the folder: `<folder>-<size>px-uint8.npy` (the images, returned memory-
    mapped, so a split larger than RAM can be streamed) and `<folder>-<size>px-labels.npz` (labels,
    classes), each written to a temporary file and renamed, labels last: a cache is complete when
    its labels file exists, and reused while the class list and the number of files match.
    """
    tree = datasets.ImageFolder(str(folder))  # lists the files; nothing is decoded here
    images_path = folder.parent / f"{folder.name}-{size}px-uint8.npy"
    labels_path = folder.parent / f"{folder.name}-{size}px-labels.npz"
    if images_path.exists() and (z := _cached_labels(labels_path, tree)) is not None:
        with z:
            return np.load(images_path, mmap_mode="c"), z["labels"], tree.classes
    paths = [p for p, _ in tree.samples]
    decode = partial(_decode_square, size=size)
    with written_whole(images_path) as tmp:
        out = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.uint8, shape=(len(paths), size, size, 3))
        with _pool(num_workers) as pool:
            for i, img in enumerate(_decoded(pool, decode, paths, f"decoding {folder} at {size}px")):
                out[i] = img
        out.flush()
        del out
    labels = np.asarray(tree.targets, np.int64)
    with written_whole(labels_path) as tmp:
        np.savez(tmp, labels=labels, classes=np.asarray(tree.classes))
    log.info("decoded %d images of %s into %s", len(paths), folder, images_path)
    return np.load(images_path, mmap_mode="c"), labels, tree.classes


class _Inline:
    """ProcessPoolExecutor's map in this process (num_workers=0)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def map(self, fn, items, chunksize=1):
        return map(fn, items)


class ImageDataModule(L.LightningDataModule):
    """Loaders and transforms shared by every dataset; subclasses provide `_load(stage)`.

    Args:
        num_classes: classes of the dataset, checked against the data found.
        img_size: side of the square images fed to the model.
        batch_size: per process (under DDP the global batch is batch_size * world size).
        val_size: images held out of the training split for validation (0: validate on
            the test split, as ImageNet recipes do).
        augment: the transforms (default: `Augment()`).
        pipeline: "cpu" (DataLoader worker processes decode and transform PIL images) or "gpu"
            (uint8 arrays on the training device, batches augmented there by
            vitflash.gpu_augment; see vitflash.gpu_data).
        shuffle_seed: of the per-epoch order and augmentation, on either pipeline (None: 0).
        gpu_storage: where the gpu pipeline keeps the images: "device", "stream" (host memory or
            a memory-mapped cache, copied in per batch) or "auto" (device when they take at most
            half of the free device memory).
        gpu_graph: on a GPU, the training augmentation is replayed as a CUDA graph (one launch per
            batch instead of hundreds; vitflash.gpu_data.SeededTransform); false: eagerly.
        aug_repeats: repeated augmentation (DeiT's; timm's --aug-repeats): each training image
            drawn into an epoch comes this many times in a row, each copy augmented apart, and
            the epoch keeps its length, so it sees 1/aug_repeats of the images. 1: off. Either
            pipeline.
        expected_sizes: (train, test) image counts the data must have (e.g. CIFAR's
            (50000, 10000)), so an incomplete copy is caught before training; None skips it.
    """

    def __init__(
        self,
        num_classes: int,
        img_size: int,
        batch_size: int = 128,
        eval_batch_size: int | None = None,
        num_workers: int = 4,
        val_size: int = 0,
        split_seed: int = 0,
        augment: Augment | None = None,
        pipeline: str = "cpu",
        shuffle_seed: int = 0,
        gpu_storage: str = "auto",
        expected_sizes: Sequence[int] | None = None,
        gpu_graph: bool = True,
        aug_repeats: int = 1,
    ):
        super().__init__()
        if pipeline not in PIPELINES:
            raise ValueError(f"data.pipeline={pipeline!r}: choose one of {', '.join(PIPELINES)}")
        if gpu_storage not in STORAGES:
            raise ValueError(f"data.gpu_storage={gpu_storage!r}: choose one of {', '.join(STORAGES)}")
        for name, value, least in (("num_classes", num_classes, 1), ("img_size", img_size, 1),
                                   ("batch_size", batch_size, 1), ("num_workers", num_workers, 0),
                                   ("val_size", val_size, 0), ("aug_repeats", aug_repeats, 1)):
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise ValueError(f"data.{name}={value!r} is not a whole number >= {least}: set it to one "
                                 f"(the dataset's config in configs/data/ shows the usual value)")
        # numpy's SeedSequence, which seeds each epoch's order and augmentation, takes no negative
        # number: refused here rather than at the first batch
        if shuffle_seed is not None and (not isinstance(shuffle_seed, int) or isinstance(shuffle_seed, bool)
                                         or shuffle_seed < 0):
            raise ValueError(f"data.shuffle_seed={shuffle_seed!r} is not a whole number >= 0: set seed (which "
                             f"data.shuffle_seed follows in configs/data/) or data.shuffle_seed to one")
        self.expected_sizes = tuple(expected_sizes) if expected_sizes else None
        self._resume: dict | None = None  # the train loader's position, from a checkpoint
        self._train_sampler: ResumableSampler | None = None
        self.num_classes, self.img_size = num_classes, img_size
        self.batch_size, self.eval_batch_size = batch_size, eval_batch_size or batch_size
        self.num_workers, self.val_size, self.split_seed = num_workers, val_size, split_seed
        self.pipeline, self.shuffle_seed, self.gpu_storage = pipeline, shuffle_seed or 0, gpu_storage
        self.gpu_graph, self.aug_repeats = bool(gpu_graph), aug_repeats
        augment = self.augment = augment or Augment()
        self.classes: list[str] | None = None  # in label order, once the data is loaded (`inputs`)
        self.train_transform = augment.train_transform(img_size)
        self.eval_transform = augment.eval_transform(img_size)
        self.gpu_augment = GPUAugment(augment, img_size) if pipeline == "gpu" else None
        self.train_set = self.val_set = self.test_set = None
        self.arrays: GPUArrays | None = None
        self._train_loader: GPULoader | None = None
        self._train_state: dict | None = None

    def inputs(self) -> dict:
        """What a model trained on this data expects of an image, saved in its checkpoints for
        scripts/predict.py (`eval_inputs`; the class names are None before the data is loaded)."""
        return eval_inputs(self.augment, self.img_size, self.classes)

    def _load(self, stage: str | None) -> tuple[Dataset, Dataset, Dataset]:
        """Return (train, train_as_eval, test): train with the training transform, the same
        images with the eval transform (the source of the held-out val split), test."""
        return self._arrays_to_splits(*self._load_arrays(stage))

    def _load_arrays(self, stage: str | None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Train images (N, H, W, 3) uint8 (an array or a memory-mapped file), labels (N,), test
        images and labels: what the gpu pipeline (and `_load` by default) reads."""
        raise NotImplementedError

    def _arrays_to_splits(self, x: np.ndarray, y: np.ndarray, xt: np.ndarray, yt: np.ndarray):
        """`_load`'s triple from in-memory arrays: train images (N, H, W, 3) uint8 and labels
        (N,), test images and labels."""
        return (ArrayDataset(x, y, self.train_transform), ArrayDataset(x, y, self.eval_transform),
                ArrayDataset(xt, yt, self.eval_transform))

    def check_data(self) -> None:
        """Raise FileNotFoundError, naming the command that fixes it, when the dataset is not
        on disk. Cheap (no image is read): train.py calls it before building the model,
        which may fetch pretrained weights."""

    def _check_classes(self, found: int, where: object) -> None:
        if found != self.num_classes:
            raise ValueError(
                f"{where} has {found} classes but data.num_classes={self.num_classes}: the data there "
                f"is incomplete or another dataset. Unpack it again with scripts/prepare_data.py (see "
                f"the data section of the README); only if it really has {found} classes, set "
                f"data.num_classes={found}"
            )

    @staticmethod
    def _check_same_classes(train_dir: Path, classes: list[str], test_dir: Path, test_classes: list[str]) -> None:
        """Labels are positions in the sorted class folders: a split that lacks a folder (or has
        another) would number its classes differently from the other, silently."""
        if test_classes == classes:
            return
        differences = [f"{split.name} lacks {', '.join(sorted(set(other) - set(mine)))}"
                       for split, mine, other in ((test_dir, test_classes, classes), (train_dir, classes, test_classes))
                       if set(other) - set(mine)]
        raise ValueError(
            f"{test_dir} and {train_dir} have different class folders ({'; '.join(differences)}), so their "
            f"labels would name different classes: the copy is incomplete. Unpack it again with "
            f"scripts/prepare_data.py; for a subset keep every class folder in both splits"
        )

    def _check_sizes(self, train: Dataset, test: Dataset) -> None:
        found = (len(train), len(test))
        if self.expected_sizes and found != self.expected_sizes:
            raise ValueError(
                f"the data has {found[0]} training and {found[1]} test images but "
                f"{self.expected_sizes[0]} and {self.expected_sizes[1]} are expected "
                f"(data.expected_sizes): the copy is incomplete. Unpack it again with "
                f"scripts/prepare_data.py; for a deliberate subset set data.expected_sizes=null"
            )

    def _split(self, n: int) -> tuple[list[int], list[int]] | None:
        """(train rows, held-out val rows) of n training images, or None when val_size is 0."""
        if self.val_size <= 0:
            return None
        if self.val_size >= n:
            raise ValueError(f"val_size={self.val_size} leaves no training images of {n}")
        order = torch.randperm(n, generator=torch.Generator().manual_seed(self.split_seed)).tolist()
        return order[self.val_size:], order[: self.val_size]

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None or self.arrays is not None:
            return
        if self.pipeline == "gpu":
            self._setup_gpu(stage)
            return
        train, train_eval, test = self._load(stage)
        self._check_sizes(train, test)
        split = self._split(len(train))
        if split is None:
            self.train_set, self.val_set = train, test
        else:
            self.train_set, self.val_set = Subset(train, split[0]), Subset(train_eval, split[1])
        self.test_set = test

    # ---- the gpu pipeline ----

    def _placement(self) -> tuple[torch.device, int, int]:
        """(device, rank, world size): the trainer's, or without one the GPU if any, alone."""
        if self.trainer is not None:
            return self.trainer.strategy.root_device, self.trainer.global_rank, self.trainer.world_size
        return torch.device("cuda" if torch.cuda.is_available() else "cpu"), 0, 1

    def _setup_gpu(self, stage: str | None) -> None:
        x, y, xt, yt = self._load_arrays(stage)
        self._check_sizes(y, yt)
        split = self._split(len(y))
        device, rank, world = self._placement()
        storage = choose_storage(self.gpu_storage, x.nbytes + xt.nbytes, device)

        def place(a):  # a memory-mapped array stays mapped until it is moved
            t = torch.from_numpy(np.ascontiguousarray(a))
            return t.to(device) if storage == "device" else t

        train, test = place(x), place(xt)
        val = (train, split[1]) if split else (test, None)
        self.arrays = GPUArrays(device=device, rank=rank, world_size=world, train=train,
                                train_labels=torch.from_numpy(np.asarray(y, np.int64)),
                                train_rows=split[0] if split else None, val=val[0],
                                val_labels=torch.from_numpy(np.asarray(y if split else yt, np.int64)),
                                val_rows=val[1], test=test, test_labels=torch.from_numpy(np.asarray(yt, np.int64)))
        log.info("gpu pipeline: %d train, %d val, %d test images of %s in %s storage on %s (rank %d of %d)",
                 len(split[0]) if split else len(y), len(split[1]) if split else len(yt), len(yt),
                 tuple(x.shape[1:]), storage, device, rank, world)

    def _gpu_loader(self, split: str) -> GPULoader:
        a = self.arrays
        images, labels, rows = getattr(a, split), getattr(a, f"{split}_labels"), getattr(a, f"{split}_rows")
        train = split == "train"
        loader = GPULoader(images, labels, self.gpu_augment.train if train else self.gpu_augment.evaluate,
                           self.batch_size if train else self.eval_batch_size, device=a.device, indices=rows,
                           train=train, seed=self.shuffle_seed, rank=a.rank, world_size=a.world_size,
                           epoch=self.trainer.current_epoch if self.trainer is not None and train else 0,
                           graph=self.gpu_graph, aug_repeats=self.aug_repeats)
        if train:
            if self._train_state is not None:
                loader.seek(self._train_state)
                self._train_state = None
            self._train_loader = loader
        return loader

    # The train loader's position travels as the DataModule's state. Lightning restores a
    # DataModule before anything builds the train loader, but a loader's own state only if the
    # loader is built after the loops are restored, which is not so when configure_optimizers
    # asks for trainer.estimated_stepping_batches (as ViTModule does).
    def state_dict(self) -> dict:
        """Where the training loader stands (saved in every checkpoint by Lightning): the gpu
        loader's (epoch, batches taken, seed), or the cpu path's ResumableSampler position. An
        epoch that took all the batches the trainer lets it take (trainer.limit_train_batches may
        cut it short) is saved as the start of the next one, on either pipeline."""
        trainer = self.trainer
        if self._train_loader is not None:
            position = self._train_loader.position()
            if trainer is not None:
                position["epoch"], position["batches"] = _resume_point(
                    position["epoch"], position["batches"], trainer.num_training_batches)
            return {"train_loader": position}
        sampler = self._train_sampler
        if sampler is None or trainer is None:
            return {}
        progress = trainer.fit_loop.epoch_loop.batch_progress.current
        return sampler.state_dict(batches_done=progress.processed, batches_per_epoch=trainer.num_training_batches,
                                  batch_size=self.batch_size)

    def load_state_dict(self, state: dict) -> None:
        if state and ("train_loader" in state) != (self.pipeline == "gpu"):
            saved = "gpu" if "train_loader" in state else "cpu"
            raise ValueError(
                f"the checkpoint was saved with data.pipeline={saved} and this run has "
                f"data.pipeline={self.pipeline}: a run resumes exactly only on the pipeline it "
                f"started on; set data.pipeline={saved}")
        if "train_loader" not in state:
            self._resume = dict(state) or None
            return
        self._train_state = state["train_loader"]
        if self._train_loader is not None:
            self._train_loader.seek(self._train_state)
            self._train_state = None

    def _loader(self, dataset: Dataset, train: bool) -> DataLoader:
        sampler = None
        if train:
            # Shuffling and augmentation drawn from (seed, epoch, index) alone, so a resumed run
            # sees the same batches, augmented alike (see ResumableSampler).
            sampler = self._train_sampler = ResumableSampler(dataset, seed=self.shuffle_seed,
                                                             aug_repeats=self.aug_repeats)
            # drop_last: a split smaller than a batch would train nothing, and the run would look fine
            require_batches(len(sampler) // self.batch_size, len(dataset), self.batch_size, sampler.num_replicas)
            if self._resume:
                sampler.load_state_dict(self._resume)
                self._resume = None
            dataset = SeededSamples(dataset)
        return DataLoader(
            dataset,
            batch_size=self.batch_size if train else self.eval_batch_size,
            sampler=sampler,
            drop_last=train,  # mixup needs even batches; equal steps on every DDP rank
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
            pin_memory=torch.cuda.is_available(),
            # its own generator: making an iterator then draws nothing from the global torch RNG
            generator=torch.Generator().manual_seed(self.split_seed),
        )

    def train_dataloader(self) -> DataLoader | GPULoader:
        return self._gpu_loader("train") if self.arrays else self._loader(self.train_set, train=True)

    def val_dataloader(self) -> DataLoader | GPULoader:
        return self._gpu_loader("val") if self.arrays else self._loader(self.val_set, train=False)

    def test_dataloader(self) -> DataLoader | GPULoader:
        return self._gpu_loader("test") if self.arrays else self._loader(self.test_set, train=False)


class CIFARDataModule(ImageDataModule):
    """CIFAR-10/100 from `root`, held in memory as uint8 arrays.

    Looks for torchvision's pickled batches (`root/cifar-10-batches-py`,
    `root/cifar-100-python`) first, then an ImageFolder JPEG tree (`root/cifar10/train`,
    `root/cifar10/test`, as in the shared archive). `download=True` lets torchvision fetch
    the batches when neither is there (needs internet).
    """

    _TORCHVISION = {"cifar10": (datasets.CIFAR10, "cifar-10-batches-py"),
                    "cifar100": (datasets.CIFAR100, "cifar-100-python")}

    def __init__(self, root: str, name: str = "cifar10", download: bool = False, **kwargs):
        if name not in self._TORCHVISION:
            raise ValueError(f"CIFAR name {name!r}: choose one of {', '.join(self._TORCHVISION)}")
        super().__init__(**kwargs)
        self.root, self.name, self.download = Path(root), name, download

    def _source(self) -> str:
        """'torchvision' or 'folder', whichever layout is under root; raise if neither."""
        if (self.root / self._TORCHVISION[self.name][1]).is_dir():
            return "torchvision"
        tree = self.root / self.name
        if (tree / "train").is_dir() and (tree / "test").is_dir():
            return "folder"
        if self.download:
            return "torchvision"
        raise FileNotFoundError(
            f"{self.name} not found under {self.root}: expected {self.root / self._TORCHVISION[self.name][1]} "
            f"(torchvision) or {tree}/train and {tree}/test (JPEG tree). "
            + self._hint()
        )

    def _hint(self) -> str:
        download = f"`python scripts/prepare_data.py --download {self.name} --root {self.root}` (online)"
        if self.name == "cifar10":  # the shared data holds CIFAR-10 only
            return _prepare_hint(self.root, "cifar10-jpeg.tar.gz") + f", or {download}"
        return f"Fetch it with {download}"

    def _arrays(self, train: bool, download: bool = False) -> tuple[np.ndarray, np.ndarray, list[str]]:
        """Images (N, 32, 32, 3) uint8, labels (N,), class names of one split."""
        if self._source() == "torchvision":
            cls = self._TORCHVISION[self.name][0]
            try:
                ds = cls(str(self.root), train=train, download=download)
            except OSError as e:  # URLError is an OSError
                raise OSError(f"could not download {self.name} into {self.root} ({e}); " + self._hint()) from e
            return ds.data, np.asarray(ds.targets, dtype=np.int64), ds.classes
        split = "train" if train else "test"
        return load_image_folder(self.root / self.name / split, num_workers=self.num_workers, mixed_sizes_fix=(
            "CIFARDataModule keeps a split in one array, which needs images of one size (CIFAR's are 32x32). "
            "Unpack the dataset again with scripts/prepare_data.py; a tree of mixed sizes reads with "
            "ImageFolderDataModule (configs/data/imagenet.yaml, in_memory=false), which decodes them on the fly"))

    def check_data(self) -> None:
        self._source()

    def prepare_data(self) -> None:
        # rank 0 only: download or decode (writing the cache) before the other ranks read it
        for train in (True, False):
            self._arrays(train, download=self.download)

    def _load_arrays(self, stage: str | None):
        (x, y, classes), (xt, yt, test_classes) = self._arrays(True), self._arrays(False)
        self._check_classes(int(y.max()) + 1, self.root / self.name)
        tree = self.root / self.name  # the JPEG tree's splits (torchvision's batches have one class list)
        self._check_same_classes(tree / "train", classes, tree / "test", test_classes)
        self.classes = list(classes)
        return x, y, xt, yt


class ImageFolderDataModule(ImageDataModule):
    """An ImageFolder tree in the ImageNet layout: `root/train/<class>/*`, `root/val/<class>/*`
    (or `root/test/<class>/*`). Images are read as RGB (greyscale ones are converted).

    in_memory: decode once into a uint8 array (images must all have one size); cpu pipeline.
    cache_size: the gpu pipeline's cache: every image resized to this short side and centre-
        cropped square, decoded once (`cache_image_folder`); the crops to img_size happen on the
        device.
    """

    def __init__(self, root: str, train_dir: str = "train", test_dir: str | None = None,
                 in_memory: bool = False, cache_size: int | None = None, **kwargs):
        super().__init__(**kwargs)
        if self.pipeline == "gpu" and not cache_size:
            raise ValueError("data.pipeline=gpu reads ImageFolder trees from a decoded cache: set data.cache_size "
                             "(the short side kept, e.g. 160 or 256; at least img_size for full-resolution crops)")
        self.root, self.train_dir, self.test_dir, self.in_memory = Path(root), train_dir, test_dir, in_memory
        self.cache_size = cache_size

    def _split_dirs(self) -> tuple[Path, Path]:
        names = [self.test_dir] if self.test_dir else ["val", "test"]
        test = next((self.root / n for n in names if (self.root / n).is_dir()), None)
        train = self.root / self.train_dir
        if not train.is_dir() or test is None:
            archive = f"{self.root.name}-val.tar.gz"
            # name the shared archive only where there is one (Imagenette, not ImageNet)
            hint = (_prepare_hint(self.root.parent, archive) + " (and the same for each train shard)"
                    if (SHARED_DATA / archive).is_file() else
                    f"Put the dataset there in that layout (`python scripts/prepare_data.py --archive "
                    f"<your archive> --root {self.root.parent}` unpacks a tar of it), or point "
                    f"data.root at it")
            raise FileNotFoundError(
                f"no ImageFolder tree at {self.root}: expected {train}/<class>/ and "
                f"{self.root}/{'|'.join(names)}/<class>/. " + hint
            )
        return train, test

    def check_data(self) -> None:
        self._split_dirs()

    def prepare_data(self) -> None:
        # rank 0 only: decode (writing the cache) before the other ranks read it
        for folder in self._split_dirs():
            if self.pipeline == "gpu":
                cache_image_folder(folder, self.cache_size, num_workers=self.num_workers)
            elif self.in_memory:
                load_image_folder(folder, num_workers=self.num_workers)

    def _load_arrays(self, stage: str | None):
        train_dir, test_dir = self._split_dirs()
        decode = partial(cache_image_folder, size=self.cache_size) if self.pipeline == "gpu" else load_image_folder
        (x, y, classes), (xt, yt, test_classes) = decode(train_dir), decode(test_dir)
        self._check_classes(len(classes), train_dir)
        self._check_same_classes(train_dir, classes, test_dir, test_classes)
        self.classes = list(classes)
        return x, y, xt, yt

    def _load(self, stage: str | None):
        train_dir, test_dir = self._split_dirs()
        if self.in_memory:
            return self._arrays_to_splits(*self._load_arrays(stage))
        train = datasets.ImageFolder(str(train_dir), transform=self.train_transform)
        self._check_classes(len(train.classes), train_dir)
        test = datasets.ImageFolder(str(test_dir), transform=self.eval_transform)
        self._check_same_classes(train_dir, train.classes, test_dir, test.classes)
        self.classes = list(train.classes)
        return train, datasets.ImageFolder(str(train_dir), transform=self.eval_transform), test


class SyntheticDataModule(ImageDataModule):
    """Random images whose class sets a fixed pattern (so a model can learn it): smoke runs
    without any data on disk."""

    def __init__(self, train_size: int = 512, test_size: int = 128, seed: int = 0, **kwargs):
        super().__init__(**kwargs)
        self.train_size, self.test_size, self.seed = train_size, test_size, seed

    def _images(self, n: int, rng: np.random.Generator, templates: np.ndarray):
        labels = np.arange(n, dtype=np.int64) % self.num_classes
        # uint8 noise and a uint16 sum: ImageNet-sized sets (bench_loop's imagenette_synthetic,
        # 9,469 images of 224 px) stay a few GB instead of int64's tens
        noise = rng.integers(0, 256, (n, self.img_size, self.img_size, 3), dtype=np.uint8)
        return ((templates.astype(np.uint16)[labels] + noise) // 2).astype(np.uint8), labels

    def _load_arrays(self, stage: str | None):
        rng = np.random.default_rng(self.seed)
        templates = rng.integers(0, 256, (self.num_classes, self.img_size, self.img_size, 3))
        (x, y), (xt, yt) = self._images(self.train_size, rng, templates), self._images(self.test_size, rng, templates)
        return x, y, xt, yt


class SeededSamples(Dataset):
    """`dataset` indexed by (index, seed) pairs: each sample is transformed with python's,
    numpy's and torch's global generators seeded by its own seed, so its augmentation depends on
    nothing else (not the worker it lands in, not what ran before). In the main process the
    generators' states are put back after each batch: the model's draws (dropout, mixup) then
    form one stream that a checkpoint can save and restore.
    """

    def __init__(self, dataset: Dataset):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, item: tuple[int, int]):
        return self.__getitems__([item])[0]

    def __getitems__(self, items: list[tuple[int, int]]) -> list:
        # DataLoader calls this once per batch, so the states are saved once per batch.
        main = get_worker_info() is None
        if main:
            saved = random.getstate(), np.random.get_state(), torch.get_rng_state()
        try:
            out = []
            for index, seed in items:
                random.seed(seed)
                np.random.seed(seed)
                torch.random.default_generator.manual_seed(seed)  # CPU only: transforms run there
                out.append(self.dataset[index])
            return out
        finally:
            if main:
                random.setstate(saved[0])
                np.random.set_state(saved[1])
                torch.set_rng_state(saved[2])


def _resume_point(epoch: int, batches_done: int, batches_per_epoch: int | float) -> tuple[int, int]:
    """(epoch, batches done in it) where a run stopped after `batches_done` batches of an epoch
    of `batches_per_epoch` (the trainer's num_training_batches) resumes: an epoch that is over
    resumes at the start of the next one, as an uninterrupted run goes on."""
    if batches_done >= batches_per_epoch:
        return epoch + 1, 0
    return epoch, batches_done


class ResumableSampler(DistributedSampler):
    """The training order: a shuffle drawn from (seed, epoch) alone, each index paired with the
    seed of its augmentation, drawn from (seed, epoch, index); `state_dict` says where an epoch
    stands, and a sampler given it starts there. Under DDP each process takes every
    world-size-th index of the shared order, as DistributedSampler does; being one, Lightning
    calls its `set_epoch` and does not wrap it.

    torch's samplers draw their order from the global generator when an iterator is made, and
    DataLoader workers seed from it too: a run resumed mid-epoch would see other batches.

    aug_repeats=r > 1: each index of the shuffle stands r times in a row, the order cut back to
    the dataset's length (repeated augmentation, as vitflash.gpu_data.GPULoader does it); the
    copy's number joins the seed of its augmentation, so no two copies are augmented alike.
    """

    def __init__(self, dataset: Dataset, seed: int = 0, aug_repeats: int = 1):
        distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
        super().__init__(dataset, num_replicas=None if distributed else 1, rank=None if distributed else 0,
                         shuffle=True, seed=seed, drop_last=False)
        self.start = 0  # samples of this process to skip in the current epoch (resume)
        self.aug_repeats = aug_repeats

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self.start = 0  # a resume position belongs to its own epoch
        super().set_epoch(epoch)

    def __iter__(self):
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        drawn = torch.randperm(len(self.dataset), generator=g).tolist()
        r = self.aug_repeats
        # (index, the seed's entropy); without repeats the entropy keeps its old form, so that
        # runs and their checkpoints from before the option see the same augmentation
        order = [(i, (self.seed, self.epoch, i) if r == 1 else (self.seed, self.epoch, i, c))
                 for i in drawn for c in range(r)][: len(drawn)]
        order += order[: self.total_size - len(order)]  # pad to a multiple of the world size
        mine = order[self.rank : self.total_size : self.num_replicas]
        start, self.start = self.start, 0
        for index, entropy in mine[start:]:
            yield index, int(np.random.SeedSequence(entropy).generate_state(1)[0])

    def state_dict(self, batches_done: int, batches_per_epoch: int | float, batch_size: int) -> dict:
        """The position after `batches_done` batches of `batch_size` in an epoch of `batches_per_epoch`."""
        epoch, batches = _resume_point(self.epoch, batches_done, batches_per_epoch)
        return {"seed": self.seed, "epoch": epoch, "start": batches * batch_size}

    def load_state_dict(self, state: dict) -> None:
        self.seed, self.epoch, self.start = state["seed"], state["epoch"], state["start"]
