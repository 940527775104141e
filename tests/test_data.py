"""DataModules, the decoded-image cache and scripts/prepare_data.py, on small trees made here."""
from __future__ import annotations

import hashlib
import io
import os
import pickle
import re
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
import torchvision
from torchvision import datasets

from vitflash.data import Augment, CIFARDataModule, ImageFolderDataModule, SyntheticDataModule, cache_image_folder, load_image_folder

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import prepare_data  # noqa: E402

CLASSES = ["cat", "dog", "frog"]


def write_tree(split_dir: Path, per_class: int, size: int = 8, seed: int = 0) -> np.ndarray:
    """Random PNG images (lossless, so decoding must give them back) in <split>/<class>/;
    returns them (N, size, size, 3) in ImageFolder order."""
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, (len(CLASSES) * per_class, size, size, 3), dtype=np.uint8)
    for i, img in enumerate(images):
        folder = split_dir / CLASSES[i // per_class]
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(img).save(folder / f"{i:04d}.png")
    return images


def kwargs(**extra):
    return dict(num_classes=len(CLASSES), img_size=8, batch_size=4, num_workers=0, **extra)


@pytest.mark.parametrize("train_crop", ["rrc", "pad"])
def test_transforms_give_normalized_tensors(train_crop):
    img = Image.fromarray(np.full((32, 32, 3), 255, np.uint8))
    train = Augment(train_crop=train_crop, auto_augment="rand-m9-mstd0.5-inc1", re_prob=0.5).train_transform(32)
    assert train(img).shape == (3, 32, 32)
    evaluate = Augment(mean=(0.5,) * 3, std=(0.25,) * 3).eval_transform(32)
    assert torch.allclose(evaluate(img), torch.full((3, 32, 32), 2.0))  # (1 - 0.5) / 0.25


def test_posterize_to_zero_bits_gives_black_as_older_pillow():
    """timm's PosterizeIncreasing keeps 0 bits at magnitude 10, which Pillow >= 13 refuses: the
    cpu pipeline's RandAugment runs its own posterize, black for 0 bits, timm's otherwise."""
    from timm.data import auto_augment as timm_auto_augment

    from vitflash.data import _posterize

    transform = Augment(train_crop="pad", auto_augment="rand-m9-mstd0.5-inc1").train_transform(16)
    transform = pickle.loads(pickle.dumps(transform))  # as DataLoader workers get it
    ops = [op for t in transform.transforms for s in getattr(t, "transforms", [t]) for op in getattr(s, "ops", [])]
    posterize = [op for op in ops if op.name.startswith("Posterize")]
    assert len(ops) == 15 and [op.name for op in posterize] == ["PosterizeIncreasing"]
    assert all(op.aug_fn is _posterize for op in posterize)
    op = posterize[0]
    op.prob, op.magnitude, op.magnitude_std = 1.0, 10, 0  # always, at the magnitude that keeps 0 bits
    img = Image.fromarray(np.random.default_rng(0).integers(1, 256, (16, 16, 3), dtype=np.uint8))
    out = op(img)
    assert out.mode == "RGB" and out.size == (16, 16) and not np.asarray(out).any()
    for bits in range(1, 9):
        assert np.array_equal(np.asarray(_posterize(img, bits)), np.asarray(timm_auto_augment.posterize(img, bits)))
    # AutoAugment's policies hold them too
    original = Augment(auto_augment="original").train_transform(16)
    policy = [op for t in original.transforms for s in getattr(t, "transforms", [t]) for sub in getattr(s, "policy", [])
              for op in sub if op.name.startswith("Posterize")]
    assert policy and all(op.aug_fn is _posterize for op in policy)


def test_synthetic_batches():
    dm = SyntheticDataModule(num_classes=10, img_size=32, batch_size=16, num_workers=0, train_size=64, test_size=32)
    dm.setup("fit")
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == (16, 3, 32, 32) and x.dtype == torch.float32
    assert y.dtype == torch.int64 and 0 <= int(y.min()) and int(y.max()) < 10
    assert len(dm.val_set) == len(dm.test_set) == 32


def test_the_cpu_sampler_repeats_each_drawn_index_with_its_own_augmentation_seed():
    from vitflash.data import ResumableSampler

    data = list(range(30))
    plain, repeated = ResumableSampler(data, seed=4), ResumableSampler(data, seed=4, aug_repeats=3)
    once, thrice = list(plain), list(repeated)
    assert len(thrice) == len(once) == 30  # the epoch keeps its length
    idx = [i for i, _ in thrice]
    assert idx == [i for i, _ in once[:10] for _ in range(3)]  # the same draw, each index three times
    assert all(len({s for _, s in thrice[k : k + 3]}) == 3 for k in range(0, 30, 3))  # copies seeded apart
    # without repeats, the seeds of runs made before the option
    assert [s for _, s in once] == [int(np.random.SeedSequence((4, 0, i)).generate_state(1)[0]) for i, _ in once]
    repeated.set_epoch(1)
    assert [i for i, _ in repeated][::3] != idx[::3]
    # a resume mid-epoch continues the same copies
    repeated.load_state_dict({"seed": 4, "epoch": 0, "start": 7})
    assert list(repeated) == thrice[7:]
    dm = SyntheticDataModule(**kwargs(aug_repeats=3), train_size=48, test_size=8)
    dm.setup("fit")
    labels = torch.cat([y for _, y in dm.train_dataloader()])
    assert len(labels) == 48 and dm._train_sampler.aug_repeats == 3


@pytest.mark.parametrize("pipeline", ["cpu", "gpu"], ids=["cpu pipeline", "gpu pipeline on the CPU"])
def test_a_split_smaller_than_a_batch_is_refused(pipeline):
    """drop_last leaves such a split no training step: both pipelines refuse it alike."""
    dm = SyntheticDataModule(**{**kwargs(pipeline=pipeline), "batch_size": 32}, train_size=20, test_size=8)
    dm.setup("fit")
    with pytest.raises(ValueError, match=r"^20 images make no batch of 32 on each of 1 process\(es\): "
                                         r"lower data.batch_size$"):
        dm.train_dataloader()
    dm = SyntheticDataModule(**{**kwargs(pipeline=pipeline), "batch_size": 20}, train_size=20, test_size=8)
    dm.setup("fit")
    assert len(dm.train_dataloader()) == 1


@pytest.mark.parametrize("seed", [-1, 1.5])
def test_a_bad_shuffle_seed_is_refused_at_once(seed):
    with pytest.raises(ValueError, match=rf"data.shuffle_seed={seed} is not a whole number >= 0: set seed "):
        SyntheticDataModule(**kwargs(shuffle_seed=seed))
    assert SyntheticDataModule(**kwargs(shuffle_seed=None)).shuffle_seed == 0


def test_decoded_arrays_are_cached(tmp_path):
    images = write_tree(tmp_path / "train", per_class=4)
    x, y, classes = load_image_folder(tmp_path / "train")
    assert classes == CLASSES
    np.testing.assert_array_equal(x, images)
    np.testing.assert_array_equal(y, np.repeat(np.arange(3), 4))
    assert (tmp_path / "train-uint8.npz").is_file()
    # same files, new pixels: the cache answers, so the old pixels come back
    write_tree(tmp_path / "train", per_class=4, seed=1)
    np.testing.assert_array_equal(load_image_folder(tmp_path / "train")[0], images)
    # one more file: the cache is stale and the folder is decoded again
    Image.fromarray(images[0]).save(tmp_path / "train" / "cat" / "extra.png")
    assert len(load_image_folder(tmp_path / "train")[1]) == 13


@pytest.mark.parametrize("size", [None, 8], ids=["npz", "npy"])
def test_runs_decoding_one_split_at_once_do_not_collide(tmp_path, monkeypatch, size):
    """Two runs started together (a sweep) decode the same split: the second writes and renames
    its cache between the first's write and rename. Each has a file of its own, so both end
    with the images, and no temporary file is left."""
    images = write_tree(tmp_path / "train", per_class=2)
    load = (lambda: load_image_folder(tmp_path / "train")) if size is None else (
        lambda: cache_image_folder(tmp_path / "train", size))
    real_replace, nested = os.replace, []

    def replace(src, dst):
        if not nested:  # the first rename of the first run: the second run goes all the way first
            nested.append(None)
            nested[0] = load()
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    first = load()
    np.testing.assert_array_equal(first[0], images)
    np.testing.assert_array_equal(nested[0][0], images)
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_images_of_other_sizes_are_named_with_the_callers_fix(tmp_path):
    """One image of another size after the first 500 (where decoding used to cut its batches):
    the folder, both files and their sizes, and what to do on the DataModule that asked."""
    for i in range(500):
        (tmp_path / "train" / "a").mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (8, 8), (i % 256, 0, 0)).save(tmp_path / "train" / "a" / f"{i:03d}.png")
    (tmp_path / "train" / "b").mkdir()
    Image.new("RGB", (16, 12)).save(tmp_path / "train" / "b" / "0.png")
    with pytest.raises(ValueError, match=r"train holds images of different sizes \(.*a/000.png is 8x8, .*b/0.png "
                                         r"is 16x12\), which cannot be kept as one array: set data.in_memory=false"):
        load_image_folder(tmp_path / "train")
    assert not (tmp_path / "train-uint8.npz").exists()

    for split in ("train", "test"):  # CIFARDataModule has no in_memory to set
        write_tree(tmp_path / "cifar" / "cifar10" / split, per_class=2)
        Image.new("RGB", (10, 10)).save(tmp_path / "cifar" / "cifar10" / split / "dog" / "odd.png")
    with pytest.raises(ValueError, match=r"different sizes .*CIFARDataModule keeps a split in one array, which needs "
                                         r"images of one size.*scripts/prepare_data.py.*ImageFolderDataModule") as e:
        CIFARDataModule(root=str(tmp_path / "cifar"), **kwargs()).setup("fit")
    assert "data.in_memory=false" not in str(e.value)


