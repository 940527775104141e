"""Attention benchmark: vitflash flash vs naive vs PyTorch SDPA backends, at ViT shapes.

Times forward and forward+backward with `triton.testing.do_bench` (median, after warm-up and
autotuning) and measures the peak memory one forward+backward adds on top of its inputs.
FLOPs: forward 4*B*H*N^2*D, forward+backward 3.5x that.

Inputs are what each path gets in a ViT block: vitflash flash takes the packed
(B, N, 3, H, D) qkv tensor and writes one dqkv; naive takes q, k, v views of it. SDPA gets
contiguous (B, H, N, D) tensors, its preferred layout. Host time per call (the CPU time
to enqueue the work, measured without synchronizing) shows when a path is bound by launch
overhead rather than by the GPU.

    python scripts/bench_attention.py --out benchmarks/results
writes attention_<gpu>.json and attention_<gpu>.md there (a GPU is required).
"""
from __future__ import annotations

import argparse
import json
import platform
import re
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

from vitflash.ops import flash_attention_qkvpacked, naive_attention

# (B, H, N, D): ViT-B/16 @224 b256, ViT-S/16 @224 b256, ViT-B/16 @384 b64,
# ViT-L/14 @448 b32, ViT-B/16 @1024 b8, N=4097 with D=128.
SHAPES = [(256, 12, 197, 64), (256, 6, 197, 64), (64, 12, 577, 64), (32, 16, 1025, 64),
          (8, 12, 4097, 64), (4, 16, 4097, 128)]
SDPA_BACKENDS = {"sdpa_flash": SDPBackend.FLASH_ATTENTION,
                 "sdpa_efficient": SDPBackend.EFFICIENT_ATTENTION,
                 "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION}
IMPLS = ["flash", "naive", *SDPA_BACKENDS]


def make_case(impl: str, B: int, H: int, N: int, D: int, dtype: torch.dtype):
    """Return (leaf tensors, fn() -> o, do) for one implementation, on random inputs."""
    if impl in ("flash", "naive"):
        qkv = torch.randn(B, N, 3, H, D, device="cuda", dtype=dtype, requires_grad=True)
        do = torch.randn(B, N, H, D, device="cuda", dtype=dtype)
        if impl == "flash":
            return [qkv], (lambda: flash_attention_qkvpacked(qkv)), do
        return [qkv], (lambda: naive_attention(*qkv.unbind(2))), do
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=dtype, requires_grad=True)
               for _ in range(3))
    backend = SDPA_BACKENDS[impl]

    def fn():
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v)

    return [q, k, v], fn, torch.randn(B, H, N, D, device="cuda", dtype=dtype)


def host_us(fn, calls: int = 20) -> float:
    """CPU microseconds to enqueue one call (few calls, so the launch queue never fills)."""
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / calls * 1e6


def bench_case(impl, shape, dtype, warmup_ms, rep_ms):
    B, H, N, D = shape
    leaves, fwd, do = make_case(impl, B, H, N, D, dtype)

    def fwd_bwd():
        fwd().backward(do)

    try:
        fwd_bwd()  # compile / autotune outside the timed region
        torch.cuda.synchronize()
    except RuntimeError as err:  # e.g. a backend that does not take this shape
        return {"error": str(err).splitlines()[0][:200]}

    # Peak memory that one forward+backward adds on top of its inputs and their grads.
    for t in leaves:
        t.grad = None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fwd_bwd()
    torch.cuda.synchronize()
    peak_mib = (torch.cuda.max_memory_allocated() - base) / 2**20

    with torch.no_grad():
        fwd_ms = triton.testing.do_bench(fwd, warmup=warmup_ms, rep=rep_ms, return_mode="median")
    fwd_bwd_ms = triton.testing.do_bench(fwd_bwd, warmup=warmup_ms, rep=rep_ms,
                                         grad_to_none=leaves, return_mode="median")
    with torch.no_grad():
        fwd_host = host_us(fwd)
    fwd_bwd_host = host_us(fwd_bwd)
    flops = 4 * B * H * N * N * D
    return {"fwd_ms": fwd_ms, "fwd_bwd_ms": fwd_bwd_ms,
            "fwd_host_us": fwd_host, "fwd_bwd_host_us": fwd_bwd_host,
            "fwd_tflops": flops / fwd_ms * 1e-9, "fwd_bwd_tflops": 3.5 * flops / fwd_bwd_ms * 1e-9,
            "peak_extra_mib": peak_mib}


