"""DataModules: CIFAR-10/100, ImageFolder trees (the ImageNet layout) and synthetic images.

Every DataModule yields batches `(images, labels)`: images (B, 3, H, W) float32, normalized;
labels (B,) int64. Augmentation comes from timm (`create_transform`: random-resized crop,
RandAugment, random erasing) and torchvision (the padded crop used on CIFAR).

Small datasets of fixed-size images (CIFAR) are decoded once into uint8 arrays (N, H, W, 3)
kept in memory; the arrays of a JPEG tree are cached as `<split>-uint8.npz` beside the split
folder, so only the first run pays for decoding.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import lightning as L
import numpy as np
import torch
from PIL import Image
from timm.data import create_transform
from torch.utils.data import DataLoader, Dataset, Subset
from torchvision import datasets
from torchvision import transforms as T
from tqdm.auto import tqdm

log = logging.getLogger(__name__)

CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR_STD = (0.2470, 0.2435, 0.2616)


def _prepare_hint(data_root: Path, archive: str) -> str:
    return (f"Unpack the data first: `python scripts/prepare_data.py "
            f"--archive ../shared/data/{archive} --root {data_root}`")


@dataclass
class Augment:
    """How images become (3, img_size, img_size) normalized tensors.

    Training: train_crop "rrc" (timm's random-resized crop over `scale`, the ImageNet recipe)
    or "pad" (a random crop of the image padded by img_size/8, the CIFAR recipe), a flip with
    probability hflip, then timm's RandAugment (`auto_augment`, e.g. "rand-m9-mstd0.5-inc1"),
    color jitter and random erasing (`re_prob`). Evaluation resizes to img_size / crop_pct and
    center-crops img_size.
    """

    train_crop: str = "rrc"
    scale: Sequence[float] = (0.08, 1.0)
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
        primary, secondary, final = create_transform(
            img_size, is_training=True, scale=tuple(self.scale), hflip=self.hflip,
            color_jitter=self.color_jitter, auto_augment=self.auto_augment, re_prob=self.re_prob,
            re_mode="pixel", interpolation=self.interpolation, mean=tuple(self.mean),
            std=tuple(self.std), separate=True,
        )
        if self.train_crop == "pad":
            primary = T.Compose([
                T.RandomCrop(img_size, padding=img_size // 8, padding_mode="reflect"),
                T.RandomHorizontalFlip(self.hflip),
            ])
        return T.Compose([primary, secondary, final])

    def eval_transform(self, img_size: int) -> Callable[[Image.Image], torch.Tensor]:
        return create_transform(img_size, is_training=False, crop_pct=self.crop_pct,
                                interpolation=self.interpolation, mean=tuple(self.mean), std=tuple(self.std))


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


def _stack(batch):
    images, labels = zip(*batch)
    return np.stack(images), np.asarray(labels, dtype=np.int64)


def load_image_folder(folder: Path, num_workers: int = 0) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Decode an ImageFolder split of same-sized images into (N, H, W, 3) uint8 + labels.

    The arrays are cached as `<folder>-uint8.npz`; the cache is reused while the class list
    and the number of files match the folder.
    """
    tree = datasets.ImageFolder(str(folder), transform=np.asarray)
    cache = folder.parent / f"{folder.name}-uint8.npz"
    if cache.exists():
        with np.load(cache) as z:
            if list(z["classes"]) == tree.classes and len(z["labels"]) == len(tree):
                return z["images"], z["labels"], tree.classes
        log.info("%s is stale (the folder changed): decoding again", cache)
    loader = DataLoader(tree, batch_size=500, num_workers=num_workers, collate_fn=_stack)
    chunks = []
    try:
        for batch in tqdm(loader, desc=f"decoding {folder}", unit="batch"):
            chunks.append(batch)
    except ValueError as e:  # np.stack of images of different sizes
        raise ValueError(
            f"{folder} holds images of different sizes, which cannot be kept as one array: "
            "set data.in_memory=false to decode them on the fly"
        ) from e
    images = np.concatenate([c[0] for c in chunks])
    labels = np.concatenate([c[1] for c in chunks])
    tmp = cache.with_name(cache.name + ".tmp.npz")  # written whole, then renamed
    np.savez(tmp, images=images, labels=labels, classes=np.asarray(tree.classes))
    os.replace(tmp, cache)
    log.info("decoded %d images of %s into %s", len(labels), folder, cache)
    return images, labels, tree.classes


class ImageDataModule(L.LightningDataModule):
    """Loaders and transforms shared by every dataset; subclasses provide `_load(stage)`.

    Args:
        num_classes: classes of the dataset, checked against the data found.
        img_size: side of the square images fed to the model.
        batch_size: per process (under DDP the global batch is batch_size * world size).
        val_size: images held out of the training split for validation (0: validate on
            the test split, as ImageNet recipes do).
        augment: the transforms (default: `Augment()`).
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
    ):
        super().__init__()
        self.num_classes, self.img_size = num_classes, img_size
        self.batch_size, self.eval_batch_size = batch_size, eval_batch_size or batch_size
        self.num_workers, self.val_size, self.split_seed = num_workers, val_size, split_seed
        augment = augment or Augment()
        self.train_transform = augment.train_transform(img_size)
        self.eval_transform = augment.eval_transform(img_size)
        self.train_set = self.val_set = self.test_set = None

    def _load(self, stage: str | None) -> tuple[Dataset, Dataset, Dataset]:
        """Return (train, train_as_eval, test): train with the training transform, the same
        images with the eval transform (the source of the held-out val split), test."""
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
                f"{where} has {found} classes but data.num_classes={self.num_classes}: "
                f"set data.num_classes={found}"
            )

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        train, train_eval, test = self._load(stage)
        if self.val_size <= 0:
            self.train_set, self.val_set = train, test
        else:
            if self.val_size >= len(train):
                raise ValueError(f"val_size={self.val_size} leaves no training images of {len(train)}")
            g = torch.Generator().manual_seed(self.split_seed)
            order = torch.randperm(len(train), generator=g).tolist()
            self.train_set = Subset(train, order[self.val_size:])
            self.val_set = Subset(train_eval, order[: self.val_size])
        self.test_set = test

    def _loader(self, dataset: Dataset, train: bool) -> DataLoader:
        return DataLoader(
            dataset,
            batch_size=self.batch_size if train else self.eval_batch_size,
            shuffle=train,
            drop_last=train,  # mixup needs even batches; equal steps on every DDP rank
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
            pin_memory=torch.cuda.is_available(),
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.train_set, train=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_set, train=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader(self.test_set, train=False)


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

    def _arrays(self, train: bool, download: bool = False) -> tuple[np.ndarray, np.ndarray]:
        if self._source() == "torchvision":
            cls = self._TORCHVISION[self.name][0]
            try:
                ds = cls(str(self.root), train=train, download=download)
            except OSError as e:  # URLError is an OSError
                raise RuntimeError(f"could not download {self.name} into {self.root} ({e}); " + self._hint()) from e
            return ds.data, np.asarray(ds.targets, dtype=np.int64)
        split = "train" if train else "test"
        images, labels, _ = load_image_folder(self.root / self.name / split, num_workers=self.num_workers)
        return images, labels

    def check_data(self) -> None:
        self._source()

    def prepare_data(self) -> None:
        # rank 0 only: download or decode (writing the cache) before the other ranks read it
        for train in (True, False):
            self._arrays(train, download=self.download)

    def _load(self, stage: str | None):
        (x, y), (xt, yt) = self._arrays(True), self._arrays(False)
        self._check_classes(int(y.max()) + 1, self.root / self.name)
        return self._arrays_to_splits(x, y, xt, yt)


class ImageFolderDataModule(ImageDataModule):
    """An ImageFolder tree in the ImageNet layout: `root/train/<class>/*`, `root/val/<class>/*`
    (or `root/test/<class>/*`). Images are read as RGB (greyscale ones are converted).

    in_memory: decode once into a uint8 array (images must all have one size).
    """

    def __init__(self, root: str, train_dir: str = "train", test_dir: str | None = None,
                 in_memory: bool = False, **kwargs):
        super().__init__(**kwargs)
        self.root, self.train_dir, self.test_dir, self.in_memory = Path(root), train_dir, test_dir, in_memory

    def _split_dirs(self) -> tuple[Path, Path]:
        names = [self.test_dir] if self.test_dir else ["val", "test"]
        test = next((self.root / n for n in names if (self.root / n).is_dir()), None)
        train = self.root / self.train_dir
        if not train.is_dir() or test is None:
            raise FileNotFoundError(
                f"no ImageFolder tree at {self.root}: expected {train}/<class>/ and "
                f"{self.root}/{'|'.join(names)}/<class>/. "
                + _prepare_hint(self.root.parent, f"{self.root.name}-val.tar.gz")
                + " (and the same for each train shard)"
            )
        return train, test

    def check_data(self) -> None:
        self._split_dirs()

    def prepare_data(self) -> None:
        if self.in_memory:
            for folder in self._split_dirs():
                load_image_folder(folder, num_workers=self.num_workers)

    def _load(self, stage: str | None):
        train_dir, test_dir = self._split_dirs()
        if self.in_memory:
            (x, y, classes), (xt, yt, _) = (load_image_folder(d) for d in (train_dir, test_dir))
            self._check_classes(len(classes), train_dir)
            return self._arrays_to_splits(x, y, xt, yt)
        train = datasets.ImageFolder(str(train_dir), transform=self.train_transform)
        self._check_classes(len(train.classes), train_dir)
        test = datasets.ImageFolder(str(test_dir), transform=self.eval_transform)
        if test.classes != train.classes:
            raise ValueError(f"{test_dir} and {train_dir} have different class folders")
        return train, datasets.ImageFolder(str(train_dir), transform=self.eval_transform), test


class SyntheticDataModule(ImageDataModule):
    """Random images whose class sets a fixed pattern (so a model can learn it): smoke runs
    without any data on disk."""

    def __init__(self, train_size: int = 512, test_size: int = 128, seed: int = 0, **kwargs):
        super().__init__(**kwargs)
        self.train_size, self.test_size, self.seed = train_size, test_size, seed

    def _images(self, n: int, rng: np.random.Generator, templates: np.ndarray):
        labels = np.arange(n, dtype=np.int64) % self.num_classes
        noise = rng.integers(0, 256, (n, self.img_size, self.img_size, 3))
        return ((templates[labels] + noise) // 2).astype(np.uint8), labels

    def _load(self, stage: str | None):
        rng = np.random.default_rng(self.seed)
        templates = rng.integers(0, 256, (self.num_classes, self.img_size, self.img_size, 3))
        (x, y), (xt, yt) = self._images(self.train_size, rng, templates), self._images(self.test_size, rng, templates)
        return self._arrays_to_splits(x, y, xt, yt)
