"""FlashAttention kernel against a float64 reference.

Rule (as flash-attention's own tests): the kernel's max error on o, dq, dk, dv must be at
most twice the max error of `naive_attention` run in the same low precision, plus a tiny
absolute floor. Without CUDA the kernels run in Triton's interpreter (see conftest.py).
"""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import warnings
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from vitflash.ops import flash as flash_mod
from vitflash.ops import hopper, kernels, launch
from vitflash.ops import (
    attention_qkvpacked,
    flash_attention,
    flash_attention_qkvpacked,
    naive_attention,
    sdpa_attention,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
ABS_FLOOR = 1e-5


def _packed_inputs(B, N, H, D, dtype, scale=1.0, seed=0):
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    qkv = torch.randn(B, N, 3, H, D, dtype=torch.float32, device=DEVICE, generator=gen) * scale
    do = torch.randn(B, N, H, D, dtype=torch.float32, device=DEVICE, generator=gen)
    return qkv.to(dtype), do.to(dtype)


def _out_and_grads(fn, qkv, do, softmax_scale=None):
    """Run fn on the (non-contiguous) q, k, v views of a fresh leaf copy of qkv."""
    leaf = qkv.detach().clone().requires_grad_()
    q, k, v = leaf.unbind(2)  # (B, N, H, D) views, strides of the packed layout
    o = fn(q, k, v, softmax_scale)
    (dqkv,) = torch.autograd.grad(o, leaf, do)
    return [o, *dqkv.unbind(2)]


def _assert_within_rule(qkv, do, softmax_scale=None, flash=flash_attention, **kw):
    """The FA2 rule on o, dq, dk, dv; `kw` (mask_diagonal) goes to both paths."""
    naive = partial(naive_attention, **kw)
    ref = _out_and_grads(naive, qkv.double(), do.double(), softmax_scale)
    low = _out_and_grads(naive, qkv, do, softmax_scale)
    got = _out_and_grads(partial(flash, **kw), qkv, do, softmax_scale)
    for name, r, lo, g in zip(("o", "dq", "dk", "dv"), ref, low, got):
        assert g.dtype == qkv.dtype and g.shape == r.shape
        assert torch.isfinite(g).all(), f"{name} has non-finite values"
        err = (g.double() - r).abs().max().item()
        naive_err = (lo.double() - r).abs().max().item()
        assert err <= 2 * naive_err + ABS_FLOOR, (
            f"{name}: flash max error {err:.3g} > 2 x naive {naive_err:.3g} + {ABS_FLOOR}")


# The interpreter runs bf16 too (widening its tiles before tl.dot, see ops/flash.py).
DTYPES = [torch.float16, torch.bfloat16]


# In the interpreter's fixed choice (launch.heuristic) N <= 128 takes the short kernels and
# N = 130 the general ones (two full key tiles and a partial one); test_each_kernel_family
# crosses them, and on the GPU test_every_config_gpu runs every candidate at N = 197, 577.
# Head dims: powers of two, split ones (80 = 64 + 16, 96 = 64 + 32, 160 = 128 + 32: two
# column chunks, launch.split_d; at 160 the backward takes the general kernels at every N)
# and a padded one (112: one 128-column tile).
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
@pytest.mark.parametrize("D", [32, 64, 80, 96, 112, 128, 160])
@pytest.mark.parametrize("N", [1, 17, 64, 65, 128, 130])
def test_matches_reference(N, D, dtype):
    qkv, do = _packed_inputs(2, N, 2, D, dtype, seed=N * 1000 + D)
    _assert_within_rule(qkv, do)


def _force(monkeypatch, fwd: launch.Candidate, bwd: launch.Candidate) -> None:
    """Make the op run these candidates instead of the one `launch.choose` would pick."""
    monkeypatch.setattr(flash_mod, "choose", lambda op, *args, **kwargs: fwd if op == "fwd" else bwd)
    monkeypatch.setattr(flash_mod, "_plans", {})


def _pairs_within_rule(monkeypatch, qkv, do, fwds, bwds):
    """Run forward and backward candidates in pairs until each has run once (the shorter
    list wraps round), each pair under the FA2 rule, naming the pair that fails; yields
    (fwd, bwd, the launch plans by op) after each, for the caller's checks."""
    for i in range(max(len(fwds), len(bwds))):
        fwd, bwd = fwds[i % len(fwds)], bwds[i % len(bwds)]
        _force(monkeypatch, fwd, bwd)
        try:
            _assert_within_rule(qkv, do)
        except Exception as err:
            raise AssertionError(f"forward {fwd} / backward {bwd}: {err}") from err
        yield fwd, bwd, {key[0]: plan for key, plan in flash_mod._plans.items()}


@pytest.mark.parametrize("N", [1, 16, 17, 65, 100, 130])
def test_each_kernel_family(monkeypatch, N):
    """Both families of both ops, whatever the length: the general kernels at short N (one
    partial tile), the short ones with and without a tail tile (16 = one tile, 17 = 16 + 16,
    65 = 64 + 16, 130 = 128 + 16) or two in the forward (100 = 64 + 32 + 16)."""
    qkv, do = _packed_inputs(2, N, 2, 32, torch.float16, seed=N)
    general_fwd = launch.Candidate("general", (("BLOCK_M", 32), ("BLOCK_N", 16)))
    general_bwd = launch.Candidate("general", (("BLOCK_M1", 16), ("BLOCK_N1", 32),
                                               ("BLOCK_M2", 32), ("BLOCK_N2", 16)))
    pairs = [(general_fwd, general_bwd), (launch.short_fwd(N, 32), general_bwd),
             (launch.short_fwd(N, 16, heads=2, stages=2), launch.short_bwd(N, 16))]
    for fwd, bwd in pairs:
        _force(monkeypatch, fwd, bwd)
        _assert_within_rule(qkv, do)


@pytest.mark.parametrize("tma", [False, True], ids=["pointers", "tma"])
@pytest.mark.parametrize("N, D, dropout_p, mask_diagonal", [(1, 32, 0.0, False), (17, 32, 0.0, True),
                                                          (65, 32, 0.2, False), (130, 80, 0.0, False)])
def test_split_backward_is_the_one_launch_bit_for_bit(monkeypatch, tma, N, D, dropout_p,
                                                      mask_diagonal):
    """A split twin (launch.split_twins) runs the same programs as its one-launch candidate,
    in two launches: dQ's, whose programs also compute delta (no delta launch), then dK/dV's.
    Its dqkv must be that candidate's bit for bit, with dropout and the diagonal mask too, at
    one partial tile (1, 17), full tiles and a partial one (65, 130) and a split head dim
    (80); and within the FA2 rule. (Bit for bit in the interpreter, which sums each row of
    dO * O alike in both kernels; on a GPU the two kernels' row sums may round apart.)"""
    monkeypatch.setattr(launch, "_TMA_LOADS", tma)
    qkv, do = _packed_inputs(2, N, 2, D, torch.float16, seed=N + D)
    family = "general_tma" if tma else "general"
    one = launch.Candidate(family, (("BLOCK_M1", 16), ("BLOCK_N1", 32), ("BLOCK_M2", 32),
                                    ("BLOCK_N2", 16)), 4, 1)
    (split,) = launch.split_twins([one])
    assert split.meta["SPLIT"] == 1 and split.family == family
    fwd = launch.Candidate("general", (("BLOCK_M", 32), ("BLOCK_N", 16)))
    results = []
    for bwd in (one, split):
        _force(monkeypatch, fwd, bwd)
        torch.manual_seed(0)  # the same dropout seed for both
        leaf = qkv.detach().clone().requires_grad_()
        o = flash_attention_qkvpacked(leaf, dropout_p=dropout_p, mask_diagonal=mask_diagonal)
        (dqkv,) = torch.autograd.grad(o, leaf, do)
        plan = flash_mod._plans[next(k for k in flash_mod._plans if k[0] == "bwd")]
        results.append((o, dqkv, [(launch_.kernel.__name__, launch_.consts.get("PART")) for launch_ in plan]))
    (o1, dqkv1, parts1), (o2, dqkv2, parts2) = results
    assert parts1 == [("bwd_delta_kernel", None), ("bwd_kernel", 0)]
    assert parts2 == [("bwd_kernel", 2), ("bwd_kernel", 1)]
    assert torch.equal(o1, o2)
    _assert_same_backward(dqkv1, dqkv2)
    if dropout_p == 0:
        _force(monkeypatch, fwd, split)
        _assert_within_rule(qkv, do, flash=flash_attention, mask_diagonal=mask_diagonal)


def _assert_same_backward(a: torch.Tensor, b: torch.Tensor) -> None:
    """Gradients of two launch forms of the same programs: equal bit for bit in the
    interpreter, which sums each row of dO * O alike in every kernel. On a GPU the delta row
    sums of the delta kernel and of a split candidate's dQ programs (their own tile shapes
    and warps) may round apart in the last bit, and the gradients with them: there, equal
    to fp16's rounding."""
    if a.device.type == "cpu":
        assert torch.equal(a, b)
    else:
        torch.testing.assert_close(a, b, rtol=2 ** -9, atol=1e-4)


@pytest.mark.parametrize("tma", [False, True], ids=["pointers", "tma"])
@pytest.mark.parametrize("N, D, dropout_p, mask_diagonal", [(33, 32, 0.0, True), (65, 32, 0.2, False),
                                                          (130, 80, 0.0, False), (100, 96, 0.1, True)])
def test_tail_ahead_forward_is_the_plain_one_bit_for_bit(monkeypatch, tma, N, D, dropout_p,
                                                         mask_diagonal):
    """A tail-ahead twin (launch.tail_ahead_twins) loads its partial key tile before the loop
    over the full ones and does the same arithmetic after it: o and the log-sum-exp the
    backward reads must be the plain candidate's bit for bit, with dropout and the diagonal
    mask too, in 16- and 32-key tiles at one key past the full tiles (33, 65), two (130) and
    four (100), split head dims (80, 96); and the twin within the FA2 rule."""
    monkeypatch.setattr(launch, "_TMA_LOADS", tma)
    qkv, do = _packed_inputs(2, N, 2, D, torch.float16, seed=N + D)
    family = "general_tma" if tma else "general"
    bwd = launch.heuristic("bwd", N, D)
    for block_n in (16, 32):
        plain = launch.Candidate(family, (("BLOCK_M", 32), ("BLOCK_N", block_n)), 4, 2)
        (ahead,) = launch.tail_ahead_twins([plain], N)
        assert ahead.meta["TAIL_AHEAD"] == 1 and ahead.family == family
        results = []
        for fwd in (plain, ahead):
            _force(monkeypatch, fwd, bwd)
            torch.manual_seed(0)  # the same dropout seed for both
            seed = flash_mod.new_seed(qkv.device) if dropout_p else None
            o, lse = flash_mod._forward(qkv, D ** -0.5, dropout_p, seed, mask_diagonal)
            (launch_,) = flash_mod._plans[next(k for k in flash_mod._plans if k[0] == "fwd")]
            results.append((o, lse, launch_.consts["TAIL_AHEAD"], launch_.consts["BLOCK_T"]))
        (o1, lse1, ahead1, tail1), (o2, lse2, ahead2, tail2) = results
        assert (ahead1, ahead2) == (0, 1) and tail1 == tail2 == launch.tail_tile(N, block_n) > 0
        assert torch.equal(o1, o2) and torch.equal(lse1, lse2)
    if dropout_p == 0:
        _assert_within_rule(qkv, do, mask_diagonal=mask_diagonal)  # `ahead`, forced last


def test_tail_ahead_twins_where_a_small_partial_key_tile_follows_a_full_one():
    """The tail-ahead twins are listed beside every general forward candidate (pointer and
    TMA loads) whose keys end in a partial tile of at most TAIL_AHEAD_MAX keys after at
    least one full tile, and nowhere else: not where the tiles divide N, nor at N <= BLOCK_N,
    nor for a 128-key tail (197 in 128-key tiles), nor in the backward."""
    for n, d in ((197, 64), (577, 64), (1025, 128), (4097, 64), (130, 80), (256, 64), (64, 64)):
        fwd = launch.candidates("fwd", n, d)
        general = [c for c in fwd if c.family in ("general", "general_tma")]
        twins = [c for c in general if c.meta.get("TAIL_AHEAD")]
        expected = [c for c in general if not c.meta.get("TAIL_AHEAD") and n > c.meta["BLOCK_N"]
                    and 0 < launch.tail_tile(n, c.meta["BLOCK_N"]) <= launch.TAIL_AHEAD_MAX]
        assert [c.blocks[:-1] + (c.family, c.num_warps, c.num_stages) for c in twins] == \
            [c.blocks + (c.family, c.num_warps, c.num_stages) for c in expected]
        assert bool(twins) == (n in (197, 577, 1025, 4097, 130))
        assert not any("TAIL_AHEAD" in c.meta for op in ("bwd", "bwd_atomic") for c in launch.candidates(op, n, d))
    assert not any(c.meta["BLOCK_N"] == 128 for c in launch.tail_ahead_twins(launch.candidates("fwd", 197, 64), 197))


@pytest.mark.parametrize("tma", [False, True], ids=["pointers", "tma"])
@pytest.mark.parametrize("N, D", [(17, 32), (130, 80)])
def test_split_backward_parts_take_their_own_tiles(monkeypatch, tma, N, D):
    """A split candidate's dQ launch may have other tiles, warps and stages than its dK/dV
    launch (WARPS2, STAGES2; with TMA, each launch gets boxes of its own tile heights). Its
    dK and dV are those of the twin with the same dK/dV tiles, bit for bit (in the
    interpreter: _assert_same_backward); its dQ, summed over other key tiles, keeps to the
    FA2 rule."""
    monkeypatch.setattr(launch, "_TMA_LOADS", tma)
    qkv, do = _packed_inputs(2, N, 2, D, torch.float16, seed=N + D)
    family = "general_tma" if tma else "general"
    names = ("BLOCK_M1", "BLOCK_N1", "BLOCK_M2", "BLOCK_N2")
    twin = launch.Candidate(family, (*zip(names, (16, 32, 32, 16)), ("SPLIT", 1)), 4, 1)
    mixed = launch.Candidate(family, (*zip(names, (16, 32, 16, 32)), ("SPLIT", 1), ("WARPS2", 2),
                                      ("STAGES2", 2)), 4, 1)
    fwd = launch.Candidate("general", (("BLOCK_M", 32), ("BLOCK_N", 16)))
    built, make = [], flash_mod._tma_descriptors
    monkeypatch.setattr(flash_mod, "_tma_descriptors", lambda t, rows, c: built.append(rows) or make(t, rows, c))
    grads = []
    for bwd in (twin, mixed):
        _force(monkeypatch, fwd, bwd)
        leaf = qkv.detach().clone().requires_grad_()
        (dqkv,) = torch.autograd.grad(flash_attention_qkvpacked(leaf), leaf, do)
        plan = flash_mod._plans[next(k for k in flash_mod._plans if k[0] == "bwd")]
        grads.append(dqkv)
        # with TMA, one set of boxes per tensor (qkv, dO) and height, shared by both launches
        # (both have heights 16 and 32 here); none without
        assert sorted(built) == ([16, 16, 32, 32] if tma else [])
        built.clear()
    dq_launch = plan[0].consts  # first: it computes delta for the dK/dV launch
    assert (plan[1].num_warps, plan[0].num_warps, plan[0].num_stages) == (4, 2, 2)
    assert (dq_launch["PART"], dq_launch["BLOCK_M2"], dq_launch["BLOCK_N2"]) == (2, 16, 32)
    assert dq_launch["DQ_DELTA"] is True and plan[1].consts["DQ_DELTA"] is False
    # the dQ launch's unused dK/dV tiles mirror its own, so that it compiles as one binary
    assert (dq_launch["BLOCK_M1"], dq_launch["BLOCK_N1"]) == (32, 16)
    _assert_same_backward(grads[0][:, :, 1:], grads[1][:, :, 1:])
    _assert_within_rule(qkv, do)


@pytest.mark.parametrize("tma", [False, True], ids=["pointers", "tma"])
@pytest.mark.parametrize("N, D, tiles, tails", [
    # 197 = 3 x 64 + 5 keys (and rows): a 16-key dK/dV program and a 16-row dQ program
    (197, 32, (32, 64, 64, 32), (16, 16)),
    # 69 keys past 128 (and 69 rows past 128): no tail program, the last one a full masked 128
    (197, 32, (32, 128, 128, 32), (0, 0)),
    # 129 = 2 x 64 + 1, the kind of the ViT lengths with a class token (577 = 9 x 64 + 1),
    # and a split head dim (96 = 64 + 32)
    (129, 96, (32, 64, 64, 32), (16, 16)),
    # a head dim with a 16-column second chunk (80 = 64 + 16) has none (their registers)
    (129, 80, (32, 64, 64, 32), (0, 0)),
    # tiles that divide N: no tails
    (128, 32, (32, 64, 64, 32), (0, 0))])
def test_backward_tail_programs(monkeypatch, tma, N, D, tiles, tails):
    """The general backward's tail programs (flash._bwd_tails): the keys past the dK/dV
    programs' last full key tile go to a program of a 16-key tile, the rows past the dQ
    programs' last full query tile to one of a 16-row tile; the loops inside the programs
    keep their masked full last step. Each launch form carries them (one launch and both
    parts of a split one); the result keeps to the FA2 rule, with pointer and TMA loads
    (whose tail tiles load by pointers), and with the diagonal mask. None at a head dim held
    in a 16-column second chunk (test_no_backward_tail_programs_where_they_spill)."""
    monkeypatch.setattr(launch, "_TMA_LOADS", tma)
    qkv, do = _packed_inputs(1, N, 2, D, torch.float16, seed=N + D)
    family = "general_tma" if tma else "general"
    names = ("BLOCK_M1", "BLOCK_N1", "BLOCK_M2", "BLOCK_N2")
    one = launch.Candidate(family, tuple(zip(names, tiles)), 4, 1)
    fwd = launch.Candidate("general", (("BLOCK_M", 32), ("BLOCK_N", 16)))
    for bwd in (one, *launch.split_twins([one])):
        plan = [p for p in flash_mod._bwd_launches(bwd, 1, N, 2, D) if p.kernel is kernels.bwd_kernel]
        dkdv = next(p for p in plan if p.consts["PART"] < 2)
        assert (dkdv.consts["BLOCK_NT1"], dkdv.consts["BLOCK_MT2"]) == tails
        for launch_ in plan:  # a split's dQ launch mirrors its tiles (and so its tails)
            c = launch_.consts
            for tile, tail in (("BLOCK_N1", "BLOCK_NT1"), ("BLOCK_M2", "BLOCK_MT2")):
                expected = launch.tail_tile(N, c[tile])
                assert c[tail] == (expected if expected < c[tile] and tails != (0, 0) else 0)
        _force(monkeypatch, fwd, bwd)
        _assert_within_rule(qkv, do)
    _assert_within_rule(qkv, do, mask_diagonal=True)


def test_no_backward_tail_programs_where_they_spill():
    """flash._bwd_tails leaves the tail programs out at head dims held in a 16-column second
    chunk (48, 80, 144) and past 128 columns (160-256): compiled for sm_90 their code took the
    whole kernel to 255 registers with up to 1.4 KB of spills there
    (benchmarks/results/registers_sm90_bwd_tails.md). Elsewhere (16-128 in one chunk, 96 =
    64 + 32) they stay, at every launch form's tiles; bwd_tail_tiles gives them anywhere."""
    names = ("BLOCK_M1", "BLOCK_N1", "BLOCK_M2", "BLOCK_N2")
    for d in (16, 32, 48, 64, 80, 96, 128, 144, 160, 192, 256):
        one = launch.Candidate("general", tuple(zip(names, (32, 64, 64, 32))), 4, 3)
        for bwd in (one, *launch.split_twins([one])):
            plan = [p for p in flash_mod._bwd_launches(bwd, 1, 577, 2, d) if p.kernel is kernels.bwd_kernel]
            tails = {(p.consts["BLOCK_NT1"], p.consts["BLOCK_MT2"]) for p in plan}
            assert tails == ({(0, 0)} if d in (48, 80, 144, 160, 192, 256) else {(16, 16)}), (d, bwd)
            raw = flash_mod.bwd_tail_tiles({k: plan[0].consts[k] for k in names}, 577)
            assert (raw["BLOCK_NT1"], raw["BLOCK_MT2"]) == (16, 16)


def test_split_twins_of_the_four_warp_general_backwards(monkeypatch):
    """Where the short backward does not apply, every listed 4-warp general backward
    candidate, pointer or TMA loads, has one split twin listed, and nothing else has: the
    short and atomic kernels have no two kinds of program. Where the short backward applies
    (N = 65, 128 at D = 64) none is listed: the short kernels win there, and the twins would
    only lengthen the first call's tuning."""
    monkeypatch.setattr(launch, "_TMA_LOADS", True)
    monkeypatch.setattr(launch, "_TMA", True)  # (else the first call caches it for later tests)
    for op, n, d, twins in (("bwd", 577, 64, 6), ("bwd", 197, 128, 6), ("bwd_atomic", 577, 80, 6),
                            ("bwd", 65, 64, 0), ("bwd", 128, 64, 0)):
        found = launch.candidates(op, n, d, 96)
        split = [c for c in found if c.meta.get("SPLIT") and c not in launch.split_pairs(d)]
        expected = [launch.Candidate(c.family, c.blocks + (("SPLIT", 1),), c.num_warps, c.num_stages)
                    for c in found if c.family in ("general", "general_tma") and c.num_warps == 4
                    and not c.meta.get("SPLIT")]
        assert split == expected[:twins] and len(split) == twins


def test_split_pairs_where_the_parts_were_timed(monkeypatch):
    """The split candidates whose dQ launch has its own tiles, warps and stages
    (launch.split_pairs) are listed where the split twins are and the TMA loads they were
    measured with exist: the dK/dV launch of the listed TMA tile, the dQ launch otherwise;
    nowhere else (no TMA loads; the short backward's lengths; other head dims above 64)."""
    monkeypatch.setattr(launch, "_TMA_LOADS", True)
    monkeypatch.setattr(launch, "_TMA", True)
    pairs = launch.split_pairs(64)
    assert [pairs[0].meta["BLOCK_M2"], pairs[0].meta["BLOCK_N2"]] == [64, 64] and len(pairs) == 3
    for c in pairs:
        assert c.family == "general_tma" and c.meta["SPLIT"] == 1
        assert (c.meta["BLOCK_M1"], c.meta["BLOCK_N1"], c.num_warps, c.num_stages) == (32, 128, 4, 3)
        assert c in launch.candidates("bwd", 577, 64, 96) and c in launch.candidates("bwd_atomic", 197, 64, 96)
        assert c not in launch.candidates("bwd", 65, 64, 96)
    (wide,) = launch.split_pairs(128)
    assert wide.meta == dict(BLOCK_M1=64, BLOCK_N1=64, BLOCK_M2=128, BLOCK_N2=64, SPLIT=1, WARPS2=8, STAGES2=3)
    assert (wide.num_warps, wide.num_stages) == (4, 2)
    # none at 80 and 96 (slower than the twins there), past 128, or padded (112)
    assert all(launch.split_pairs(d) == [] for d in (80, 96, 112, 256))
    monkeypatch.setattr(launch, "_TMA_LOADS", False)
    assert launch.split_pairs(64) == []


@pytest.mark.parametrize("N, D", [(1, 32), (17, 32), (65, 32), (130, 32), (197, 64), (65, 80), (33, 112)])
def test_atomic_backward(monkeypatch, N, D):
    """deterministic=False: every candidate of the backward that adds into dQ atomically,
    against the reference, at one partial key tile (1, 17), several programs adding into
    each dQ row (65, 130, 197 in key tiles of 32 to 128), a split head dim (80 = 64 + 16) and
    a padded one (112, in a 128-column tile). It runs as op "bwd_atomic", in three launches
    (delta, the key-tile programs, dQ's scaling)."""
    B, H = 2, 2
    qkv, do = _packed_inputs(B, N, H, D, torch.float16, seed=N + D)
    atomic = [c for c in launch.candidates("bwd_atomic", N, D) if c.family == "atomic"]
    assert atomic and not any(c.family == "atomic" for c in launch.candidates("bwd", N, D))
    for bwd in atomic:
        _force(monkeypatch, launch.heuristic("fwd", N, D), bwd)
        try:
            _assert_within_rule(qkv, do, flash=partial(flash_attention, deterministic=False))
        except Exception as err:
            raise AssertionError(f"backward {bwd}: {err}") from err
        plans = {key[0]: plan for key, plan in flash_mod._plans.items()}
        assert plans.keys() == {"fwd", "bwd_atomic"}
        assert [launch.kernel for launch in plans["bwd_atomic"]] == [
            flash_mod.kernels.bwd_delta_kernel, flash_mod.kernels.bwd_atomic_kernel,
            flash_mod.kernels.bwd_dq_kernel]


@pytest.fixture
def interpreter_tma_reductions(monkeypatch):
    """Triton's interpreter has no TMA reductions (descriptor atomic_add). Give it one: a
    read-add-write of the descriptor's tile, with the descriptor's bounds. That is exact
    there, since the interpreter runs programs one at a time, so two programs never add into
    one element at once."""
    if DEVICE == "cuda":
        return
    from triton.runtime import interpreter

    def create_descriptor_reduce(self, kind, desc, value, indices):
        ptrs, mask = desc.materialize_pointers(indices)
        zero = interpreter.TensorHandle(np.zeros_like(value.data), value.dtype)
        old = self.create_masked_load(ptrs, mask, zero, None, None, False)
        return self.create_masked_store(ptrs, interpreter.TensorHandle(old.data + value.data, old.dtype),
                                        mask, None, None)

    monkeypatch.setattr(interpreter.InterpreterBuilder, "create_descriptor_reduce",
                        create_descriptor_reduce, raising=False)


@pytest.mark.parametrize("N, D", [(17, 32), (65, 32), (130, 32), (197, 64), (65, 80)])
def test_tma_reduction_backward(monkeypatch, interpreter_tma_reductions, N, D):
    """The atomic_tma twins of every atomic candidate against the reference: one partial
    query tile (17), several key-tile programs adding into each dQ row through the
    descriptor, rows past N clipped by its bounds (65, 130, 197), and a split head dim whose
    two column chunks go through two descriptors (80 = 64 + 16). On CPU through the
    interpreter's stand-in reduction (the fixture); on the GPU test_every_config_gpu runs
    them natively."""
    qkv, do = _packed_inputs(2, N, 2, D, torch.float16, seed=N + D)
    atomic = [c for c in launch.candidates("bwd_atomic", N, D) if c.family == "atomic"]
    for c in atomic:
        bwd = launch.Candidate("atomic_tma", c.blocks, c.num_warps, c.num_stages)
        _force(monkeypatch, launch.heuristic("fwd", N, D), bwd)
        try:
            _assert_within_rule(qkv, do, flash=partial(flash_attention, deterministic=False))
        except Exception as err:
            raise AssertionError(f"backward {bwd}: {err}") from err
        (plan,) = [plan for key, plan in flash_mod._plans.items() if key[0] == "bwd_atomic"]
        assert plan[1].consts["TMA_DQ"] is True


@pytest.mark.parametrize("D", [64, 80, 40, 256])
def test_tma_reduction_candidates_mirror_the_atomic_ones(monkeypatch, D):
    """Where TMA reductions exist (Hopper), each atomic candidate gets a twin that adds its dQ
    tiles in bulk through tensor descriptors: at head dims whose tile is their own width
    (64, and 80 split 64 + 16), not at a padded one (40, in a 64-column tile) nor past the
    128-column chunks that the TMA kernels were built for (256), as for the TMA loads. Its launch
    sets TMA_DQ, and the descriptors cover the accumulator in tiles of the kernel's chunks."""
    monkeypatch.setattr(launch, "_TMA", True)
    found = launch.candidates("bwd_atomic", 577, D)
    atomic = [c for c in found if c.family == "atomic"]
    tma = [c for c in found if c.family == "atomic_tma"]
    twins = [launch.Candidate("atomic_tma", c.blocks, c.num_warps, c.num_stages) for c in atomic]
    # each atomic candidate's twin, then 8-warp tiles that pay only with TMA loads
    no_twins = D in (40, 256)
    assert atomic and (tma == [] if no_twins else tma[:len(twins)] == twins and len(tma) > len(twins))
    monkeypatch.setattr(launch, "_TMA", False)
    assert not any(c.family == "atomic_tma" for c in launch.candidates("bwd_atomic", 577, D))
    if no_twins:
        return
    for cand in (atomic[0], tma[0]):
        main = flash_mod._bwd_launches(cand, B=2, N=577, H=3, D=D)[1]
        assert main.kernel is flash_mod.kernels.bwd_atomic_kernel
        assert main.consts["TMA_DQ"] is (cand.family == "atomic_tma")
    acc = torch.zeros(2 * 3, 577, D)
    first, second = flash_mod._tma_descriptors(acc, main.consts["BLOCK_M"], main.consts)
    bd, bd2 = launch.split_d(D)
    assert first.block_shape == [1, tma[0].meta["BLOCK_M"], bd] and first.shape == [6, 577, D]
    assert (second.block_shape == [1, tma[0].meta["BLOCK_M"], bd2]) if bd2 else second is None


_COMPILE_FOR_HOPPER = '''
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from vitflash.ops import hopper, kernels, launch
D, M = {D}, 64
bd, bd2 = launch.split_d(D)
sig = dict(QKV="*bf16", DO="*bf16", LSE="*fp32", DELTA="*fp32", DQ_ACC="*fp32", DQKV="*bf16",
           SEED="*i64", DQ_DESC=f"tensordesc<fp32[1,{{M}},{{bd}}]>",
           DQ_DESC2=f"tensordesc<fp32[1,{{M}},{{bd2 or bd}}]>")
for name in ("Q_DESC", "DO_DESC", "KV_DESC"):  # the tiles' loads (BLOCK_M = BLOCK_N here)
    sig[name], sig[name + "2"] = f"tensordesc<bf16[1,{{M}},{{bd}}]>", f"tensordesc<bf16[1,{{M}},{{bd2 or bd}}]>"
sig.update(qk_scale="fp32", sm_scale="fp32", drop_p="fp32", H="i32", N="i32")
consts = dict(HEAD_DIM=D, BLOCK_D=bd, BLOCK_D2=bd2, BLOCK_M=M, BLOCK_N=64, DROPOUT=False, TMA_DQ=True, DIAG=False)
if not bd2:  # an unsplit head dim's second-chunk descriptors are None, as the launcher passes them
    consts.update(dict.fromkeys([k for k in sig if k.endswith("_DESC2")], None))
sig.update(dict.fromkeys(consts, "constexpr"))
ck = triton.compile(ASTSource(fn=kernels.bwd_atomic_kernel, signature=sig, constexprs=consts),
                    target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4, num_stages=2))
ptx = ck.asm["ptx"]
print(sum("cp.reduce.async.bulk.tensor" in line for line in ptx.splitlines()),
      sum(any(op.startswith(("red.", "atom.")) for op in line.split()) for line in ptx.splitlines()))
'''


@pytest.mark.parametrize("D", [64, 80])
def test_tma_reduction_kernel_compiles_for_hopper(D):
    """What the GPU will run of the atomic_tma kernels (test_tma_reduction_backward runs them
    in the interpreter through a stand-in reduction): compiled for sm_90, without a GPU, in a
    process without the interpreter. Each column chunk's adds are one bulk tensor reduction,
    with no element-wise atomics left."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", _COMPILE_FOR_HOPPER.format(D=D)], env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    bulk, elementwise = map(int, out.stdout.split()[-2:])
    assert (bulk, elementwise) == (1 if D == 64 else 2, 0)


@pytest.mark.parametrize("N", [65, 577])
def test_allowing_nondeterminism_keeps_every_deterministic_candidate(N):
    """deterministic=False adds the atomic candidates to the deterministic ones, never
    replaces them (on an H200 the atomic backward measured slower at every shape tried, so
    the tuner must be able to keep the deterministic one). The short backward is already one
    pass with no recomputation and no atomics: where it applies the interpreter uses it."""
    det, nondet = launch.candidates("bwd", N, 64), launch.candidates("bwd_atomic", N, 64)
    assert set(det) < set(nondet) and {c.family for c in set(nondet) - set(det)} == {"atomic"}
    assert launch.heuristic("bwd_atomic", N, 64).family == ("short" if N == 65 else "atomic")


def test_nondeterministic_backward_is_refused_under_deterministic_algorithms():
    qkv, _ = _packed_inputs(1, 17, 2, 32, torch.float16)
    with pytest.raises(TypeError, match="deterministic must be True or False"):
        flash_attention_qkvpacked(qkv, deterministic="no")
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        with pytest.raises(RuntimeError, match=r"deterministic=False.*use_deterministic_algorithms"):
            flash_attention_qkvpacked(qkv, deterministic=False)
        flash_attention_qkvpacked(qkv)  # the default is deterministic: allowed
    finally:
        torch.use_deterministic_algorithms(before)


def test_split_d():
    """Head dims that are the sum of two powers of two A > B >= 16 are held as two column
    chunks (A, B); any other is padded to one power-of-two tile (B = 0)."""
    assert launch.split_d(80) == (64, 16) and launch.split_d(96) == (64, 32)
    assert launch.split_d(48) == (32, 16) and launch.split_d(160) == (128, 32)
    assert launch.split_d(144) == (128, 16) and launch.split_d(192) == (128, 64)
    assert launch.split_d(64) == (64, 0) and launch.split_d(40) == (64, 0)
    assert launch.split_d(112) == (128, 0) and launch.split_d(8) == (16, 0)
    assert launch.split_d(24) == (32, 0) and launch.split_d(256) == (256, 0)
    for d in range(8, 257, 8):  # the kernels' tiles cover the head, split ones exactly
        a, b = launch.split_d(d)
        assert a + b == d if b else a >= d
        assert launch.tile_width(d) == a + b


def test_tail_tile():
    """The partial last block's tile: a power of two from 16 to the block, none (0) when the
    block divides n."""
    assert [launch.tail_tile(65, b) for b in (16, 32, 64, 128)] == [16, 16, 16, 128]
    assert [launch.tail_tile(n, 32) for n in (1, 17, 32, 60, 64)] == [16, 32, 0, 32, 0]
    assert launch.tail_tile(197, 64) == 16 and launch.tail_tile(197, 128) == 128


@pytest.mark.parametrize("N, D, block_ms", [(16, 32, {16}), (17, 32, {16, 32}), (33, 32, {16, 32, 64}),
                                            (64, 32, {16, 32, 64}), (65, 32, {16, 32, 64, 128}),
                                            (33, 48, {16, 32, 64}), (65, 80, {16, 32, 64, 128})])
def test_every_short_candidate(monkeypatch, N, D, block_ms):
    """Every short candidate of both ops (every BLOCK_M, HEADS and STAGES; warps do not
    change the interpreter's arithmetic) at lengths whose query rows end in a tail tile
    (17, 33, 65: 64 + 16 or 32 + 32 + 16 rows) or in full tiles (16, 64, and 33, 65 with
    16-row tiles), against the reference; and at split head dims (48 = 32 + 16,
    80 = 64 + 16), in two column chunks. On the GPU, test_every_config_gpu runs them all."""
    B, H = 2, 4
    qkv, do = _packed_inputs(B, N, H, D, torch.float16, seed=N + D)

    def short(op, **kw):  # one candidate per distinct set of blocks
        cands = {c.blocks: c for c in launch.candidates(op, N, D, **kw) if c.family == "short"}
        return list(cands.values())

    fwds, bwds = short("fwd", bh=B * H), short("bwd")
    assert {c.meta["BLOCK_M"] for c in fwds} == block_ms
    # the backward's 128-row chunks only where a tile is at most 64 columns wide
    assert {c.meta["BLOCK_M"] for c in bwds} == (block_ms if D <= 64 else block_ms - {128})
    for fwd, bwd, plans in _pairs_within_rule(monkeypatch, qkv, do, fwds, bwds):
        # the launches ran with the query tail tile that N and BLOCK_M call for
        assert plans.keys() == {"fwd", "bwd"}
        for op, cand in (("fwd", fwd), ("bwd", bwd)):
            consts = plans[op][0].consts
            assert consts["BLOCK_MT"] == launch.tail_tile(N, cand.meta["BLOCK_M"])
            assert (consts["BLOCK_D"], consts["BLOCK_D2"]) == launch.split_d(D)


def test_one_key_twins_exactly_where_one_key_is_past_the_tile():
    """The one-key-tail twins (BLOCK_T = 1) are listed beside every short backward candidate
    and every pipelined short forward at N = 2^k + 1, and nowhere else;
    test_every_short_candidate and test_short_tma_forward run them (N = 17, 33, 65) against
    the reference."""
    def same(cands):
        return {(c.meta["BLOCK_M"], c.num_warps, c.meta.get("HEADS"), c.meta.get("STAGES")) for c in cands}

    for n in (17, 33, 65, 129):
        short = [c for c in launch.candidates("bwd", n, 64) if c.family == "short" and not c.maxnreg]
        twins = [c for c in short if c.meta["BLOCK_T"] == 1]
        assert launch.one_key_tail(n) and twins and len(twins) * 2 == len(short)
        assert same(twins) == same(c for c in short if c.meta["BLOCK_T"] > 1)
        fwd = [c for c in launch.candidates("fwd", n, 64, bh=64) if c.family == "short"]
        fwd_twins = [c for c in fwd if c.meta["BLOCK_T"] == 1]
        assert fwd_twins and same(fwd_twins) == same(c for c in fwd if c.meta["BLOCK_T"] > 1 and c.meta["HEADS"] > 1)
        assert all(c.meta["HAS_TAIL"] and c.meta["BLOCK_N"] == n - 1 for c in twins + fwd_twins)
        assert all(c.meta["BLOCK_T2"] == 0 for c in fwd_twins)
    for n in (1, 16, 18, 64, 66, 100, 130):
        assert not launch.one_key_tail(n)
        assert all(c.meta.get("BLOCK_T") != 1 for op in ("fwd", "bwd") for c in launch.candidates(op, n, 64, bh=64))
    with pytest.raises(ValueError, match="N = 66 is not a power-of-two tile and one key"):
        launch.short_bwd(66, 16, one_key=True)
    with pytest.raises(ValueError, match="N = 64 is not a power-of-two tile and one key"):
        launch.short_fwd(64, 16, heads=2, stages=2, one_key=True)


def test_register_capped_short_backward_listed_at_65_keys_and_33_to_64_columns():
    """The short backward's register-capped twin (16-row chunks, 4 warps, maxnreg 168, the
    kernel's KEY_PER_CHUNK form) is listed at N = 65 where a tile is 33-64 columns wide, the
    one shape it was timed at, and nowhere else; the cap travels through the tuning cache's
    JSON and into the launch's compile options, and only the one-key twin takes one."""
    for n, d in ((65, 64), (65, 48), (65, 40)):
        capped = [c for c in launch.candidates("bwd", n, d) if c.maxnreg]
        assert capped == [launch.short_bwd(n, 16, 4, one_key=True, maxnreg=168)]
        assert capped[0].meta["KEY_PER_CHUNK"] == 1 and capped[0].meta["BLOCK_T"] == 1
        assert launch.Candidate.from_json(json.loads(json.dumps(capped[0].to_json()))) == capped[0]
        assert capped[0].label().endswith("4w 1s cap 168")
    for n, d in ((65, 32), (65, 80), (65, 128), (17, 64), (33, 64), (129, 64), (64, 64), (197, 64)):
        assert not [c for c in launch.candidates("bwd", n, d) if c.maxnreg], (n, d)
        assert not [c for c in launch.candidates("fwd", n, d, bh=64) if c.maxnreg], (n, d)
    (plan,) = flash_mod._bwd_launches(launch.short_bwd(65, 16, 4, one_key=True, maxnreg=168), 2, 65, 3, 64)
    assert plan.options == {"num_warps": 4, "num_stages": 1, "maxnreg": 168}
    assert plan.consts["KEY_PER_CHUNK"] == 1
    (plain,) = flash_mod._bwd_launches(launch.short_bwd(65, 32, 4, one_key=True), 2, 65, 3, 64)
    assert plain.options == {"num_warps": 4, "num_stages": 1} and plain.consts["KEY_PER_CHUNK"] == 0
    with pytest.raises(ValueError, match="only for the one-key twin"):
        launch.short_bwd(65, 32, 4, maxnreg=168)


def test_a_general_candidates_register_cap_reaches_every_launch_of_it():
    """A cap on a general or atomic candidate (none listed; the backward-parts probe makes
    them) goes to each of its kernel launches, as it does for the short backward's twin; the
    delta and dQ-scaling launches of the plan stay uncapped (a split candidate has no delta
    launch: its dQ launch computes delta)."""
    blocks = (("BLOCK_M1", 32), ("BLOCK_N1", 128), ("BLOCK_M2", 128), ("BLOCK_N2", 32))
    one = launch.Candidate("general", blocks, 4, 3, 168)
    split = launch.Candidate("general", (*blocks, ("SPLIT", 1)), 4, 3, 168)
    atomic = launch.Candidate("atomic", (("BLOCK_M", 32), ("BLOCK_N", 64)), 4, 2, 168)
    delta, bwd = ("bwd_delta_kernel", None), ("bwd_kernel", 168)
    for c, expected in ((one, [delta, bwd]), (split, [bwd, bwd]),
                        (atomic, [delta, ("bwd_atomic_kernel", 168), ("bwd_dq_kernel", None)])):
        plan = flash_mod._bwd_launches(c, 2, 577, 3, 64)
        assert [(p.kernel.__name__, p.options.get("maxnreg")) for p in plan] == expected
    (fwd,) = flash_mod._fwd_launches(launch.Candidate("general", (("BLOCK_M", 128), ("BLOCK_N", 64)), 8, 3, 200),
                                     2, 577, 3, 64)
    assert fwd.options == {"num_warps": 8, "num_stages": 3, "maxnreg": 200}
    uncapped = flash_mod._bwd_launches(launch.Candidate("general", blocks, 4, 3), 2, 577, 3, 64)
    assert all("maxnreg" not in p.options for p in uncapped)


@pytest.mark.parametrize("D, dtype, dropout_p, diag", [(64, torch.bfloat16, 0.0, False),
                                                       (48, torch.float16, 0.2, True)])
def test_key_per_chunk_backward_gives_the_same_bits(monkeypatch, D, dtype, dropout_p, diag):
    """The short backward's KEY_PER_CHUNK form (the key past the tile read again per query
    chunk, its vector work before the chunk's products) does the same arithmetic in the same
    order as the one-key twin it stands beside: dqkv equal bit for bit, with a split head
    dim (48 = 32 + 16), dropout and the diagonal mask too; in 16-row chunks (the listed twin:
    the last, 16-row chunk adds into the one key's unsummed terms with the full ones) and in
    32-row chunks (it adds after their sums). (The interpreter ignores the register cap; on a
    GPU test_every_config_gpu runs the capped binary against float64.)"""
    B, H, N = 2, 2, 65
    qkv, do = _packed_inputs(B, N, H, D, dtype, seed=D)
    seed = torch.tensor([99], dtype=torch.int64, device=DEVICE)
    fwd = launch.short_fwd(N, 32, heads=2, stages=2, one_key=True)
    for rows in (16, 32):
        out = []
        for bwd in (launch.short_bwd(N, rows, 4, one_key=True),
                    launch.short_bwd(N, rows, 4, one_key=True, maxnreg=168)):
            _force(monkeypatch, fwd, bwd)
            o, lse = flash_mod._forward(qkv, D ** -0.5, dropout_p, seed, diag)
            out.append(flash_mod._backward(do, qkv, o, lse, D ** -0.5, dropout_p, seed, mask_diagonal=diag))
            assert flash_mod._plans[("bwd", dtype, qkv.device, B, N, H, D, dropout_p > 0, diag)][0].consts[
                "KEY_PER_CHUNK"] == bool(bwd.maxnreg)
        assert out[0].abs().sum() > 0 and torch.equal(out[0], out[1]), rows


def test_short_forward_takes_eight_warps_only_on_128_row_tiles():
    """The 64-row short forward in 8 warps broke the rule on an H200 (D = 16, N = 197, the
    diagonal mask), and 8 warps below 128 rows never came near the best: none is listed."""
    seen = set()
    for n, d in [(17, 64), (65, 16), (65, 64), (100, 80), (197, 16), (197, 64)]:
        for c in launch.candidates("fwd", n, d, bh=64):
            if c.family in ("short", "short_tma"):
                seen.add((c.meta["BLOCK_M"], c.num_warps))
    assert (128, 8) in seen and (64, 4) in seen
    assert not [(m, w) for m, w in seen if w == 8 and m < 128]


def _misaligned(t: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of t that starts 2 bytes past a 16-byte boundary (a view one fp16
    element into a larger buffer)."""
    buf = torch.empty(t.numel() + 8, dtype=t.dtype, device=t.device)
    start = next(i for i in range(8) if (buf.data_ptr() + i * t.element_size()) % 16 == 2)
    out = buf[start:start + t.numel()].view(t.shape)
    out.copy_(t)
    assert out.is_contiguous() and out.data_ptr() % 16 == 2
    return out


def test_a_misaligned_packed_input_is_copied_and_gives_the_same_results():
    """The kernels' TMA descriptors need 16-byte aligned starts: a contiguous qkv or output
    gradient that starts elsewhere is copied (an aligned one is read in place), and the
    results are the aligned inputs' bit for bit, gradients included."""
    qkv, do = _packed_inputs(2, 17, 2, 32, torch.float16, seed=3)
    assert flash_mod._packed_input(qkv) is qkv
    copy = flash_mod._packed_input(_misaligned(qkv))
    assert copy.data_ptr() % 16 == 0 and torch.equal(copy, qkv)
    results = []
    for x, g in ((qkv, do), (_misaligned(qkv), _misaligned(do))):
        leaf = x.detach().requires_grad_()
        o = flash_attention_qkvpacked(leaf)
        (dqkv,) = torch.autograd.grad(o, leaf, g)
        results.append((o, dqkv))
    assert all(torch.equal(a, b) for a, b in zip(*results))


def _bwd_form(c: launch.Candidate) -> tuple:
    """A Gluon backward candidate as (BLOCK_M1, BLOCK_N1, BLOCK_M2, BLOCK_N2, flags, warps,
    stages)."""
    return (*(c.meta[k] for k in ("BLOCK_M1", "BLOCK_N1", "BLOCK_M2", "BLOCK_N2")),
            "+".join(k for k in ("OVERLAP", "DQ_OVERLAP", "WS", "DQ_WS") if c.meta.get(k)),
            c.num_warps, c.num_stages)


def test_gluon_kernels_are_listed_only_where_they_were_measured_to_pay(monkeypatch):
    """On Hopper the forward lists one Gluon candidate past N = 256 at D = 64 (the 4-warp
    form) and D = 128 (the warp-specialized one, and its persistent form), and both backwards
    (deterministic or not) 64-key and 128-key dK/dV programs with 64-row dQ programs (at
    D = 128 with the dQ products overlapped), at D = 64 the 64-key one with its products
    overlapped across steps, in 2 and 3 stages (at D = 128 it spills); never at N <= 256, at
    other head dims, or with dropout (the Gluon kernels have none). The warp-specialized
    dQ kernel's forms at D = 128 are staged apart (gluon_ws_bwd_candidates: yet to be decided on
    a GPU); none at D = 64."""
    monkeypatch.setattr(launch, "_GLUON", True)
    monkeypatch.setattr(launch, "_TMA", True)

    def gluon(op, n, d, dropout=False):
        return [c for c in launch.candidates(op, n, d, 96, dropout)
                if c.family in (*launch.GLUON_FAMILIES, launch.GLUON_BWD_FAMILY)]

    (c64,) = gluon("fwd", 577, 64)
    assert c64.family == "gluon" and c64.meta == dict(BLOCK_M=64, BLOCK_N=128)
    assert (c64.num_warps, c64.num_stages) == (4, 2)
    c128, p128 = gluon("fwd", 4097, 128)
    assert c128.family == "gluon_ws" and c128.meta == dict(BLOCK_M=64, BLOCK_N=128, CONSUMER_REGS=240)
    assert p128.family == "gluon_ws" and p128.meta == dict(c128.meta, PERSISTENT=1)
    assert gluon("fwd", launch.GLUON_MIN_N, 64) == [c64]
    for op, n, d in (("bwd", 577, 64), ("bwd", launch.GLUON_MIN_N, 128), ("bwd_atomic", 4097, 128),
                     ("bwd_atomic", 1025, 64)):
        cands = gluon(op, n, d)
        assert {c.family for c in cands} == {"gluon_bwd"}
        # (BLOCK_M1, BLOCK_N1, BLOCK_M2, BLOCK_N2, flags, warps, stages)
        got = [_bwd_form(c) for c in cands]
        if d == 64:
            assert got == [(64, 64, 64, 64, "", 4, 2), (64, 128, 64, 64, "", 8, 2),
                           (64, 64, 64, 64, "OVERLAP", 4, 2), (64, 64, 64, 64, "OVERLAP", 4, 3)], (op, n)
        else:
            assert got == [(64, 64, 64, 64, "DQ_OVERLAP", 4, 2), (64, 128, 64, 64, "DQ_OVERLAP", 8, 2)], (op, n)
    # staged (not listed): the warp-specialized dQ kernel beside the listed dK/dV one, at D = 128
    assert launch.gluon_ws_bwd_candidates(64) == []
    assert [_bwd_form(c) for c in launch.gluon_ws_bwd_candidates(128)] == [
        (64, 64, 64, 128, "DQ_WS", 4, 2), (64, 64, 64, 64, "DQ_WS", 4, 2)]
    for op, n, d, dropout in (("fwd", 197, 64, False), ("fwd", 256, 128, False), ("fwd", 577, 80, False),
                              ("fwd", 577, 32, False), ("fwd", 577, 64, True), ("bwd", 256, 64, False),
                              ("bwd", 577, 96, False), ("bwd", 577, 64, True), ("bwd_atomic", 197, 128, False)):
        assert gluon(op, n, d, dropout) == [], (op, n, d, dropout)
    monkeypatch.setattr(launch, "_GLUON", False)  # not a Hopper, or no Gluon in this triton
    assert gluon("fwd", 577, 64) == [] and gluon("bwd", 577, 64) == []


def test_tuning_choices_among_the_gluon_and_staged_kernels_are_cached_apart(monkeypatch):
    """The tuning cache's entry for one key names the GPU, the versions and the key, and
    keeps apart the choices made without the Gluon kernels, among the listed ones, and among
    the staged ones too (VITFLASH_GLUON=staged): a choice of a staged kernel is never read
    back by a process that does not list it."""
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H100 80GB HBM3")
    key = launch._key("bwd", torch.bfloat16, 577, 128, 64)
    entries = []
    for gluon, staged in ((False, False), (True, False), (True, True)):
        monkeypatch.setattr(launch, "_GLUON", gluon)
        monkeypatch.setattr(launch, "_STAGED", staged)
        entries.append(launch._disk_key(key, None))
    assert all(e.startswith("NVIDIA H100 80GB HBM3|torch ") and f"|v{launch.CACHE_VERSION}|bwd|bfloat16|N=577|D=128|"
               in e for e in entries)
    assert [e.rsplit("|", 1)[-1] for e in entries] == ["BH<=64", "gluon", "gluon+staged"]


def test_the_gluon_kernels_are_listed_unless_turned_off(monkeypatch):
    """The Gluon kernels are listed by default where they can run and with VITFLASH_GLUON=1;
    VITFLASH_GLUON=0 leaves them out; VITFLASH_GLUON=staged lists the staged ones too (the
    warp-specialized backward's forms, and only then); any other value is an error that
    names the variable and its three values. Where they cannot run (another GPU, none, the
    interpreter) they are never listed. The machine is stood in for: a Hopper GPU, or a GPU
    of compute capability 8.0, outside the interpreter."""
    if not hopper.available():
        pytest.skip(f"Gluon does not import in this triton: {hopper._IMPORT_ERROR}")
    monkeypatch.setattr(launch, "INTERPRET", False)
    monkeypatch.setattr(launch, "_STAGED", False)  # (restored after the test)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for major, runs in ((9, True), (8, False)):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a, m=major: (m, 0))
        for value, listed in ((None, runs), ("1", runs), (" 1 ", runs), ("0", False), ("staged", runs)):
            monkeypatch.setattr(launch, "_GLUON", None)
            if value is None:
                monkeypatch.delenv("VITFLASH_GLUON", raising=False)
            else:
                monkeypatch.setenv("VITFLASH_GLUON", value)
            assert launch.gluon_kernels() is listed, (major, value)
            assert launch.gluon_staged() is (listed and value == "staged"), (major, value)
            ws = [c for c in launch.candidates("bwd", 577, 128) if c.meta.get("WS") or c.meta.get("DQ_WS")]
            assert ws == (launch.gluon_ws_bwd_candidates(128) if launch.gluon_staged() else []), (major, value)
    monkeypatch.setattr(launch, "INTERPRET", True)  # (the CPU tests' case)
    monkeypatch.setattr(launch, "_GLUON", None)
    monkeypatch.delenv("VITFLASH_GLUON", raising=False)
    assert launch.gluon_kernels() is False
    monkeypatch.setattr(launch, "_GLUON", None)
    monkeypatch.setenv("VITFLASH_GLUON", "yes")
    with pytest.raises(ValueError, match=r"VITFLASH_GLUON='yes'.*set it to 0.*to 1 \(the default\).*or to staged"):
        launch.gluon_kernels()


# A GluonLaunch's warm-up (what the tuner's _compile_all runs) compiled for sm_90 with no GPU:
# a stand-in driver names the target, and the kernel's binder, compile options and keyword
# constexprs are Triton's own. Outside the interpreter (Gluon cannot call its jit functions).
_GLUON_LAUNCH_WARMUP = """
import sys
import torch
sys.path.insert(0, sys.argv[1])
import hopper_standin  # noqa: F401  (an sm_90 GPU stands in for this CPU from here on)
from vitflash.ops import launch

ws = (("BLOCK_M", 64), ("BLOCK_N", 128), ("CONSUMER_REGS", 240))
for family, blocks, D, N in (("gluon_ws", ws, 128, 577), ("gluon", (("BLOCK_M", 64), ("BLOCK_N", 128)), 64, 300),
                             ("gluon_ws", (*ws, ("PERSISTENT", 1)), 128, 577)):
    g = launch.GluonLaunch(launch.Candidate(family, blocks, 4, 2), D)
    for dtype in (torch.bfloat16, torch.float16):
        qkv = torch.zeros(2, N, 3, 3, D, dtype=dtype)
        o, lse = torch.zeros(2, N, 3, D, dtype=dtype), torch.zeros(2, 3, N)
        launch._compiling.only = True
        g(qkv, o, lse, lse, 0.1, 0.0, 3, N)
    compiled = list(g.kernel.device_caches[0][0].values())
    print(family, D, len(compiled), *{(ck.metadata.num_warps, getattr(ck.metadata, "maxnreg", None),
                                       "wgmma" in ck.asm["ptx"]) for ck in compiled})


def bwd_warmup(c, D, dkdv):  # one of a backward candidate's launches, bf16 and fp16: its binaries
    g = launch.GluonBwdLaunch(c, D, dkdv)
    g.kernel.device_caches.clear()
    for dtype in (torch.bfloat16, torch.float16):
        qkv, do = torch.zeros(2, 300, 3, 3, D, dtype=dtype), torch.zeros(2, 300, 3, D, dtype=dtype)
        lse = torch.zeros(2, 3, 300)
        launch._compiling.only = True
        g(qkv, torch.zeros_like(do), do, lse, lse, torch.empty_like(qkv), 0.1, 0.125, 3, 300)
    return g, list(g.kernel.device_caches[0][0].values())


# the backward's two launches, each candidate at both head dims (the overlapped one at D = 64)
names = ("BLOCK_M1", "BLOCK_N1", "BLOCK_M2", "BLOCK_N2", "OVERLAP")
for n1, warps, overlap in ((64, 4, 0), (128, 8, 0), (64, 4, 1)):
    c = launch.Candidate("gluon_bwd", tuple(zip(names, (64, n1, 64, 64, overlap))), warps, 2)
    for D in ((64, ) if overlap else (64, 128)):
        for dkdv in (True, False):
            g, compiled = bwd_warmup(c, D, dkdv)
            print("dkdv" if dkdv else "dq", n1, D, overlap, len(compiled),
                  *{(ck.metadata.num_warps, "wgmma" in ck.asm["ptx"]) for ck in compiled})

# the warp-specialized backward's two launches (WS, DQ_WS) at the tiles listed at each head dim
names = ("BLOCK_M1", "BLOCK_N1", "BLOCK_M2", "BLOCK_N2", "WS", "DQ_WS")
for D, m1, n2 in ((64, 64, 64), (128, 32, 128)):
    c = launch.Candidate("gluon_bwd", tuple(zip(names, (m1, 64, 64, n2, 1, 1))), 4, 2)
    for dkdv in (True, False):
        g, compiled = bwd_warmup(c, D, dkdv)
        print("ws_dkdv" if dkdv else "ws_dq", D, g.rows, len(compiled),
              *{(ck.metadata.num_warps, getattr(ck.metadata, "maxnreg", None), "wgmma" in ck.asm["ptx"])
                for ck in compiled})
"""


def test_a_gluon_launch_compiles_its_kernel_for_sm90():
    """The Gluon forward plans (the warp-specialized one in both forms, persistent and not, and
    the 4-warp one) compile through GluonLaunch's own call (keyword constexprs, the
    descriptors it makes, the warp-specialized form's register cap), for bf16 and fp16
    qkv (one binary each), for sm_90, where the tuner's compile-only pass would: 12 warps
    (two consumer groups and the loader's warp allocated as a group) under a 168-register
    cap, or 4 warps with none. So do both Gluon backward candidates' two launches
    (GluonBwdLaunch) at D = 64 and 128, and the overlapped dK/dV form at D = 64: the dK/dV
    kernel in a warp group per 64 keys, the dQ kernel in 4 warps; and the warp-specialized
    backward's two (WS, DQ_WS) at the tiles listed at each head dim, in 12 warps under the
    register cap."""
    if not hopper.available():
        pytest.skip(f"Gluon does not import in this triton: {hopper._IMPORT_ERROR}")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", _GLUON_LAUNCH_WARMUP, str(Path(__file__).parent)],
                         capture_output=True, text=True, env=env, check=True).stdout.split("\n")
    assert out[:3] == ["gluon_ws 128 2 (12, 168, True)", "gluon 64 2 (4, None, True)",
                       "gluon_ws 128 2 (12, 168, True)"]
    assert out[3:13] == [f"{k} {n1} {D} {o} 2 ({w}, True)" for n1, o, dims in ((64, 0, (64, 128)),
                                                                               (128, 0, (64, 128)),
                                                                               (64, 1, (64, )))
                         for D in dims for k, w in (("dkdv", n1 // 16), ("dq", 4))]
    cap = hopper.ws_maxnreg(launch.WS_REGS)
    # 128 rows a program, 12 warps (two consumer groups and the loader's warp); their spills:
    # test_probes' test_gluon_bwd_probe_compiles_its_kernel_for_sm90, at the same tiles
    assert out[13:17] == [f"{k} {D} 128 2 (12, {cap}, True)" for D in (64, 128) for k in ("ws_dkdv", "ws_dq")]


def test_a_gluon_candidate_plans_one_gluon_launch_but_not_with_a_mask_or_dropout():
    """A Gluon candidate becomes a GluonLaunch of its kernel (the warp-specialized one with its
    consumers' register count and the kernel-wide cap that gives it); with the diagonal mask
    or dropout, which the Gluon kernels lack, the plan falls back to the Triton forward."""
    ws = launch.Candidate("gluon_ws", (("BLOCK_M", 64), ("BLOCK_N", 128), ("CONSUMER_REGS", 240)), 4, 2)
    (g,) = flash_mod._fwd_launches(ws, 2, 4097, 16, 128)
    assert isinstance(g, launch.GluonLaunch) and g.rows == 128 and g.num_stages == 2
    assert g.consts["CONSUMER_REGS"] == 240 and g.options["maxnreg"] == hopper.ws_maxnreg(240)
    assert flash_mod._fwd_descriptors(g, None) == ()
    four = launch.Candidate("gluon", (("BLOCK_M", 64), ("BLOCK_N", 128)), 4, 2)
    (g,) = flash_mod._fwd_launches(four, 2, 577, 12, 64)
    assert isinstance(g, launch.GluonLaunch) and g.rows == 64 and "maxnreg" not in g.options
    for kw in (dict(diag=True), dict(dropout=True)):
        (t,) = flash_mod._fwd_launches(four, 2, 577, 12, 64, **kw)
        assert isinstance(t, launch.Launch) and t.kernel is kernels.fwd_kernel, kw


def test_a_gluon_backward_candidate_plans_its_two_launches_but_not_with_a_mask_or_dropout():
    """A "gluon_bwd" candidate becomes the dQ kernel's launch (BLOCK_M2 queries, BLOCK_N2-key
    tiles), which computes delta (DQ_DELTA), then the dK/dV kernel's (its BLOCK_N1 keys a
    program in a warp group per 64, BLOCK_M1-row query tiles), both with the candidate's
    stages, each overlapped where its own key says (OVERLAP, DQ_OVERLAP), or warp-specialized
    (WS, DQ_WS: twice the rows a program, 12 warps under the consumers' register cap); no
    delta launch. With the diagonal mask or dropout it falls back to the Triton backward,
    delta first."""
    names = ("BLOCK_M1", "BLOCK_N1", "BLOCK_M2", "BLOCK_N2")
    c = launch.Candidate("gluon_bwd", tuple(zip(names, (64, 128, 64, 64))), 8, 2)
    dq, dkdv = flash_mod._bwd_launches(c, 2, 577, 12, 128)
    assert (dkdv.kernel, dkdv.rows, dkdv.num_warps, dkdv.dkdv) == (hopper.bwd_dkdv_kernel, 128, 8, True)
    assert (dq.kernel, dq.rows, dq.num_warps, dq.dkdv) == (hopper.bwd_dq_kernel, 64, 4, False)
    assert dkdv.consts == dict(HEAD_DIM=128, BLOCK_M=64, BLOCK_N=128, STAGES=2)
    assert dq.consts == dict(HEAD_DIM=128, BLOCK_M=64, BLOCK_N=64, STAGES=2, DQ_DELTA=1)
    overlapped = launch.Candidate("gluon_bwd", (*zip(names, (64, 64, 64, 64)), ("OVERLAP", 1)), 4, 3)
    dq, dkdv = flash_mod._bwd_launches(overlapped, 2, 577, 12, 64)
    assert dkdv.consts == dict(HEAD_DIM=64, BLOCK_M=64, BLOCK_N=64, STAGES=3, OVERLAP=1)
    assert dq.consts == dict(HEAD_DIM=64, BLOCK_M=64, BLOCK_N=64, STAGES=3, DQ_DELTA=1)
    dq_overlapped = launch.Candidate("gluon_bwd", (*zip(names, (32, 64, 64, 64)), ("DQ_OVERLAP", 1)), 4, 2)
    dq, dkdv = flash_mod._bwd_launches(dq_overlapped, 2, 577, 12, 128)
    assert dkdv.consts == dict(HEAD_DIM=128, BLOCK_M=32, BLOCK_N=64, STAGES=2)
    assert dq.consts == dict(HEAD_DIM=128, BLOCK_M=64, BLOCK_N=64, STAGES=2, OVERLAP=1, DQ_DELTA=1)
    # the warp-specialized forms: two consumers of BLOCK_N1 keys (BLOCK_M2 queries) a program
    ws = launch.Candidate("gluon_bwd", (*zip(names, (32, 64, 64, 128)), ("WS", 1), ("DQ_WS", 1)), 4, 3)
    dq, dkdv = flash_mod._bwd_launches(ws, 2, 577, 12, 128)
    regs = dict(num_warps=4, maxnreg=hopper.ws_maxnreg(launch.WS_REGS))
    assert (dkdv.kernel, dkdv.rows, dkdv.options) == (hopper.bwd_dkdv_ws_kernel, 128, regs)
    assert (dq.kernel, dq.rows, dq.options) == (hopper.bwd_dq_ws_kernel, 128, regs)
    assert dkdv.consts == dict(HEAD_DIM=128, BLOCK_M=32, BLOCK_N=64, STAGES=3, CONSUMER_REGS=launch.WS_REGS)
    assert dq.consts == dict(HEAD_DIM=128, BLOCK_M=64, BLOCK_N=128, STAGES=3, CONSUMER_REGS=launch.WS_REGS)
    half = launch.Candidate("gluon_bwd", (*zip(names, (32, 64, 64, 64)), ("WS", 1), ("DQ_OVERLAP", 1)), 4, 2)
    dq, dkdv = flash_mod._bwd_launches(half, 2, 577, 12, 128)
    assert (dkdv.kernel, dkdv.rows, dq.kernel, dq.rows) == (hopper.bwd_dkdv_ws_kernel, 128, hopper.bwd_dq_kernel, 64)
    assert dq.consts == dict(HEAD_DIM=128, BLOCK_M=64, BLOCK_N=64, STAGES=2, OVERLAP=1, DQ_DELTA=1)
    for kw in (dict(diag=True), dict(dropout=True)):
        plan = flash_mod._bwd_launches(c, 2, 577, 12, 128, **kw)
        assert all(isinstance(p, launch.Launch) for p in plan), kw
        assert plan[0].kernel is kernels.bwd_delta_kernel, kw
        assert {p.kernel for p in plan} <= {kernels.bwd_delta_kernel, kernels.bwd_kernel}, kw


@pytest.mark.gpu
@pytest.mark.parametrize("D", [64, 80, 96, 128])
@pytest.mark.parametrize("N", [1, 65, 197, 577])
def test_every_config_gpu(monkeypatch, N, D):
    """Every autotuning candidate, not only the winner, keeps to the rule."""
    _every_candidate_within_rule(monkeypatch, N, D)


# The CIFAR models' narrow heads (vit_tiny_h12: 12 heads of 16), the one-key-tail twins at
# N = 17 and 65, and locality attention's mask_diagonal (a DIAG constexpr: kernels of their own).
@pytest.mark.gpu
@pytest.mark.parametrize("N, D, mask_diagonal", [(17, 64, False), (65, 16, False), (65, 16, True),
                                                  (65, 64, True), (197, 64, True), (197, 16, True)])
def test_every_config_narrow_heads_and_masked_gpu(monkeypatch, N, D, mask_diagonal):
    _every_candidate_within_rule(monkeypatch, N, D, mask_diagonal=mask_diagonal)


@pytest.mark.gpu
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("N", [257, 577, 1000, 2049])
def test_gluon_forward_gpu(monkeypatch, N, D):
    """The Gluon forward listed at this head dim (on Hopper), at full and partial last query
    and key tiles, under the rule on o and, through the Triton backward that reads its LSE,
    on dq, dk, dv."""
    monkeypatch.setenv("VITFLASH_GLUON", "1")
    monkeypatch.setattr(launch, "_GLUON", None)
    if not launch.gluon_kernels():
        pytest.skip("the Gluon forwards run on Hopper GPUs with a triton that has Gluon")
    cands = [c for c in launch.candidates("fwd", N, D, 2 * 4) if c.family in launch.GLUON_FAMILIES]
    assert len(cands) == (1 if D == 64 else 2)  # at D = 128 the persistent form too
    for cand in cands:
        _force(monkeypatch, cand, launch.heuristic("bwd", N, D))
        for dtype in DTYPES:
            qkv, do = _packed_inputs(2, N, 4, D, dtype, seed=N + D)
            _assert_within_rule(qkv, do)
            assert isinstance(flash_mod._plans[("fwd", dtype, qkv.device, 2, N, 4, D, False, False)][0],
                              launch.GluonLaunch)


@pytest.mark.gpu
@pytest.mark.parametrize("B, H, N", [(32, 16, 577), (3, 16, 4097), (1, 1, 257)])
def test_gluon_persistent_forward_gpu(monkeypatch, B, H, N):
    """The persistent warp-specialized forward at D = 128, where each program takes several
    query tiles in turn (2560 and 1584 tiles on 132 SMs: its buffer ring's sequence runs
    on across them) and where it has one tile: O and LSE bit for bit the non-persistent
    form's (each tile's arithmetic is the same), and O under the rule."""
    monkeypatch.setenv("VITFLASH_GLUON", "1")
    monkeypatch.setattr(launch, "_GLUON", None)
    if not launch.gluon_kernels():
        pytest.skip("the Gluon forwards run on Hopper GPUs with a triton that has Gluon")
    plain, persistent = [c for c in launch.candidates("fwd", N, 128, B * H) if c.family in launch.GLUON_FAMILIES]
    assert persistent.meta.get("PERSISTENT") and not plain.meta.get("PERSISTENT")
    gen = torch.Generator(device="cuda").manual_seed(N)
    qkv = torch.randn(B, N, 3, H, 128, device="cuda", generator=gen).to(torch.bfloat16)
    outs = []
    for c in (plain, persistent):
        g = launch.GluonLaunch(c, 128)
        o = torch.full((B, N, H, 128), float("nan"), device="cuda", dtype=qkv.dtype)
        lse = torch.full((B, H, N), float("nan"), device="cuda")
        g(qkv, o, lse, None, 128 ** -0.5 * 1.4426950408889634, 0.0, H, N)
        outs.append((o, lse))
    torch.cuda.synchronize()
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
    assert torch.isfinite(outs[1][0]).all()
    ref = naive_attention(*(t.double() for t in qkv[:1].unbind(2)), 128 ** -0.5)
    low = naive_attention(*qkv[:1].unbind(2), 128 ** -0.5)
    err = (outs[1][0][:1].double() - ref).abs().max().item()
    assert err <= 2 * (low.double() - ref).abs().max().item() + 1e-5


@pytest.mark.gpu
@pytest.mark.parametrize("D, staged", [(64, False), (128, False), (128, True)],
                         ids=["64-listed", "128-listed", "128-staged"])
@pytest.mark.parametrize("N", [257, 577, 1000, 2049])
def test_gluon_backward_gpu(monkeypatch, N, D, staged):
    """Each Gluon backward candidate (on Hopper), listed or staged (gluon_ws_bwd_candidates:
    at D = 128 only), after the Triton forward and after the Gluon one, at full and partial
    last query and key tiles, under the rule on o, dq, dk, dv."""
    monkeypatch.setenv("VITFLASH_GLUON", "1")
    monkeypatch.setattr(launch, "_GLUON", None)
    if not launch.gluon_kernels():
        pytest.skip("the Gluon kernels run on Hopper GPUs with a triton that has Gluon")
    listed = [c for c in launch.candidates("bwd", N, D) if c.family == launch.GLUON_BWD_FAMILY]
    bwds = launch.gluon_ws_bwd_candidates(D) if staged else listed
    gluon_fwd = [c for c in launch.candidates("fwd", N, D, 2 * 4) if c.family in launch.GLUON_FAMILIES][-1]
    assert len(listed) == (4 if D == 64 else 2)
    if staged:  # the warp-specialized dQ kernel's pairing, at 128- and 64-key steps
        assert len(bwds) == 2
    for fwd in (launch.heuristic("fwd", N, D), gluon_fwd):
        for bwd in bwds:
            _force(monkeypatch, fwd, bwd)
            for dtype in DTYPES:
                qkv, do = _packed_inputs(2, N, 4, D, dtype, seed=N + D)
                _assert_within_rule(qkv, do)
                plan = flash_mod._plans[("bwd", dtype, qkv.device, 2, N, 4, D, False, False)]
                # the dQ kernel, computing delta, then the dK/dV kernel
                assert [(type(p), p.dkdv) for p in plan] == [(launch.GluonBwdLaunch, False),
                                                            (launch.GluonBwdLaunch, True)]


@pytest.mark.gpu
def test_gluon_kernels_in_a_cuda_graph_gpu(monkeypatch):
    """The Gluon forward and backward captured in CUDA graphs after eager calls of the same
    leaf, as bench_attention's graph timer does it (the forward under no_grad, then the
    forward+backward), and a captured forward+backward replayed: the eager call's gradients,
    bit for bit (the backward is deterministic). At (4, 16, 4097, 128), where one such
    capture in bench_attention once met an AccumulateGrad node of the eager calls."""
    monkeypatch.setenv("VITFLASH_GLUON", "1")
    monkeypatch.setattr(launch, "_GLUON", None)
    if not launch.gluon_kernels():
        pytest.skip("the Gluon kernels run on Hopper GPUs with a triton that has Gluon")
    B, H, N, D = 4, 16, 4097, 128
    fwd = [c for c in launch.candidates("fwd", N, D, B * H) if c.family in launch.GLUON_FAMILIES]
    bwd = [c for c in launch.candidates("bwd", N, D) if c.family == launch.GLUON_BWD_FAMILY]
    _force(monkeypatch, fwd[0], bwd[0])
    gen = torch.Generator(device="cuda").manual_seed(0)
    leaf = torch.randn(B, N, 3, H, D, device="cuda", generator=gen).to(torch.bfloat16).requires_grad_()
    do = torch.randn(B, N, H, D, device="cuda", generator=gen).to(torch.bfloat16)

    def fwd_bwd():
        return torch.autograd.grad(flash_attention_qkvpacked(leaf), leaf, do)

    (ref,) = fwd_bwd()
    with torch.no_grad():
        triton.testing.do_bench_cudagraph(lambda: flash_attention_qkvpacked(leaf), rep=5)
    triton.testing.do_bench_cudagraph(fwd_bwd, rep=5)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fwd_bwd()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        (dqkv,) = fwd_bwd()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(dqkv, ref)
    kinds = {op: type(plan[-1]) for (op, *_), plan in flash_mod._plans.items()}
    assert kinds == {"fwd": launch.GluonLaunch, "bwd": launch.GluonBwdLaunch}


def _every_candidate_within_rule(monkeypatch, N, D, **kw):
    qkv, do = _packed_inputs(3 * 4, N, 2, D, torch.bfloat16, seed=N + D)
    fwd0, bwd0 = launch.heuristic("fwd", N, D), launch.heuristic("bwd", N, D)
    pairs = [(fwd, bwd0) for fwd in launch.candidates("fwd", N, D, bh=3 * 2 * 4)]
    pairs += [(fwd0, bwd) for bwd in launch.candidates("bwd", N, D)]
    pairs += [(fwd0, bwd) for bwd in launch.candidates("bwd_atomic", N, D)
              if bwd.family in launch.ATOMIC_FAMILIES]  # atomic_tma too, on Hopper
    failed = []  # every failing pair, not only the first: a list entry that fails must go
    for fwd, bwd in pairs:
        _force(monkeypatch, fwd, bwd)
        try:
            _assert_within_rule(qkv, do, **kw)
        except Exception as err:
            failed.append(f"forward {fwd} / backward {bwd}: {str(err).splitlines()[0]}")
    assert not failed, f"{len(failed)} of {len(pairs)} pairs broke the rule:\n" + "\n".join(failed)


@pytest.mark.parametrize("D", [8, 40, 96, 256])
def test_odd_head_dims(D):
    qkv, do = _packed_inputs(2, 33, 2, D, torch.float16, seed=D)
    _assert_within_rule(qkv, do)


def test_errors_carry_no_bias():
    """Beyond the max-error rule: flash's errors do not lean one way. A scale slightly off
    somewhere (a tail tile, a rescaling) would shrink or grow every gradient a little, within
    the max-error bound, and bias training. The projection of the error on the float64
    result, (got - ref) . ref / |ref|^2, is well under the spread of the error itself
    (relative RMS), and that spread is within naive's, at the 197 tokens of a ViT-B/16."""
    for seed in range(2):
        qkv, do = _packed_inputs(2, 197, 2, 64, torch.bfloat16, scale=1.5, seed=seed)
        ref = _out_and_grads(naive_attention, qkv.double(), do.double())
        low = _out_and_grads(naive_attention, qkv, do)
        got = _out_and_grads(flash_attention, qkv, do)
        for name, r, lo, g in zip(("o", "dq", "dk", "dv"), ref, low, got):
            err, naive_err = g.double() - r, lo.double() - r
            bias = ((err * r).sum() / (r * r).sum()).item()
            rms, naive_rms = (err.norm() / r.norm()).item(), (naive_err.norm() / r.norm()).item()
            assert rms <= naive_rms, f"{name}: flash relative RMS error {rms:.2e} > naive's {naive_rms:.2e}"
            assert abs(bias) <= rms / 10, f"{name}: the error leans by {bias:+.2e}, RMS {rms:.2e}"


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
def test_many_narrow_heads(dtype):
    """The shape of vit_tiny_h12_patch4_32: 65 tokens, 12 heads of 16."""
    qkv, do = _packed_inputs(2, 65, 12, 16, dtype, seed=16)
    _assert_within_rule(qkv, do)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("N", [197, 577, 1025, 4097])
@pytest.mark.parametrize("deterministic", [True, False], ids=["deterministic", "atomic"])
def test_long_sequences_gpu(N, D, dtype, deterministic):
    """The chosen kernels at long sequences, with deterministic=False too (where the tuner
    may pick the backward that adds into dQ atomically)."""
    qkv, do = _packed_inputs(2, N, 3, D, dtype, seed=N + D)
    _assert_within_rule(qkv, do, flash=partial(flash_attention, deterministic=deterministic))


def test_separate_strided_tensors():  # stacked into the packed layout: any strides work
    """q, k, v from unrelated (B, H, N, D) buffers, transposed: no shared storage, odd strides."""
    B, N, H, D = 2, 45, 3, 64
    gen = torch.Generator(device=DEVICE).manual_seed(1)
    q, k, v, do = (torch.randn(B, H, N, D, device=DEVICE, generator=gen).half().transpose(1, 2)
                   for _ in range(4))
    assert not q.is_contiguous()
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    o = flash_attention(*leaves)
    grads = torch.autograd.grad(o, leaves, do)
    ref_leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    ref = naive_attention(*ref_leaves)
    ref_grads = torch.autograd.grad(ref, ref_leaves, do.double())
    low_leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    low = naive_attention(*low_leaves)
    low_grads = torch.autograd.grad(low, low_leaves, do)
    for g, r, lo in zip((o, *grads), (ref, *ref_grads), (low, *low_grads)):
        err = (g.double() - r).abs().max()
        assert err <= 2 * (lo.double() - r).abs().max() + ABS_FLOOR


def test_output_layout_reshapes_without_copy():
    qkv, _ = _packed_inputs(2, 20, 3, 32, torch.float16)
    o = flash_attention(*qkv.unbind(2))
    assert o.shape == (2, 20, 3, 32) and o.is_contiguous()
    assert o.reshape(2, 20, 96).data_ptr() == o.data_ptr()


def test_qkvpacked_equals_unpacked_and_writes_one_dqkv():
    qkv, do = _packed_inputs(2, 40, 2, 64, torch.float16)
    unpacked = _out_and_grads(flash_attention, qkv, do)
    leaf = qkv.detach().clone().requires_grad_()
    o = flash_attention_qkvpacked(leaf)
    # The packed op's backward feeds the leaf's gradient directly: no unbind/stack node.
    next_nodes = [fn for fn, _ in o.grad_fn.next_functions if fn is not None]
    assert [type(fn).__name__ for fn in next_nodes] == ["AccumulateGrad"]
    (dqkv,) = torch.autograd.grad(o, leaf, do)
    for a, b in zip([o, *dqkv.unbind(2)], unpacked):
        assert torch.equal(a, b)


def test_dispatch_paths_agree():
    qkv, _ = _packed_inputs(2, 50, 2, 32, torch.float16)
    outs = {impl: attention_qkvpacked(qkv, impl).double() for impl in ("flash", "naive")}
    outs["sdpa"] = sdpa_attention(*qkv.double().unbind(2))
    assert (outs["flash"] - outs["sdpa"]).abs().max() < 2e-3
    assert (outs["naive"] - outs["sdpa"]).abs().max() < 2e-3
    with pytest.raises(ValueError, match="unknown attention path 'flsh'"):
        attention_qkvpacked(qkv, "flsh")


@pytest.mark.gpu  # the interpreter runs programs one by one: only the GPU can race
def test_second_order_gradient_through_flash_raises():
    """The kernels' backward is not differentiable again: a gradient taken with
    create_graph=True is still right, and differentiating it raises (torch's
    once_differentiable) instead of silently leaving attention's share out; naive
    attention differentiates twice."""
    qkv, _ = _packed_inputs(1, 17, 2, 16, torch.float16)
    leaf = qkv.detach().requires_grad_()
    (g,) = torch.autograd.grad(flash_attention_qkvpacked(leaf).float().square().sum(), leaf,
                               create_graph=True)
    (ref,) = torch.autograd.grad(flash_attention_qkvpacked(leaf).float().square().sum(), leaf)
    assert torch.equal(g, ref)
    with pytest.raises(RuntimeError, match="differentiate twice"):
        g.float().square().sum().backward()
    q, k, v = leaf.unbind(2)
    (g2,) = torch.autograd.grad(naive_attention(q, k, v).float().square().sum(), leaf, create_graph=True)
    g2.float().square().sum().backward()
    assert leaf.grad is not None and leaf.grad.abs().sum() > 0


def test_backward_is_deterministic():
    qkv, do = _packed_inputs(2, 130, 2, 64, torch.bfloat16, seed=7)
    first = _out_and_grads(flash_attention, qkv, do)
    second = _out_and_grads(flash_attention, qkv, do)
    for a, b in zip(first, second):
        assert torch.equal(a, b)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
def test_large_scores_stay_finite(dtype):
    """Inputs scaled so that scores reach +-1e4: no inf or NaN, still within the rule.

    softmax_scale=1 keeps the fp16 naive yardstick itself finite (its unscaled q k^T would
    overflow fp16 at the default scale), so the rule stays meaningful.
    """
    qkv, do = _packed_inputs(2, 70, 2, 64, dtype, scale=18.0, seed=3)
    q, k, _ = qkv.double().unbind(2)
    scores = torch.einsum("bnhd,bmhd->bhnm", q, k)
    assert 1e4 <= scores.abs().max() < 6e4
    _assert_within_rule(qkv, do, softmax_scale=1.0)


def test_naive_matches_sdpa_in_fp32():
    qkv, _ = _packed_inputs(2, 33, 2, 32, torch.float32)
    q, k, v = qkv.unbind(2)
    torch.testing.assert_close(naive_attention(q, k, v, 0.3), sdpa_attention(q, k, v, 0.3),
                               atol=1e-5, rtol=1e-5)


def test_custom_scale():
    qkv, do = _packed_inputs(1, 30, 2, 32, torch.float16)
    got = flash_attention(*qkv.unbind(2), softmax_scale=0.05)
    ref = naive_attention(*qkv.double().unbind(2), softmax_scale=0.05)
    low = naive_attention(*qkv.unbind(2), softmax_scale=0.05)
    assert (got.double() - ref).abs().max() <= 2 * (low.double() - ref).abs().max() + ABS_FLOOR


# ---------------------------------------------------------------------------------------
# Bad input: a clear error, never a silent wrong result
# ---------------------------------------------------------------------------------------
def _qkv(B=1, N=8, H=2, D=32, dtype=torch.float16):
    return [torch.randn(B, N, H, D, device=DEVICE).to(dtype) for _ in range(3)]


def test_rejects_fp32_naming_supported_dtypes():
    with pytest.raises(TypeError, match="float16 and torch.bfloat16.*float32"):
        flash_attention(*_qkv(dtype=torch.float32))


def test_rejects_mixed_dtypes():
    q, k, v = _qkv()
    with pytest.raises(TypeError, match="k is torch.bfloat16 but q is torch.float16"):
        flash_attention(q, k.bfloat16(), v)


def test_rejects_mismatched_shapes():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=r"k has shape \(1, 9, 2, 32\), expected \(1, 8, 2, 32\)"):
        flash_attention(q, torch.randn(1, 9, 2, 32, device=DEVICE).half(), v)
    with pytest.raises(ValueError, match="must be 4-d"):
        flash_attention(q[0], k[0], v[0])
    with pytest.raises(ValueError, match=r"qkv must be \(B, N, 3, H, D\)"):
        flash_attention_qkvpacked(torch.randn(1, 8, 2, 2, 32, device=DEVICE).half())


@pytest.mark.parametrize("impl", ["naive", "sdpa"])
def test_reference_paths_reject_wrong_layouts(impl):
    """naive and sdpa check the layout as flash does: a 3-d q or a packed tensor without
    its (B, N, 3, H, D) axes would otherwise attend over the wrong dimension."""
    fn = naive_attention if impl == "naive" else sdpa_attention
    x = torch.randn(2, 17, 2, 16)
    with pytest.raises(ValueError, match=r"q must be 4-d \(B, N, H, D\), got shape \(2, 17, 16\)"):
        fn(x[:, :, 0], x[:, :, 0], x[:, :, 0])
    with pytest.raises(ValueError, match=r"k has shape \(2, 16, 2, 16\), expected \(2, 17, 2, 16\)"):
        fn(x, x[:, :16], x)
    with pytest.raises(ValueError, match=r"qkv must be \(B, N, 3, H, D\), got shape \(2, 17, 3, 64\)"):
        attention_qkvpacked(torch.randn(2, 17, 3, 64), impl)


def test_rejects_mismatched_devices():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="k is on meta but q is on"):
        flash_attention(q, k.to("meta"), v)


@pytest.mark.parametrize("D", [12, 264])
def test_rejects_unsupported_head_dim(D):
    with pytest.raises(ValueError, match=f"head dim {D} is not supported by flash attention"):
        flash_attention(*_qkv(D=D))


@pytest.mark.parametrize("scale", ["0.1", float("nan"), -1.0, 0.0, True])
def test_rejects_bad_softmax_scale(scale):
    with pytest.raises((TypeError, ValueError), match=r"softmax_scale=.* is not a (number|finite number > 0)"):
        flash_attention(*_qkv(), softmax_scale=scale)


def test_rejects_cpu_tensors_without_interpreter(monkeypatch):
    monkeypatch.setattr(launch, "INTERPRET", False)
    q, k, v = (t.cpu() for t in _qkv())
    with pytest.raises(ValueError, match="needs CUDA tensors.*'sdpa' or 'naive'"):
        flash_attention(q, k, v)


def test_custom_ops_schema_and_fake_shapes():
    """The torch.library ops that torch.compile sees: schema and fake (meta) implementations
    agree with the real kernels."""
    qkv, do = _packed_inputs(1, 20, 2, 32, torch.float16)
    o, lse = torch.ops.vitflash.flash_attn_forward(qkv, 0.2, 0.0, None)
    seed = torch.tensor([7], dtype=torch.int64, device=DEVICE)
    for op, args in ((torch.ops.vitflash.flash_attn_forward, (qkv, 0.2, 0.0, None)),
                     (torch.ops.vitflash.flash_attn_forward, (qkv, 0.2, 0.25, seed)),
                     (torch.ops.vitflash.flash_attn_backward, (do, qkv, o, lse, 0.2, 0.0, None, True)),
                     (torch.ops.vitflash.flash_attn_backward, (do, qkv, o, lse, 0.2, 0.0, None, False))):
        torch.library.opcheck(op, args, test_utils=("test_schema", "test_faketensor"))
    assert lse.shape == (1, 2, 20) and lse.dtype == torch.float32
    assert torch.equal(o, flash_attention_qkvpacked(qkv, 0.2))


# ---------------------------------------------------------------------------------------
# Attention dropout: the kernels' mask, regenerated in the backward
# ---------------------------------------------------------------------------------------
def _dropout_reference(qkv, do, mask, p, mask_diagonal=False):
    """o and dq, dk, dv of softmax(q k^T / sqrt(D)) o mask / (1 - p) v, in qkv's dtype
    (float64 for the reference, the low precision for the rule's yardstick); with
    mask_diagonal, each query's own key left out of its softmax."""
    leaf = qkv.detach().clone().requires_grad_()
    q, k, v = (t.transpose(1, 2) for t in leaf.unbind(2))  # (B, H, N, D)
    scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
    if mask_diagonal:
        scores = scores.masked_fill(torch.eye(q.shape[2], dtype=torch.bool, device=q.device), float("-inf"))
    probs = torch.softmax(scores, -1)
    o = ((probs * mask.to(probs.dtype) / (1 - p)) @ v).transpose(1, 2)
    (dqkv,) = torch.autograd.grad(o, leaf, do)
    return [o, *dqkv.unbind(2)]


@pytest.mark.parametrize("N, D, dtype", [(17, 32, torch.float16), (65, 32, torch.float16), (100, 32, torch.float16),
                                         (130, 32, torch.float16), (65, 80, torch.bfloat16),
                                         (33, 40, torch.float16)])
def test_dropout_matches_reference_with_the_kernels_mask(monkeypatch, N, D, dtype):
    """With dropout_p > 0 the forward and the backward drop the same weights, those of
    `dropout_keep_mask` for the seed, in both kernel families, within the FA2 rule: key tail
    tiles (17, 65, 130), the short forward's second tail (100 = 64 + 32 + 16), a split head
    dim in bf16 (80 = 64 + 16, two column chunks) and a padded one (40, in a 64-column tile);
    at 17 and 65 also the short kernels' one-key-tail twins, whose key past the tile draws
    its mask alone (`_keep_one`) from the Philox numbers of its group of eight keys."""
    B, H, p = 2, 2, 0.3
    qkv, do = _packed_inputs(B, N, H, D, dtype, seed=N)
    seed = torch.tensor([1234 + N], dtype=torch.int64, device=DEVICE)
    mask = flash_mod.dropout_keep_mask(seed, B, H, N, p)
    assert abs(mask.float().mean().item() - (1 - p)) < 0.05
    ref = _dropout_reference(qkv.double(), do.double(), mask, p)
    low = _dropout_reference(qkv, do, mask, p)
    general = (launch.Candidate("general", (("BLOCK_M", 32), ("BLOCK_N", 16))),
               launch.Candidate("general", (("BLOCK_M1", 16), ("BLOCK_N1", 32), ("BLOCK_M2", 32), ("BLOCK_N2", 16))))
    atomic = (general[0], launch.Candidate("atomic", (("BLOCK_M", 16), ("BLOCK_N", 32))))
    short = [(launch.short_fwd(N, 16, heads=2, stages=2), launch.short_bwd(N, 16))]
    if launch.one_key_tail(N):  # 17 = 16 + 1, 65 = 64 + 1: the key past the tile as vectors
        short.append((launch.short_fwd(N, 32, heads=2, stages=2, one_key=True),
                      launch.short_bwd(N, 16, one_key=True)))
    for fwd, bwd in (general, atomic, *short):
        _force(monkeypatch, fwd, bwd)
        o, lse = flash_mod._forward(qkv.contiguous(), D ** -0.5, p, seed)
        dqkv = flash_mod._backward(do, qkv.contiguous(), o, lse, D ** -0.5, p, seed)
        for name, r, lo, g in zip(("o", "dq", "dk", "dv"), ref, low, [o, *dqkv.unbind(2)]):
            err = (g.double() - r).abs().max().item()
            naive_err = (lo.double() - r).abs().max().item()
            assert err <= 2 * naive_err + ABS_FLOOR, f"{fwd.family}/{bwd.family} {name}: {err:.3g} > 2 x {naive_err:.3g}"


@pytest.mark.parametrize("N, D, dtype", [(2, 32, torch.float16), (17, 32, torch.float16), (65, 64, torch.bfloat16),
                                         (100, 32, torch.float16), (130, 80, torch.float16)])
def test_mask_diagonal_in_every_kernel_family(monkeypatch, N, D, dtype):
    """mask_diagonal=True (locality self-attention: no query attends to its own key) in every
    kernel family against naive attention with the same mask, under the FA2 rule: the general
    forward and backward (the diagonal crossing full and tail key tiles), the atomic backward,
    the short kernels with and without their pipelined heads, their one-key-tail twins where
    N = 2^k + 1 (17, 65: the last query's own key is the one key), a second key tail (100) and
    a split head dim (80); and with dropout on top (N > 2), against the kernels' own dropout
    mask."""
    B, H = 2, 2
    qkv, do = _packed_inputs(B, N, H, D, dtype, seed=7 * N + D)
    general = (launch.Candidate("general", (("BLOCK_M", 32), ("BLOCK_N", 16))),
               launch.Candidate("general", (("BLOCK_M1", 16), ("BLOCK_N1", 32), ("BLOCK_M2", 32), ("BLOCK_N2", 16))))
    pairs = [general, (general[0], launch.Candidate("atomic", (("BLOCK_M", 16), ("BLOCK_N", 32)))),
             (launch.short_fwd(N, 16), launch.short_bwd(N, 16)),
             (launch.short_fwd(N, 32, heads=2, stages=2), launch.short_bwd(N, 32))]
    if launch.one_key_tail(N):
        pairs.append((launch.short_fwd(N, 16, heads=2, stages=2, one_key=True), launch.short_bwd(N, 16, one_key=True)))
    for fwd, bwd in pairs:
        _force(monkeypatch, fwd, bwd)
        try:
            _assert_within_rule(qkv, do, mask_diagonal=True)
        except Exception as err:
            raise AssertionError(f"forward {fwd} / backward {bwd}: {err}") from err
    # it does change the result: without the mask the output differs by far more than the rule
    o_masked = flash_attention(*qkv.unbind(2), mask_diagonal=True)
    assert (o_masked.float() - flash_attention(*qkv.unbind(2)).float()).abs().max() > 0.05

    if N == 2:  # one key left per query: dQ is exactly 0, so the rule's yardstick is 0 too
        return
    p = 0.25
    seed = torch.tensor([99 + N], dtype=torch.int64, device=DEVICE)
    keep = flash_mod.dropout_keep_mask(seed, B, H, N, p)
    ref = _dropout_reference(qkv.double(), do.double(), keep, p, mask_diagonal=True)
    low = _dropout_reference(qkv, do, keep, p, mask_diagonal=True)
    for fwd, bwd in pairs[::2] + pairs[-1:]:
        _force(monkeypatch, fwd, bwd)
        o, lse = flash_mod._forward(qkv.contiguous(), D ** -0.5, p, seed, True)
        dqkv = flash_mod._backward(do, qkv.contiguous(), o, lse, D ** -0.5, p, seed, True, True)
        for name, r, lo, g in zip(("o", "dq", "dk", "dv"), ref, low, [o, *dqkv.unbind(2)]):
            err = (g.double() - r).abs().max().item()
            naive_err = (lo.double() - r).abs().max().item()
            assert err <= 2 * naive_err + ABS_FLOOR, f"{fwd} / {bwd} {name}: {err:.3g} > 2 x {naive_err:.3g}"


def test_mask_diagonal_on_every_path_and_its_errors():
    """The three paths of the dispatch agree with the mask (fp32 for naive and SDPA, whose
    boolean attn_mask carries it), and bad values are refused by name on each."""
    torch.manual_seed(0)
    qkv = torch.randn(2, 9, 3, 2, 16, device=DEVICE)
    q, k, v = qkv.unbind(2)
    naive, sdpa = naive_attention(q, k, v, mask_diagonal=True), sdpa_attention(q, k, v, mask_diagonal=True)
    assert torch.allclose(naive, sdpa, atol=1e-5)
    # by hand for one query: the softmax over the other keys
    s = (q[0, 3, 1] @ k[0, :, 1].T) / 4
    w = torch.softmax(torch.cat([s[:3], s[4:]]), 0)
    assert torch.allclose(naive[0, 3, 1], w @ torch.cat([v[0, :3, 1], v[0, 4:, 1]]), atol=1e-5)
    flash = attention_qkvpacked(qkv.half(), "flash", mask_diagonal=True)
    assert (flash.float() - naive).abs().max() < 1e-2
    for impl in ("flash", "naive", "sdpa"):
        x = qkv.half() if impl == "flash" else qkv
        with pytest.raises(ValueError, match="mask_diagonal=True needs N >= 2 tokens"):
            attention_qkvpacked(x[:, :1], impl, mask_diagonal=True)
        with pytest.raises(TypeError, match="mask_diagonal=1 is not True or False"):
            attention_qkvpacked(x, impl, mask_diagonal=1)


def test_dropout_masks_per_seed_head_and_call():
    """The mask is a function of the seed alone, differs between heads and seeds; the op
    draws a new seed per call from torch's generator (torch.manual_seed repeats it)."""
    B, H, N, D = 2, 2, 33, 32
    one = torch.tensor([5], dtype=torch.int64, device=DEVICE)
    mask = flash_mod.dropout_keep_mask(one, B, H, N, 0.5)
    assert torch.equal(mask, flash_mod.dropout_keep_mask(one.clone(), B, H, N, 0.5))
    assert not torch.equal(mask, flash_mod.dropout_keep_mask(one + 1, B, H, N, 0.5))
    assert not torch.equal(mask[0, 0], mask[0, 1]) and not torch.equal(mask[0, 0], mask[1, 0])
    qkv, _ = _packed_inputs(B, N, H, D, torch.float16)
    torch.manual_seed(3)
    first = flash_attention_qkvpacked(qkv, dropout_p=0.2)
    second = flash_attention_qkvpacked(qkv, dropout_p=0.2)
    torch.manual_seed(3)
    assert torch.equal(first, flash_attention_qkvpacked(qkv, dropout_p=0.2)) and not torch.equal(first, second)
    # dropout_p=0 is the plain op
    assert torch.equal(flash_attention_qkvpacked(qkv, dropout_p=0.0), flash_attention_qkvpacked(qkv))


def test_dropout_mask_has_no_pattern_across_keys_or_rows():
    """Eight keys share one Philox call, a 16-bit half of its numbers each: each half, and
    neighbouring keys, must still look independent. For p = 0.5: each key position mod 8
    kept half the time, and two neighbouring keys (within and across a call's eight) equal
    half the time; no two rows alike. For p = 0.1 the keep rate is 0.9."""
    B, H, N, p = 1, 4, 256, 0.5
    mask = flash_mod.dropout_keep_mask(torch.tensor([99], dtype=torch.int64, device=DEVICE), B, H, N, p).float()
    for lane in range(8):
        assert abs(mask[..., lane::8].mean().item() - 0.5) < 0.02, lane
    same = (mask[..., 1:] == mask[..., :-1]).float()
    for lane in range(8):  # key 8c + lane against key 8c + lane + 1 (lane 7: the next call's first)
        assert abs(same[..., lane::8].mean().item() - 0.5) < 0.02, lane
    assert abs((mask[..., 1:, :] == mask[..., :-1, :]).float().mean().item() - 0.5) < 0.02  # neighbouring rows
    rows = mask.reshape(-1, N)
    assert torch.unique(rows, dim=0).shape[0] == rows.shape[0]
    kept = flash_mod.dropout_keep_mask(torch.tensor([7], dtype=torch.int64, device=DEVICE), B, H, N, 0.1).float()
    assert abs(kept.mean().item() - 0.9) < 0.005


@triton.jit
def _keep_one_against_tile(SEED, ONE, TILE, N, drop_p, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    """Each key of a BLOCK-key tile from k = 8 on through kernels._keep_one (ONE) and the
    tile through kernels._keep (TILE), (ROWS, BLOCK) uint8 each."""
    seed = tl.load(SEED)
    rows = tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    tile = kernels._keep(seed, 3, rows, 8, N, drop_p, BLOCK, False)
    tl.store(TILE + rows[:, None] * BLOCK + cols[None, :], tile.to(tl.uint8))
    for j in tl.static_range(BLOCK):
        one = kernels._keep_one(seed, 3, rows, 8 + j, N, drop_p)
        tl.store(ONE + rows * BLOCK + j, one.to(tl.uint8))


def test_keep_one_draws_each_key_as_the_tile_does():
    """The one-key-tail kernels decide their single key by _keep_one: for every place of a
    group of eight (not only the first, where those kernels' keys fall) it must give the
    mask _keep gives that key inside a tile, or the forward and the backward of different
    kernel families would drop different weights."""
    rows, block, n = 4, 16, 40
    seed = torch.tensor([2024], dtype=torch.int64, device=DEVICE)
    one = torch.empty(rows, block, dtype=torch.uint8, device=DEVICE)
    tile = torch.empty_like(one)
    _keep_one_against_tile[(1,)](seed, one, tile, n, 0.5, ROWS=rows, BLOCK=block)
    assert torch.equal(one, tile) and 0 < tile.float().mean().item() < 1


@pytest.mark.parametrize("impl", ["flash", "naive", "sdpa"])
@pytest.mark.parametrize("p, error", [(1.0, ValueError), (-0.1, ValueError), ("0.1", TypeError), (True, TypeError)])
def test_rejects_bad_dropout_p(impl, p, error):
    qkv, _ = _packed_inputs(1, 8, 2, 32, torch.float16 if impl == "flash" else torch.float32)
    with pytest.raises(error, match="dropout_p="):
        attention_qkvpacked(qkv, impl, dropout_p=p)


def test_reference_paths_drop_attention_weights():
    """naive and sdpa: dropout_p > 0 changes the output, repeatably under one torch seed."""
    qkv, _ = _packed_inputs(2, 16, 2, 32, torch.float32)
    for impl in ("naive", "sdpa"):
        plain = attention_qkvpacked(qkv, impl)
        torch.manual_seed(0)
        dropped = attention_qkvpacked(qkv, impl, dropout_p=0.5)
        torch.manual_seed(0)
        assert torch.equal(dropped, attention_qkvpacked(qkv, impl, dropout_p=0.5))
        assert not torch.allclose(dropped, plain), impl


def test_compiled_op_matches_eager_with_and_without_dropout():
    """torch.compile traces the op whole (fullgraph: no graph break), the dropout seed drawn
    inside the graph from torch's generator: under one torch seed the compiled function
    gives eager's loss and gradient. aot_eager runs the traced graphs without code
    generation, so this runs on any machine."""
    qkv, _ = _packed_inputs(1, 17, 2, 32, torch.float16)
    qkv.requires_grad_()

    def loss(x, p):
        return flash_attention_qkvpacked(x, dropout_p=p).float().square().sum()

    for p in (0.0, 0.3):
        torch._dynamo.reset()
        compiled = torch.compile(loss, backend="aot_eager", fullgraph=True)
        torch.manual_seed(1)
        got = compiled(qkv, p)
        (got_grad,) = torch.autograd.grad(got, qkv)
        torch.manual_seed(1)
        want = loss(qkv, p)
        (want_grad,) = torch.autograd.grad(want, qkv)
        assert torch.equal(got, want) and torch.equal(got_grad, want_grad), p
    torch._dynamo.reset()


# ---------------------------------------------------------------------------------------
# GPU only: torch.compile sees one op
# ---------------------------------------------------------------------------------------
@pytest.mark.gpu
def test_compiles_without_graph_break():
    class TinyAttention(torch.nn.Module):
        def __init__(self, dim=128, heads=2):
            super().__init__()
            self.heads = heads
            self.qkv = torch.nn.Linear(dim, 3 * dim)
            self.proj = torch.nn.Linear(dim, dim)

        def forward(self, x):
            B, N, C = x.shape
            qkv = self.qkv(x).view(B, N, 3, self.heads, C // self.heads)  # (B, N, 3, H, D)
            return self.proj(flash_attention_qkvpacked(qkv).reshape(B, N, C))

    torch._dynamo.reset()
    model = TinyAttention().cuda().to(torch.bfloat16)
    x = torch.randn(4, 197, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    compiled = torch.compile(model, fullgraph=True)  # fullgraph: a graph break is an error
    out = compiled(x)
    eager = model(x)
    torch.testing.assert_close(out, eager, atol=2e-2, rtol=2e-2)
    (grad,) = torch.autograd.grad(out.float().sum(), x)
    (eager_grad,) = torch.autograd.grad(eager.float().sum(), x)
    torch.testing.assert_close(grad, eager_grad, atol=2e-2, rtol=2e-2)


@pytest.mark.gpu
def test_cuda_graphs_capture_the_flash_path():
    """torch.compile(mode="reduce-overhead"): the flash op is captured into CUDA graphs (no
    cudagraph skip, no recompile across steps) and gives eager's output and gradients."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    layer = torch.nn.Linear(192, 3 * 192).cuda().to(torch.bfloat16)

    def step(x):
        qkv = layer(x).view(x.shape[0], x.shape[1], 3, 3, 64)  # (B, N, 3, H, D)
        return flash_attention_qkvpacked(qkv).float().square().mean()

    compiled = torch.compile(step, mode="reduce-overhead", fullgraph=True)
    for i in range(4):
        x = torch.randn(32, 65, 192, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        torch.compiler.cudagraph_mark_step_begin()
        loss = compiled(x)
        (grad,) = torch.autograd.grad(loss, x)
        eager_loss = step(x)
        (eager_grad,) = torch.autograd.grad(eager_loss, x)
        torch.testing.assert_close(loss, eager_loss, atol=1e-3, rtol=1e-2)
        torch.testing.assert_close(grad, eager_grad, atol=1e-3, rtol=2e-2)
    assert counters["inductor"]["cudagraph_skips"] == 0
    assert counters["stats"]["unique_graphs"] == 1


@pytest.mark.gpu
def test_dropout_under_a_cuda_graph_draws_a_new_mask_per_replay():
    """The seed is drawn on the device inside the graph: each replay drops other weights."""
    qkv, _ = _packed_inputs(4, 65, 3, 64, torch.bfloat16)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # tuning and compiling before the capture
        flash_attention_qkvpacked(qkv, dropout_p=0.3)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = flash_attention_qkvpacked(qkv, dropout_p=0.3)
    graph.replay()
    first = out.clone()
    graph.replay()
    assert torch.isfinite(first).all() and not torch.equal(first, out)


@pytest.mark.gpu
def test_the_tuner_times_its_finalists_in_cuda_graphs_gpu(monkeypatch, tmp_path):
    """On a GPU, at a key seen first: the tuner's finalists (here every candidate within any
    margin, at most three) are captured and replayed in CUDA graphs, their times are GPU
    times of the same order as the short windows', the kept candidate is the fastest of
    them, the captures leave the random generator where it was, and the op's results keep
    to the FA2 rule."""
    monkeypatch.setenv("VITFLASH_CACHE_DIR", str(tmp_path))
    for name, value in (("_disk", None), ("_chosen", {}), ("_timings", {}), ("_graph_timings", {}),
                        ("FINAL_MARGIN", float("inf")), ("FINALISTS", 3)):
        monkeypatch.setattr(launch, name, value)
    monkeypatch.setattr(flash_mod, "_plans", {})
    B, N, H, D = 4, 577, 4, 64
    qkv, do = _packed_inputs(B, N, H, D, torch.bfloat16, seed=5)
    torch.manual_seed(11)
    before = torch.cuda.get_rng_state()
    flash_attention_qkvpacked(qkv.clone().requires_grad_()).backward(do)
    torch.cuda.synchronize()
    assert torch.equal(torch.cuda.get_rng_state(), before)
    for op in ("fwd", "bwd"):
        window = launch.tuning_times(op, torch.bfloat16, N, D, B * H)
        graph = launch.final_times(op, torch.bfloat16, N, D, B * H)
        assert graph is not None and len(graph) == min(3, len(window)) >= 2, op
        assert sorted(graph, key=window.__getitem__) == sorted(window, key=window.__getitem__)[:len(graph)]
        for cand, ms in graph.items():
            assert 0.2 < ms / window[cand] < 5, (op, cand, ms, window[cand])
        assert launch.chosen(op, torch.bfloat16, N, D, B * H) == min(graph, key=graph.__getitem__)
    _assert_within_rule(qkv, do)


def test_tuning_choices_survive_the_process(monkeypatch, tmp_path):
    """What the autotuner chose is written to $VITFLASH_CACHE_DIR/autotune.json (atomically,
    merged with what is there) and read back as the same candidate by a fresh reader."""
    monkeypatch.setenv("VITFLASH_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(launch, "_disk", None)
    chosen = {"a": launch.short_fwd(65, 32, 8, heads=4, stages=2),
              "b": launch.heuristic("bwd", 197, 64)}
    for entry, cand in chosen.items():
        launch._write_disk(entry, cand)
    monkeypatch.setattr(launch, "_disk", None)  # a new process: nothing in memory
    saved = launch._read_disk()
    assert {e: launch.Candidate.from_json(d) for e, d in saved.items()} == chosen
    # no temp file left; the (empty) lock file of the writes stays, as flock's do
    assert sorted(p.name for p in tmp_path.iterdir()) == ["autotune.json", "autotune.json.lock"]


def _fake_tuning(monkeypatch, tmp_path, n: int = 577):
    """launch.choose off the interpreter, with a fake GPU: the first three forward candidates
    at (n, 64), the third the fastest. Returns them, their milliseconds, the list that `run`
    appends each launched candidate to, and the choose() arguments."""
    monkeypatch.setenv("VITFLASH_CACHE_DIR", str(tmp_path))
    for name, value in (("_disk", None), ("INTERPRET", False), ("_chosen", {}), ("_timings", {})):
        monkeypatch.setattr(launch, name, value)
    monkeypatch.setattr(launch, "_disk_key", lambda key, device: "|".join(map(str, key)))
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    cands = launch.candidates("fwd", n, 64)[:3]
    monkeypatch.setattr(launch, "candidates", lambda *a: cands)
    ms = {c: 3.0 - i for i, c in enumerate(cands)}
    ran = []
    monkeypatch.setattr(launch, "_time_ms", lambda fn: (fn(), ms[ran[-1]])[1])
    return cands, ms, ran, ("fwd", torch.float16, n, 64, 24)


@pytest.mark.parametrize("content", ["[1, 2]", "null", '{"KEY": "short"}', '{"KEY": {"family": "short"}}',
                                     '{"KEY": {"family": "short", "blocks": [1], "num_warps": 4, "num_stages": 1}}',
                                     '{"KEY": {"family": "short", "blocks": {"BLOCK_Q": 32}, "num_warps": 4, '
                                     '"num_stages": 1}}'],
                         ids=["a list", "null", "an entry of a string", "an entry without blocks",
                              "blocks not a mapping", "unknown blocks"])
def test_a_damaged_tuning_cache_is_tuned_over(monkeypatch, tmp_path, content):
    """A cache file whose JSON is not an object, or whose entry for the key names no listed
    candidate, is tuned over (with a warning naming the file where an entry was unusable),
    and the file is written again, whole: no flash call fails on it."""
    cands, _, ran, key = _fake_tuning(monkeypatch, tmp_path)
    entry = "|".join(map(str, launch._key(*key)))
    (tmp_path / "autotune.json").write_text(content.replace("KEY", entry))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert launch.choose(*key, torch.device("cpu"), ran.append) == cands[2]
    assert len(ran) > 0  # timed
    named = [str(w.message) for w in caught if "tuning cache" in str(w.message)]
    assert bool(named) == content.startswith("{") and all(str(tmp_path / "autotune.json") in m for m in named)
    saved = json.loads((tmp_path / "autotune.json").read_text())
    assert launch.Candidate.from_json(saved[entry]) == cands[2]


def test_processes_writing_the_tuning_cache_at_once_keep_every_entry(tmp_path):
    """Two processes each writing 40 choices into one cache file at the same time: all 80
    are there at the end (the read-merge-replace runs under a lock)."""
    code = ("import sys; from vitflash.ops import launch\n"
            "c = launch.heuristic('fwd', 197, 64)\n"
            "for i in range(40): launch._write_disk(f'{sys.argv[1]}{i}', c)\n")
    env = {**os.environ, "VITFLASH_CACHE_DIR": str(tmp_path)}
    procs = [subprocess.Popen([sys.executable, "-c", code, name], env=env) for name in "AB"]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    saved = json.loads((tmp_path / "autotune.json").read_text())
    assert sorted(saved) == sorted(f"{name}{i}" for name in "AB" for i in range(40))


def test_an_unwritable_tuning_cache_is_said_once(monkeypatch, tmp_path):
    (tmp_path / "a_file").write_text("")
    monkeypatch.setenv("VITFLASH_CACHE_DIR", str(tmp_path / "a_file" / "cache"))
    monkeypatch.setattr(launch, "_disk", None)
    monkeypatch.setattr(launch, "_unwritable", set())
    cand = launch.heuristic("fwd", 197, 64)
    with pytest.warns(UserWarning, match=r"cannot write the tuning cache .*a_file/cache/autotune.json .*"
                                         r"set VITFLASH_CACHE_DIR to a writable folder"):
        launch._write_disk("x", cand)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        launch._write_disk("y", cand)  # said once
    assert launch._read_disk() == {"x": cand.to_json(), "y": cand.to_json()}  # kept for this process


def test_tuner_times_are_kept_for_benchmarks(monkeypatch, tmp_path):
    """A key the tuner times keeps each candidate's milliseconds (`tuning_times`, which
    bench_attention.py writes beside its own timings); a key whose choice a later process
    reads from the cache file has none, and nothing is timed there."""
    cands, ms, ran, key = _fake_tuning(monkeypatch, tmp_path)
    assert launch.choose(*key, torch.device("cpu"), ran.append) == cands[2]
    assert launch.tuning_times(*key) == ms
    for name, value in (("_disk", None), ("_chosen", {}), ("_timings", {})):  # a new process
        monkeypatch.setattr(launch, name, value)
    assert launch.choose(*key, torch.device("cpu"), lambda c: pytest.fail("timed")) == cands[2]
    assert launch.tuning_times(*key) is None


def test_dropout_is_tuned_apart(monkeypatch, tmp_path):
    """Attention dropout is part of the tuning key: its mask work moves the best candidate
    (on an H200, at three of four N = 65 shapes, a pipelined TMA forward without it, the
    pointer-load one with it), so a shape met with dropout is timed anew, not given the choice made without, and
    each is cached under its own entry."""
    monkeypatch.setenv("VITFLASH_CACHE_DIR", str(tmp_path))
    for name, value in (("_disk", None), ("INTERPRET", False), ("_chosen", {}), ("_timings", {})):
        monkeypatch.setattr(launch, name, value)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "GPU")
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    cands = launch.candidates("fwd", 65, 64)[:2]
    monkeypatch.setattr(launch, "candidates", lambda *a: cands)
    ran, fastest = [], {False: cands[0], True: cands[1]}
    mode = {"dropout": False}
    monkeypatch.setattr(launch, "_time_ms",
                        lambda fn: (fn(), 1.0 if ran[-1] == fastest[mode["dropout"]] else 2.0)[1])
    key = ("fwd", torch.bfloat16, 65, 64, 768)
    assert launch.choose(*key, torch.device("cpu"), ran.append) == cands[0]
    mode["dropout"] = True
    assert launch.choose(*key, torch.device("cpu"), ran.append, dropout=True) == cands[1]
    assert launch.chosen(*key) == cands[0] and launch.chosen(*key, dropout=True) == cands[1]
    entries = sorted(launch._read_disk())
    assert len(entries) == 2 and entries[1] == entries[0] + "|dropout"


def test_results_that_disagree_by_more_than_rounding_are_measured_as_such():
    ref = (torch.linspace(-3, 3, 4 * 65 * 16).view(4, 65, 16).to(torch.bfloat16),)
    ulp = torch.finfo(torch.bfloat16).eps * 3  # a unit in the last place of the largest value
    assert launch._disagreement(ref, ref) == 0
    assert launch._disagreement((ref[0] + 2 * ulp,), ref) <= 1  # rounding: well inside
    broken = ref[0].clone()
    broken[3, 64] += 1.0  # one value of the last batch entry off by 1 (the bound: 16 ulps, 0.375)
    assert launch._disagreement((broken,), ref) > 2
    broken[3, 64] = float("nan")
    assert launch._disagreement((broken,), ref) == float("inf")


def _tuning_on_the_cpu(monkeypatch, tmp_path, op, cands, ms):
    """Let the tuner run here, with `cands` as op's candidates (the other op: two of its
    own): the kernels in the interpreter, times made up (ms: per candidate), nothing read
    from or kept beyond tmp_path."""
    monkeypatch.setenv("VITFLASH_CACHE_DIR", str(tmp_path))
    # INTERPRET off in launch.py makes choose() tune (the kernels still run in the
    # interpreter); the inputs' device check, which reads it too, is left out
    for name, value in (("_disk", None), ("INTERPRET", False), ("_chosen", {}), ("_timings", {}),
                        ("_graph_timings", {}), ("COMPILE_THREADS", 1), ("_TMA_LOADS", False),
                        ("_TMA", False)):
        monkeypatch.setattr(launch, name, value)
    # finalists (candidates within FINAL_MARGIN) keep the order of their made-up times
    monkeypatch.setattr(launch, "_graph_times", lambda cands, window_ms, run: dict(window_ms))
    monkeypatch.setattr(flash_mod, "_plans", {})
    monkeypatch.setattr(flash_mod, "_check_tensor", lambda *a, **k: None)
    monkeypatch.setattr(launch, "_disk_key", lambda key, device: "|".join(map(str, key)))
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    real_candidates = launch.candidates
    monkeypatch.setattr(launch, "candidates", lambda o, *a: cands if o == op else real_candidates(o, *a)[:2])
    ran = []
    monkeypatch.setattr(launch, "_time_ms", lambda fn: (fn(), ms.get(ran[-1] if ran else None, 5.0))[1])
    return ran


def _break(monkeypatch, op, broken, ran):
    """Make candidate `broken` of op compute a negated result (o; dqkv), as a kernel that a
    compiler got wrong could; record in `ran` the candidate whose launches ran last."""
    name = "_fwd_launches" if op == "fwd" else "_bwd_launches"
    real, out = getattr(flash_mod, name), 1 if op == "fwd" else 4  # o; dqkv (short backward)

    class Recorded:
        def __init__(self, launch, cand):
            self.kernel, self.consts, self.launch, self.cand = launch.kernel, launch.consts, launch, cand

        def __call__(self, *args):
            ran.append(self.cand)
            self.launch(*args)
            if self.cand == broken:
                args[out].neg_()

    def launches(c, *a):
        return [Recorded(x, c) for x in real(c, *a)]

    monkeypatch.setattr(flash_mod, name, launches)


@pytest.mark.parametrize("op", ["fwd", "bwd"])
def test_the_tuner_leaves_out_a_candidate_that_computes_wrongly(monkeypatch, tmp_path, op):
    """A candidate whose result disagrees with the heuristic candidate's (as the 64-row
    8-warp short forward did on an H200) is never chosen, however fast it times; the tuner
    warns and names it, and the op's results keep to the rule."""
    N, D = 17, 32
    make = launch.short_fwd if op == "fwd" else launch.short_bwd
    cands = [make(N, 16), make(N, 32), launch.heuristic(op, N, D)]
    broken = cands[0]
    ran = _tuning_on_the_cpu(monkeypatch, tmp_path, op, cands, {broken: 0.5, cands[1]: 1.0, cands[2]: 2.0})
    _break(monkeypatch, op, broken, ran)
    qkv, do = _packed_inputs(1, N, 2, D, torch.float16, seed=3)
    with pytest.warns(UserWarning, match=r"BLOCK_M', 16\).*left out of the tuning"):
        _assert_within_rule(qkv, do)
    assert launch.chosen(op, torch.float16, N, D, 2) == cands[1]  # the fastest that agrees
    assert broken not in launch.tuning_times(op, torch.float16, N, D, 2)


def test_the_tuner_makes_each_candidates_launches_once(monkeypatch, tmp_path):
    """While a new shape is tuned, each candidate's launches are made once and called again
    for the check and every timing (so that after its first call each one calls its compiled
    kernel directly); the chosen candidate's own launches become the shape's plan."""
    N, D = 17, 32
    cands = [launch.short_fwd(N, 16), launch.short_fwd(N, 32), launch.heuristic("fwd", N, D)]
    _tuning_on_the_cpu(monkeypatch, tmp_path, "fwd", cands, {})
    real, made = flash_mod._fwd_launches, []

    def counted(c, *a):
        made.append((c, real(c, *a)))
        return made[-1][1]

    monkeypatch.setattr(flash_mod, "_fwd_launches", counted)
    windows = []
    monkeypatch.setattr(launch, "_time_ms", lambda fn: (windows.append(fn), fn(), fn(), 5.0)[-1])
    qkv, _ = _packed_inputs(1, N, 2, D, torch.float16, seed=3)
    with torch.no_grad():
        flash_attention_qkvpacked(qkv)
    assert len(windows) >= len(cands)  # each candidate timed, two calls a window
    assert sorted(map(str, (c for c, _ in made))) == sorted(map(str, cands))  # made once each
    chosen = launch.chosen("fwd", torch.float16, N, D, 2)
    plan = next(p for k, p in flash_mod._plans.items() if k[0] == "fwd")
    assert plan is dict(made)[chosen]


def test_the_tuner_stops_when_most_candidates_disagree(monkeypatch, tmp_path):
    N, D = 17, 32
    cands = [launch.short_fwd(N, 16), launch.short_fwd(N, 32), launch.heuristic("fwd", N, D)]
    ran = _tuning_on_the_cpu(monkeypatch, tmp_path, "fwd", cands, {})
    _break(monkeypatch, "fwd", cands[2], ran)  # the reference itself: all others disagree
    qkv, _ = _packed_inputs(1, N, 2, D, torch.float16, seed=3)
    with pytest.warns(UserWarning), pytest.raises(RuntimeError, match="2 of 3 configurations "
                                                  "disagree.*use the 'sdpa' or 'naive' attention path"):
        flash_attention_qkvpacked(qkv)


@pytest.mark.parametrize("host_us, cycles", [(5, launch.SLEEP_CYCLES), (80, 3_200_000),
                                             (5_000, launch.SLEEP_MAX)])
def test_tuner_sleep_outlasts_the_host(monkeypatch, host_us, cycles):
    """Each timing window starts behind a sleeping kernel long enough for the host to
    enqueue the window's calls (twice one call's host time, measured after the warm-up),
    so a candidate with a costlier launch (a TMA twin's descriptors) is timed on its GPU
    time, not on the host's: half a millisecond at least, 20 ms at most."""
    clock = iter([0.0, host_us * 1e-6])
    monkeypatch.setattr(launch.time, "perf_counter", lambda: next(clock))
    slept, calls = [], []

    class Event:
        def __init__(self, enable_timing):
            self.at = None

        def record(self):
            self.at = len(calls)

        def synchronize(self):
            pass

        def elapsed_time(self, end):
            return 0.25 * (end.at - self.at)  # 0.25 ms a call

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "_sleep", slept.append, raising=False)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    assert launch._time_ms(lambda: calls.append(1), calls=10, repeats=3) == 0.25
    assert slept == [cycles] * 3 and len(calls) == 2 + 10 * 3


def test_launch_orders_constexprs_as_the_kernel_does():
    """The direct launch passes constexprs by position: a Launch orders them as the kernel's
    signature, whatever order a candidate (or a cache file) lists its blocks in."""
    cand = launch.Candidate("general", (("BLOCK_M2", 64), ("BLOCK_N1", 32), ("BLOCK_M1", 16),
                                        ("BLOCK_N2", 16)))
    (_, main) = flash_mod._bwd_launches(cand, B=2, N=65, H=3, D=64)
    names = flash_mod.kernels.bwd_kernel.arg_names
    assert list(main.consts) == names[len(names) - len(main.consts):]


def test_tuning_compiles_all_then_keeps_each_candidates_best_round(monkeypatch):
    """The tuner compiles every candidate (skipping one that does not fit the chip) before it
    times any, then times them in rounds and keeps each one's best: a candidate that had one
    slow window is not lost for it."""
    cands = [launch.short_fwd(65, m) for m in (16, 32, 64)] + [launch.heuristic("fwd", 577, 64)]
    too_big, slow_once, steady = cands[0], cands[1], cands[2]
    windows = {slow_once: iter([9.0, 1.0]), steady: iter([2.0, 2.0]), cands[3]: iter([3.0, 3.0])}
    events = []

    def run(cand):
        if cand is too_big:
            raise triton.runtime.errors.OutOfResources(1, 0, "shared memory")
        if not launch._compiling.only:  # (a compile alone launches nothing)
            events.append(("run", cand))

    def time_ms(fn):  # one window: its calls are logged as a "time" event
        at = len(events)
        fn()
        cand = events[at][1]
        events[at:] = [("time", cand)]
        return next(windows[cand])

    monkeypatch.setattr(launch, "_time_ms", time_ms)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    times = {}
    assert launch._time_candidates(cands, run, times) is slow_once
    assert times == {slow_once: 1.0, steady: 2.0, cands[3]: 3.0}  # each one's better round
    first_time = next(i for i, e in enumerate(events) if e[0] == "time")
    assert [c for _, c in events[:first_time]] == cands[1:]  # all run first
    assert [c for kind, c in events if kind == "time"] == [slow_once, steady, cands[3]] * launch.TIMING_ROUNDS
    with pytest.raises(RuntimeError, match="no flash-attention configuration compiles"):
        launch._time_candidates([too_big], run)


def test_the_tuner_keeps_the_fastest_finalist_in_graph_replays(monkeypatch):
    """The candidates within FINAL_MARGIN of the fastest in the short windows, at most
    FINALISTS of them, are timed again in CUDA-graph replays, and the fastest there is kept
    (the short windows ranked the D = 128 forwards otherwise than a busy GPU); with one
    finalist nothing is replayed, and where a capture fails the windows' choice stands."""
    cands = [launch.short_fwd(65, m, w) for m in (16, 32, 64) for w in (2, 4)]
    window = dict(zip(cands, [1.00, 1.02, 1.05, 1.08, 1.09, 1.30]))  # 1.09: the fifth within 10%
    graph = dict(zip(cands, [1.20, 1.30, 1.10, 1.15]))
    monkeypatch.setattr(launch, "FINAL_MARGIN", 0.10)
    monkeypatch.setattr(launch, "FINALISTS", 4)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    timing = []

    def time_ms(fn):
        fn()
        return window[timing[-1]]

    replayed = []

    def graph_times(finals, window_ms, run):
        replayed.append(list(finals))
        assert window_ms == {c: window[c] for c in cands}  # each one's windows sized its graph
        return None if fail else {c: graph[c] for c in finals}

    monkeypatch.setattr(launch, "_time_ms", time_ms)
    monkeypatch.setattr(launch, "_graph_times", graph_times)
    fail = False
    times, graph_ms = {}, {}
    assert launch._time_candidates(cands, timing.append, times, None, graph_ms) is cands[2]
    assert replayed == [cands[:4]]  # fastest first, the fifth within the margin left out
    assert graph_ms == {c: graph[c] for c in cands[:4]} and times == window
    fail = True
    graph_ms = {}
    assert launch._time_candidates(cands, timing.append, None, None, graph_ms) is cands[0]
    assert graph_ms == {}
    window.update({cands[1]: 1.11, cands[2]: 1.2})
    replayed.clear()
    assert launch._time_candidates(cands[:3], timing.append) is cands[0] and replayed == []


class _FakeGraphs:
    """Stand-ins for torch.cuda's streams, graphs and events on a CPU: a graph records the
    calls made during its capture; a replay runs them again and advances a clock by each
    call's made-up milliseconds (`ms_per_call`: one list a candidate, one value a replay in
    turn); an event reads the clock."""

    def __init__(self, monkeypatch, ms_per_call, fail_capture=False):
        self.clock, self.log, fake = 0.0, [], self

        class Stream:
            def wait_stream(self, other):
                pass

        class Graph:
            def capture_begin(self, capture_error_mode="global"):
                fake.log.append(("begin", capture_error_mode))
                if fail_capture:
                    raise RuntimeError("operation not permitted when stream is capturing")
                self.calls, fake.capturing = [], self

            def capture_end(self):
                fake.capturing = None

            def replay(self):
                cand = self.calls[0]
                fake.log.append(("replay", cand))
                fake.clock += len(self.calls) * fake.ms[cand].pop(0)

        class Event:
            def __init__(self, enable_timing=False):
                self.at = None

            def record(self):
                self.at = fake.clock

            def elapsed_time(self, end):
                return end.at - self.at

        self.ms, self.capturing = {c: list(v) for c, v in ms_per_call.items()}, None
        monkeypatch.setattr(torch.cuda, "Stream", Stream)
        monkeypatch.setattr(torch.cuda, "current_stream", lambda *a: Stream())
        monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
        monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
        monkeypatch.setattr(torch.cuda, "Event", Event)
        monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)

    def run(self, cand):
        """A candidate's call: recorded into the graph being captured."""
        assert self.capturing is not None, "a finalist ran outside its capture"
        self.capturing.calls.append(cand)


