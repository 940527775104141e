"""Launching the kernels of `kernels.py`: candidate configurations, autotuning with a cache
that outlives the process, and a launch path with little host work.

Each op (forward, backward, and "bwd_atomic", the backward of deterministic=False, which may
also add into dQ atomically) has candidates: a kernel family with its block sizes, warps and
stages. The families: "general" streams K/V tiles (or Q tiles, in the backward's dK/dV
programs); "short" holds all keys of a head on chip, a power-of-two tile and a tail tile (two
in the forward where that saves work); "atomic", the key-tile programs that bwd_atomic adds
to the backward's candidates. On Hopper, "general_tma", "short_tma" (the forward's) and
"atomic_tma" are their twins that load tiles through TMA descriptors, the last also adding dQ
tiles in bulk. Also on Hopper, unless VITFLASH_GLUON=0 (gluon_kernels), past N = 256 at head
dims 64 and 128, the forward lists "gluon" or "gluon_ws": the Gluon forwards of `hopper.py` (a
4-warp form, and a warp-specialized one), launched by `GluonLaunch`; and the backward lists
"gluon_bwd": the Gluon dK/dV and dQ kernels of `hopper.py`, launched apart after the delta
(`GluonBwdLaunch`); with VITFLASH_GLUON=staged also their staged forms, which a GPU run has
yet to decide (`gluon_ws_bwd_candidates`). A general backward
candidate with SPLIT = 1 launches its dK/dV programs and its dQ programs apart (split_twins),
the dQ launch with tiles, warps and stages of its own where that was measured to pay
(split_pairs). The tiles of a partial last block of queries
(short kernels) or keys (general forward) are not part of a candidate: `tail_tile` derives
them from N and the block when the launch is built. The first call at a key (op, dtype, N,
D, B*H rounded up to a power of two, dropout on or off) compiles every candidate on a pool
of threads, checks each one's result against `heuristic`'s (a candidate that the compiler
got wrong on this GPU is left out, with a warning), then times every one that compiles and
agrees in short windows, times the few fastest again as CUDA-graph replays (the GPU kept
busy, as a training step keeps it), and keeps the fastest of those;
the choice is written to a JSON file keyed by GPU and versions
(`$VITFLASH_CACHE_DIR/autotune.json`, default `~/.cache/vitflash`), so later processes start
at full speed (Triton keeps the compiled binaries in its own cache).
While a CUDA graph is being captured nothing can be timed: an unseen key then takes
`heuristic`, and is not written to the file.

Later calls skip Triton's per-call argument binding and the tuner's bookkeeping: the caller
keeps a plan per (op, dtype, device, B, N, H, D), a list of `Launch`es that call the compiled
kernels directly. Triton specializes a kernel on its integer arguments (== 1, multiples of
16), which that key fixes, and on pointer alignment, which is checked per call (a pointer
that is not 16-byte aligned takes Triton's own launch path).
"""
from __future__ import annotations

import functools
import json
import os
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch
import triton

from vitflash.files import written_whole
from vitflash.ops import hopper, kernels

try:
    import fcntl  # an advisory lock around the cache file's read-merge-replace
except ImportError:  # (Windows: none; of two processes writing at once, one's entries are lost)
    fcntl = None

INTERPRET = bool(kernels.INTERPRET)
# bump when a kernel or the candidate list changes in a way that can change the best config:
# 29, the Gluon backward's dQ kernel computing delta, launched before the dK/dV kernel
#     (its DQ_DELTA; no delta launch), its products overlapped at D = 128 (DQ_OVERLAP), and the
#     persistent warp-specialized Gluon forward at D = 128 (PERSISTENT);
# 28, the short backward's one key summed over the rows once (kernels.bwd_short_kernel,
#     LATE_SUMS), and its register-capped twin in 16-row chunks instead of 32 (SHORT_BWD_CAPPED);
# 27, the finalists timed in two passes of blocks, the second in reverse order, each keeping
#     its best block (_graph_times);
# 26, the finalists of the short windows timed again as CUDA-graph replays (_graph_times);
# 25, no backward tail programs at head dims with a 16-column second chunk or past 128
#     columns (flash._bwd_tails): the best backward there changes (TMA loads win again);
# 24, 23's lazy twins taken out again: the fastest twin 5-19% slower than the fastest plain
#     candidate on the H200 (benchmarks/results/gpu_session_b7a82e1/);
# 23, the general forward's lazy-rescaling twins (LAZY: the accumulator rescaled only when a
#     row's maximum grows by more than 2^8);
# 22, the general forward's tail-ahead twins (TAIL_AHEAD: the partial key tile loaded before
#     the loop over the full ones);
# 21, the backward's tail programs step through the other side in their wide tile's rows;
# 20, a split backward's delta computed in its dQ launch (kernels.bwd_kernel, DQ_DELTA);
# 19, the general backward's tail programs (at N = 197 in 64-key tiles, a 16-key program
#     instead of a fourth 64-key one; flash._bwd_tails);
# 18, the short backward's register-capped twin at N = 65 (KEY_PER_CHUNK, maxnreg 168);
# 17, dropout in the key (a cache file may hold a choice made with dropout under the key
#     without it), and the dropout mask drawn eight keys a Philox call;
# 16, no short forward past 128 keys at D >= 64 where TMA loads exist (Hopper);
# 15, no 8-warp general backward where TMA loads exist (Hopper);
# 14, split candidates whose dQ launch has its own tiles, warps and stages (split_pairs);
# 13, the general backward's split twins (dK/dV and dQ in two launches, split_twins);
# 12, no 8-warp short forwards below 128 rows (a cache file may hold one, and the
#     64-row one computed wrongly on an H200 at D = 16 with the diagonal mask);
# 11, the short kernels' one-key-tail twins (N = 2^k + 1: every short backward, the
#     pipelined short forwards, the latter as TMA twins on Hopper);
# 10, the short forward's TMA-load twins ("short_tma", Hopper; 9 keyed the reverted
#     register-capped candidates of dc8413a, which a cache file may still hold);
# 8, the general forward's and backward's TMA-load twins ("general_tma", Hopper);
# 7, (128, 128) forward tiles at head dims 65-128, bwd_atomic choosing among the
#    deterministic candidates too and, on Hopper, its TMA-reduction twins;
# 6, the forwards' FMA-folded softmax (and the bwd_atomic op);
# 5, split head dims (4 keyed the reverted TAILS candidates of 067433b, which a GPU
#    machine's cache file may still hold)
CACHE_VERSION = 29

# the families of bwd_atomic's own kernels: dQ added element by element, or by TMA tiles
ATOMIC_FAMILIES = ("atomic", "atomic_tma")
# the heights of the short forward's descriptor boxes, in its parameters' order (D16 ... D256)
BOX_HEIGHTS = (16, 32, 64, 128, 256)

# the short forward's families: tiles loaded by pointers, or by TMA descriptors (Hopper)
SHORT_FWD_FAMILIES = ("short", "short_tma")

# the Gluon forwards (hopper.py): fwd_wgmma_kernel, and fwd_ws_kernel (warp-specialized)
GLUON_FAMILIES = ("gluon", "gluon_ws")
# the Gluon backward (hopper.py): bwd_dkdv_kernel's launch, then bwd_dq_kernel's
GLUON_BWD_FAMILY = "gluon_bwd"
# its tiles: the dK/dV kernel's query tiles and keys a program, the dQ kernel's queries a
# program and key tiles
_GLUON_BWD_TILES = ("BLOCK_M1", "BLOCK_N1", "BLOCK_M2", "BLOCK_N2")
# the registers a thread of the warp-specialized Gluon kernels' consumer warp groups take
# (setmaxnreg; the forward's CONSUMER_REGS, the backward's): the most that two consumer
# groups and a loader warp fit
WS_REGS = 240
# listed from this length on: at N = 197 no Gluon forward configuration reached the Triton
# one on an H200 or an H100 (benchmarks/results/gpu_session_17e1b36/)
GLUON_MIN_N = 257


@dataclass(frozen=True)
class Candidate:
    """One way to run an op: kernel family, block sizes, warps, pipeline stages and a cap on
    registers per thread (Triton's maxnreg option; 0: the compiler's choice)."""

    family: str  # "general", "general_tma", "short", "short_tma", "atomic", "atomic_tma",
    # "gluon", "gluon_ws" or "gluon_bwd"
    blocks: tuple[tuple[str, int], ...]
    num_warps: int = 4
    num_stages: int = 1
    maxnreg: int = 0

    @property
    def meta(self) -> dict:
        return dict(self.blocks)

    def to_json(self) -> dict:
        return {**asdict(self), "blocks": dict(self.blocks)}

    @classmethod
    def from_json(cls, d: dict) -> "Candidate":
        return cls(d["family"], tuple(d["blocks"].items()), d["num_warps"], d["num_stages"],
                   d.get("maxnreg", 0))

    def label(self) -> str:
        """One line for tables: the family unless "general", the blocks (BLOCK_ dropped from
        their names), warps and stages, and a register cap if set, e.g. "general_tma:
        M1=32 N1=128 M2=128 N2=32 SPLIT=1, 4w 3s", "short: ... KEY_PER_CHUNK=1, 4w 1s cap 168"."""
        family = "" if self.family == "general" else self.family + ": "
        return family + " ".join(f"{k.removeprefix('BLOCK_')}={v}" for k, v in self.blocks) \
            + f", {self.num_warps}w {self.num_stages}s" \
            + (f" cap {self.maxnreg}" if self.maxnreg else "")

    @property
    def form(self) -> str:
        """How a general backward candidate launches its two kinds of program: "one launch"
        (PART 0), "split twin" (two launches with the same tiles, warps and stages:
        split_twins) or "split pair" (the dQ launch with tiles, warps or stages of its own:
        split_pairs). Every other candidate: its family."""
        m = self.meta
        if self.family not in ("general", "general_tma") or "BLOCK_M1" not in m:
            return self.family
        if not m.get("SPLIT"):
            return "one launch"
        mirrored = (m["BLOCK_M2"], m["BLOCK_N2"]) == (m["BLOCK_N1"], m["BLOCK_M1"])
        return "split twin" if mirrored and "WARPS2" not in m else "split pair"


