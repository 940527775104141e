"""The probes under benchmarks/probes still run: their kernels against a float32 reference on a
tiny case (the GPU runs that produced their committed logs are not repeated here)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

PROBES = Path(__file__).resolve().parents[1] / "benchmarks" / "probes"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"vitflash_probe_{name}", PROBES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("ws", [False, True])
def test_warp_specialize_probe_forward_matches_sdpa(ws):
    """The probe's TMA forward, with and without warp specialization, at a length that ends in
    a partial tile (70 = 4 * 16 + 6), against float32 SDPA: what the probe prints as `err`."""
    probe = _load("warp_specialize")
    torch.manual_seed(0)
    qkv = torch.randn(1, 70, 3, 2, 32, dtype=torch.float16)
    launch, o = probe.run(qkv, 16, 16, 4, 1, ws)
    launch()
    q, k, v = (qkv[:, :, i].transpose(1, 2).float() for i in range(3))
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    assert (o.float() - ref).abs().max().item() < 2e-3