@pytest.mark.parametrize("decode", ["arrays", "arrays-workers", "cache", "cache-workers"])
def test_a_damaged_image_is_named(tmp_path, decode):
    write_tree(tmp_path / "train", per_class=2)
    bad = tmp_path / "train" / "dog" / "0002.png"
    bad.write_bytes(bad.read_bytes()[:60])  # a half-copied file
    load = {"arrays": lambda: load_image_folder(tmp_path / "train"),
            "arrays-workers": lambda: load_image_folder(tmp_path / "train", num_workers=2),
            "cache": lambda: cache_image_folder(tmp_path / "train", 8),
            "cache-workers": lambda: cache_image_folder(tmp_path / "train", 8, num_workers=2)}[decode]
    with pytest.raises(ValueError, match=rf"^cannot decode {re.escape(str(bad))} \(.+\): the copy is damaged or "
                                         r"half-unpacked. Unpack it again with scripts/prepare_data.py$"):
        load()


def test_a_failed_decode_leaves_no_file(tmp_path, monkeypatch):
    write_tree(tmp_path / "train", per_class=2)

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(np, "savez", full_disk)
    with pytest.raises(OSError, match="No space left"):
        load_image_folder(tmp_path / "train")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train"]


def test_cifar_jpeg_tree_with_held_out_val(tmp_path):
    write_tree(tmp_path / "cifar10" / "train", per_class=10)
    write_tree(tmp_path / "cifar10" / "test", per_class=2)
    dm = CIFARDataModule(root=str(tmp_path), **kwargs(val_size=6))
    dm.prepare_data()
    dm.setup("fit")
    assert (len(dm.train_set), len(dm.val_set), len(dm.test_set)) == (24, 6, 6)
    assert not set(dm.train_set.indices) & set(dm.val_set.indices)
    x, y = next(iter(dm.val_dataloader()))
    assert x.shape == (4, 3, 8, 8)