def _c(family: str, names: tuple[str, ...], *rows) -> list[Candidate]:
    return [Candidate(family, tuple(zip(names, r[:-2])), r[-2], r[-1]) for r in rows]


def _pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def block_d(d: int) -> int:
    """Head dim padded to the power of two that the kernels compute with unless it splits
    (`split_d`)."""
    return max(16, _pow2(d))


def split_d(d: int) -> tuple[int, int]:
    """(BLOCK_D, BLOCK_D2): the column chunks the kernels hold a head-dim tile in. A head dim
    that is the sum of two powers of two A > B >= 16 (48 = 32 + 16, 80 = 64 + 16,
    96 = 64 + 32, 144 = 128 + 16, 160 = 128 + 32, 192 = 128 + 64) is split into (A, B), with
    no padding; any other is one chunk padded to block_d(d), and BLOCK_D2 = 0 (40 = 32 + 8
    and 112 = 64 + 48 too: 8 is below the matrix units' 16, 48 no power of two)."""
    a = 1 << (d.bit_length() - 1)  # the largest power of two <= d; d - a < a
    b = d - a
    if b >= 16 and b & (b - 1) == 0:
        return a, b
    return block_d(d), 0


def tile_width(d: int) -> int:
    """Columns of a head-dim tile on chip: d itself when it splits, else the padded
    block_d(d)."""
    return sum(split_d(d))


def tail_tile(n: int, block: int) -> int:
    """The tile of the partial last block when n rows (or keys) are cut into `block`-sized
    blocks: the power of two, at least 16 and at most `block`, that covers n % block; 0 when
    `block` divides n. 65 in blocks of 64 or 32 -> 16, 197 in 128 -> 128, 60 in 32 -> 32."""
    rest = n % block
    return min(block, max(16, _pow2(rest))) if rest else 0


def short_tiles(n: int, tails: int = 1) -> tuple[tuple[str, int], ...]:
    """The key tiles of the short kernels: the largest power of two <= N (at least 16) and,
    for the keys past it, a power-of-two tail tile: 65 -> 64 + 16, 197 -> 128 + 128. With
    tails=2 (the forward's) the keys past the first tail go into a second one (BLOCK_T2;
    0: none) where that saves work: 197 -> 128 + 64 + 16, 100 -> 64 + 32 + 16."""
    main = max(16, 1 << (n.bit_length() - 1))
    rest = n - main
    tail, tail2 = (max(16, _pow2(rest)) if rest > 0 else 16), 0
    if tails == 2 and rest > 0:
        first = max(16, 1 << (rest.bit_length() - 1))
        if first + tail_tile(rest, first) < tail:
            tail, tail2 = first, tail_tile(rest, first)
    tiles = (("BLOCK_N", main), ("BLOCK_T", tail), ("HAS_TAIL", rest > 0))
    return tiles + (("BLOCK_T2", tail2),) if tails == 2 else tiles


def short_keys(n: int, tails: int = 1) -> int:
    """Keys the short kernels hold on chip (padding included)."""
    t = dict(short_tiles(n, tails))
    return t["BLOCK_N"] + t["BLOCK_T"] * t["HAS_TAIL"] + t.get("BLOCK_T2", 0)


SHORT_FWD_MAX = 256  # short forward when all keys (padded) fit in this many
SHORT_BWD_MAX = 160  # short backward: K, V, dK, dV of a head stay on chip


def short_fwd(n: int, block_m: int, num_warps: int = 4, heads: int = 1,
              stages: int = 1, one_key: bool = False) -> Candidate:
    """A short-forward candidate at sequence length n: one program loops over `heads`
    (batch, head)s, software-pipelined over `stages`. Its query tile has `block_m` rows,
    the partial last one `tail_tile(n, block_m)` (set when the launch is built). one_key
    (where one_key_tail(n)): the key past the tile in vector arithmetic, as short_bwd's."""
    return Candidate("short", (("BLOCK_M", block_m),) + _tail_tiles(n, 2, one_key)
                     + (("HEADS", heads), ("STAGES", stages)), num_warps, 1)


def one_key_tail(n: int) -> bool:
    """Whether n keys are a power-of-two tile and one key more (17, 33, 65, 129: a class
    token after a power-of-two grid of patches)."""
    return n > 16 and (n - 1) & (n - 2) == 0


def short_bwd(n: int, block_m: int, num_warps: int = 4, one_key: bool = False,
              maxnreg: int = 0) -> Candidate:
    """A short-backward candidate at sequence length n: query rows in chunks of `block_m`,
    the rest in one chunk of `tail_tile(n, block_m)` rows (set when the launch is built).
    one_key (where one_key_tail(n)): the key past the tile in vector arithmetic, a tail of
    BLOCK_T = 1, rather than a 16-key tile of products. maxnreg (with one_key): registers
    capped at that many a thread, the kernel's KEY_PER_CHUNK form, which needs fewer
    (kernels.bwd_short_kernel)."""
    if maxnreg and not one_key:
        raise ValueError("a register cap is listed only for the one-key twin (KEY_PER_CHUNK)")
    capped = (("KEY_PER_CHUNK", 1),) if maxnreg else ()
    return Candidate("short", (("BLOCK_M", block_m),) + _tail_tiles(n, 1, one_key) + capped,
                     num_warps, 1, maxnreg)


# The short backward's register-capped twins, (BLOCK_M, warps, cap), at N = 65 and 33-64
# columns, in the kernel's KEY_PER_CHUNK form. With the one key's sums taken once after the
# chunks (kernels.bwd_short_kernel, LATE_SUMS), a 4-warp program of 16-row chunks takes
# 216-232 registers a thread, so 2 fit an SM; capped at 168, 3 fit, for 56 bytes of local
# memory a thread. On an H100 (triton 3.6) at the four N = 65, D = 64 shapes it ran 8-9%
# faster than the fastest candidate without the cap (the 32-row one-key twin), and 11-14%
# faster than the fastest backward before the sums were moved, the 32-row capped twin, which
# they made 1-5% slower (benchmarks/results/gpu_session_65e0e7e/run1/). Before them, on an
# H200, that 32-row twin had run 2-7% faster than the rest (gpu_session_d2d37d3/). At D = 16
# the kernel takes 128 registers anyway.
SHORT_BWD_CAPPED = ((16, 4, 168),)


def _tail_tiles(n: int, tails: int, one_key: bool) -> tuple[tuple[str, int], ...]:
    """short_tiles(n, tails), with a tail of one key (BLOCK_T = 1) if one_key."""
    tiles = dict(short_tiles(n, tails))
    if one_key:
        if not one_key_tail(n):
            raise ValueError(f"N = {n} is not a power-of-two tile and one key")
        tiles["BLOCK_T"] = 1
    return tuple(tiles.items())


