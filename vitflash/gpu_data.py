"""Batches from uint8 images held on the training device (or streamed to it), augmented there.

`GPULoader` is what the DataModules' train/val/test_dataloader return under `data.pipeline=gpu`:
an iterable with `__len__` yielding (images (B, 3, S, S) float32 normalized, labels (B,) int64)
already on the device. It replaces torch's DataLoader + worker processes: indexing a uint8 array
on the GPU and augmenting the batch in tensor ops (vitflash.gpu_augment) costs microseconds per
batch, where decoding and transforming PIL images costs milliseconds per image.

Order and randomness: every epoch one permutation from a generator seeded with (seed, epoch),
the same on every DDP rank; rank r takes every world_size-th index of it, as DistributedSampler
does. With aug_repeats=r > 1 (repeated augmentation, as DeiT trains) each index of the
permutation stands r times in a row and the order is cut back to the epoch's length: an epoch
sees a 1/r share of the images, r differently augmented copies of each (spread over the ranks
under DDP). The augmentation generator of batch k is seeded with (seed, epoch, rank, k). The
whole state of a loader is therefore (epoch, batches yielded, seed): `position()` holds them,
and a loader given it by `seek()` yields the same batches the saved one would have next. The
DataModule carries that position in Lightning's checkpoints (vitflash.data says why there).
"""
from __future__ import annotations

import logging
import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np
import torch

from vitflash.graph_step import capturing

log = logging.getLogger(__name__)

STORAGES = ("auto", "device", "stream")


def _seed(*entropy: int) -> int:
    """A 63-bit seed mixed from integers (numpy's SeedSequence: nearby inputs give unrelated seeds)."""
    return int(np.random.SeedSequence([int(e) for e in entropy]).generate_state(1, np.uint64)[0] >> 1)


def require_batches(batches: int, images: int, batch_size: int, world_size: int) -> None:
    """Raise where a loader of `images` images would yield no batch (`batches` is 0): a training
    split smaller than a batch on each process trains nothing, and the run would look as if it
    had. Both pipelines' loaders check with it."""
    if batches < 1:
        raise ValueError(f"{images} images make no batch of {batch_size} on each of {world_size} process(es): "
                         "lower data.batch_size")


def choose_storage(storage: str, nbytes: int, device: torch.device, fraction: float = 0.5) -> str:
    """"device" (the images move to `device` once) or "stream" (they stay in host memory or a
    memory-mapped file and every batch is copied in). "auto" picks "device" where the images take
    at most `fraction` of the free device memory (always on the CPU)."""
    if storage not in STORAGES:
        raise ValueError(f"data.gpu_storage={storage!r}: choose one of {', '.join(STORAGES)}")
    if storage != "auto":
        return storage
    if device.type != "cuda":
        return "device"
    free, _ = torch.cuda.mem_get_info(device)
    choice = "device" if nbytes <= fraction * free else "stream"
    log.info("data.gpu_storage=auto -> %s (images %.1f GiB, %.1f GiB free on %s)", choice, nbytes / 2**30,
             free / 2**30, device)
    return choice


@dataclass
class GPUArrays:
    """What a DataModule's gpu pipeline reads: images (N, H, W, 3) uint8 and labels (N,) int64
    per split, `*_rows` the rows of a split (None: all; the held-out val split shares the train
    images), the device and this process's place among the DDP processes."""

    device: torch.device
    rank: int
    world_size: int
    train: torch.Tensor
    train_labels: torch.Tensor
    train_rows: list[int] | None
    val: torch.Tensor
    val_labels: torch.Tensor
    val_rows: list[int] | None
    test: torch.Tensor
    test_labels: torch.Tensor
    test_rows: list[int] | None = None


