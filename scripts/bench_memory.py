"""The largest batch whose whole ViT training step fits in GPU memory, per attention path.

The step is bench_model.py's (`step_fn`): forward, cross-entropy, backward, fused AdamW
update, bf16 autocast, eager, random images on the GPU, a 10-class head. A batch "fits" when
--steps (2) such steps run without CUDA running out of memory: the second step is the one
that holds the optimizer state (AdamW allocates it inside the first step) as well as the
activations, so one step alone would pass batches that the next step cannot run. The limit
also depends on the allocator's settings (PYTORCH_CUDA_ALLOC_CONF, recorded with the table).

Search (`largest_fitting`): the batch doubles from --start until a step runs out of memory
(or --max-batch is reached), then bisects between the last batch that fitted and the first
that did not, down to --granularity images. Every batch tried is a multiple of the
granularity, so the answer is the largest multiple of it that fits. After each out-of-memory
attempt the optimizer, images, gradients and the exception's frames are dropped and the
allocator's cache emptied, so one failure does not shrink the next attempt.

Default suite: ViT-B/16 at 224 and 384 px on flash, naive and sdpa, granularity 8, start 32,
cap 8192, two steps a try: about 15 tries a case and 2-3 minutes in all on an H200 (141 GB),
most of it the steps at batches near the limit; a first run on a new GPU also autotunes the
flash kernel at each new B*H bucket (cached on disk after that).

    python scripts/bench_memory.py --out benchmarks/results
    python scripts/bench_memory.py --grad-checkpointing off on   # each case also with activation checkpointing
writes memory_<gpu>.json and .md there (a GPU is required). JSON rows: model, img_size,
attention, grad_checkpointing (true where each block reran its forward in the backward,
VisionTransformer.set_grad_checkpointing), max_batch, peak_gib and reserved_gib at max_batch, mib_per_image (the slope of
peak memory over the batches that fitted: activations and gradients per image, without
the weights and optimizer state), first_oom, capped, seconds, and tries (batch, fits,
peak_gib of each attempt).
"""
from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from pathlib import Path
from typing import Callable, NamedTuple

import torch

from bench_attention import command_line, environment, write_results  # scripts/ is on sys.path
from bench_model import step_fn
from vitflash import build_model
from vitflash.model import preset_kwargs

MODELS = ["vit_base_patch16_224", "vit_base_patch16_384"]
PATHS = ["flash", "naive", "sdpa"]


class SearchResult(NamedTuple):
    """What `largest_fitting` found.

    max_batch: the largest batch tried that fitted (None: not even `granularity` fits).
    first_failure: the smallest batch tried that did not fit (None: none failed).
    capped: the cap itself fitted, so the true limit may be higher.
    tries: (batch, fitted) in the order tried.
    """

    max_batch: int | None
    first_failure: int | None
    capped: bool
    tries: list[tuple[int, bool]]


def check_search(start: int, granularity: int, cap: int) -> None:
    """Raise ValueError unless 1 <= granularity <= start <= cap, all on the granularity's grid."""
    if granularity < 1 or start < granularity or cap < start:
        raise ValueError(f"need 1 <= granularity <= start <= cap, got granularity={granularity}, "
                         f"start={start}, cap={cap}")
    if start % granularity or cap % granularity:
        raise ValueError(f"start={start} and cap={cap} must be multiples of granularity="
                         f"{granularity}: every batch tried is one")


def largest_fitting(fits: Callable[[int], bool], start: int, granularity: int,
                    cap: int) -> SearchResult:
    """The largest multiple of `granularity`, at most `cap`, for which `fits` is true.

    Assumes `fits` is monotone: if a batch fits, every smaller one does (memory grows with
    the batch). Doubles from `start` until a batch fails or `cap` fits, then bisects between
    the last success and the first failure; if `start` itself fails, bisects below it. With
    M the true limit the result is granularity * floor(min(M, cap) / granularity), in about
    log2(M / start) + log2(M / granularity) calls. No batch is tried twice.
    """
    check_search(start, granularity, cap)
    tries: list[tuple[int, bool]] = []

    def attempt(batch: int) -> bool:
        ok = bool(fits(batch))
        tries.append((batch, ok))
        return ok

    lo, hi, batch = 0, None, start  # lo fits (0: none yet), hi does not (None: none yet)
    while hi is None:
        if not attempt(batch):
            hi = batch
        elif batch == cap:
            return SearchResult(cap, None, True, tries)
        else:
            lo, batch = batch, min(2 * batch, cap)
    while hi - lo > granularity:
        mid = lo + (hi - lo) // (2 * granularity) * granularity  # a multiple, strictly inside
        if attempt(mid):
            lo = mid
        else:
            hi = mid
    return SearchResult(lo or None, hi, False, tries)