def candidates(op: str, n: int, d: int, bh: int = 1, dropout: bool = False) -> list[Candidate]:
    """Every candidate of op ("fwd", "bwd", or "bwd_atomic": the backward that may add into
    dQ atomically, nondeterministic) at sequence length n, head dim d and B * H = bh (forward
    programs that loop over several heads need bh to be a multiple of them), with attention
    dropout or without (the Gluon forwards have none: gluon_candidates).

    The limits below size shared memory and registers by bd, the columns a head-dim tile
    takes on chip: the padded block_d(d), or d itself for a split head dim (80 = 64 + 16
    columns, not 128). The 64 / 128 steps that pick the general candidates put every split
    head dim where its padded width would (48 with 64, 80 and 96 with 128, 144-192 above
    128), so the real width changes only the short kernels' limits, which then let through
    a few candidates more than the padded width would: the pipelined multi-head forwards
    (their shared-memory bound) and the 2-warp tiles at every split D, and at D = 144-192
    short kernels for more keys (up to 8 more candidates at a shape: more tuning time on a
    first call)."""
    bd = tile_width(d)
    out: list[Candidate] = []
    if op == "fwd":
        keys = short_keys(n, tails=2)
        names = ("BLOCK_M", "BLOCK_N")
        if bd <= 64:
            out += _c("general", names, (128, 64, 4, 3), (128, 128, 8, 3), (64, 64, 4, 3), (128, 32, 4, 3))
        elif bd <= 128:
            out += _c("general", names, (128, 64, 8, 3), (128, 32, 4, 3), (64, 64, 4, 3), (64, 32, 4, 2),
                      (128, 128, 8, 3))
        else:
            out += _c("general", names, (64, 32, 4, 2), (32, 64, 4, 2), (64, 64, 8, 2), (32, 32, 4, 1))
        out += _tma_twins(out, d)
        out += tail_ahead_twins(out, n)
        if not dropout:
            out += gluon_candidates("fwd", n, d)
        if keys <= SHORT_FWD_MAX and keys * bd <= 256 * 128 and not _short_fwd_cut(n, d):
            # 8 warps only on 128-row tiles: below that they never came within 1.5x of the
            # best at the CIFAR shapes (benchmarks/results/tuning_spread_small_shapes.md), and
            # the 64-row one gave wrong output on an H200 (triton 3.6) at D = 16, N = 197
            # with the diagonal mask (benchmarks/results/gpu_session_7fdd729/)
            out += [short_fwd(n, m, w) for m, w in ((16, 4), (32, 4), (64, 4), (128, 4), (128, 8))
                    if m <= max(16, _pow2(n)) and m * keys <= 128 * 160]
            # small tiles in 2 warps: more programs resident per SM where a tile is tiny
            out += [short_fwd(n, m, 2) for m in (16, 32) if m <= max(16, _pow2(n)) and keys * bd <= 128 * 64]
            # pipelined: `st` copies of the Q, K, V tiles in shared memory; keep under ~160 KB
            piped = [short_fwd(n, m, 4, g, st) for m in (32, 64) for g, st in ((2, 2), (4, 2), (8, 3), (16, 3))
                     if m <= max(16, _pow2(n)) and bh % g == 0
                     and st * (m + 2 * keys) * bd * 2 <= 160 * 1024]
            out += piped
            out += _short_tma_twins([c for c in out if c.family == "short"], d)
            if one_key_tail(n):  # the pipelined ones again with the key past the tile as vectors:
                # as TMA twins where TMA loads exist (the family that wins at N = 65 on an H200),
                # else by pointers; not both, which would add to the first call's tuning time
                twins = [short_fwd(n, c.meta["BLOCK_M"], c.num_warps, c.meta["HEADS"], c.meta["STAGES"],
                                   one_key=True) for c in piped]
                out += _short_tma_twins(twins, d) or twins
    elif op in ("bwd", "bwd_atomic"):
        keys = short_keys(n)
        names = ("BLOCK_M1", "BLOCK_N1", "BLOCK_M2", "BLOCK_N2")
        if op == "bwd_atomic":  # one program kind, a key tile each: (BLOCK_M, BLOCK_N)
            # ... beside the deterministic ones below: allowing atomics never costs speed
            out += _atomic_candidates(bd)
            if tma_width(d) and tma_reductions():
                out += [Candidate("atomic_tma", c.blocks, c.num_warps, c.num_stages)
                        for c in _atomic_candidates(bd) + _atomic_tma_extra(bd)]
        if bd <= 64:
            general = _c("general", names, (32, 128, 128, 32, 4, 3), (64, 128, 128, 64, 8, 3),
                         (64, 64, 64, 64, 4, 3), (32, 64, 64, 32, 4, 3))
        elif bd <= 128:
            general = _c("general", names, (32, 128, 128, 32, 8, 2), (64, 64, 64, 64, 4, 2),
                         (32, 64, 64, 32, 4, 3), (16, 64, 64, 16, 4, 2))
        else:
            general = _c("general", names, (16, 64, 64, 16, 4, 1), (32, 32, 32, 32, 4, 1),
                         (16, 32, 32, 16, 4, 1))
        if tma_loads() and tma_width(d) and d >= 64:
            # Hopper, where the TMA twins exist, at the head dims measured: 4 warps only. On
            # an H200 no 8-warp general backward (pointer or TMA loads) came within 1.24x of
            # the fastest candidate in any of 35 (run, shape) timings at D = 64, nor within
            # 1.41x in any of 9 at D = 80-128 (benchmarks/results/tuning_spread_large_shapes.md);
            # each one only lengthened the first call's tuning.
            general = [c for c in general if c.num_warps == 4]
        out += general + _tma_twins(general, d)
        if not dropout:
            out += gluon_candidates("bwd", n, d)
        if keys <= SHORT_BWD_MAX and keys * bd <= 160 * 128:
            out += [short_bwd(n, m, w) for m in (16, 32, 64) for w in (4, 8)
                    if m <= max(16, _pow2(n))]
            if keys * bd <= 128 * 64:  # a small head's whole backward in 2 warps, 16-row chunks
                out.append(short_bwd(n, 16, 2))
            # 128-row chunks (65 rows: one chunk, against 64 + 16 above) only with 8 warps,
            # and only where their Q, dO, O chunks and (keys, 128) score tiles stay far
            # below the shared memory: D <= 64 and at most 128 keys
            if 128 <= _pow2(n) and keys <= 128 and bd <= 64:
                out.append(short_bwd(n, 128, 8))
            if one_key_tail(n):  # each again with the one key past the tile as vectors
                out += [short_bwd(n, c.meta["BLOCK_M"], c.num_warps, one_key=True)
                        for c in out if c.family == "short"]
                if n == 65 and 32 < bd <= 64:
                    out += [short_bwd(n, m, w, one_key=True, maxnreg=r) for m, w, r in SHORT_BWD_CAPPED]
        else:  # longer sequences only: at short ones the split candidates would lengthen the
            out += split_twins(out) + split_pairs(d)  # first call's tuning where the short
            # kernels win anyway
    else:
        raise ValueError(f"unknown op {op!r}")
    return out


_TMA: bool | None = None
_GLUON: bool | None = None
_STAGED = False  # (set with _GLUON: VITFLASH_GLUON=staged)


def gluon_kernels() -> bool:
    """Whether the ops list the Gluon kernels of hopper.py: not turned off (VITFLASH_GLUON=0;
    1, the default, lists them; "staged" lists the staged ones too, gluon_staged), Gluon
    imports in this triton and the GPU is a Hopper (compute capability 9.x: wgmma, which
    later GPUs lack). Never in the interpreter, which does not run Gluon kernels. Where
    listed they are candidates like any other: the tuner keeps one only where it checks out
    and is the fastest.

    On Hopper GPUs the op's path through them passed the FA2 rule, forward and backward, at
    N = 257-2049 and D = 64, 128 in bf16 and fp16 (test_gluon_forward_gpu,
    test_gluon_backward_gpu, benchmarks/results/gpu_session_f48ef01/ on an H100)."""
    global _GLUON, _STAGED
    if _GLUON is None:
        asked = os.environ.get("VITFLASH_GLUON", "1").strip()
        if asked not in ("0", "1", "staged"):
            raise ValueError(f"VITFLASH_GLUON={asked!r}: set it to 0 to leave the Gluon kernels out "
                             "(Hopper GPUs), to 1 (the default) to list them, or to staged to list "
                             "the staged ones too (yet to be decided on a GPU)")
        _GLUON = (asked != "0" and not INTERPRET and hopper.available() and torch.cuda.is_available()
                  and torch.cuda.get_device_capability()[0] == 9)
        _STAGED = _GLUON and asked == "staged"
    return _GLUON


def gluon_staged() -> bool:
    """Whether the ops also list the staged Gluon kernels (gluon_ws_bwd_candidates):
    VITFLASH_GLUON=staged where gluon_kernels(). For timing them through the op (the
    tuner keeps one only where it checks out and is the fastest) before they are listed by
    default; their choices are cached apart from the default lists' (_disk_key)."""
    return gluon_kernels() and _STAGED


def gluon_candidates(op: str, n: int, d: int) -> list[Candidate]:
    """The Gluon kernels op ("fwd", or a backward) lists at sequence length n and head dim d,
    on Hopper; nowhere unless gluon_kernels(), nor at N <= 256, where no Gluon forward came
    near the Triton one.

    Forward: at D = 64 the 4-warp form with (64, 128) tiles in 2 stages, 1.02-1.03x the tuned
    Triton forward at N = 577-4097 on an H100; at D = 128 the warp-specialized form (two
    64-row consumers at 240 registers, 128-key tiles, 2 stages), 1.10-1.26x it at
    N = 577-4097 (benchmarks/results/gpu_session_17e1b36/), and the same in its persistent
    form (PERSISTENT), 1.15x, 1.04x, 1.02x the other at N = 577, 2049, 4097 (H100,
    benchmarks/results/gpu_session_64c5aa5/run1).

    Backward: the dK/dV kernel (BLOCK_N1 keys a program, BLOCK_N1 / 16 warps, BLOCK_M1-row
    query tiles in num_stages buffers) and the dQ kernel (BLOCK_M2 queries, BLOCK_M2 / 16 warps,
    BLOCK_N2-key tiles in as many). 64-key dK/dV programs were 1.08-1.12x the 128-key ones,
    and 64-row dQ programs 1.03-1.08x the 128-row ones, at three shapes on an H100
    (benchmarks/results/gpu_session_f48ef01/run1): the 64-row dQ with both dK/dV forms, and at
    D = 64 the 64-key one with its products overlapped across steps (OVERLAP, 2 or 3 stages),
    1.10x and 1.16x the other at N = 577 and 4097 (run5). The dQ kernel computes delta itself
    (its DQ_DELTA, in every plan: GluonBwdLaunch): at D = 128 on an H100, 0.321 ms against 0.302 + 0.052 for the dQ and delta
    kernels at N = 577, 1.384 against 1.374 + 0.047 at 4097; and at D = 128 its products
    overlap across steps (DQ_OVERLAP): 1.310 ms at 4097, 0.320 at 577
    (benchmarks/results/gpu_session_64c5aa5/run1). The 32-query overlapped dK/dV form at
    D = 128 was 0.89x and 0.95x the 64-query plain one there: not listed.

    The staged forms (gluon_ws_bwd_candidates) are listed only with VITFLASH_GLUON=staged
    (gluon_staged): forms a GPU run has yet to decide."""
    if n < GLUON_MIN_N or d not in hopper.HEAD_DIMS or not gluon_kernels():
        return []
    if op != "fwd":
        names = _GLUON_BWD_TILES
        staged = gluon_ws_bwd_candidates(d) if gluon_staged() else []
        if d == 128:  # the dQ products overlapped across steps (DQ_OVERLAP)
            return _c(GLUON_BWD_FAMILY, (*names, "DQ_OVERLAP"), (64, 64, 64, 64, 1, 4, 2),
                      (64, 128, 64, 64, 1, 8, 2)) + staged
        # at D = 64 the dK/dV products overlapped across steps (spills at D = 128) beside the
        # plain forms
        return (_c(GLUON_BWD_FAMILY, names, (64, 64, 64, 64, 4, 2), (64, 128, 64, 64, 8, 2))
                + _c(GLUON_BWD_FAMILY, (*names, "OVERLAP"), (64, 64, 64, 64, 1, 4, 2),
                     (64, 64, 64, 64, 1, 4, 3)) + staged)
    if d == 64:
        return [Candidate("gluon", (("BLOCK_M", 64), ("BLOCK_N", 128)), 4, 2)]
    ws = (("BLOCK_M", 64), ("BLOCK_N", 128), ("CONSUMER_REGS", WS_REGS))
    # and its persistent form, one program an SM (hopper.fwd_ws_persistent_kernel)
    return [Candidate("gluon_ws", ws, 4, 2), Candidate("gluon_ws", (*ws, ("PERSISTENT", 1)), 4, 2)]