def test_graph_times_replay_each_finalist_in_a_block_of_its_own(monkeypatch):
    """Each finalist's graph holds about GRAPH_WINDOW_MS of its calls (by its time in the
    short windows; at least 1, at most GRAPH_MAX_CALLS), captured in thread_local mode, and
    is replayed once to warm up, then GRAPH_ROUNDS times back to back before the next
    finalist's (not in turns, which an H100 timed otherwise): a block, whose time is the
    median of its timed replays per call. GRAPH_PASSES passes over the finalists, every other
    one in reverse order, each block captured afresh; a finalist keeps its best block."""
    a, b, c = (launch.short_fwd(65, m) for m in (16, 32, 64))
    monkeypatch.setattr(launch, "GRAPH_ROUNDS", 3)
    monkeypatch.setattr(launch, "GRAPH_PASSES", 1)
    fake = _FakeGraphs(monkeypatch, {a: [9.0, 1.0, 3.0, 2.0], b: [9.0, 2.5, 2.5, 2.0],
                                     c: [9.0, 0.5, 0.7, 0.6]})  # the warm-up replay first
    got = launch._graph_times([a, b, c], {a: 2.0, b: 0.001, c: 50.0}, fake.run)
    assert got == pytest.approx({a: 2.0, b: 2.5, c: 0.6})  # the warm-up's 9.0 is not counted
    assert fake.log == [e for x in (a, b, c) for e in [("begin", "thread_local")] + [("replay", x)] * (1 + 3)]
    assert fake.ms == {a: [], b: [], c: []}
    # three passes: a b c, c b a, a b c; each finalist's best block, whichever pass it fell in
    monkeypatch.setattr(launch, "GRAPH_PASSES", 3)
    fake = _FakeGraphs(monkeypatch, {a: [9.0, 2.0, 2.0, 2.0, 9.0, 1.5, 1.5, 1.5, 9.0, 3.0, 3.0, 3.0],
                                     b: [9.0, 2.5, 2.5, 2.0, 9.0, 2.6, 2.6, 2.6, 9.0, 2.4, 2.4, 9.0],
                                     c: [9.0, 0.5, 0.7, 0.6, 9.0, 0.9, 0.9, 0.9, 9.0, 0.8, 0.8, 0.8]})
    got = launch._graph_times([a, b, c], {a: 2.0, b: 0.001, c: 50.0}, fake.run)
    assert got == pytest.approx({a: 1.5, b: 2.4, c: 0.6})
    order = [x for kind, x in fake.log if kind == "replay"][::4]  # each block's warm-up replay
    assert order == [a, b, c, c, b, a, a, b, c]
    assert [kind for kind, _ in fake.log].count("begin") == 9  # every block captured afresh
    assert fake.ms == {a: [], b: [], c: []}
    # the graphs' sizes: 20 ms / 2 ms = 10 calls; capped at GRAPH_MAX_CALLS; at least one
    monkeypatch.setattr(launch, "GRAPH_PASSES", 1)
    sizes = {}
    fake = _FakeGraphs(monkeypatch, {x: [1.0] * 4 for x in (a, b, c)})
    real = torch.cuda.CUDAGraph.replay

    def replay(graph):
        sizes[graph.calls[0]] = len(graph.calls)
        real(graph)

    monkeypatch.setattr(torch.cuda.CUDAGraph, "replay", replay)
    launch._graph_times([a, b, c], {a: 2.0, b: 0.001, c: 50.0}, fake.run)
    assert sizes == {a: round(launch.GRAPH_WINDOW_MS / 2.0), b: launch.GRAPH_MAX_CALLS, c: 1}


