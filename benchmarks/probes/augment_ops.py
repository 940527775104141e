"""Probe: how much work the GPU pipeline's augmentation policies launch per batch.

Each batched policy (`vitflash.gpu_augment`) is captured into a CUDA graph and replayed once
per batch, so its number of operators is the number of kernels in that graph. This counts,
for one batch of 512 images of 32 px on the CPU:

- the op calls of the CIFAR-10 AutoAugment: one per op kind and op position (its plan's
  blocks), against one per sub-policy and op position (25 x 2) for a loop over sub-policies;
- the compute operators each policy runs (torch.profiler's leaf aten operators, views and
  allocations left out), for the CIFAR-10 AutoAugment and RandAugment ("rand-m9-mstd0.5-inc1").

    python benchmarks/probes/augment_ops.py   # writes benchmarks/results/augment_ops_cpu.txt

Runs on the CPU in seconds.
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from vitflash.gpu_augment import AUTOAUGMENT_CIFAR10, CIFAR10AutoAugment, policy

B, SIZE = 512, 32
# operators that move no data on the device: views, aliases and allocations
NOT_WORK = {"aten::view", "aten::slice", "aten::as_strided", "aten::select", "aten::unsqueeze", "aten::expand",
            "aten::empty", "aten::empty_like", "aten::empty_strided", "aten::squeeze", "aten::unbind",
            "aten::alias", "aten::t", "aten::transpose", "aten::permute", "aten::reshape", "aten::_unsafe_view",
            "aten::detach", "aten::resolve_conj", "aten::resolve_neg", "aten::lift_fresh"}


def operators(fn, x, fill, seed: int = 0) -> Counter:
    """The leaf aten operators of one call of fn(x, fill, generator), by name."""
    fn(x, fill, torch.Generator().manual_seed(seed))  # first call: plans and caches made
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn(x, fill, torch.Generator().manual_seed(seed))
    aten = [e for e in prof.events() if e.name.startswith("aten::")]
    leaves = [e for e in aten if not any(c.name.startswith("aten::") for c in e.cpu_children)]
    return Counter(e.name for e in leaves if e.name not in NOT_WORK)


def main() -> str:
    x = torch.rand(B, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(1))
    fill = torch.tensor([0.49, 0.48, 0.45]).view(1, 3, 1, 1)
    auto = CIFAR10AutoAugment(SIZE)
    blocks = sum(len(p[1]) for p in auto._plan(B, x.device))
    lines = [f"One batch of {B} images of {SIZE} px on the CPU (torch {torch.__version__}).", "",
             f"CIFAR-10 AutoAugment op calls: {blocks} (one per op kind and position), against "
             f"{len(auto.subpolicies) * auto.num_ops} for a loop over its {len(auto.subpolicies)} sub-policies", "",
             "| policy | compute operators | the most frequent |", "|---|---|---|"]
    for name in (AUTOAUGMENT_CIFAR10, "rand-m9-mstd0.5-inc1"):
        ops = operators(policy(name, SIZE), x, fill)
        top = ", ".join(f"{k.removeprefix('aten::')} {v}" for k, v in ops.most_common(5))
        lines.append(f"| {name} | {sum(ops.values())} | {top} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    text = main()
    print(text, end="")
    out = Path(__file__).resolve().parents[1] / "results" / "augment_ops_cpu.txt"
    out.write_text("Written by `python benchmarks/probes/augment_ops.py`.\n\n" + text)
