"""Probe: the host cost of calling the flash ops through PyTorch's dispatcher, as a
default-mode torch.compile graph calls them at every step, against calling the Python
functions directly, and against the same functions registered with torch.library.custom_op
(under another namespace, with the same schema and fake implementations). Runs on the CPU,
with the kernel launches replaced by a no-op: what is timed is the host path only.

Then one eager forward+backward as a user's code makes it (`flash_attention_qkvpacked`, then
autograd), beside two things that no Python-defined op can undercut: an empty
`torch.autograd.Function` (it allocates its output and gradient, nothing else) and the floor of
`scripts/bench_attention.py` (one elementwise op and its gradient, built-in autograd).

    python benchmarks/probes/op_dispatch.py [--calls 2000]

Prints a markdown table: microseconds per call, median of 15 rounds (min-max), the cases
taking turns within each round.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import time

os.environ["TRITON_INTERPRET"] = "1"  # CPU tensors are accepted (the launches do nothing here)

import torch  # noqa: E402

from vitflash.ops import flash, launch  # noqa: E402


def per_call_us(fns: list, calls: int, rounds: int = 15) -> list[tuple[float, float, float]]:
    """Microseconds per call of each of fns: rounds of `calls` calls, the functions taking
    turns within each round (so that a change in the machine's load reaches them all);
    median, min and max over the rounds."""
    for fn in fns:
        for _ in range(calls // 10):
            fn()
    times = [[] for _ in fns]
    for _ in range(rounds):
        for fn, out in zip(fns, times):
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            out.append((time.perf_counter() - start) / calls * 1e6)
    return [(statistics.median(t), min(t), max(t)) for t in times]


def custom_op_twins():
    """The two functions registered with torch.library.custom_op, as flash.py did before."""
    @torch.library.custom_op("vitflash_probe::flash_attn_forward", mutates_args=())
    def fwd(qkv: torch.Tensor, softmax_scale: float, dropout_p: float,
            seed: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        return flash._forward(qkv, softmax_scale, dropout_p, seed)

    @torch.library.custom_op("vitflash_probe::flash_attn_backward", mutates_args=())
    def bwd(do: torch.Tensor, qkv: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
            softmax_scale: float, dropout_p: float, seed: torch.Tensor | None,
            deterministic: bool) -> torch.Tensor:
        return flash._backward(do, qkv, o, lse, softmax_scale, dropout_p, seed, deterministic)

    return fwd, bwd


class _Empty(torch.autograd.Function):
    """An attention-shaped op that does nothing: (B, N, 3, H, D) -> (B, N, H, D)."""

    @staticmethod
    def forward(ctx, qkv):
        ctx.save_for_backward(qkv)
        return qkv.new_empty(qkv.shape[:2] + qkv.shape[3:])

    @staticmethod
    def backward(ctx, do):
        return torch.empty_like(ctx.saved_tensors[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    launch.Launch.__call__ = lambda self, *a: None  # host path only
    B, N, H, D = 1, 65, 3, 64
    qkv = torch.randn(B, N, 3, H, D, dtype=torch.float16)
    do = torch.randn(B, N, H, D, dtype=torch.float16)
    o, lse = flash._forward(qkv, 0.125)
    co_fwd, co_bwd = custom_op_twins()
    leaf = qkv.clone().requires_grad_()
    x = torch.randn(B, N, H, D, dtype=torch.float16, requires_grad=True)
    fwd_args, bwd_args = (qkv, 0.125, 0.0, None), (do, qkv, o, lse, 0.125, 0.0, None, True)
    rows = [("forward", "the function (`flash._forward`)", lambda: flash._forward(*fwd_args)),
            ("forward", "the op, `torch.library.Library`", lambda: flash._forward_op(*fwd_args)),
            ("forward", "the op, `torch.library.custom_op`", lambda: co_fwd(*fwd_args)),
            ("backward", "the function (`flash._backward`)", lambda: flash._backward(*bwd_args)),
            ("backward", "the op, `torch.library.Library`", lambda: flash._backward_op(*bwd_args)),
            ("backward", "the op, `torch.library.custom_op`", lambda: co_bwd(*bwd_args)),
            ("forward+backward", "`flash_attention_qkvpacked` and autograd",
             lambda: flash.flash_attention_qkvpacked(leaf).backward(do)),
            ("forward+backward", "an empty `autograd.Function`", lambda: _Empty.apply(leaf).backward(do)),
            ("forward+backward", "the floor: `x * 0.125` and its gradient", lambda: (x * 0.125).backward(do))]
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    print(f"# Host cost of the flash ops' dispatch, CPU\n\nCommand: `python benchmarks/probes/"
          f"op_dispatch.py --calls {args.calls}`; commit {commit}; torch {torch.__version__}, Python "
          f"{platform.python_version()}, {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cores. (B, N, H, D) = {(B, N, H, D)}, float16, launches stubbed out.\n")
    print("| call | through | us per call, median (min-max) |\n|---|---|---|")
    for (op, through, _), (med, lo, hi) in zip(rows, per_call_us([r[2] for r in rows], args.calls)):
        print(f"| {op} | {through} | {med:.1f} ({lo:.1f}-{hi:.1f}) |")


if __name__ == "__main__":
    main()