def test_graph_times_warn_and_step_aside_when_a_capture_fails(monkeypatch):
    """A finalist whose launch cannot be captured leaves the choice to the short windows,
    with a warning that says so; the tuning goes on."""
    a, b = launch.short_fwd(65, 16), launch.short_fwd(65, 32)
    fake = _FakeGraphs(monkeypatch, {a: [1.0], b: [1.0]}, fail_capture=True)
    recovered = []
    monkeypatch.setattr(launch, "recover_from_failed_capture", lambda *a: recovered.append(a))
    with pytest.warns(UserWarning, match=r"finalists in CUDA graphs failed \(RuntimeError: "
                                         r"operation not permitted.*left to its short windows"):
        assert launch._graph_times([a, b], {a: 1.0, b: 1.0}, fake.run) is None
    assert recovered == [()]  # the random generator taken out of capture mode, once


@pytest.mark.gpu
def test_a_failed_finalist_capture_leaves_the_random_generator_usable_gpu():
    """On a GPU, a finalist whose calls cannot be captured (here one that reads a device value
    on the host) leaves the choice to the short windows, and random draws on the device go on
    from where they were: a failed capture would otherwise leave the generator in capture mode."""
    x = torch.ones(4, device="cuda")
    a, b = launch.short_fwd(65, 16), launch.short_fwd(65, 32)
    torch.manual_seed(3)
    state = torch.cuda.get_rng_state()
    with pytest.warns(UserWarning, match="finalists in CUDA graphs failed"):
        assert launch._graph_times([a, b], {a: 0.01, b: 0.01}, lambda c: x.sum().item()) is None
    assert torch.equal(torch.cuda.get_rng_state(), state)
    drawn = torch.randn(8, device="cuda")  # raised "Offset increment outside graph capture ..."
    torch.cuda.set_rng_state(state)
    assert torch.equal(drawn, torch.randn(8, device="cuda"))


