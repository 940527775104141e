"""Launching the kernels of `kernels.py`: candidate configurations, autotuning with a cache
that outlives the process, and a launch path with little host work.

Each op (forward, backward) has candidates: a kernel family ("general" streams K/V tiles,
"short" holds all keys of a head in one tile) with its block sizes, warps and stages. The
first call at a key (op, dtype, N, D, B*H rounded up to a power of two) times every
candidate that compiles and keeps the fastest; the choice is written to a JSON file keyed by
GPU and versions (`$VITFLASH_CACHE_DIR/autotune.json`, default `~/.cache/vitflash`), so later
processes start at full speed (Triton keeps the compiled binaries in its own cache).
While a CUDA graph is being captured nothing can be timed: an unseen key then takes
`heuristic`, and is not written to the file.

Later calls skip Triton's per-call argument binding: the compiled kernel of each
(kernel, config, integer arguments, dtype, device) is kept and launched directly. Triton
specializes a kernel on its integer arguments (== 1, multiples of 16) and on pointer
alignment, so those are part of that key, and a pointer that is not 16-byte aligned takes
Triton's own launch path.
"""
from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch
import triton

from vitflash.ops import kernels

INTERPRET = bool(kernels.INTERPRET)
CACHE_VERSION = 1  # bump when a kernel changes in a way that can change the best config


@dataclass(frozen=True)
class Candidate:
    """One way to run an op: kernel family, block sizes, warps and pipeline stages."""

    family: str  # "general" or "short"
    blocks: tuple[tuple[str, int], ...]
    num_warps: int = 4
    num_stages: int = 1

    @property
    def meta(self) -> dict:
        return dict(self.blocks)

    def to_json(self) -> dict:
        return {**asdict(self), "blocks": dict(self.blocks)}

    @classmethod
    def from_json(cls, d: dict) -> "Candidate":
        return cls(d["family"], tuple(d["blocks"].items()), d["num_warps"], d["num_stages"])


def _c(family: str, names: tuple[str, ...], *rows) -> list[Candidate]:
    return [Candidate(family, tuple(zip(names, r[:-2])), r[-2], r[-1]) for r in rows]


def _pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def block_d(d: int) -> int:
    """Head dim padded to the power of two the kernels compute with."""
    return max(16, _pow2(d))


def short_block_n(n: int) -> int:
    """The one key tile of the short kernels: N rounded up to a power of two, at least 16."""
    return max(16, _pow2(n))


SHORT_FWD_MAX = 256  # short forward when all keys fit a tile of this many
SHORT_BWD_MAX = 128  # short backward: K, V, dK, dV of a head stay on chip


def candidates(op: str, n: int, d: int) -> list[Candidate]:
    """Every candidate of op ("fwd" or "bwd") at sequence length n and head dim d."""
    bd = block_d(d)
    bn = short_block_n(n)
    out: list[Candidate] = []
    if op == "fwd":
        names = ("BLOCK_M", "BLOCK_N")
        if bd <= 64:
            out += _c("general", names, (128, 64, 4, 3), (128, 128, 8, 3), (64, 64, 4, 3), (128, 32, 4, 3))
        elif bd <= 128:
            out += _c("general", names, (128, 64, 8, 3), (128, 32, 4, 3), (64, 64, 4, 3), (64, 32, 4, 2))
        else:
            out += _c("general", names, (64, 32, 4, 2), (32, 64, 4, 2), (64, 64, 8, 2), (32, 32, 4, 1))
        if bn <= SHORT_FWD_MAX and bn * bd <= 128 * 128:
            out += _c("short", names, *[(m, bn, w, 1) for m in (16, 32, 64, 128) for w in (4, 8)
                                        if m <= max(16, bn) and m * bn <= 128 * 128])
    elif op == "bwd":
        names = ("BLOCK_M1", "BLOCK_N1", "BLOCK_M2", "BLOCK_N2")
        if bd <= 64:
            out += _c("general", names, (32, 128, 128, 32, 4, 3), (64, 128, 128, 64, 8, 3),
                      (64, 64, 64, 64, 4, 3), (32, 64, 64, 32, 4, 3))
        elif bd <= 128:
            out += _c("general", names, (32, 128, 128, 32, 8, 2), (64, 64, 64, 64, 4, 2),
                      (32, 64, 64, 32, 4, 3), (16, 64, 64, 16, 4, 2))
        else:
            out += _c("general", names, (16, 64, 64, 16, 4, 1), (32, 32, 32, 32, 4, 1),
                      (16, 32, 32, 16, 4, 1))
        if bn <= SHORT_BWD_MAX and bn * bd <= 128 * 128:
            out += _c("short", ("BLOCK_M", "BLOCK_N"),
                      *[(m, bn, w, 1) for m in (16, 32, 64) for w in (4, 8) if m <= max(16, bn)])
    else:
        raise ValueError(f"unknown op {op!r}")
    return out


def heuristic(op: str, n: int, d: int) -> Candidate:
    """The candidate used without timing: in the interpreter (one config keeps CI fast) and
    for keys first seen during CUDA-graph capture. Short kernels wherever they apply."""
    bn = short_block_n(n)
    if op == "fwd":
        if bn <= 128:
            return Candidate("short", (("BLOCK_M", 64), ("BLOCK_N", bn)), 4, 1)
        return Candidate("general", (("BLOCK_M", 64), ("BLOCK_N", 64)), 4, 2)
    if bn <= SHORT_BWD_MAX and bn * block_d(d) <= 128 * 128:
        return Candidate("short", (("BLOCK_M", 32), ("BLOCK_N", bn)), 4, 1)
    if block_d(d) > 128:
        return Candidate("general", (("BLOCK_M1", 16), ("BLOCK_N1", 64), ("BLOCK_M2", 64),
                                     ("BLOCK_N2", 16)), 4, 1)
    return Candidate("general", (("BLOCK_M1", 64), ("BLOCK_N1", 64), ("BLOCK_M2", 64),
                                 ("BLOCK_N2", 64)), 4, 2)