def test_splits_with_other_class_folders_are_refused(tmp_path):
    """Labels number the class folders in order: a test split lacking one would shift the rest."""
    write_tree(tmp_path / "cifar10" / "train", per_class=2)
    write_tree(tmp_path / "cifar10" / "test", per_class=1)
    for f in (tmp_path / "cifar10" / "test" / "dog").iterdir():
        f.unlink()
    (tmp_path / "cifar10" / "test" / "dog").rmdir()
    (tmp_path / "cifar10" / "test" / "eel").mkdir()
    Image.new("RGB", (8, 8)).save(tmp_path / "cifar10" / "test" / "eel" / "0.png")
    with pytest.raises(ValueError, match=r"cifar10/test and .*cifar10/train have different class folders \(test "
                                         r"lacks dog; train lacks eel\), so their labels would name different classes"):
        CIFARDataModule(root=str(tmp_path), **kwargs()).setup("fit")
    with pytest.raises(ValueError, match=r"different class folders \(test lacks dog; train lacks eel\)"):
        ImageFolderDataModule(root=str(tmp_path / "cifar10"), **kwargs()).setup("fit")


def test_cifar_torchvision_batches(tmp_path, monkeypatch):
    # torchvision's pickled layout; the md5 check is for the real files, so it is waived here
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    rng = np.random.default_rng(0)
    names = [n for n, _ in datasets.CIFAR10.train_list + datasets.CIFAR10.test_list]
    for name in names:
        data = rng.integers(0, 256, (5, 3 * 32 * 32), dtype=np.uint8)
        labels = [int(v) for v in rng.integers(0, 10, 5)]
        labels[0] = 9
        (folder / name).write_bytes(pickle.dumps({"data": data, "labels": labels}))
    (folder / "batches.meta").write_bytes(pickle.dumps({"label_names": [str(i) for i in range(10)]}))
    monkeypatch.setattr(torchvision.datasets.cifar, "check_integrity", lambda *args: True)
    dm = CIFARDataModule(root=str(tmp_path), num_classes=10, img_size=32, batch_size=5, num_workers=0)
    dm.setup("fit")
    assert (len(dm.train_set), len(dm.test_set)) == (25, 5)
    assert next(iter(dm.train_dataloader()))[0].shape == (5, 3, 32, 32)


