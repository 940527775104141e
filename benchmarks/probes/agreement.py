"""Probe: how far apart correct attention results lie, in the units of the tuner's check.

Before it times a candidate, the autotuner runs it on fixed standard-normal inputs of the
call's shape (`flash._probe`) and leaves it out if its result (o; dqkv) differs from the
heuristic candidate's by more than `launch.AGREE_ULPS` units in the last place of the largest
value (`launch._disagreement`, which reports that difference over the bound: > 1 fails).
This prints what sizes that bound:

1. naive attention in bf16 against float64, on inputs scaled by 1 (what the check uses) and
   by 3 and 6 (peaked attention, as a trained model's can be): the spread rounding alone
   gives, and why the check does not use the call's own inputs;
2. the flash candidates (the pointer-load ones, the first six of each op's list) against
   the heuristic candidate on the probe inputs, in Triton's interpreter.

    python benchmarks/probes/agreement.py

Runs on the CPU (the interpreter); a minute or two.
"""
from __future__ import annotations

import os
import platform
import subprocess

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

import torch  # noqa: E402

from vitflash.ops import flash, flash_attention_qkvpacked, launch, naive_attention  # noqa: E402


def out_and_grad(fn, qkv: torch.Tensor, do: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    leaf = qkv.detach().requires_grad_()
    o = fn(leaf)
    (dqkv,) = torch.autograd.grad(o, leaf, do)
    return o.detach(), dqkv


def naive_rows() -> list[str]:
    gen = torch.Generator().manual_seed(0)
    rows = []
    for n, d in ((65, 16), (197, 64), (1025, 64)):
        for scale in (1.0, 3.0, 6.0):
            qkv = torch.randn(2, n, 3, 2, d, generator=gen) * scale
            do = torch.randn(2, n, 2, d, generator=gen)
            naive = lambda x: naive_attention(*x.unbind(2))  # noqa: E731
            exact = out_and_grad(naive, qkv.double(), do.double())
            low = out_and_grad(naive, qkv.bfloat16(), do.bfloat16())
            eps = torch.finfo(torch.bfloat16).eps
            units = [((lo.double() - ex).abs().max() / (eps * ex.abs().max())).item()
                     for lo, ex in zip(low, exact)]
            rows.append(f"| ({n}, {d}) | {scale:g} | {units[0]:.1f} | {units[1]:.1f} |")
    return rows


def candidate_rows() -> list[str]:
    rows = []
    real_choose = flash.choose
    for n, d, dtype in ((65, 64, torch.bfloat16), (130, 64, torch.bfloat16), (197, 80, torch.float16)):
        qkv = flash._probe(torch.empty(2, n, 3, 2, d, dtype=dtype))
        do = flash._probe(torch.empty(2, n, 2, d, dtype=dtype))
        worst = {}
        for op in ("fwd", "bwd"):
            ref, worst[op] = None, 0.0
            cands = [c for c in launch.candidates(op, n, d, bh=4) if "tma" not in c.family][:6]
            for cand in [launch.heuristic(op, n, d)] + cands:
                fixed = {"fwd": launch.heuristic("fwd", n, d), "bwd": launch.heuristic("bwd", n, d), op: cand}
                flash.choose = lambda o, *args, fixed=fixed, **kwargs: fixed["bwd" if o != "fwd" else "fwd"]
                flash._plans.clear()
                o, dqkv = out_and_grad(flash_attention_qkvpacked, qkv, do)
                got = (o,) if op == "fwd" else (dqkv,)
                if ref is None:
                    ref = got
                else:
                    worst[op] = max(worst[op], launch._disagreement(got, ref) * launch.AGREE_ULPS)
            rows.append(f"| ({n}, {d}), {str(dtype).split('.')[-1]} | {op} | {len(cands)} | {worst[op]:.2f} |")
    flash.choose = real_choose
    flash._plans.clear()
    return rows


def main() -> None:
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    print("# How far apart correct attention results lie, in the tuner check's units\n")
    print(f"Command: `python benchmarks/probes/agreement.py`; commit {commit}; torch "
          f"{torch.__version__}, Python {platform.python_version()}, CPU. Units: units in the last "
          f"place (bf16 or fp16 eps) of the reference's largest magnitude; the tuner leaves a "
          f"candidate out above {launch.AGREE_ULPS}.\n")
    print("## Naive attention in bf16 against float64 (B = 2, H = 2), inputs times a scale\n")
    print("| (N, D) | input scale | o | dqkv |\n|---|---|---|---|")
    print("\n".join(naive_rows()))
    print("\n## Flash candidates against the heuristic candidate, on the tuner's probe inputs "
          "(interpreter)\n")
    print("| (N, D), dtype | op | candidates | largest difference |\n|---|---|---|---|")
    print("\n".join(candidate_rows()))


if __name__ == "__main__":
    main()