# ----------------------------------------------------------------------------------------
# Launching one kernel
# ----------------------------------------------------------------------------------------
_compiled: dict = {}  # (kernel, config, int args, dtype, device) -> Triton's compiled kernel
_get_stream = None


def _fast_launch_supported(ck) -> bool:
    return all(hasattr(ck, a) for a in ("run", "function", "packed_metadata"))


def launch(kernel, grid: int, args: list, consts: dict, num_warps: int, num_stages: int) -> None:
    """kernel[(grid,)](*args, **consts) with the given warps and stages.

    `args` are the runtime arguments in the kernel's order (tensors first), `consts` its
    constexprs, which follow them in its signature.
    """
    if INTERPRET:
        kernel[(grid,)](*args, **consts)
        return
    ints = tuple(a for a in args if isinstance(a, int))
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    aligned = all(t.data_ptr() % 16 == 0 for t in tensors)
    key = (kernel, num_warps, num_stages, tuple(consts.values()), ints,
           tuple(t.dtype for t in tensors), tensors[0].device.index, aligned)
    ck = _compiled.get(key)
    if ck is not None:
        global _get_stream
        if _get_stream is None:
            _get_stream = triton.runtime.driver.active.get_current_stream
        # The launcher takes every parameter in order, constexprs included (it skips them).
        ck.run(grid, 1, 1, _get_stream(tensors[0].device.index), ck.function,
               ck.packed_metadata, None, None, None, *args, *consts.values())
        return
    ck = kernel[(grid,)](*args, **consts, num_warps=num_warps, num_stages=num_stages)
    hooks = triton.knobs.runtime if hasattr(triton, "knobs") else None
    no_hooks = hooks is None or (hooks.launch_enter_hook is None and hooks.launch_exit_hook is None)
    if aligned and no_hooks and _fast_launch_supported(ck) and \
            list(consts) == list(kernel.arg_names[len(args):]):
        _compiled[key] = ck


# ----------------------------------------------------------------------------------------
# Choosing a candidate
# ----------------------------------------------------------------------------------------
_chosen: dict[tuple, Candidate] = {}
_disk: dict | None = None


def _cache_file() -> Path:
    root = os.environ.get("VITFLASH_CACHE_DIR") or Path.home() / ".cache" / "vitflash"
    return Path(root) / "autotune.json"


def _disk_key(key: tuple, device: torch.device) -> str:
    op, dtype, n, d, bh = key
    return (f"{torch.cuda.get_device_name(device)}|torch {torch.__version__}|triton "
            f"{triton.__version__}|v{CACHE_VERSION}|{op}|{str(dtype).split('.')[-1]}|N={n}|D={d}|BH<={bh}")


def _read_disk() -> dict:
    global _disk
    if _disk is None:
        try:
            _disk = json.loads(_cache_file().read_text())
        except (OSError, ValueError):
            _disk = {}
    return _disk


def _write_disk(entry: str, cand: Candidate) -> None:
    """Merge one entry into the cache file: a temp file beside it, then os.replace, so a
    reader (another rank, another run) never sees half a file."""
    path = _cache_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            current = json.loads(path.read_text())
        except (OSError, ValueError):
            current = {}
        current[entry] = cand.to_json()
        _read_disk()[entry] = cand.to_json()
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".autotune-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump(current, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only home costs a re-tune next time, nothing more


def choose(op: str, dtype: torch.dtype, n: int, d: int, bh: int, device: torch.device,
           run: Callable[[Candidate], None]) -> Candidate:
    """The candidate for this key: remembered, read from the cache file, or timed now by
    calling run(candidate) (which must launch the op on the real arguments)."""
    key = (op, dtype, n, d, _pow2(bh))
    cand = _chosen.get(key)
    if cand is not None:
        return cand
    if INTERPRET:
        cand = _chosen[key] = heuristic(op, n, d)
        return cand
    if torch.cuda.is_current_stream_capturing():
        return heuristic(op, n, d)
    entry = _disk_key(key, device)
    saved = _read_disk().get(entry)
    if saved is not None:
        cand = Candidate.from_json(saved)
    else:
        cand = _time_candidates(candidates(op, n, d), run)
        _write_disk(entry, cand)
    _chosen[key] = cand
    return cand


def _time_candidates(cands: list[Candidate], run: Callable[[Candidate], None]) -> Candidate:
    best, best_ms = None, float("inf")
    for cand in cands:
        try:
            run(cand)  # compiles; a config that does not fit the chip fails here
            torch.cuda.synchronize()
        except (triton.runtime.errors.OutOfResources, triton.compiler.errors.CompilationError):
            continue
        ms = triton.testing.do_bench(lambda: run(cand), warmup=5, rep=20, return_mode="median")
        if ms < best_ms:
            best, best_ms = cand, ms
    if best is None:
        raise RuntimeError("no flash-attention configuration compiles on this GPU: "
                           f"tried {len(cands)}; use the 'sdpa' or 'naive' attention path")
    return best