def test_tuning_leaves_out_a_candidate_the_compiler_fails_on(monkeypatch):
    """A compiler can fail on one configuration with any error (triton 3.8 aborts an MLIR
    pass with a RuntimeError on some loop forms): the tuner leaves that candidate out with a
    warning that names it and times the rest, and says what failed if none compiles. A
    failure at launch (the GPU may be in an error state) still ends the tuning."""
    cands = [launch.short_fwd(65, m) for m in (16, 32, 64)]
    crashes, fine, faults = cands

    def run(cand):
        if launch._compiling.only:  # a compile alone
            if cand is crashes:
                raise RuntimeError("PassManager::run failed\n<a page of IR>")
        elif cand is faults:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(launch, "_time_ms", lambda fn: (fn(), 1.0)[1])
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    with pytest.warns(UserWarning, match=r"short: M=16 .*does not compile .*RuntimeError: "
                                         r"PassManager::run failed\)"):
        assert launch._time_candidates([crashes, fine], run) is fine
    with pytest.warns(UserWarning), pytest.raises(RuntimeError, match="illegal memory access"):
        launch._time_candidates(cands, run)
    with pytest.warns(UserWarning), pytest.raises(
            RuntimeError, match=r"no flash-attention configuration compiles .*first fault: "
                                r"RuntimeError: PassManager::run failed\)"):
        launch._time_candidates([crashes], run)