def environment() -> dict:
    return {"gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu", "torch": torch.__version__,
            "triton": triton.__version__, "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version(), "python": platform.python_version(),
            "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}


def command_line() -> str:
    """The command as run, less where it wrote (that does not change a number)."""
    argv = [a for i, a in enumerate(sys.argv)
            if a != "--out" and (i == 0 or sys.argv[i - 1] != "--out")]
    return "python " + " ".join(argv)


def write_results(out: Path, prefix: str, env: dict, command: str, results: list,
                  table: str) -> None:
    """<out>/<prefix>_<gpu>.json (command, environment, results) and .md (the table)."""
    out.mkdir(parents=True, exist_ok=True)
    stem = prefix + "_" + re.sub(r"[^A-Za-z0-9]+", "_", env["gpu"]).strip("_").lower()
    (out / f"{stem}.json").write_text(
        json.dumps({"command": command, "environment": env, "results": results}, indent=1))
    (out / f"{stem}.md").write_text(table)


def markdown(results: list[dict], env: dict, command: str) -> str:
    def cell(r, key, fmt):
        return fmt.format(r[key]) if key in r else "n/a"

    lines = [f"# Attention benchmark on {env['gpu']}", "",
             f"Command: `{command}`", "",
             f"torch {env['torch']}, triton {env['triton']}, CUDA {env['cuda']}, "
             f"cuDNN {env['cudnn']}, Python {env['python']}; {env['date']}. bf16, non-causal, "
             "random inputs, `triton.testing.do_bench` median. TFLOP/s count 4*B*H*N^2*D "
             "for the forward, 3.5x that for forward+backward. Peak extra memory: what one "
             "forward+backward allocates on top of its inputs.", ""]
    for metric, title, fmt in (("fwd_tflops", "Forward TFLOP/s", "{:.0f}"),
                               ("fwd_bwd_tflops", "Forward+backward TFLOP/s", "{:.0f}"),
                               ("fwd_ms", "Forward ms", "{:.3f}"),
                               ("fwd_bwd_ms", "Forward+backward ms", "{:.3f}"),
                               ("peak_extra_mib", "Peak extra memory of forward+backward, MiB",
                                "{:.0f}"),
                               ("fwd_bwd_host_us", "Host time per forward+backward call, us",
                                "{:.0f}")):
        lines += [f"## {title}", "", "| (B, H, N, D) | " + " | ".join(IMPLS) + " |",
                  "|---" * (len(IMPLS) + 1) + "|"]
        for r in results:
            lines.append(f"| {tuple(r['shape'])} | "
                         + " | ".join(cell(r[i], metric, fmt) for i in IMPLS) + " |")
        lines.append("")
    lines += ["## vitflash flash / SDPA FLASH (FlashAttention-2), same run", "",
              "| (B, H, N, D) | forward | forward+backward |", "|---|---|---|"]
    for r in results:
        f, s = r["flash"], r["sdpa_flash"]
        ratio = [f"{f[k] / s[k]:.2f}x" if k in f and k in s else "n/a"
                 for k in ("fwd_tflops", "fwd_bwd_tflops")]
        lines.append(f"| {tuple(r['shape'])} | {ratio[0]} | {ratio[1]} |")
    errors = [(r["shape"], i, r[i]["error"]) for r in results for i in IMPLS if "error" in r[i]]
    if errors:
        lines += ["", "Not run:"] + [f"- {tuple(s)} {i}: {e}" for s, i, e in errors]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--impls", nargs="+", default=IMPLS, choices=IMPLS)
    parser.add_argument("--warmup-ms", type=int, default=25)
    parser.add_argument("--rep-ms", type=int, default=100)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_attention.py needs a CUDA GPU: it times GPU kernels.")

    env = environment()
    command = command_line()
    results = []
    for shape in SHAPES:
        row = {"shape": list(shape)}
        for impl in IMPLS:
            row[impl] = (bench_case(impl, shape, torch.bfloat16, args.warmup_ms, args.rep_ms)
                         if impl in args.impls else {"error": "not selected"})
            torch.cuda.empty_cache()
            print(shape, impl, {k: round(v, 3) if isinstance(v, float) else v
                                for k, v in row[impl].items()}, flush=True)
        results.append(row)

    table = markdown(results, env, command)
    write_results(args.out, "attention", env, command, results, table)
    print(table)


if __name__ == "__main__":
    main()
