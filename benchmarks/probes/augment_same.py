"""Probe: does the GPU pipeline's CIFAR-10 AutoAugment give the same bits in two checkouts?

Runs `vitflash.gpu_augment.CIFAR10AutoAugment` of each checkout (a path to a copy of the
repository, e.g. a `git worktree` at an older commit) on the same batch of 64 random 32 px
images with the same generator seed, on the CPU, each in its own process, and compares the
outputs bit for bit.

    git worktree add /tmp/old a0b2db2
    python benchmarks/probes/augment_same.py /tmp/old .      # e.g. > benchmarks/results/autoaugment_same_bits_cpu.txt
"""
from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import torch

RUN = """
import sys, torch
sys.path.insert(0, sys.argv[1])
import vitflash.gpu_augment as m
assert m.__file__.startswith(sys.argv[1]), m.__file__
torch.manual_seed(0)
x = torch.randint(0, 256, (64, 3, 32, 32), dtype=torch.uint8).float()
fill = torch.tensor([125.0, 123.0, 114.0]).view(1, 3, 1, 1)
torch.save(m.CIFAR10AutoAugment(32)(x, fill, torch.Generator().manual_seed(1)), sys.argv[2])
"""


def main(a: str, b: str) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        outs = []
        for i, root in enumerate((a, b)):
            out = Path(tmp) / f"{i}.pt"
            subprocess.run([sys.executable, "-c", RUN, str(Path(root).resolve()), str(out)], check=True)
            outs.append(torch.load(out))
    same = torch.equal(*outs)
    print(f"batch {tuple(outs[0].shape)}: {'the same bits' if same else 'different'} in both checkouts "
          f"(largest difference {(outs[0] - outs[1]).abs().max().item():g})")
    return 0 if same else 1


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python benchmarks/probes/augment_same.py <checkout A> <checkout B>")
    sys.exit(main(*sys.argv[1:]))