def test_candidates_compile_on_threads_before_timing(monkeypatch):
    """Before a key's candidates are timed, _compile_all runs each of them as warm-ups only
    (compile, launch nothing) under Triton's AsyncCompileMode, which hands the compiles to
    COMPILE_THREADS threads; a candidate that fails there is left to the timed pass; and
    afterwards Launches launch again."""
    from triton.runtime import _async_compile

    events = []

    class Kernel:  # records what a Launch asks of it
        arg_names = ["X", "BLOCK_M"]

        def warmup(self, *args, grid, BLOCK_M, num_warps, num_stages):
            pool = _async_compile.active_mode.get()  # where Triton sends the compile
            events.append(("compile", BLOCK_M, pool is not None and pool.executor._max_workers))
            if BLOCK_M == 16:
                raise RuntimeError("does not compile")

        def __getitem__(self, grid):
            return lambda *args, BLOCK_M, **kw: events.append(("launch", BLOCK_M))

    kernel = Kernel()
    cands = [launch.short_fwd(65, m) for m in (16, 32, 64, 128)]

    def run(cand):
        launch.Launch(kernel, 1, {"BLOCK_M": cand.meta["BLOCK_M"]}, cand.num_warps, 1, n_tensors=0)(None)

    monkeypatch.setattr(launch, "INTERPRET", False)
    monkeypatch.setattr(launch, "COMPILE_THREADS", 3)
    launch._compile_all(cands, run)
    assert events == [("compile", m, 3) for m in (16, 32, 64, 128)]
    assert _async_compile.active_mode.get() is None
    events.clear()
    run(cands[1])  # the mode is left: a Launch launches
    assert events == [("launch", 32)]
    events.clear()
    monkeypatch.setattr(launch, "COMPILE_THREADS", 1)  # one core: the timed pass compiles alone
    launch._compile_all(cands, run)
    assert events == []
    monkeypatch.setattr(launch, "COMPILE_THREADS", 3)
    with ThreadPoolExecutor(1) as pool, triton.AsyncCompileMode(pool):  # the caller's own
        launch._compile_all(cands, run)  # Triton allows one mode at a time: none here
    assert events == []
    run(cands[2])  # and this thread's Launches launch again
    assert events == [("launch", 64)]