def gluon_ws_bwd_candidates(d: int) -> list[Candidate]:
    """The staged forms of the Gluon backward at head dim d, listed by gluon_candidates only
    with VITFLASH_GLUON=staged (gluon_staged): at D = 128, the listed 64-key dK/dV kernel beside
    DQ_WS, the warp-specialized dQ kernel hopper.bwd_dq_ws_kernel (two consumer warp groups of
    BLOCK_M2 = 64 queries sharing one ring of K and V tiles that a loader warp fills, computing
    delta), at 64- and 128-key steps; none at D = 64.

    The forms staged before it were decided on one H100: within the FA2 rule, none kept by the
    tuner; the warp-specialized dK/dV kernel (WS) lost to the listed one, and the
    warp-specialized dQ kernel alone took 0.95x the listed dQ kernel's time, which this pairing
    would bring into the op (benchmarks/KERNEL_NOTES.md, "The Gluon backward"; the figures in
    benchmarks/results/gpu_session_cae18ce/). test_gluon_backward_gpu holds each staged form to
    the FA2 rule through the op."""
    if d != 128:
        return []
    return _c(GLUON_BWD_FAMILY, (*_GLUON_BWD_TILES, "DQ_WS"), (64, 64, 64, 128, 1, 4, 2),
              (64, 64, 64, 64, 1, 4, 2))


def tma_reductions() -> bool:
    """Whether this machine can also add tiles into memory through TMA descriptors: TMA
    loads (`tma_loads`) and a Triton whose descriptors have atomic_add (3.6 and 3.8 both
    do). Not in the interpreter, which has no such reduction (the tests give it one)."""
    global _TMA
    if _TMA is None:
        import triton.language as tl

        _TMA = tma_loads() and hasattr(getattr(tl, "tensor_descriptor", None), "atomic_add")
    return _TMA


_TMA_LOADS: bool | None = None


def _short_fwd_cut(n: int, d: int) -> bool:
    """Whether the short forwards are left off the list (cache version 16): on Hopper, where
    the TMA twins exist, past one 128-key tile (N > 128: a 128-key tile and tails) at D >= 64.
    On an H200 no short forward came within 1.16x of the fastest candidate in any of 14 (run,
    shape) timings at N = 197, D = 64, nor within 1.74x at D = 96
    (benchmarks/results/tuning_spread_large_shapes.md), and their 14 candidates (with the TMA
    twins) took most of the first forward's tuning at N = 197: without them the first forward
    at (256, 12, 197, 64) took 5.0 s instead of 12.9, the same forward chosen
    (benchmarks/results/gpu_session_89a08a7/first_call/)."""
    return n > 128 and d >= 64 and tma_loads() and tma_width(d)


def tma_loads() -> bool:
    """Whether this machine's kernels can load tiles through TMA descriptors: a CUDA GPU of
    compute capability 9 (Hopper) or newer. Not in the interpreter, where the tests turn it
    on themselves (its descriptor loads are exact, only slow)."""
    global _TMA_LOADS
    if _TMA_LOADS is None:
        _TMA_LOADS = (not INTERPRET and torch.cuda.is_available()
                      and torch.cuda.get_device_capability()[0] >= 9)
    return _TMA_LOADS


def tma_width(d: int) -> bool:
    """Whether head dim d's tiles can go through TMA boxes: its column chunks cover d
    exactly (a padded head dim would read its neighbour's columns, which a box cannot mask),
    none wider than the 128 columns the TMA kernels were built and tested for."""
    return tile_width(d) == d and split_d(d)[0] <= 128


def tma_fits(c: Candidate, d: int) -> bool:
    """Whether general candidate c's tiles can come through TMA descriptors at head dim d:
    `tma_width(d)` and, for the backward, its tiles have the two heights of the FA2 shapes,
    BLOCK_M1 = BLOCK_N2 and BLOCK_N1 = BLOCK_M2, one descriptor each."""
    m = c.meta
    return (c.family == "general" and tma_width(d)
            and m.get("BLOCK_M1") == m.get("BLOCK_N2") and m.get("BLOCK_N1") == m.get("BLOCK_M2"))


# The largest partial key tile that a general forward's tail-ahead twin loads before its loop
# and holds across it (in shared memory when compiled for sm_90: 4 KiB for 16 keys at
# D = 64); a 128-key tail (197 in 128-key tiles) is left to the loop's way.
TAIL_AHEAD_MAX = 32


def tail_ahead_twins(cands: list[Candidate], n: int) -> list[Candidate]:
    """A TAIL_AHEAD twin (kernels.fwd_kernel) of each general forward candidate in cands
    (pointer or TMA loads) whose keys at length n end in a partial tile of at most
    TAIL_AHEAD_MAX keys after at least one full tile: that tile loaded before the loop, where
    its latency overlaps the loop's work, instead of after it (at 197, 577, 1025 and 4097 in
    64-key tiles, a 16-key tail of 5 or 1 keys). The same bits as the candidate; listed
    beside it, so that the tuner's timings at each shape say which is faster (on the H200
    the twin of the (128, 32) tile won at both N = 197 ViT shapes, 3% under it, and lost or
    tied elsewhere: benchmarks/results/gpu_session_caef401/)."""
    return [Candidate(c.family, c.blocks + (("TAIL_AHEAD", 1),), c.num_warps, c.num_stages)
            for c in cands if c.family in ("general", "general_tma")
            and n > c.meta["BLOCK_N"] and 0 < tail_tile(n, c.meta["BLOCK_N"]) <= TAIL_AHEAD_MAX]


def _tma_twins(cands: list[Candidate], d: int) -> list[Candidate]:
    """Where TMA loads exist, a "general_tma" twin of each general candidate that fits them
    (the same tiles, warps and stages, the tiles loaded by the copy engine)."""
    if not tma_loads():
        return []
    return [Candidate("general_tma", c.blocks, c.num_warps, c.num_stages)
            for c in cands if tma_fits(c, d)]


def split_twins(cands: list[Candidate]) -> list[Candidate]:
    """A split twin (SPLIT = 1) of each 4-warp candidate of the general backward, pointer or
    TMA loads: the same tiles and warps, with the dK/dV programs and the dQ programs in two
    launches (kernels.bwd_kernel's PART) rather than one. One launch holds the registers of
    its larger kind for both: compiled for sm_90 (triton 3.8, pointers aligned as the JIT
    compiles them), the TMA (32, 128) tile at D = 64 takes 255 registers a thread in one
    launch and in its dK/dV launch alone, and 154 in its dQ launch alone (3 programs an SM
    instead of 2); the TMA (64, 64) tile at D = 128 (2 stages), 255 and 154
    (benchmarks/results/registers_sm90_aligned.md; on an H200 the dK/dV launches of both
    took 255, as the driver reports them, benchmarks/results/gpu_session_d2d37d3/run1/). The
    split costs a launch more and the tail between the two."""
    return [Candidate(c.family, c.blocks + (("SPLIT", 1),), c.num_warps, c.num_stages)
            for c in cands if c.family in ("general", "general_tma") and c.num_warps == 4
            and "BLOCK_M1" in c.meta]


