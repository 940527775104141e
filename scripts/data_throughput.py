"""Images per second of the gpu data pipeline alone (no model): GPULoader + GPUAugment with the
augmentation of a real recipe, on random uint8 images of the recipe's dataset shape.

    python scripts/data_throughput.py                                  # the recipes below, on CUDA
    python scripts/data_throughput.py --storage stream --batches 50    # host images copied in per batch
    python scripts/data_throughput.py --only imagenette --profile 5     # + the GPU time of each op of 5 batches

Each case times `--batches` training batches after a warm-up epoch's first batches, with the
device synchronised before and after, `--repeats` times, and prints one Markdown row: recipe,
images of the split, batch, storage, img/s (median and range of the repeats) and the
milliseconds of one batch (at the median). `--profile N` then runs N batches of each case
eagerly (not as a CUDA graph, so that each kernel is attributed to its op) under
torch.profiler and prints the ops by their GPU time. Compare with the bare training step of
the same batch (bench_loop.py): the data path is cheap enough when its img/s is many times
the step's.
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

import vitflash  # noqa: F401  (registers the ${if_cuda:...} resolver)
from vitflash.gpu_augment import GPUAugment
from vitflash.gpu_data import GPULoader

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
# (experiment, images in the training split, side of the stored images, batch)
CASES = [("cifar10_vit_tiny", 45_000, 32, 1024), ("cifar10_vit_tiny", 45_000, 32, 256),
         ("imagenette_finetune", 9_469, 224, 256)]


def augment_of(experiment: str):
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cfg = compose("train", overrides=[f"experiment={experiment}"])
    return instantiate(cfg.data.augment, _convert_="all"), cfg.data.img_size


def make_loader(experiment: str, n: int, side: int, batch: int, storage: str, device: torch.device,
                graph: bool = True) -> GPULoader:
    """The training loader of the recipe's augmentation over n random images of side x side."""
    augment, img_size = augment_of(experiment)
    images = torch.randint(0, 256, (n, side, side, 3), dtype=torch.uint8)
    images = images.to(device) if storage == "device" else images.pin_memory() if device.type == "cuda" else images
    return GPULoader(images, torch.zeros(n, dtype=torch.int64), GPUAugment(augment, img_size).train, batch,
                     device=device, train=True, stream=storage == "stream", graph=graph)


def measure(loader: GPULoader, batches: int, repeats: int, device: torch.device) -> list[float]:
    """img/s of each of `repeats` runs of `batches` batches."""
    it = iter(loader)
    for _ in range(3):  # warm-up: allocator, cuDNN/roi_align first calls
        next(it)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    rates = []
    for _ in range(repeats):
        sync()
        start, done = time.perf_counter(), 0
        while done < batches:
            for x, y in it:
                done += 1
                if done == batches:
                    break
            else:
                it = iter(loader)  # the epoch ended: the next one
        sync()
        rates.append(batches * loader.batch_size / (time.perf_counter() - start))
    return rates


def profile_ops(experiment: str, loader: GPULoader, batches: int, device: torch.device) -> None:
    """Print the ops of `batches` batches by GPU (or CPU) time, with their call counts."""
    from torch.profiler import ProfilerActivity, profile

    it = iter(loader)
    next(it)  # first-call work outside the profile
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(batches):
            next(it)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    key = "cuda_time_total" if device.type == "cuda" else "cpu_time_total"
    print(f"\nOps of {batches} eager batches of {experiment}, batch {loader.batch_size}, by {key}:\n")
    print(prof.key_averages().table(sort_by=key, row_limit=30), flush=True)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--storage", choices=["device", "stream"], default="device")
    p.add_argument("--batches", type=int, default=100)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--only", default="", help="only the recipes whose name contains this")
    p.add_argument("--profile", type=int, default=0, metavar="N", help="profile N eager batches per case")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    print(f"device: {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}, torch {torch.__version__}")
    print("| recipe | images | batch | storage | img/s, median (min-max) | ms per batch |\n|---|---:|---:|---|---:|---:|")
    for experiment, n, side, batch in CASES:
        if args.only not in experiment:
            continue
        loader = make_loader(experiment, n, side, batch, args.storage, device)
        rates = sorted(measure(loader, args.batches, args.repeats, device))
        median = statistics.median(rates)  # of an even number of repeats too
        print(f"| {experiment} ({side}px) | {n} | {batch} | {args.storage} | {median:,.0f} "
              f"({rates[0]:,.0f}-{rates[-1]:,.0f}) | {1000 * batch / median:.2f} |", flush=True)
    for experiment, n, side, batch in CASES:
        if args.profile and args.only in experiment:
            loader = make_loader(experiment, n, side, batch, args.storage, device, graph=False)
            profile_ops(experiment, loader, args.profile, device)


if __name__ == "__main__":
    main()