@pytest.mark.parametrize("D", [64, 96, 128])
def test_every_general_forward_candidate(monkeypatch, D):
    """Every general forward candidate of the lists (the short ones have their own test), at
    N = 130: a full key tile and a partial one for every BLOCK_N up to 128. On the GPU
    test_every_config_gpu runs them at the real lengths."""
    qkv, do = _packed_inputs(1, 130, 1, D, torch.float16, seed=D)
    bwd = launch.heuristic("bwd", 130, D)
    general = [c for c in launch.candidates("fwd", 130, D) if c.family == "general"]
    assert general
    for fwd in general:
        _force(monkeypatch, fwd, bwd)
        try:
            _assert_within_rule(qkv, do)
        except AssertionError as err:
            raise AssertionError(f"forward {fwd}: {err}") from err


@pytest.mark.parametrize("N, D", [(17, 32), (130, 32), (197, 64), (100, 80), (70, 96)])
def test_tma_load_kernels(monkeypatch, N, D):
    """The general forward's and backward's "general_tma" twins (Hopper), whose tiles come
    through TMA descriptors, against the reference at each of their tile shapes: one partial
    tile (17), full tiles and a partial one (130, 197, rows past N read as zeros from the
    descriptor's bounds), and split head dims whose second chunk has descriptors of its own
    (80 = 64 + 16, 96 = 64 + 32). The interpreter's descriptor loads stand in for the copy
    engine's; test_every_config_gpu runs the twins natively."""
    monkeypatch.setattr(launch, "_TMA_LOADS", True)
    qkv, do = _packed_inputs(2, N, 2, D, torch.float16, seed=N + D)
    pairs = []
    for op in ("fwd", "bwd"):
        found = launch.candidates(op, N, D)
        general = [c for c in found if c.family == "general" and not c.meta.get("SPLIT")]
        tma = [c for c in found if c.family == "general_tma"]  # split twins too (backward)
        twins = [launch.Candidate("general_tma", c.blocks, c.num_warps, c.num_stages)
                 for c in general]
        assert [c for c in tma if not c.meta.get("SPLIT")][:len(twins)] == twins
        pairs.append(tma)
    for _, _, plans in _pairs_within_rule(monkeypatch, qkv, do, *pairs):
        assert plans["fwd"][0].consts["TMA"] is True and plans["bwd"][1].consts["TMA"] is True


