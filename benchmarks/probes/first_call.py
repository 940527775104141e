"""Probe: what the candidates that recent cache versions took off the Hopper lists, and the
tuner's other changes, cost a first call at a new shape.

The tuner compiles and times every listed candidate the first time it meets a shape
(launch.choose). On Hopper, version 15 dropped the 8-warp general backwards at D >= 64 (as
pointer-load candidates and TMA twins) and the two 8-warp TMA-only ones at each D; version 16
dropped the short forwards past one 128-key tile at D >= 64 (launch._short_fwd_cut); each
after the tuner's own timings showed none near the fastest (benchmarks/results/
tuning_spread_large_shapes.md). This probe times the flash op's first forward and first
backward at each shape with the list as it is ("listed") and with earlier versions' lists
put back: "v15" (the short forwards) and "v14" (those and the 8-warp backwards, `v14_extras`).
"one_pass" keeps today's lists but times the tuner's finalists in one pass of CUDA-graph
blocks, as cache version 26 did (launch.GRAPH_PASSES = 1), to show what version 27's second
pass costs. "remade" keeps today's lists but makes each candidate's launches afresh at every
call the tuner makes, as it did before 2dc8b0e (each call then goes through Triton's argument
binding), to show what making them once per tuned shape saves. Each case runs in a fresh
process with an empty tuning cache ($VITFLASH_CACHE_DIR) and an empty Triton compile cache
($TRITON_CACHE_DIR), which is what a new machine pays; the
cases alternate, `--repeats` rounds of them. `--warm-compile` gives every case one compile
cache instead, filled by an untimed first call at each shape: the first call then pays the
tuner's loading and timing without the compiles, so a difference in the timing stands out.

    python benchmarks/probes/first_call.py --shapes 256,12,197,64 --variants listed v15 --repeats 3
    python benchmarks/probes/first_call.py --shapes 256,12,197,64 4,16,4097,128 --variants listed v14
    python benchmarks/probes/first_call.py --shapes 4,16,4097,128 --variants listed one_pass --warm-compile
    python benchmarks/probes/first_call.py --shapes 256,3,65,64 --variants listed remade --warm-compile

Needs a CUDA GPU of compute capability 9 (elsewhere the lists are the same). Writes
<out>/first_call_<gpu>.json and .md; `--render <that json>` prints its tables again anywhere.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from vitflash.ops import flash, flash_attention_qkvpacked, launch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from bench_attention import command_line, environment, spread, write_results  # noqa: E402

VARIANTS = ("listed", "v15", "v14", "one_pass", "remade")
NAMES = ("BLOCK_M1", "BLOCK_N1", "BLOCK_M2", "BLOCK_N2")


def v14_extras(op: str, n: int, d: int) -> list[launch.Candidate]:
    """The backward candidates at (n, d) that cache version 14 listed and 15 does not, on a
    machine with TMA loads: the 8-warp general tile of the head dim's width class, pointer
    and TMA loads (D >= 64 only: below it they are still listed), and the 8-warp
    configurations that were listed with TMA loads only."""
    if op != "bwd" or not (launch.tma_loads() and launch.tma_width(d)):
        return []
    bd = launch.tile_width(d)
    if bd <= 64:
        eight, tma_only = [(64, 128, 128, 64, 8, 3)], [(32, 128, 128, 32, 8, 3), (64, 64, 64, 64, 8, 3)]
    elif bd <= 128:
        eight, tma_only = [(32, 128, 128, 32, 8, 2)], [(64, 64, 64, 64, 8, 2), (64, 64, 64, 64, 8, 3)]
    else:
        return []
    pointer = launch._c("general", NAMES, *eight) if d >= 64 else []
    twins = [launch.Candidate("general_tma", c.blocks, c.num_warps, c.num_stages)
             for c in pointer + launch._c("general", NAMES, *tma_only) if launch.tma_fits(c, d)]
    return pointer + twins


class Remade:
    """A launch made afresh at every call, as the tuner's were before 2dc8b0e: each call goes
    through Triton's argument binding instead of the compiled kernel's launcher."""

    def __init__(self, made: launch.Launch):
        self.made = made

    def __getattr__(self, name: str):
        return getattr(self.made, name)

    def __call__(self, *args) -> None:
        m = self.made
        launch.Launch(m.kernel, m.grid, m.consts, m.num_warps, m.num_stages, m.n_tensors,
                      m.options.get("maxnreg", 0))(*args)


def remake_launches() -> None:
    """Make flash's plans (this process only) of launches that are made afresh at each call."""
    for name in ("_fwd_launches", "_bwd_launches"):
        make = getattr(flash, name)
        setattr(flash, name, lambda *a, _make=make, **k: [Remade(x) for x in _make(*a, **k)])


