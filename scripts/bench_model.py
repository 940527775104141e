"""Whole training step of a ViT: vitflash on its three attention paths, and timm for scale.

One step = forward, cross-entropy, backward, AdamW update, under bf16 autocast, on random
images. The same vitflash weights run on every path (`model.set_attention`); timm's own
VisionTransformer (its fused SDPA attention) is the outside reference. Reports images per
second (median step time after warm-up) and the peak GPU memory of training.

    python scripts/bench_model.py --out benchmarks/results
writes train_step_<gpu>.json and train_step_<gpu>.md there (a GPU is required).
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import timm
import torch
import torch.nn.functional as F

from bench_attention import command_line, environment, write_results  # scripts/ is on sys.path
from vitflash import build_model

CASES = [("vit_small_patch16_224", 256), ("vit_base_patch16_224", 256),
         ("vit_base_patch16_384", 64)]
PATHS = ["flash", "sdpa", "naive", "timm"]


def step_fn(model, batch: int, img_size: int):
    images = torch.randn(batch, 3, img_size, img_size, device="cuda")
    labels = torch.randint(0, 1000, (batch,), device="cuda")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(images), labels)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def measure(step, warmup: int, steps: int) -> tuple[float, float]:
    """Median seconds per step and peak GiB allocated while training."""
    for _ in range(warmup):  # includes autotuning and optimizer-state allocation
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(steps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times), torch.cuda.max_memory_allocated() / 2**30


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_model.py needs a CUDA GPU.")

    torch.manual_seed(0)
    rows = []
    for name, batch in CASES:
        img_size = int(name.rsplit("_", 1)[-1])
        row = {"model": name, "batch": batch}
        for path in PATHS:
            torch.cuda.empty_cache()
            if path == "timm":
                model = timm.create_model(name, pretrained=False).cuda()
            else:
                model = build_model(name, attention=path).cuda()
            sec, gib = measure(step_fn(model, batch, img_size), args.warmup, args.steps)
            row[path] = {"img_per_s": batch / sec, "step_ms": sec * 1e3, "peak_gib": gib}
            print(name, batch, path, row[path], flush=True)
            del model
        rows.append(row)

    env = environment()
    command = command_line()
    lines = [f"# ViT training step on {env['gpu']}", "", f"Command: `{command}`", "",
             f"torch {env['torch']}, triton {env['triton']}, timm {timm.__version__}, "
             f"CUDA {env['cuda']}; {env['date']}. AdamW (fused), bf16 autocast, random "
             f"images, median of {args.steps} steps after {args.warmup} warm-up steps. "
             "Peak: max GPU memory allocated while training (weights, optimizer state, "
             "activations).", "",
             "| model | batch | " + " | ".join(f"{p} img/s | {p} peak GiB" for p in PATHS) + " |",
             "|---|---|" + "---|---|" * len(PATHS)]
    for r in rows:
        lines.append(f"| {r['model']} | {r['batch']} | " + " | ".join(
            f"{r[p]['img_per_s']:,.0f} | {r[p]['peak_gib']:.1f}" for p in PATHS) + " |")
    table = "\n".join(lines) + "\n"
    write_results(args.out, "train_step", env, command, rows, table)
    print(table)


if __name__ == "__main__":
    main()