@pytest.mark.parametrize("N, D, B, H", [(17, 32, 2, 2), (65, 64, 2, 2), (64, 32, 1, 4),
                                        (100, 80, 2, 2), (197, 48, 1, 2)])
def test_short_tma_forward(monkeypatch, N, D, B, H):
    """The short forward's "short_tma" twins (Hopper), whose Q, K and V tiles come through
    TMA descriptors of one box height each (query tile, its partial tail, key tile and one
    or two key tails), against the reference, each twin once: a partial tail past N (17 =
    16 + 16, 65 = 64 + 16 rows past N read as zeros), no tail (64 keys; 4 heads, so the
    pipelined programs over 2 and 4 heads run too), two key tails (100 = 64 + 32 + 16,
    197 = 128 + 64 + 16) and split head dims (80 = 64 + 16, 48 = 32 + 16), whose second
    chunks have descriptors of their own (past 128 keys the short forwards are listed on
    Hopper below D = 64 only); at 17 and 65 also the pipelined one-key-tail twins,
    whose key past the tile is loaded by pointers beside the TMA tiles."""
    monkeypatch.setattr(launch, "_TMA_LOADS", True)
    qkv, do = _packed_inputs(B, N, H, D, torch.float16, seed=N + D)
    found = launch.candidates("fwd", N, D, B * H)
    short = [c for c in found if c.family == "short"]
    tma = [c for c in found if c.family == "short_tma"]
    twins = [launch.Candidate("short_tma", c.blocks, c.num_warps, c.num_stages) for c in short]
    # where one key is past the tile, the pipelined forwards' one-key twins, as TMA twins only
    one_key = [c for c in tma if c.meta["BLOCK_T"] == 1]
    assert short and tma == twins + one_key
    assert not any(c.meta["BLOCK_T"] == 1 for c in short)
    assert len(one_key) == (sum(c.meta["HEADS"] > 1 for c in short) if launch.one_key_tail(N) else 0)
    bwd = launch.heuristic("bwd", N, D)
    for _, _, plans in _pairs_within_rule(monkeypatch, qkv, do, tma, [bwd]):
        (fwd,) = plans["fwd"]
        assert fwd.kernel is flash_mod.kernels.fwd_short_kernel and fwd.consts["TMA"] is True