def split_pairs(d: int) -> list[Candidate]:
    """Split candidates whose dQ launch has other tiles, warps or stages than its dK/dV
    launch (WARPS2, STAGES2: the dQ launch's warps and stages): the fastest configuration of
    each part, timed apart over a grid at the large ViT shapes on an H200 (triton 3.6,
    benchmarks/probes/bwd_parts.py; benchmarks/results/gpu_session_d17457d/run2). At D = 64
    the dK/dV launch was fastest with the listed (32, 128) tile at every length, and the dQ
    launch with (64, 64), (64, 32) or 8-warp (128, 64) tiles rather than its twin's (128, 32);
    at D = 128, dK/dV with (64, 64) in 2 stages, dQ with (128, 64) in 8 warps and 3 stages.
    Listed, the tuner chose a pair at all six large shapes, 1-4% under the best split twin
    (run3). Only at D <= 64 and D = 128: at D = 80 and 96 the D = 128 pair took 17-42% more
    than the twins (run4; both from the tuner's own timings, tabulated by
    `scripts/bench_attention.py --render` in gpu_session_d17457d/tuning_forms.md); and only
    where TMA loads exist (Hopper), where they were measured."""
    if not (tma_loads() and tma_width(d)):
        return []
    bd = tile_width(d)
    if bd <= 64:
        dkdv, dqs = (32, 128, 4, 3), ((64, 64, 4, 3), (64, 32, 4, 3), (128, 64, 8, 3))
    elif bd == 128:
        dkdv, dqs = (64, 64, 4, 2), ((128, 64, 8, 3),)
    else:
        return []
    m1, n1, w1, s1 = dkdv
    out = []
    for m2, n2, w2, s2 in dqs:
        blocks = (("BLOCK_M1", m1), ("BLOCK_N1", n1), ("BLOCK_M2", m2), ("BLOCK_N2", n2), ("SPLIT", 1))
        if (w2, s2) != (w1, s1):
            blocks += (("WARPS2", w2), ("STAGES2", s2))
        out.append(Candidate("general_tma", blocks, w1, s1))
    return out


def _short_tma_twins(cands: list[Candidate], d: int) -> list[Candidate]:
    """Where TMA loads exist and head dim d's chunks cover it exactly, a "short_tma" twin of
    each short forward candidate: the same tiles, warps and pipeline, its Q, K and V tiles
    loaded by the copy engine into shared memory rather than through pointer tiles.
    Compiled for sm_90 with aligned pointers the two take about as many registers at N = 65,
    D = 64 (75 and 96 a thread at the 64- and 32-row tiles with TMA, 96 and 80 by pointers,
    benchmarks/results/registers_sm90_aligned.md); the tuner times both."""
    if not (tma_loads() and tma_width(d)):
        return []
    return [Candidate("short_tma", c.blocks, c.num_warps, c.num_stages) for c in cands]


def _atomic_candidates(bd: int) -> list[Candidate]:
    """The nondeterministic backward's candidates at head-dim tile width bd: the key tile and
    query tile sizes of the deterministic backward's dK/dV programs, which this one is plus
    dQ's atomic adds."""
    names = ("BLOCK_M", "BLOCK_N")
    if bd <= 64:
        return _c("atomic", names, (32, 128, 4, 3), (64, 128, 8, 3), (64, 64, 4, 3), (32, 64, 4, 3))
    if bd <= 128:
        return _c("atomic", names, (32, 128, 8, 2), (64, 64, 4, 2), (32, 64, 4, 3), (16, 64, 4, 2))
    return _c("atomic", names, (16, 64, 4, 1), (32, 32, 4, 1), (16, 32, 4, 1))


def _atomic_tma_extra(bd: int) -> list[Candidate]:
    """8-warp tiles for the atomic_tma kernels, whose Q, K, V and dO tiles TMA loads into
    shared memory: compiled for sm_90 these use no local memory, where with pointer loads
    they would not pay."""
    names = ("BLOCK_M", "BLOCK_N")
    if bd <= 64:
        return _c("atomic", names, (32, 128, 8, 3), (64, 64, 8, 3))
    if bd <= 128:
        return _c("atomic", names, (64, 64, 8, 2))
    return []


def heuristic(op: str, n: int, d: int) -> Candidate:
    """The candidate used without timing: in the interpreter (one config keeps CI fast) and
    for keys first seen during CUDA-graph capture. Short kernels wherever they apply."""
    keys, bd = short_keys(n), tile_width(d)  # the same choices as with block_d(d) (see candidates)
    if op == "fwd":
        if keys <= 128:
            return short_fwd(n, 64)
        return Candidate("general", (("BLOCK_M", 64), ("BLOCK_N", 64)), 4, 2)
    if keys <= 128 and bd <= 128:
        return short_bwd(n, 32)
    if op == "bwd_atomic":
        return Candidate("atomic", (("BLOCK_M", 16 if bd > 128 else 64), ("BLOCK_N", 64)), 4,
                         1 if bd > 128 else 2)
    if bd > 128:
        return Candidate("general", (("BLOCK_M1", 16), ("BLOCK_N1", 64), ("BLOCK_M2", 64),
                                     ("BLOCK_N2", 16)), 4, 1)
    return Candidate("general", (("BLOCK_M1", 64), ("BLOCK_N1", 64), ("BLOCK_M2", 64),
                                 ("BLOCK_N2", 64)), 4, 2)


# ----------------------------------------------------------------------------------------
# Launching one kernel
# ----------------------------------------------------------------------------------------
_get_stream = None
_fast_count = 0


class Launch:
    """One kernel launch with its grid, constexprs, warps and stages fixed: the unit a plan
    is made of. Its first call goes through Triton (compiling, or finding the binary in
    Triton's cache); later calls hand the arguments straight to the compiled kernel's
    launcher. The plan that holds a Launch is keyed by everything Triton specializes on
    except pointer alignment, which is checked per call."""

    __slots__ = ("kernel", "grid", "consts", "values", "options", "n_tensors", "compiled")

    def __init__(self, kernel, grid: int, consts: dict, num_warps: int, num_stages: int,
                 n_tensors: int, maxnreg: int = 0):
        # in the kernel's parameter order, which the direct launch relies on (a candidate
        # read back from the cache file may list its blocks in another order)
        names = list(getattr(kernel, "arg_names", consts))
        consts = dict(sorted(consts.items(), key=lambda kv: names.index(kv[0])))
        self.kernel, self.grid, self.consts = kernel, grid, consts
        self.values = tuple(consts.values())
        # Triton's compile options; maxnreg only where set (0: the compiler's choice)
        self.options = dict(num_warps=num_warps, num_stages=num_stages)
        if maxnreg:
            self.options["maxnreg"] = maxnreg
        self.n_tensors = n_tensors
        self.compiled = None

    @property
    def num_warps(self) -> int:
        return self.options["num_warps"]

    @property
    def num_stages(self) -> int:
        return self.options["num_stages"]

    def __call__(self, *args) -> None:
        """Launch on `args`: the runtime arguments in the kernel's order, tensors first."""
        ck = self.compiled
        if ck is not None:
            tensors = args[:self.n_tensors]
            if all(t.data_ptr() % 16 == 0 for t in tensors):
                # The launcher takes every parameter in order, constexprs too (it skips them).
                ck.run(self.grid, 1, 1, _get_stream(tensors[0].device.index), ck.function,
                       ck.packed_metadata, None, None, None, *args, *self.values)
                return
        if INTERPRET:
            self.kernel[(self.grid,)](*args, **self.consts)
            return
        if getattr(_compiling, "only", False):  # in _compile_all: compile, launch nothing
            self.kernel.warmup(*args, grid=(self.grid,), **self.consts, **self.options)
            return
        ck = self.kernel[(self.grid,)](*args, **self.consts, **self.options)
        if self.compiled is None and _fast_launch_ok(self, ck, args):
            global _fast_count
            self.compiled = ck
            _fast_count += 1


def _hooks_idle() -> bool:
    """No launch hooks are set (a profiler sets them). Triton's hooks are None or a chain of
    calls (newer versions), which is idle when empty."""
    runtime = getattr(getattr(triton, "knobs", None), "runtime", None)
    if runtime is None:
        return True
    return all(h is None or getattr(h, "calls", None) == []
               for h in (runtime.launch_enter_hook, runtime.launch_exit_hook))


def _fast_launch_ok(launch: Launch, ck, args) -> bool:
    """Whether later calls may go straight to ck's launcher: it has the attributes this
    relies on, no launch hooks are set, the constexprs close the signature, and the first
    call's pointers were aligned like the later ones must be."""
    global _get_stream
    if not all(hasattr(ck, a) for a in ("run", "function", "packed_metadata")):
        return False
    names = list(getattr(launch.kernel, "arg_names", []))
    if names[len(args):] != list(launch.consts) or not _hooks_idle():
        return False
    if not all(t.data_ptr() % 16 == 0 for t in args[:launch.n_tensors]):
        return False
    _get_stream = triton.runtime.driver.active.get_current_stream
    return True


def fast_launches() -> int:
    """How many launch plans call their compiled kernel directly (for benchmarks' notes)."""
    return _fast_count