def test_missing_dataset_says_how_to_prepare_it(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"cifar10 not found under .*scripts/prepare_data.py --archive"):
        CIFARDataModule(root=str(tmp_path), **kwargs()).prepare_data()
    with pytest.raises(FileNotFoundError, match=r"no ImageFolder tree .*scripts/prepare_data.py"):
        ImageFolderDataModule(root=str(tmp_path / "imagenette"), **kwargs()).setup("fit")


@pytest.mark.parametrize("shared", [True, False])
def test_the_hint_names_the_shared_archive_only_where_it_is(tmp_path, monkeypatch, shared):
    import vitflash.data
    folder = tmp_path / "shared"
    folder.mkdir()
    if shared:
        (folder / "cifar10-jpeg.tar.gz").write_bytes(b"")
    monkeypatch.setattr(vitflash.data, "SHARED_DATA", folder)
    named = f"--archive {folder / 'cifar10-jpeg.tar.gz'} " if shared else "--archive <path to cifar10-jpeg.tar.gz> "
    with pytest.raises(FileNotFoundError, match="cifar10 not found under") as err:
        CIFARDataModule(root=str(tmp_path / "data"), **kwargs()).prepare_data()
    assert named in str(err.value) and "--download cifar10" in str(err.value)


def test_image_folder_tree_and_class_count(tmp_path):
    write_tree(tmp_path / "train", per_class=3)
    write_tree(tmp_path / "val", per_class=1)
    dm = ImageFolderDataModule(root=str(tmp_path), **kwargs())
    dm.setup("fit")
    assert (len(dm.train_set), len(dm.val_set), len(dm.test_set)) == (9, 3, 3)
    with pytest.raises(ValueError, match=r"has 3 classes but data.num_classes=5: the data there is incomplete.*set data.num_classes=3"):
        ImageFolderDataModule(root=str(tmp_path), **{**kwargs(), "num_classes": 5}).setup("fit")


def make_tar(path: Path, members: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, payload in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
    return path


def test_prepare_data_unpacks_and_checks(tmp_path):
    archive = make_tar(tmp_path / "toy.tar.gz", {"toy/train/a/0.txt": b"x", "toy/test/a/0.txt": b"y"})
    (tmp_path / "SHA256SUMS").write_text(f"{hashlib.sha256(archive.read_bytes()).hexdigest()}  toy.tar.gz\n")
    prepare_data.main(["--archive", str(archive), "--root", str(tmp_path / "data")])
    assert (tmp_path / "data" / "toy" / "test" / "a" / "0.txt").read_bytes() == b"y"

    (tmp_path / "SHA256SUMS").write_text(f"{'0' * 64}  toy.tar.gz\n")
    with pytest.raises(SystemExit, match="does not match its checksum"):
        prepare_data.main(["--archive", str(archive), "--root", str(tmp_path / "data")])


@pytest.mark.parametrize("what", ["missing", "folder"])
def test_prepare_data_names_a_missing_archive_before_its_checksum(tmp_path, what):
    """An archive that SHA256SUMS lists but that is missing (or is a folder) is named as such,
    not met with a traceback from reading it for its checksum."""
    archive = tmp_path / "toy.tar.gz"
    (tmp_path / "SHA256SUMS").write_text(f"{'0' * 64}  toy.tar.gz\n")
    if what == "folder":
        archive.mkdir()
    message = "is a folder: pass the .tar.gz file itself" if what == "folder" else "does not exist"
    with pytest.raises(SystemExit, match=f"archive {re.escape(str(archive))} {re.escape(message)}"):
        prepare_data.main(["--archive", str(archive), "--root", str(tmp_path / "data")])
    assert not (tmp_path / "data").exists()


def test_prepare_data_refuses_members_outside_the_root(tmp_path):
    archive = make_tar(tmp_path / "evil.tar.gz", {"../escaped.txt": b"x"})
    with pytest.raises(SystemExit, match="refusing to unpack"):
        prepare_data.main(["--archive", str(archive), "--root", str(tmp_path / "data")])
    assert not (tmp_path / "escaped.txt").exists()