def is_oom(err: BaseException) -> bool:
    """Out of GPU memory: the caching allocator's error, or a library's own allocation
    failure (cuBLAS / cuDNN workspaces), which reaches Python as a RuntimeError."""
    if isinstance(err, torch.OutOfMemoryError):
        return True
    msg = str(err)
    return isinstance(err, RuntimeError) and ("out of memory" in msg or "ALLOC_FAILED" in msg)


def free(model: torch.nn.Module) -> None:
    """Drop what a try left (gradients, and anything only cycles still hold) and return the
    cached blocks to CUDA, so the next try starts from the weights alone."""
    model.zero_grad(set_to_none=True)
    gc.collect()
    torch.cuda.empty_cache()


def search_case(model, name: str, path: str, args) -> dict:
    """Largest-batch search for one (model, attention path); the model stays on the GPU
    across tries, a fresh optimizer and batch are made for each."""
    img_size = model.config["img_size"]
    model.set_attention(path)
    peaks: dict[int, tuple[float, float]] = {}

    def fits(batch: int) -> bool:
        torch.cuda.reset_peak_memory_stats()  # the previous try freed its memory
        start, ok = time.perf_counter(), True
        try:
            step = step_fn(model, batch, img_size, None)
            for _ in range(args.steps):
                step()
            torch.cuda.synchronize()
        except (torch.OutOfMemoryError, RuntimeError) as err:
            if not is_oom(err):
                raise
            ok = False
        step = None  # the optimizer and images; the exception and its frames are gone here
        peak, reserved = (torch.cuda.max_memory_allocated() / 2**30,
                          torch.cuda.max_memory_reserved() / 2**30)
        free(model)
        if ok:
            peaks[batch] = (peak, reserved)
        print(f"  {name} {path} batch {batch}: {'fits' if ok else 'out of memory'}, "
              f"peak {peak:.1f} GiB, {time.perf_counter() - start:.1f} s", flush=True)
        return ok

    begin = time.perf_counter()
    free(model)
    try:
        found = largest_fitting(fits, args.start, args.granularity, args.max_batch)
    except Exception as err:  # one failing case must not lose the others' numbers
        free(model)
        return {"error": f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"}
    row = {"max_batch": found.max_batch, "first_oom": found.first_failure,
           "capped": found.capped, "seconds": time.perf_counter() - begin,
           "tries": [{"batch": b, "fits": ok, "peak_gib": peaks[b][0] if ok else None}
                     for b, ok in found.tries]}
    if found.max_batch is None:
        row["error"] = f"even batch {args.granularity} does not fit"
        return row
    row["peak_gib"], row["reserved_gib"] = peaks[found.max_batch]
    fitted = sorted(peaks)
    # Slope over the widest span of batches that fitted: per-image memory, without the
    # fixed weights and optimizer state that peak / batch would spread over the images.
    row["mib_per_image"] = ((peaks[fitted[-1]][0] - peaks[fitted[0]][0]) * 1024
                            / (fitted[-1] - fitted[0]) if len(fitted) > 1 else None)
    return row


def markdown(rows: list[dict], env: dict, command: str, args) -> str:
    """The results table: one line per (model, attention path)."""
    naive = {(r["model"], r.get("grad_checkpointing", False)): r.get("max_batch")
             for r in rows if r["attention"] == "naive"}

    def num(value, fmt):
        return "n/a" if value is None else fmt.format(value)

    lines = [f"# Largest training batch on {env['gpu']}", "", f"Command: `{command}`", "",
             f"Commit {env['commit']}; torch {env['torch']}, triton {env['triton']}, CUDA "
             f"{env['cuda']}; {env['date']}. GPU memory {env['gpu_total_gib']:.1f} GiB, "
             f"{env['gpu_free_gib']:.1f} GiB free at the start; PYTORCH_CUDA_ALLOC_CONF="
             f"{env['alloc_conf'] or '(unset)'}. Training step: forward, cross-entropy, "
             "backward, AdamW (fused), bf16 autocast, eager, random images. A batch fits when "
             f"{args.steps} steps run; batches double from {args.start}, then bisect to "
             f"{args.granularity} images (cap {args.max_batch}). Peak: max GPU memory "
             "allocated (reserved: held by the allocator) at the largest batch; per image: "
             "slope of the peak over the batches that fitted.", "",
             "| model | img | attention | max batch | / naive | peak GiB | reserved GiB "
             "| MiB / image | first OOM | tries | s |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        best, ckpt = r.get("max_batch"), r.get("grad_checkpointing", False)
        base = naive.get((r["model"], ckpt))
        ratio = f"{best / base:.2f}x" if best and base else "n/a"
        cap = "+ (cap)" if r.get("capped") else ""
        attention = f"{r['attention']} + grad ckpt" if ckpt else r["attention"]
        lines.append(
            f"| {r['model']} | {r['img_size']} | {attention} | {num(best, '{}')}{cap} | "
            f"{ratio} | {num(r.get('peak_gib'), '{:.1f}')} | {num(r.get('reserved_gib'), '{:.1f}')} | "
            f"{num(r.get('mib_per_image'), '{:.0f}')} | {num(r.get('first_oom'), '{}')} | "
            f"{len(r.get('tries', []))} | {num(r.get('seconds'), '{:.0f}')} |")
    errors = [(r["model"], r["attention"] + (" + grad ckpt" if r.get("grad_checkpointing") else ""), r["error"])
              for r in rows if "error" in r]
    if errors:
        lines += ["", "Failed:"] + [f"- {m} {p}: {e}" for m, p, e in errors]
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--models", nargs="+", default=MODELS, help="vitflash presets")
    parser.add_argument("--attention", nargs="+", default=PATHS, choices=PATHS)
    parser.add_argument("--start", type=int, default=32, help="first batch tried")
    parser.add_argument("--granularity", type=int, default=8,
                        help="the answer is exact to this many images")
    parser.add_argument("--max-batch", type=int, default=8192,
                        help="never try more than this (bounds the run time)")
    parser.add_argument("--grad-checkpointing", nargs="+", choices=("off", "on"), default=["off"],
                        help="activation checkpointing (each block reruns its forward in the backward): off, "
                             "on, or both (each case measured with each; the / naive column compares like with "
                             "like)")
    parser.add_argument("--steps", type=int, default=2,
                        help="training steps a batch must survive (>= 2: see the docstring)")
    args = parser.parse_args(argv)
    for name in args.models:
        try:
            preset_kwargs(name)
        except ValueError as err:  # names the presets
            parser.error(str(err))
    if args.steps < 2:
        parser.error(f"--steps {args.steps}: use at least 2, the first step runs without "
                     "the optimizer state")
    try:  # before any GPU work
        check_search(args.start, args.granularity, args.max_batch)
    except ValueError as err:
        parser.error(f"{err} (--start, --granularity, --max-batch)")
    return args


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("bench_memory.py needs a CUDA GPU: it measures GPU memory.")
    free_b, total_b = torch.cuda.mem_get_info()
    env = {**environment(), "gpu_total_gib": total_b / 2**30, "gpu_free_gib": free_b / 2**30,
           "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")}
    command = command_line()
    rows, table = [], ""
    for name in args.models:
        torch.manual_seed(0)
        model = build_model(name, attention="sdpa", num_classes=10).cuda()
        for ckpt in args.grad_checkpointing:
            model.set_grad_checkpointing(ckpt == "on")
            for path in args.attention:
                case = f"{name} {path}" + (" + grad ckpt" if ckpt == "on" else "")
                print(f"{case}:", flush=True)
                row = {"model": name, "img_size": model.config["img_size"], "attention": path,
                       "grad_checkpointing": ckpt == "on", **search_case(model, name, path, args)}
                print(f"{case}: max batch {row.get('max_batch')}"
                      + (f" ({row['error']})" if "error" in row else ""), flush=True)
                rows.append(row)
                # after every row, so that a run stopped by a time limit keeps what it measured
                table = markdown(rows, env, command, args)
                write_results(args.out, "memory", env, command, rows, table)
        del model  # this model's weights, before the next one is built
        gc.collect()
        torch.cuda.empty_cache()
    print(table)
    return rows


if __name__ == "__main__":
    main()