@pytest.mark.parametrize("D", [40, 112, 256])
def test_tma_loads_only_where_the_boxes_fit(monkeypatch, D):
    """No TMA twin where a box cannot stand in for a masked load: a padded head dim (40 in
    a 64-column tile, 112 in 128) would read the next head's columns; a 256-column chunk is
    past what the twins were built for. Nor without TMA (before Hopper, or the
    interpreter's default). The short forward's twins likewise, at N = 65, where its
    pointer candidates exist at every one of these head dims."""
    monkeypatch.setattr(launch, "_TMA_LOADS", True)
    assert not any(c.family == "general_tma" for op in ("fwd", "bwd")
                   for c in launch.candidates(op, 577, D))
    short = [c.family for c in launch.candidates("fwd", 65, D)]
    assert "short" in short and "short_tma" not in short
    monkeypatch.setattr(launch, "_TMA_LOADS", False)
    assert not any(c.family == "general_tma" for c in launch.candidates("fwd", 577, 64))
    assert not any(c.family == "short_tma" for c in launch.candidates("fwd", 65, 64))


_COMPILE_TMA_LOADS = '''
import re, subprocess, sys, tempfile
from pathlib import Path
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from vitflash.ops import flash, kernels, launch
op, D, cfg = {op!r}, {D}, {cfg!r}
bd, bd2 = launch.split_d(D)
box = lambda rows, w: f"tensordesc<bf16[1,{{rows}},{{w}}]>"
if op == "fwd":
    M, N, warps, stages = cfg
    sig = dict(QKV="*bf16", O="*bf16", LSE="*fp32", SEED="*i64", Q_DESC=box(M, bd),
               Q_DESC2=box(M, bd2 or bd), KV_DESC=box(N, bd), KV_DESC2=box(N, bd2 or bd),
               qk_scale="fp32", drop_p="fp32", H="i32", N="i32")
    consts = dict(HEAD_DIM=D, BLOCK_D=bd, BLOCK_D2=bd2, BLOCK_M=M, BLOCK_N=N, BLOCK_T=16,
                  DROPOUT=False, TMA=True, DIAG=False, TAIL_AHEAD=False)
    fn = kernels.fwd_kernel
else:
    M1, N1, warps, stages = cfg
    sig = dict(QKV="*bf16", O="*bf16", DO="*bf16", LSE="*fp32", DELTA="*fp32", DQKV="*bf16", SEED="*i64")
    for name, rows in (("QKV_S", M1), ("QKV_L", N1), ("DO_S", M1), ("DO_L", N1)):
        sig[name], sig[name + "2"] = box(rows, bd), box(rows, bd2 or bd)
    sig.update(qk_scale="fp32", sm_scale="fp32", drop_p="fp32", BH="i32", H="i32", N="i32")
    consts = dict(HEAD_DIM=D, BLOCK_D=bd, BLOCK_D2=bd2, BLOCK_M1=M1, BLOCK_N1=N1, BLOCK_M2=N1,
                  BLOCK_N2=M1, DROPOUT=False, TMA=True, DIAG=False, PART=0, DQ_DELTA=False)
    flash._bwd_tails(consts, 577)  # the tail tiles of N = 577 (a 16-key and a 16-row one)
    fn = kernels.bwd_kernel
if not bd2:  # an unsplit head dim's second-chunk descriptors are None, as the launcher passes them
    consts.update(dict.fromkeys([k for k in sig if k.endswith("2") and sig[k].startswith("tensordesc")], None))
sig.update(dict.fromkeys(consts, "constexpr"))
# pointers 16-byte aligned, as the JIT compiles the launches (registers.py's pointer_attrs)
attrs = {{(fn.arg_names.index(k),): [["tt.divisibility", 16]] for k, v in sig.items() if v.startswith("*")}}
ck = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs),
                    target=GPUTarget("cuda", 90, 32), options=dict(num_warps=warps, num_stages=stages))
ptx = ck.asm["ptx"]
ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
with tempfile.TemporaryDirectory() as tmp:
    (Path(tmp) / "k.ptx").write_text(ptx)
    report = subprocess.run([str(ptxas), "-arch=sm_90a", "-v", str(Path(tmp) / "k.ptx"), "-o",
                             str(Path(tmp) / "k.cubin")], capture_output=True, text=True).stderr
print(sum("cp.async.bulk.tensor" in line for line in ptx.splitlines()),
      re.search(r"(\\d+) bytes spill stores", report).group(1))
'''


@pytest.mark.parametrize("op, D, cfg", [("fwd", 64, (128, 64, 4, 3)), ("fwd", 128, (128, 128, 8, 3)),
                                        ("bwd", 64, (64, 64, 4, 3)), ("bwd", 64, (32, 64, 4, 3))])
def test_tma_twins_compile_for_hopper_without_spills(monkeypatch, op, D, cfg):
    """What the GPU runs of the general_tma twins (listed configurations), compiled for sm_90
    without a GPU (in a process without the interpreter, pointers aligned as the JIT compiles
    them), and assembled by Triton's ptxas: the tiles are bulk tensor copies, and no register
    spills to local memory. (The pointer-load backwards use all 255 registers and spill
    12-180 bytes a thread; benchmarks/results/registers_sm90_aligned.md.)"""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    monkeypatch.setattr(launch, "_TMA_LOADS", True)  # listed on Hopper, where the twins exist
    monkeypatch.setattr(launch, "_TMA", True)
    names = ("BLOCK_M", "BLOCK_N") if op == "fwd" else ("BLOCK_M1", "BLOCK_N1", "BLOCK_M2", "BLOCK_N2")
    tiles = cfg[:2] if op == "fwd" else (*cfg[:2], cfg[1], cfg[0])
    assert launch.Candidate("general_tma", tuple(zip(names, tiles)), *cfg[2:]) in launch.candidates(op, 577, D, 96)
    out = subprocess.run([sys.executable, "-c", _COMPILE_TMA_LOADS.format(op=op, D=D, cfg=cfg)],
                         env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    bulk, spilled = map(int, out.stdout.split()[-2:])
    assert bulk > 0 and spilled == 0


@pytest.mark.parametrize("D", [64, 80, 128])
def test_hopper_lists_only_four_warp_general_backwards(monkeypatch, D):
    """Where TMA loads exist (Hopper) the general backward's candidates, pointer and TMA loads,
    one launch and split, all have 4 warps (8-warp ones never came near the best on an H200:
    benchmarks/results/tuning_spread_large_shapes.md); elsewhere the 8-warp tile is listed."""
    monkeypatch.setattr(launch, "_TMA_LOADS", True)
    monkeypatch.setattr(launch, "_TMA", True)
    general = [c for c in launch.candidates("bwd", 577, D, 96) if c.family in ("general", "general_tma")]
    assert {c.num_warps for c in general} == {4} and {c.family for c in general} == {"general", "general_tma"}
    monkeypatch.setattr(launch, "_TMA_LOADS", False)
    monkeypatch.setattr(launch, "_TMA", False)
    assert 8 in {c.num_warps for c in launch.candidates("bwd", 577, D, 96)}


@pytest.mark.parametrize("N, D", [(197, 64), (129, 96), (256, 128)])
def test_hopper_lists_no_short_forward_past_one_128_key_tile(monkeypatch, N, D):
    """Where TMA loads exist (Hopper), past 128 keys at D >= 64 the forward's candidates are
    general ones only (no short forward came within 1.16x of the best at N = 197 on an H200:
    benchmarks/results/tuning_spread_large_shapes.md). Up to 128 keys, at narrow heads, and
    without TMA loads, the short forwards stay listed."""
    monkeypatch.setattr(launch, "_TMA_LOADS", True)
    monkeypatch.setattr(launch, "_TMA", True)
    families = {c.family for c in launch.candidates("fwd", N, D, 96)}
    assert families == {"general", "general_tma"}
    assert "short_tma" in {c.family for c in launch.candidates("fwd", 128, D, 96)}
    assert "short_tma" in {c.family for c in launch.candidates("fwd", 65, 64, 96)}
    assert "short_tma" in {c.family for c in launch.candidates("fwd", N, 16, 96)}  # narrow heads: not measured
    monkeypatch.setattr(launch, "_TMA_LOADS", False)
    monkeypatch.setattr(launch, "_TMA", False)
    assert "short" in {c.family for c in launch.candidates("fwd", N, D, 96)}