def use_list(variant: str) -> None:
    """Make launch.candidates list an earlier version's candidates (this process only): "v15"
    puts back the short forwards past 128 keys, "v14" those and version 14's backwards;
    "one_pass" keeps the lists and times the finalists in one pass (launch.GRAPH_PASSES);
    "remade" keeps them and makes each launch afresh at every call (remake_launches)."""
    if variant == "listed":
        return
    if variant == "one_pass":
        launch.GRAPH_PASSES = 1
        return
    if variant == "remade":
        remake_launches()
        return
    launch._short_fwd_cut = lambda n, d: False
    if variant == "v15":
        return
    listed = launch.candidates

    def candidates(op: str, n: int, d: int, bh: int = 1) -> list[launch.Candidate]:
        out = listed(op, n, d, bh)
        return out + [c for c in v14_extras(op, n, d) if c not in out]

    launch.candidates = candidates


def child(shape: tuple[int, int, int, int], variant: str) -> dict:
    """One first forward and backward of the flash op at shape (B, H, N, D), bf16, in this
    process: seconds each, the candidates listed and the ones chosen."""
    use_list(variant)
    B, H, N, D = shape
    qkv = torch.randn(B, N, 3, H, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    do = torch.randn(B, N, H, D, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    o = flash_attention_qkvpacked(qkv)
    torch.cuda.synchronize()
    t1 = time.perf_counter()
    o.backward(do)
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    row = {"shape": list(shape), "variant": variant, "fwd_s": t1 - t0, "bwd_s": t2 - t1}
    for op in ("fwd", "bwd"):
        row[f"{op}_candidates"] = len(launch.candidates(op, N, D, B * H))
        chosen = launch.chosen(op, torch.bfloat16, N, D, B * H)
        row[f"{op}_chosen"] = chosen.label() if chosen is not None else None
    return row


def run_child(shape: tuple[int, int, int, int], variant: str, compiled: str | None = None) -> dict:
    """child() in a fresh process with an empty tuning cache, and an empty compile cache
    unless `compiled` names one to use (--warm-compile)."""
    with tempfile.TemporaryDirectory() as tune, tempfile.TemporaryDirectory() as empty:
        env = dict(os.environ, VITFLASH_CACHE_DIR=tune, TRITON_CACHE_DIR=compiled or empty)
        out = subprocess.run([sys.executable, __file__, "--child", ",".join(map(str, shape)),
                              "--variant", variant], env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"the first call at {shape} ({variant}) failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def summarize(rows: list[dict]) -> list[dict]:
    """One row per (shape, variant): candidate counts, the chosen forward(s) and
    backward(s), and the median and min-max of the first forward's and backward's seconds."""
    out = []
    for shape in dict.fromkeys(tuple(r["shape"]) for r in rows):
        for variant in VARIANTS:
            mine = [r for r in rows if tuple(r["shape"]) == shape and r["variant"] == variant]
            if not mine:
                continue
            out.append({"shape": list(shape), "variant": variant,
                        "fwd_candidates": mine[0]["fwd_candidates"],
                        "bwd_candidates": mine[0]["bwd_candidates"],
                        "fwd_chosen": sorted({r["fwd_chosen"] for r in mine if r.get("fwd_chosen")}),
                        "bwd_chosen": sorted({r["bwd_chosen"] for r in mine if r["bwd_chosen"]}),
                        "fwd_s": spread([r["fwd_s"] for r in mine]),
                        "bwd_s": spread([r["bwd_s"] for r in mine])})
    return out


def _s(x: dict) -> str:
    return f"{x['median']:.2f} ({x['min']:.2f}-{x['max']:.2f})"


def markdown(summary: list[dict], env: dict, command: str) -> str:
    lines = [f"# First call at a new shape: today's candidate lists against earlier versions' ({env['gpu']})",
             "",
             f"`{command}`; commit {env['commit']}, torch {env['torch']}, triton {env['triton']}, "
             f"{env['date']}. Each case in a fresh process with an empty tuning cache and "
             + ("one compile cache that an untimed first call at each shape filled (--warm-compile)"
                if env.get("warm_compile") else "an empty compile cache")
             + f"; seconds, median (min-max) of {env['repeats']}. v15: the short forwards past 128 "
             "keys put back; v14: those and the 8-warp general backwards; one_pass: the finalists "
             "timed in one pass of blocks; remade: each launch made afresh at every call the tuner "
             "makes (before 2dc8b0e).",
             "",
             "| shape (B, H, N, D) | list | fwd / bwd candidates | first forward, s | first backward, s | "
             "forward chosen | backward chosen |",
             "|---|---|---|---|---|---|---|"]
    for r in summary:
        lines.append(f"| {tuple(r['shape'])} | {r['variant']} | {r['fwd_candidates']} / {r['bwd_candidates']} | "
                     f"{_s(r['fwd_s'])} | {_s(r['bwd_s'])} | {'; '.join(r['fwd_chosen'])} | "
                     f"{'; '.join(r['bwd_chosen'])} |")
    lines += ["", "| shape | list | forward: list - listed, s | backward: list - listed, s | listed / list, "
              "forward | listed / list, backward |", "|---|---|---|---|---|---|"]
    for shape in dict.fromkeys(tuple(r["shape"]) for r in summary):
        mine = {r["variant"]: r for r in summary if tuple(r["shape"]) == shape}
        if "listed" not in mine:
            continue
        f, b = (mine["listed"][k]["median"] for k in ("fwd_s", "bwd_s"))
        for variant, r in mine.items():
            if variant != "listed":
                f2, b2 = (r[k]["median"] for k in ("fwd_s", "bwd_s"))
                lines.append(f"| {shape} | {variant} | {f2 - f:+.2f} | {b2 - b:+.2f} | {f / f2:.2f} | {b / b2:.2f} |")
    return "\n".join(lines) + "\n"


def _shape(text: str) -> tuple[int, int, int, int]:
    try:
        B, H, N, D = (int(x) for x in text.split(","))
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"{text!r}: a shape is B,H,N,D, e.g. 256,12,197,64") from err
    return B, H, N, D


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", type=_shape, nargs="+", default=[(256, 12, 197, 64), (4, 16, 4097, 128)])
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=["listed", "v15"],
                        help="the lists to time: listed (today's), v15, v14, one_pass, remade")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warm-compile", action="store_true",
                        help="one compile cache for every case, filled by an untimed first call "
                             "at each shape: the tuner's timing without the compiles")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--render", type=Path, metavar="JSON",
                        help="print the tables of a result file this probe wrote, again (no GPU needed)")
    parser.add_argument("--child", type=_shape, help=argparse.SUPPRESS)
    parser.add_argument("--variant", choices=VARIANTS, default="listed", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.render:
        saved = json.loads(args.render.read_text())
        print(markdown(summarize(saved["results"]["runs"]), saved["environment"], saved["command"]), end="")
        return
    if not torch.cuda.is_available():
        sys.exit("first_call.py needs a CUDA GPU: it times the flash op's first call.")
    if args.child:
        print(json.dumps(child(args.child, args.variant)))
        return
    if not launch.tma_loads():
        sys.exit("first_call.py compares lists that differ only where TMA loads exist (compute "
                 "capability 9 or newer); on this GPU they are the same.")
    env, command = environment(), command_line()
    env["repeats"], env["warm_compile"] = args.repeats, args.warm_compile
    with tempfile.TemporaryDirectory() as compiled:
        if args.warm_compile:
            for shape in args.shapes:
                run_child(shape, "listed", compiled)
        rows = _rounds(args, compiled if args.warm_compile else None)
    summary = summarize(rows)
    table = markdown(summary, env, command)
    write_results(args.out, "first_call", env, command, {"runs": rows, "summary": summary}, table)
    print(table, end="")


def _rounds(args: argparse.Namespace, compiled: str | None) -> list[dict]:
    """--repeats rounds over the shapes and variants, every other round in reverse order."""
    rows = []
    for r in range(args.repeats):
        for shape in args.shapes:
            for variant in (args.variants if r % 2 == 0 else args.variants[::-1]):
                rows.append(run_child(shape, variant, compiled))
                print(f"{tuple(shape)} {variant}: forward {rows[-1]['fwd_s']:.2f} s, backward "
                      f"{rows[-1]['bwd_s']:.2f} s ({rows[-1]['fwd_candidates']} / "
                      f"{rows[-1]['bwd_candidates']} candidates)", flush=True)
    return rows


if __name__ == "__main__":
    main()