class _GluonLaunches:
    """What the Gluon launches share: a kernel of hopper.py with its constexprs (STAGES among
    them) and compile options, programs of `rows` rows (queries or keys) each, launched over
    (row tiles, batch, head) through Gluon's own launch path, or compiled only (_compile_all)."""

    __slots__ = ("kernel", "consts", "options", "rows")

    @property
    def num_warps(self) -> int:
        return self.options["num_warps"]

    @property
    def num_stages(self) -> int:
        return self.consts["STAGES"]

    @property
    def compiled(self) -> None:
        """None: no direct launch of a compiled binary (see Launch.compiled)."""
        return None

    def _tiles(self, qkv: torch.Tensor, H: int, N: int) -> int:
        """The number of row tiles of `rows` rows over every (batch, head)."""
        return -(-N // self.rows) * qkv.shape[0] * H

    def _launch(self, args: tuple, programs: int) -> None:
        grid = (programs, )
        if getattr(_compiling, "only", False):  # in _compile_all: compile, launch nothing
            self.kernel.warmup(*args, grid=grid, **self.consts, **self.options)
            return
        self.kernel[grid](*args, **self.consts, **self.options)


class GluonLaunch(_GluonLaunches):
    """A Gluon forward (hopper.py) in an op's plan, called as a Launch of the Triton forward
    is, (qkv, o, lse, seed, qk_scale, drop_p, H, N), without the descriptor arguments: it
    makes its own TMA descriptors at each call, and never runs with dropout (seed and drop_p
    are not read). A "gluon_ws" candidate with PERSISTENT launches the persistent form: no
    more programs than the GPU has SMs, each over every programs-th query tile."""

    __slots__ = ("block_m", "block_n", "persistent")

    def __init__(self, c: Candidate, D: int):
        m = c.meta
        self.block_m, self.block_n = m["BLOCK_M"], m["BLOCK_N"]
        self.consts = dict(HEAD_DIM=D, BLOCK_M=self.block_m, BLOCK_N=self.block_n,
                           STAGES=c.num_stages)
        self.options = dict(num_warps=c.num_warps)
        self.kernel, self.rows = hopper.fwd_wgmma_kernel, self.block_m
        self.persistent = bool(m.get("PERSISTENT"))
        if c.family == "gluon_ws":
            self.kernel, self.rows = hopper.fwd_ws_kernel, 2 * self.block_m
            if self.persistent:
                self.kernel = hopper.fwd_ws_persistent_kernel
            self.consts["CONSUMER_REGS"] = m["CONSUMER_REGS"]
            self.options["maxnreg"] = hopper.ws_maxnreg(m["CONSUMER_REGS"])

    def __call__(self, qkv, o, lse, seed, qk_scale, drop_p, H, N) -> None:
        args = (*hopper.descriptors(qkv, o, self.block_m, self.block_n), lse, qk_scale, H, N)
        tiles = self._tiles(qkv, H, N)
        if not self.persistent:
            self._launch(args, tiles)
            return
        sms = _sm_count(qkv.device.index) if qkv.is_cuda else tiles  # (a CPU: compiled only)
        self._launch((*args, tiles), min(tiles, sms))


class GluonBwdLaunch(_GluonLaunches):
    """One of a "gluon_bwd" candidate's two launches (hopper.py): its dK/dV kernel (dkdv) or
    its dQ kernel, called as (qkv, o, do, lse, delta, dqkv, qk_scale, softmax_scale, H, N);
    each makes its own TMA descriptors at each call. The dQ kernel runs first and computes
    delta from o and do (its DQ_DELTA), writing it for the dK/dV kernel (which reads no o).
    WS (DQ_WS) in the candidate's key: the dK/dV (dQ) kernel's warp-specialized form, two
    consumer warp groups of BLOCK_N1 keys (BLOCK_M2 queries) at WS_REGS registers and a
    loader warp, so a program owns twice that many rows."""

    __slots__ = ("dkdv", )

    def __init__(self, c: Candidate, D: int, dkdv: bool):
        m = c.meta
        block_m, block_n = (m["BLOCK_M1"], m["BLOCK_N1"]) if dkdv else (m["BLOCK_M2"], m["BLOCK_N2"])
        self.dkdv, self.rows = dkdv, block_n if dkdv else block_m  # a program's keys or queries
        self.consts = dict(HEAD_DIM=D, BLOCK_M=block_m, BLOCK_N=block_n, STAGES=c.num_stages)
        self.options = dict(num_warps=self.rows // 16)  # a warp group per 64 rows
        if m.get("WS" if dkdv else "DQ_WS"):  # two consumers of self.rows each, and a loader
            self.kernel = hopper.bwd_dkdv_ws_kernel if dkdv else hopper.bwd_dq_ws_kernel
            self.rows *= 2
            self.consts["CONSUMER_REGS"] = WS_REGS
            self.options = dict(num_warps=4, maxnreg=hopper.ws_maxnreg(WS_REGS))
            return
        self.kernel = hopper.bwd_dkdv_kernel if dkdv else hopper.bwd_dq_kernel
        if m.get("OVERLAP" if dkdv else "DQ_OVERLAP"):  # each kernel's products overlapped
            self.consts["OVERLAP"] = 1
        if not dkdv:
            self.consts["DQ_DELTA"] = 1

    def __call__(self, qkv, o, do, lse, delta, dqkv, qk_scale, softmax_scale, H, N) -> None:
        c = self.consts
        descs = hopper.bwd_descriptors(qkv, do, dqkv, c["BLOCK_M"], c["BLOCK_N"], self.dkdv)
        args = (*descs, lse, delta, *(() if self.dkdv else (o, )), qk_scale, softmax_scale, H, N)
        self._launch(args, self._tiles(qkv, H, N))


@functools.lru_cache(maxsize=None)
def _sm_count(index: int | None) -> int:
    """The number of SMs of CUDA device `index` (None: the current one)."""
    return torch.cuda.get_device_properties(torch.cuda.current_device() if index is None else index
                                            ).multi_processor_count


# ----------------------------------------------------------------------------------------
# Choosing a candidate
# ----------------------------------------------------------------------------------------
_chosen: dict[tuple, Candidate] = {}
_timings: dict[tuple, dict[Candidate, float]] = {}
_graph_timings: dict[tuple, dict[Candidate, float]] = {}
_disk: dict | None = None


def _cache_file() -> Path:
    root = os.environ.get("VITFLASH_CACHE_DIR") or Path.home() / ".cache" / "vitflash"
    return Path(root) / "autotune.json"


def _disk_key(key: tuple, device: torch.device) -> str:
    """The cache file's entry for key on device: GPU name, versions, the key; entries chosen
    among the Gluon kernels too (gluon_kernels()), and among the staged ones too
    (gluon_staged()), are kept apart from those chosen without."""
    op, dtype, n, d, bh, dropout = key
    return (f"{torch.cuda.get_device_name(device)}|torch {torch.__version__}|triton "
            f"{triton.__version__}|v{CACHE_VERSION}|{op}|{str(dtype).split('.')[-1]}|N={n}|D={d}|BH<={bh}"
            + ("|dropout" if dropout else "") + ("|gluon" if gluon_kernels() else "")
            + ("+staged" if gluon_staged() else ""))


def _load_cache(path: Path) -> dict:
    """The cache file's entries; {} for a missing, unreadable or damaged file, which the next
    choice then replaces (a JSON value other than an object counts as damaged)."""
    try:
        entries = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return entries if isinstance(entries, dict) else {}


def _read_disk() -> dict:
    global _disk
    if _disk is None:
        _disk = _load_cache(_cache_file())
    return _disk


_unwritable: set[Path] = set()  # cache files that could not be written, warned about once


def _write_disk(entry: str, cand: Candidate) -> None:
    """Merge one entry into the cache file: under an advisory lock (another process writing
    its choices at the same moment would otherwise replace the file without them), into a
    temp file beside it, then os.replace, so that a reader never sees half a file."""
    path = _cache_file()
    _read_disk()[entry] = cand.to_json()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path.with_name(path.name + ".lock"), "a") as lock:
            if fcntl is not None:
                fcntl.flock(lock, fcntl.LOCK_EX)  # released as the file closes
            current = _load_cache(path)
            current[entry] = cand.to_json()
            with written_whole(path) as tmp:
                Path(tmp).write_text(json.dumps(current, indent=1))
    except OSError as e:
        if path not in _unwritable:
            _unwritable.add(path)
            warnings.warn(f"flash attention: cannot write the tuning cache {path} ({e}): a new process tunes "
                          "each shape again, seconds at its first call; set VITFLASH_CACHE_DIR to a writable "
                          "folder", stacklevel=3)


def _saved(entry: str, op: str, n: int, d: int, bh: int) -> Candidate | None:
    """The cache file's choice for `entry`, if it names a candidate listed for its key (any
    B * H of its bucket); None, to tune again, where there is none or the entry names no
    listed candidate (a damaged file, or one written before a candidate left the lists)."""
    saved = _read_disk().get(entry)
    if saved is None:
        return None
    try:
        cand = Candidate.from_json(saved)
        listed = cand in candidates(op, n, d, _pow2(bh))
    except (KeyError, TypeError, AttributeError, ValueError):
        listed = False
    if not listed:
        warnings.warn(f"flash attention: the tuning cache {_cache_file()} names no listed configuration for "
                      f"{entry} ({saved!r}): tuning it again", stacklevel=3)
        return None
    return cand


def _key(op: str, dtype: torch.dtype, n: int, d: int, bh: int, dropout: bool = False) -> tuple:
    """What a choice is made for: op, dtype, N, D, B*H rounded up to a power of two, and
    whether attention dropout is on. Its mask work moves the best candidate: on an H200, at
    three of the four N = 65 shapes of bench_attention's small set, the tuner chose a
    pipelined TMA short forward without it (7fdd729) and the pointer-load one with it
    (8f7ca33; benchmarks/results/gpu_session_8f7ca33/README.md). The diagonal mask (one
    comparison a score) is left out: no timing has shown it moving the choice."""
    return op, dtype, n, d, _pow2(bh), bool(dropout)


def chosen(op: str, dtype: torch.dtype, n: int, d: int, bh: int, dropout: bool = False) -> Candidate | None:
    """The candidate this process uses for the key, or None before its first call there
    (benchmarks record it beside their timings)."""
    return _chosen.get(_key(op, dtype, n, d, bh, dropout))


def tuning_times(op: str, dtype: torch.dtype, n: int, d: int, bh: int,
                 dropout: bool = False) -> dict[Candidate, float] | None:
    """The milliseconds per call that this process's tuner measured for each candidate at
    the key (each one's better round), or None where it timed none (the choice came from
    the cache file, or the key is unseen): benchmarks record them beside their own
    timings, so a choice that their timer disagrees with can be traced."""
    return _timings.get(_key(op, dtype, n, d, bh, dropout))


def final_times(op: str, dtype: torch.dtype, n: int, d: int, bh: int,
                dropout: bool = False) -> dict[Candidate, float] | None:
    """The milliseconds per call that this process's tuner measured in CUDA-graph replays
    for each finalist at the key (`finalists`; the choice is the fastest of them), or None
    where it timed none that way (one finalist, a failed capture, a cached choice)."""
    return _graph_timings.get(_key(op, dtype, n, d, bh, dropout))


def choose(op: str, dtype: torch.dtype, n: int, d: int, bh: int, device: torch.device,
           run: Callable[[Candidate], None],
           verify: Callable[[Candidate], tuple[torch.Tensor, ...]] | None = None,
           dropout: bool = False) -> Candidate:
    """The candidate for this key: remembered, read from the cache file, or timed now by
    calling run(candidate) (which must launch the op on the real arguments, with dropout
    where the key has it). verify(candidate): the candidate's results (o; dqkv) on fixed,
    well-conditioned inputs of the key's shape, which must agree with the heuristic
    candidate's before it is timed (_time_candidates)."""
    key = _key(op, dtype, n, d, bh, dropout)
    cand = _chosen.get(key)
    if cand is not None:
        return cand
    if INTERPRET:
        cand = _chosen[key] = heuristic(op, n, d)
        return cand
    if torch.cuda.is_current_stream_capturing():
        return heuristic(op, n, d)
    entry = _disk_key(key, device)
    cand = _saved(entry, op, n, d, bh)
    if cand is None:
        times = _timings[key] = {}
        graph_times = _graph_timings[key] = {}
        cands = candidates(op, n, d, bh, dropout)
        _compile_all(cands, run)
        check = (heuristic(op, n, d), verify) if verify is not None else None
        cand = _time_candidates(cands, run, times, check, graph_times)
        if not graph_times:
            del _graph_timings[key]
        _write_disk(entry, cand)
    _chosen[key] = cand
    return cand


# A sleeping kernel ahead of each timing window must outlast the host's enqueueing of the
# window's calls: at least this many GPU clock cycles (about half a millisecond), more where
# one call's host time says so (SLEEP_HZ: cycles a second, about an H100's / H200's SM clock)
SLEEP_CYCLES, SLEEP_HZ, SLEEP_MAX = 1_000_000, 2.0e9, 40_000_000


def _sleep_cycles(host_s: float, calls: int) -> int:
    """Cycles of the sleeping kernel ahead of a window of `calls` calls that each take
    `host_s` seconds of host time to enqueue: twice that time, at least SLEEP_CYCLES, at
    most SLEEP_MAX (20 ms)."""
    return round(min(SLEEP_MAX, max(SLEEP_CYCLES, 2 * calls * host_s * SLEEP_HZ)))


def _time_ms(fn: Callable[[], None], calls: int = 10, repeats: int = 5) -> float:
    """Median over `repeats` windows of GPU milliseconds per call of fn, from CUDA events.
    Not triton.testing.do_bench: that allocates a 256 MB buffer to flush the L2 cache before
    every call, which would show in the caller's peak memory (an eval's, say) for a tuning
    that ran once; and in training the inputs of attention come straight from the qkv
    projection, in L2 as here. A sleeping kernel ahead of each window keeps the GPU busy
    while the host enqueues the calls, so a window times the kernels, not the host's
    launches (small shapes take less GPU time than launch time). The sleep is sized by one
    call's host time (`_sleep_cycles`): a candidate whose launch costs more host time (the
    TMA twins build their descriptors per call) is still judged on its GPU time, as a
    CUDA graph replays it."""
    fn()  # warm-up
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()  # one call's host time: the enqueueing, the kernels run on
    host_s = time.perf_counter() - t0
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    sleep = getattr(torch.cuda, "_sleep", None)
    cycles = _sleep_cycles(host_s, calls)
    times = []
    for _ in range(repeats):
        if sleep is not None:
            sleep(cycles)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / calls)
    return sorted(times)[len(times) // 2]


# Threads that compile a key's candidates at once (Triton's compiler releases the GIL for
# much of a compile: its MLIR passes, LLVM and ptxas)
COMPILE_THREADS = min(8, os.cpu_count() or 1)
_compiling = threading.local()  # .only: this thread's Launches compile without launching


def _compile_all(cands: list[Candidate], run: Callable[[Candidate], None]) -> None:
    """Compile every candidate before any is timed, COMPILE_THREADS at a time: under
    Triton's AsyncCompileMode, run(cand) with this thread's Launches set to compile only
    (Triton's warm-up) hands each kernel's compile to a pool of threads, and leaving the
    mode waits for them all and puts the binaries in the kernels' caches. A candidate that
    fails to compile here fails again when _time_candidates compiles it alone
    (_compile_error), which leaves it out."""
    mode = getattr(triton, "AsyncCompileMode", None)  # in triton 3.6 and 3.8
    if mode is None or COMPILE_THREADS < 2 or len(cands) < 2:
        return
    _compiling.only = True
    try:
        with ThreadPoolExecutor(COMPILE_THREADS) as pool, mode(pool, ignore_errors=True):
            for cand in cands:
                try:
                    run(cand)
                except Exception:  # left to _time_candidates (see above)
                    pass
    except RuntimeError:  # the caller's own AsyncCompileMode is active (one at a time)
        pass
    finally:
        _compiling.only = False


TIMING_ROUNDS = 2

# What a configuration that does not fit the chip raises: too much shared memory or too many
# registers (at launch), or a compile that Triton refuses for the config
UNFIT = (triton.runtime.errors.OutOfResources, triton.compiler.errors.CompilationError)


def _compile_error(cand: Candidate, run: Callable[[Candidate], None]) -> Exception | None:
    """Compile cand's kernels without launching them (Triton's warm-up, as in _compile_all,
    whose binaries it finds in the cache): None, or what the compile raised. Besides UNFIT,
    a Triton compiler can fail on a config with any error (an MLIR pass that aborts raises a
    RuntimeError); that leaves the candidate out instead of ending the tuning, while a
    failure of a launch, which may leave the GPU in an error state, still propagates."""
    _compiling.only = True
    try:
        run(cand)
    except Exception as err:  # (see above: any compile failure)
        return err
    finally:
        _compiling.only = False
    return None


def error_line(err: Exception) -> str:
    """err's type and the first line of its message (a compiler's can be a page of IR), for
    a warning or a table's error column."""
    lines = str(err).strip().splitlines()
    return type(err).__name__ + (f": {lines[0][:200]}" if lines else "")


# A candidate's result agrees with the reference's where no element differs by more than
# this many units in the last place of the reference's largest magnitude. On the tuner's
# standard-normal inputs (flash._probe) correct kernels differ by rounding, a unit or two
# (naive attention in bf16 is 1-1.4 units from float64 there, at N = 65-1025, and flash
# candidates under 0.7 from each other in the interpreter: benchmarks/probes/agreement.py,
# its output in benchmarks/results/agreement_cpu.md); a kernel the
# compiler got wrong is off by whole values (the H200 case: 1.03 on o, naive 0.013).
AGREE_ULPS = 16


def _disagreement(got: tuple[torch.Tensor, ...], ref: tuple[torch.Tensor, ...]) -> float:
    """The largest |got - ref| over the tensors, as a multiple of AGREE_ULPS units in the
    last place of each reference's largest magnitude (> 1: they disagree; NaN or inf in got
    counts as inf). Taken a slice at a time, so that it never holds a copy of the tensors."""
    worst = 0.0
    for g, r in zip(got, ref):
        scale = torch.finfo(r.dtype).eps * AGREE_ULPS * max(r.abs().max().item(), 1e-3)
        g2, r2 = g.reshape(g.shape[0], -1), r.reshape(r.shape[0], -1)
        step = max(1, g2.shape[0] // 8)
        for i in range(0, g2.shape[0], step):
            err = (g2[i:i + step] - r2[i:i + step]).abs().max().item()
            worst = max(worst, err / scale if err == err else float("inf"))  # err != err: NaN
    return worst


def _time_candidates(cands: list[Candidate], run: Callable[[Candidate], None],
                     times: dict | None = None,
                     check: tuple[Candidate, Callable[[Candidate], tuple[torch.Tensor, ...]]] | None = None,
                     graph_times: dict | None = None) -> Candidate:
    """The fastest of cands. All are compiled first, then timed back to back in
    TIMING_ROUNDS rounds, each keeping its best round: a candidate timed right after seconds
    of compiling, with the GPU idle, or in a slow moment of a shared machine, is not
    judged on that one window. (With one window each, timed right after its compile, the
    tuner once kept a forward at (4, 16, 4097, 128) that scripts/sweep_configs.py then
    measured 12% slower than another listed candidate.) `times`, if given, receives each
    timed candidate's milliseconds per call. A candidate whose compile fails is left out:
    silently where it does not fit the chip (UNFIT), with a warning where the compiler
    itself failed (_compile_error).

    The short windows rank long calls otherwise than a GPU kept busy does, so their
    finalists (`finalists`: within FINAL_MARGIN of the fastest) are timed again as CUDA-graph
    replays (_graph_times), and the fastest there is kept; `graph_times`, if given, receives
    those milliseconds. (On H100s at (4, 16, 4097, 128) the short windows put the TMA
    (64, 64) forward and the (128, 128) one within 1% of each other, either first; graph
    replays put the TMA (64, 64) one 4-6% behind.)

    check = (reference, verify): before any is timed, each candidate's results, verify(cand),
    must agree with the reference candidate's (_disagreement). verify runs a candidate on
    fixed, well-conditioned inputs, where correct kernels differ by rounding alone.
    One that does not is left out, with a warning that names it: a kernel that the compiler
    got wrong on this GPU and Triton (it happened once, on an H200 with triton 3.6, to a
    candidate that the interpreter computes right) must not be chosen, least of all for
    being fast. If most disagree, the reference itself is in doubt, and the op stops with
    an error instead."""
    ref = None
    if check is not None:
        reference, verify = check
        try:
            if _compile_error(reference, run) is None:
                ref = tuple(t.clone() for t in verify(reference))
                torch.cuda.synchronize()
        except UNFIT:
            pass  # nothing to compare with: the candidates are timed unchecked
    ready, wrong, broken = [], [], []
    for cand in cands:
        err = _compile_error(cand, run)
        if err is not None:
            if not isinstance(err, UNFIT):  # not a config that does not fit: a compiler fault
                broken.append(err)
                warnings.warn(f"flash attention: {cand.label()} does not compile with triton "
                              f"{triton.__version__} here ({error_line(err)}); it is left out of "
                              "the tuning.", stacklevel=2)
            continue
        try:
            run(cand)  # a config that does not fit the chip fails here (or in the compile)
            torch.cuda.synchronize()
        except UNFIT:
            continue
        if ref is not None and (off := _disagreement(verify(cand), ref)) > 1:
            wrong.append(cand)
            warnings.warn(f"flash attention: {cand} computes a result {off:.3g}x further from "
                          f"{reference}'s than rounding explains, on this GPU; it is left out "
                          "of the tuning. A compiler fault is the likely cause: please report "
                          "it with the GPU, the versions, and the output of `python -m pytest "
                          "-m gpu tests/test_flash_attention.py -k every_config`.", stacklevel=2)
            continue
        ready.append(cand)
    if len(wrong) > len(ready):
        raise RuntimeError(f"flash attention: {len(wrong)} of {len(wrong) + len(ready)} "
                           "configurations disagree with the reference configuration on this GPU, "
                           "so none can be trusted here; use the 'sdpa' or 'naive' attention path")
    if not ready:
        first = f" (the first fault: {error_line(broken[0])})" if broken else ""
        raise RuntimeError("no flash-attention configuration compiles on this GPU: "
                           f"tried {len(cands)}{first}; use the 'sdpa' or 'naive' attention path")
    best_ms = {cand: float("inf") for cand in ready}
    for _ in range(TIMING_ROUNDS):
        for cand in ready:
            best_ms[cand] = min(best_ms[cand], _time_ms(lambda: run(cand)))
    if times is not None:
        times.update(best_ms)
    finals = finalists(best_ms)
    if len(finals) < 2:
        return finals[0]
    final_ms = _graph_times(finals, best_ms, run)
    if final_ms is None:  # a capture failed (warned): the windows' choice stands
        return finals[0]
    if graph_times is not None:
        graph_times.update(final_ms)
    return min(finals, key=final_ms.__getitem__)


# The finalists: the candidates within FINAL_MARGIN of the fastest by the short windows, at
# most FINALISTS of them, fastest first. The short windows (10 calls behind an idle sleep)
# rank long calls otherwise than a GPU kept busy: at (4, 16, 4097, 128) on an H100 the TMA
# (64, 64) forward came out 5.5% faster in them than in CUDA-graph replays, and the other
# listed forwards moved between -4.3% and +3.9% (benchmarks/results/gpu_session_a5ea267/run4),
# so two candidates' order can turn over a gap of up to about 10%.
FINAL_MARGIN, FINALISTS = 0.10, 4
# Each finalist's graph holds about GRAPH_WINDOW_MS of its calls (at most GRAPH_MAX_CALLS); it
# is replayed once to warm up, then GRAPH_ROUNDS times back to back, before the next finalist's.
# GRAPH_PASSES passes over the finalists, every other one in reverse order; each finalist keeps
# its best block.
GRAPH_WINDOW_MS, GRAPH_MAX_CALLS, GRAPH_ROUNDS, GRAPH_PASSES = 20.0, 500, 5, 2


def finalists(ms: dict) -> list:
    """The keys of ms (candidate -> milliseconds a call) within FINAL_MARGIN of the
    smallest value, at most FINALISTS of them, fastest first."""
    ranked = sorted(ms, key=ms.__getitem__)
    cut = ms[ranked[0]] * (1 + FINAL_MARGIN)
    return [c for c in ranked if ms[c] <= cut][:FINALISTS]


def _capture(fn: Callable[[], None], calls: int) -> torch.cuda.CUDAGraph:
    """A CUDA graph of `calls` calls of fn, captured on a side stream that waits for the
    current one (and the current one for it), in thread_local mode: other threads of the
    process (a data loader's, DDP's) may use the device meanwhile. Unlike torch.cuda.graph,
    it neither collects garbage nor empties the allocator's cache. A capture that fails
    leaves the device's random generator usable (recover_from_failed_capture)."""
    graph = torch.cuda.CUDAGraph()
    here = torch.cuda.current_stream()
    side = torch.cuda.Stream()
    side.wait_stream(here)
    try:
        with torch.cuda.stream(side):
            graph.capture_begin(capture_error_mode="thread_local")
            try:
                for _ in range(calls):
                    fn()
            finally:
                graph.capture_end()
    except BaseException:
        here.wait_stream(side)
        recover_from_failed_capture()
        raise
    here.wait_stream(side)
    return graph


def recover_from_failed_capture(device: torch.device | int | None = None) -> None:
    """Take the device's default random generator out of capture mode after a CUDA-graph
    capture that failed. A capture puts the generator in that mode when it begins and takes
    it out when it ends, but where the capture was invalidated (a host read of a device value
    inside it, say) ending it raises first (seen with torch 2.11): the generator stays in
    capture mode, and every later random draw on the device raises "Offset increment outside
    graph capture encountered unexpectedly". A capture that ends cleanly (one trivial kernel)
    takes it out again; its random state is where it was before the failed capture."""
    index = torch.device("cuda", device).index if isinstance(device, int) else getattr(device, "index", None)
    device = torch.device("cuda", torch.cuda.current_device() if index is None else index)
    scratch = torch.zeros(1, device=device)
    here = torch.cuda.current_stream(device)
    side = torch.cuda.Stream(device)
    side.wait_stream(here)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.device(device), torch.cuda.stream(side):
        graph.capture_begin(capture_error_mode="thread_local")
        scratch.add_(1)
        graph.capture_end()
    here.wait_stream(side)


def _block_ms(fn: Callable[[], None], calls: int) -> float:
    """One block of _graph_times: a CUDA graph of `calls` calls of fn, captured afresh,
    replayed once to warm up and then GRAPH_ROUNDS times back to back; the median replay's
    GPU milliseconds a call."""
    graph = _capture(fn, calls)
    graph.replay()
    marks = [torch.cuda.Event(enable_timing=True) for _ in range(GRAPH_ROUNDS + 1)]
    marks[0].record()
    for mark in marks[1:]:
        graph.replay()
        mark.record()
    torch.cuda.synchronize()
    ts = sorted(a.elapsed_time(b) / calls for a, b in zip(marks, marks[1:]))
    return ts[len(ts) // 2]


def _graph_times(cands: list, window_ms: dict, run: Callable) -> dict | None:
    """GPU milliseconds a call of each candidate as CUDA-graph replays time it (what
    `scripts/bench_attention.py --timer graph` and a captured training step run): a graph of
    about GRAPH_WINDOW_MS of its calls (sized by window_ms, its time in the short windows),
    replayed once to warm up and then GRAPH_ROUNDS times back to back, the median replay a
    call; one candidate after the other, each in a block of its own. (Replayed in turns, one
    replay of each candidate after the other, the H100 timed the TMA (64, 64) forward at
    (4, 16, 4097, 128) 5% faster than the (128, 128) one; alone, either way, 5% slower: the
    benchmark's order. benchmarks/results/gpu_session_82d2523/run2.)

    GRAPH_PASSES passes over the candidates, every other one in reverse order (a, b, c, then
    c, b, a), each block captured afresh; a candidate's time is its best block's median. One
    pass left the choice to where a block fell: on an H100 at (4, 16, 4097, 128) the (128, 128)
    forward, timed first, took 1.194 ms a call in its block and the TMA (64, 64) one 1.192, so
    the tuner kept the latter, which the benchmark then timed 3.6% slower (457 against 474
    TFLOP/s in the next fresh tuning; benchmarks/results/gpu_session_0858500, run1 and run5).

    None, with a warning, where a capture fails: a candidate whose launch cannot be captured
    leaves the choice to the short windows."""
    blocks = {cand: [] for cand in cands}
    try:
        for turn in range(GRAPH_PASSES):
            for cand in (cands if turn % 2 == 0 else cands[::-1]):
                calls = max(1, min(GRAPH_MAX_CALLS, round(GRAPH_WINDOW_MS / max(window_ms[cand], 1e-6))))
                blocks[cand].append(_block_ms(lambda: run(cand), calls))
    except RuntimeError as err:
        torch.cuda.synchronize()
        warnings.warn(f"flash attention: timing the tuner's finalists in CUDA graphs failed "
                      f"({error_line(err)}); the choice is left to its short windows.", stacklevel=3)
        return None
    return {cand: min(ms) for cand, ms in blocks.items()}
