"""Where the host time of one small attention call goes: the launchers, the custom ops, the
public op with and without autograd, against SDPA and an autograd.Function that does nothing.

At the CIFAR models' shapes a forward+backward of attention is tens of microseconds of GPU
work, so without CUDA graphs the host's work per call decides the speed. This prints the
wall microseconds per call, enqueue only unless the row says "sync" (then one
torch.cuda.synchronize per call): median of `--calls` calls, each case 3 times, the median
of the three and their min-max.

    python scripts/bench_host.py                  # B in {1, 256} at H=3, N=65, D=64
    python scripts/bench_host.py --profile        # and torch.profiler's host-time table of
                                                  # flash and SDPA forward+backward at B=1

Needs a CUDA GPU.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from vitflash.ops import flash as flash_ops
from vitflash.ops import flash_attention_qkvpacked


class Identity(torch.autograd.Function):
    """The cheapest autograd.Function: the floor that any Python-defined op pays."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad


def wall_us(fn, calls: int, sync_each: bool) -> str:
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    medians = []
    for _ in range(3):
        times = []
        for _ in range(calls):
            start = time.perf_counter()
            fn()
            if sync_each:
                torch.cuda.synchronize()
            times.append((time.perf_counter() - start) * 1e6)
        torch.cuda.synchronize()
        medians.append(statistics.median(times))
    return f"{statistics.median(medians):7.1f} ({min(medians):.1f}-{max(medians):.1f})"


def cases(B: int, H: int, N: int, D: int) -> dict:
    """name -> (fn, synchronize after each call)."""
    dt = torch.bfloat16
    qkv = torch.randn(B, N, 3, H, D, device="cuda", dtype=dt, requires_grad=True)
    do = torch.randn(B, N, H, D, device="cuda", dtype=dt)
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=dt, requires_grad=True) for _ in range(3))
    do_sdpa = torch.randn(B, H, N, D, device="cuda", dtype=dt)
    x = torch.randn(B, N, H, D, device="cuda", requires_grad=True)
    scale = D ** -0.5
    packed = qkv.detach()
    o, lse = flash_ops._forward(packed, scale)
    flash = flash_attention_qkvpacked

    def flash_no_grad():
        with torch.no_grad():
            return flash(packed)

    return {
        "synchronize alone": (torch.cuda.synchronize, False),
        "one empty_like": (lambda: torch.empty_like(packed), False),
        "flash forward launcher": (lambda: flash_ops._forward(packed, scale), False),
        "flash backward launcher": (lambda: flash_ops._backward(do, packed, o, lse, scale), False),
        "flash forward custom op": (lambda: flash_ops._forward_op(packed, scale, 0.0, None), False),
        "flash backward custom op": (lambda: flash_ops._backward_op(do, packed, o, lse, scale, 0.0, None, True),
                                     False),
        "flash public op, no_grad": (flash_no_grad, False),
        "flash forward (grad)": (lambda: flash(qkv), False),
        "flash fwd+bwd": (lambda: flash(qkv).backward(do), False),
        "flash fwd+autograd.grad": (lambda: torch.autograd.grad(flash(qkv), qkv, do), False),
        "flash fwd+bwd sync": (lambda: flash(qkv).backward(do), True),
        "sdpa forward (grad)": (lambda: F.scaled_dot_product_attention(q, k, v), False),
        "sdpa fwd+bwd": (lambda: F.scaled_dot_product_attention(q, k, v).backward(do_sdpa), False),
        "sdpa fwd+bwd sync": (lambda: F.scaled_dot_product_attention(q, k, v).backward(do_sdpa), True),
        "identity Function fwd+bwd": (lambda: Identity.apply(x).backward(x), False),
        "identity Function fwd+bwd sync": (lambda: Identity.apply(x).backward(x), True),
    }


def profile(H: int, N: int, D: int, calls: int = 50) -> None:
    """torch.profiler's table of host time per operator over `calls` forward+backwards."""
    from torch.profiler import ProfilerActivity
    table = cases(1, H, N, D)
    for name in ("flash fwd+bwd", "sdpa fwd+bwd", "identity Function fwd+bwd"):
        fn = table[name][0]
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(calls):
                fn()
            torch.cuda.synchronize()
        print(f"\n{name}, {calls} calls:")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 256])
    parser.add_argument("--shape", type=int, nargs=3, default=[3, 65, 64], metavar=("H", "N", "D"))
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--profile", action="store_true", help="also print torch.profiler tables")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_host.py measures CUDA launches: it needs a CUDA GPU.")
    H, N, D = args.shape
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}: wall us per call, "
          f"median (min-max) of 3 x {args.calls} calls")
    for B in args.batches:
        for name, (fn, sync_each) in cases(B, H, N, D).items():
            print(f"(B={B}, H={H}, N={N}, D={D}) {name:32s} {wall_us(fn, args.calls, sync_each)} us", flush=True)
    if args.profile:
        profile(H, N, D)


if __name__ == "__main__":
    main()