class GPULoader:
    """Batches of `images[indices]` on `device`, augmented there.

    Args:
        images: (N, H, W, 3) uint8, on `device` (storage "device") or in host memory, e.g. a
            memory-mapped array (storage "stream": every batch is gathered on the host into pinned
            memory and copied in, the next batch prepared by a thread while this one trains).
        labels: (N,) int64.
        transform: train (`(uint8 (B, H, W, 3), generator) -> (B, 3, S, S)`) or evaluation
            (`uint8 (B, H, W, 3) -> (B, 3, S, S)`) of vitflash.gpu_augment.GPUAugment.
        batch_size: per process.
        indices: the rows of images this loader reads (default all), e.g. the training split.
        train: shuffle each epoch, drop the last partial batch (static shapes for CUDA graphs,
            equal steps on every rank) and augment; else read in order, keep the last batch.
        seed: of the permutations and the augmentation.
        rank, world_size: the DDP process and the number of processes; each rank reads a disjoint
            slice (evaluation pads with repeated images to equal counts, as DistributedSampler).
        epoch: the epoch the first iteration belongs to.
        stream: gather batches on the host and copy them in (default: when images are not on device).
        graph: on a CUDA device, replay the training augmentation as a CUDA graph (SeededTransform).
        aug_repeats: training copies of each drawn image per epoch (repeated augmentation; 1: off).
    """

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, transform: Callable, batch_size: int,
                 device: torch.device | str = "cpu", indices: torch.Tensor | None = None, train: bool = False,
                 seed: int = 0, rank: int = 0, world_size: int = 1, epoch: int = 0, stream: bool | None = None,
                 graph: bool = True, aug_repeats: int = 1):
        if images.dtype != torch.uint8 or images.ndim != 4 or images.shape[-1] != 3:
            raise ValueError(f"images must be (N, H, W, 3) uint8, got {tuple(images.shape)} {images.dtype}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} of world size {world_size}")
        if isinstance(aug_repeats, bool) or not isinstance(aug_repeats, int) or aug_repeats < 1:
            raise ValueError(f"aug_repeats={aug_repeats!r}: a whole number >= 1 (1: no repeated augmentation)")
        self.aug_repeats = aug_repeats
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:  # "cuda": the current GPU, as its tensors say
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.images, self.transform, self.batch_size, self.train = images, transform, batch_size, train
        self.labels = labels.to(self.device, torch.int64)
        self.indices = torch.arange(len(labels)) if indices is None else torch.as_tensor(indices).long().cpu()
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self.epoch, self.batches, self._resumed = epoch, 0, False
        self.streamed = images.device != self.device if stream is None else stream
        n = len(self.indices)
        self.per_rank = n // world_size if train else math.ceil(n / world_size)
        require_batches(len(self), n, batch_size, world_size)
        self._pinned: list[torch.Tensor] = []
        self._events: list = []
        self._augment = SeededTransform(transform, self.device, graph) if train else None

    def __len__(self) -> int:
        if self.train:
            return self.per_rank // self.batch_size
        return math.ceil(self.per_rank / self.batch_size)

    # ---- position (the DataModule carries it in checkpoints; not named state_dict, so that
    # Lightning does not also write a copy of its own that it would never read back) ----

    def position(self) -> dict[str, int]:
        """epoch, batches already yielded in it, seed."""
        return {"epoch": self.epoch, "batches": self.batches, "seed": self.seed}

    def seek(self, state: dict[str, int]) -> None:
        self.epoch, self.batches, self.seed = int(state["epoch"]), int(state["batches"]), int(state["seed"])
        self._resumed = True  # the next iteration continues this epoch where it was left

    # ---- iteration ----

    def _rank_indices(self, epoch: int) -> torch.Tensor:
        """(per_rank,) rows of images for this rank and epoch."""
        order = self.indices
        if self.train:
            perm = torch.randperm(len(order), generator=torch.Generator().manual_seed(_seed(self.seed, epoch)))
            order = order[perm].repeat_interleave(self.aug_repeats)[: self.per_rank * self.world_size]
        elif self.world_size > 1:  # pad by wrapping around, as DistributedSampler does
            order = order[torch.arange(self.per_rank * self.world_size) % len(order)]
        return order[self.rank :: self.world_size]

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        # A new iteration starts a new epoch unless nothing of this one was taken yet or a
        # restored state says where to continue. An epoch left before its end
        # (limit_train_batches) counts as done, as with a DataLoader. Decided at the first batch,
        # not at iter(): Lightning makes iterators it never advances (a check, then the real one
        # after a mid-epoch restore), and those must not use up the restored position.
        if self.batches >= len(self) or (self.batches > 0 and not self._resumed):
            self.epoch, self.batches = self.epoch + 1, 0
        self._resumed = False
        yield from self._iterate(self.epoch, self.batches)

    def _iterate(self, epoch: int, start: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        rows = self._rank_indices(epoch)
        ks = range(start, len(self))
        if not self.streamed:
            rows_dev = rows.to(self.device, non_blocking=True)
            for k in ks:
                idx = rows_dev[k * self.batch_size : (k + 1) * self.batch_size]
                self.batches = k + 1  # counted before the batch is handed out: a checkpoint taken after it includes it
                yield self._transform(epoch, k, self.images[idx]), self.labels[idx]
            return
        batches = [rows[k * self.batch_size : (k + 1) * self.batch_size] for k in ks]
        with ThreadPoolExecutor(1) as pool:  # gathers batch k+1 on the host while batch k trains
            pending = pool.submit(self._gather, batches[0], 0) if batches else None
            for j, k in enumerate(ks):
                staged = pending.result()
                if j + 1 < len(batches):
                    pending = pool.submit(self._gather, batches[j + 1], j + 1)
                images = staged.to(self.device, non_blocking=True)
                if self._events:
                    self._events[j % len(self._events)].record()
                self.batches = k + 1
                yield self._transform(epoch, k, images), self.labels[batches[j].to(self.device)]

    def _gather(self, idx: torch.Tensor, j: int) -> torch.Tensor:
        """Host rows idx into a staging buffer: pinned memory (one of three, reused once the copy
        that last read it is done) when the device is a GPU."""
        if self.device.type != "cuda":
            return self.images.index_select(0, idx)
        with torch.cuda.device(self.device):  # this thread's CUDA calls go to the loader's GPU, not GPU 0
            return self._gather_pinned(idx, j)

    def _gather_pinned(self, idx: torch.Tensor, j: int) -> torch.Tensor:
        if not self._pinned:
            shape = (self.batch_size, *self.images.shape[1:])
            self._pinned = [torch.empty(shape, dtype=torch.uint8, pin_memory=True) for _ in range(3)]
            self._events = [torch.cuda.Event() for _ in range(3)]
        slot = j % 3
        self._events[slot].synchronize()  # this thread waits, not the training loop
        out = self._pinned[slot][: len(idx)]
        torch.index_select(self.images, 0, idx, out=out)
        return out

    def _transform(self, epoch: int, k: int, images: torch.Tensor) -> torch.Tensor:
        """Batch k of the epoch, augmented with its own seed (evaluation: no randomness)."""
        if not self.train:
            return self.transform(images)
        return self._augment(images, _seed(self.seed, epoch, self.rank, k))


class SeededTransform:
    """`fn(images, generator)` called as `(images, seed)`: the generator seeded with `seed` for
    each call, so a batch depends on its seed alone.

    graph=True on a CUDA device: the first call of each input shape captures `fn` into a CUDA
    graph (the generator registered with it, so every replay draws from the seed set just
    before it), and later calls replay it: one launch instead of the few hundred small
    kernels of a RandAugment batch, whose launches cost the host several milliseconds per
    batch, more than a CUDA-graph training step of a small model leaves it. Where capture fails
    (an op that cannot be captured), the shape runs eagerly, with a warning."""

    def __init__(self, fn: Callable, device: torch.device, graph: bool = True):
        self.fn, self.device = fn, torch.device(device)
        self.graph = graph and self.device.type == "cuda" and hasattr(torch.cuda.CUDAGraph, "register_generator_state")
        self.generator = torch.Generator(self.device)  # registered with every captured graph
        # eager calls draw from one of their own: one registered with a graph whose capture
        # failed halfway is no longer a plain generator
        self.eager_generator = torch.Generator(self.device)
        self._graphs: dict[tuple, tuple | None] = {}

    def __call__(self, images: torch.Tensor, seed: int) -> torch.Tensor:
        key = (tuple(images.shape), images.dtype)
        if self.graph and key not in self._graphs:
            self._graphs[key] = self._capture(images)
        entry = self._graphs.get(key)
        if entry is None:
            self.eager_generator.manual_seed(seed)
            return self.fn(images, self.eager_generator)
        graph, static_in, static_out = entry
        static_in.copy_(images)
        self.generator.manual_seed(seed)
        graph.replay()
        return static_out.clone()  # the next replay overwrites static_out

    def _capture(self, images: torch.Tensor) -> tuple | None:
        static_in = images.clone()
        try:
            warm = torch.cuda.Stream(self.device)  # warm-up off the capturing stream, as CUDA graphs require
            warm.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(warm):
                for _ in range(2):
                    self.generator.manual_seed(0)
                    self.fn(static_in, self.generator)
            torch.cuda.current_stream(self.device).wait_stream(warm)
            graph = torch.cuda.CUDAGraph()
            graph.register_generator_state(self.generator)
            with capturing(graph, self.device):
                static_out = self.fn(static_in, self.generator)
        except Exception as e:  # noqa: BLE001 (whatever the op raised: said, then eager)
            log.warning("the augmentation of %s batches could not be captured into a CUDA graph (%s); "
                        "it runs eagerly (data.gpu_graph=false skips the attempt)", tuple(images.shape), e)
            return None
        log.info("augmentation of %s batches captured into a CUDA graph", tuple(images.shape))
        return graph, static_in, static_out
