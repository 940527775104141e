"""Probe: the general backward's two kinds of program timed apart, over a grid of tiles, warps
and stages for each, to find the best pair of a split candidate (launch.split_twins; a split
candidate may give its dQ launch other tiles, warps and stages than its dK/dV launch).

A split backward is two launches: the dQ programs (PART = 2: a program per query tile of
BLOCK_M2 queries, looping over key tiles of BLOCK_N2), which also compute delta for their rows,
then the dK/dV programs (PART = 1: a program per key tile of BLOCK_N1 keys, looping over query
tiles of BLOCK_M1), which read it. The two parts write disjoint parts of dqkv, and delta is
computed once here before any part runs, so each can be timed alone, and the best split pair
is the best of each. This probe times every configuration of each
part's grid alone at each shape, checks what each wrote against the one-launch heuristic
candidate's result (launch._disagreement: rounding alone), then times whole: the tuner's
choice among the listed candidates, and the best pair as one split candidate.

    python benchmarks/probes/bwd_parts.py --shapes 256,12,197,64 8,12,4097,64 4,16,4097,128

--warps and --stages set the grid's warps and pipeline stages (default 4 and 8 warps, 2 and 3
stages), e.g. `--warps 4 --stages 3 4 5` for deeper pipelines of the streamed tiles. --maxnreg
adds register caps per thread to the dK/dV grid (0: the compiler's choice, the default alone),
e.g. `--maxnreg 0 168`: 3 programs of 4 warps an SM instead of 2, for the spills that
`benchmarks/probes/registers.py --op bwd_general --maxnreg 0,168` lists; a pair whose dK/dV
part is capped carries the cap to both of its launches.

Times are launch._time_ms (CUDA events, a sleeping kernel ahead of each window so that the
GPU time is measured, not the host's), `--repeats` times: median (min-max) ms. Needs a CUDA
GPU. Writes <out>/bwd_parts_<gpu>.json and .md after every shape.

`--compare NAME=JSON ...` (no GPU needed) sets the result files of several runs side by side,
e.g. the same command on the kernels of several commits: per shape, each run's whole backward
(the tuner's choice), its fastest dK/dV and dQ launches and its delta launch.

    python benchmarks/probes/bwd_parts.py --compare main=a/bwd_parts_nvidia_h200.json tails=b/bwd_parts_nvidia_h200.json
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import torch

from vitflash.ops import flash as flash_mod
from vitflash.ops import kernels, launch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from bench_attention import command_line, environment, result_stem, spread  # noqa: E402

NAMES = ("BLOCK_M1", "BLOCK_N1", "BLOCK_M2", "BLOCK_N2")
# (queries, keys) of a part's tile: dK/dV's (BLOCK_M1, BLOCK_N1), dQ's (BLOCK_M2, BLOCK_N2)
DKDV_TILES = ((16, 64), (16, 128), (32, 64), (32, 128), (64, 64), (64, 128))
DQ_TILES = ((64, 16), (64, 32), (64, 64), (128, 16), (128, 32), (128, 64))


def part_candidate(part: int, tile: tuple[int, int], warps: int, stages: int,
                   family: str = "general_tma", maxnreg: int = 0) -> launch.Candidate:
    """A split candidate whose `part` (1: dK/dV, 2: dQ) has this tile, warps, stages and
    register cap; the other part mirrors it, as a one-launch candidate's would."""
    a, b = tile
    tiles = (a, b, b, a) if part == 1 else (b, a, a, b)
    return launch.Candidate(family, (*zip(NAMES, tiles), ("SPLIT", 1)), warps, stages, maxnreg)


def pair_candidate(dkdv: launch.Candidate, dq: launch.Candidate) -> launch.Candidate:
    """The split candidate of dkdv's dK/dV part and dq's dQ part (both part_candidate's)."""
    m1, n1 = dkdv.meta["BLOCK_M1"], dkdv.meta["BLOCK_N1"]
    m2, n2 = dq.meta["BLOCK_M2"], dq.meta["BLOCK_N2"]
    blocks = (*zip(NAMES, (m1, n1, m2, n2)), ("SPLIT", 1))
    if (dq.num_warps, dq.num_stages) != (dkdv.num_warps, dkdv.num_stages):
        blocks += (("WARPS2", dq.num_warps), ("STAGES2", dq.num_stages))
    return launch.Candidate(dkdv.family, blocks, dkdv.num_warps, dkdv.num_stages, dkdv.maxnreg)


def grid(part: int, families: tuple[str, ...], warps=(4, 8), stages=(2, 3),
         caps=(0,)) -> list[launch.Candidate]:
    """Part `part`'s configurations; the register caps `caps` for the dK/dV part only (the dQ
    programs take 90-160 registers uncapped)."""
    tiles = DKDV_TILES if part == 1 else DQ_TILES
    caps = caps if part == 1 else (0,)
    return [part_candidate(part, t, w, s, f, r)
            for f, t, w, s, r in itertools.product(families, tiles, warps, stages, caps)]


def label(c: launch.Candidate, part: int | None = None) -> str:
    """A part's configuration (part 1: dK/dV's tile, 2: dQ's), or a whole candidate's (part
    None: Candidate.label)."""
    if part is None:
        return c.label()
    names = NAMES[:2] if part == 1 else NAMES[2:]
    own = tuple((k, c.meta[k]) for k in names)
    return launch.Candidate(c.family, own, c.num_warps, c.num_stages, c.maxnreg).label()


class Shape:
    """The tensors of one shape and runners of a backward's launches on them."""

    def __init__(self, B: int, H: int, N: int, D: int, ref: launch.Candidate):
        self.B, self.H, self.N, self.D = B, H, N, D
        gen = torch.Generator(device="cuda").manual_seed(N + D)
        self.qkv = torch.randn(B, N, 3, H, D, device="cuda", dtype=torch.bfloat16, generator=gen)
        self.do = torch.randn(B, N, H, D, device="cuda", dtype=torch.bfloat16, generator=gen)
        self.scale = D ** -0.5
        self.o, self.lse = flash_mod._forward(self.qkv, self.scale)
        self.dqkv = torch.zeros_like(self.qkv)
        self.delta = torch.empty_like(self.lse)
        self.launches(ref)[0](self.o, self.do, self.delta, H, N)

    def launches(self, c: launch.Candidate) -> list:
        return flash_mod._bwd_launches(c, self.B, self.N, self.H, self.D)

    def part(self, c: launch.Candidate, part: int):
        """The launch of PART `part` (1: dK/dV, 2: dQ) of split candidate c."""
        return next(p for p in self.launches(c) if p.consts.get("PART") == part)

    def run_part(self, part_launch) -> None:
        part_launch(self.qkv, self.o, self.do, self.lse, self.delta, self.dqkv, self.lse,
                    *flash_mod._bwd_descriptors(part_launch, self.qkv, self.do),
                    self.scale * flash_mod.LOG2E, self.scale, 0.0, self.B * self.H, self.H, self.N)

    def run_whole(self, c: launch.Candidate) -> None:
        """c's launches as flash._backward runs them: delta's launch first, if it has one (a
        split candidate computes delta in its dQ launch)."""
        for p in self.launches(c):
            if p.kernel is kernels.bwd_delta_kernel:
                p(self.o, self.do, self.delta, self.H, self.N)
            else:
                self.run_part(p)


def time_spread(fn, repeats: int) -> dict:
    return spread([launch._time_ms(fn) for _ in range(repeats)])


def probe_shape(shape: tuple[int, int, int, int], families: tuple[str, ...], repeats: int,
                warps: tuple[int, ...] = (4, 8), stages: tuple[int, ...] = (2, 3),
                caps: tuple[int, ...] = (0,)) -> dict:
    B, H, N, D = shape
    # the listed general candidates (the short backward, one launch of another kernel, is
    # not listed at the lengths this probe is for); the reference: the first one-launch one
    listed = [c for c in launch.candidates("bwd", N, D, B * H) if c.family in ("general", "general_tma")]
    ref_c = next(c for c in listed if not c.meta.get("SPLIT"))
    s = Shape(B, H, N, D, ref_c)
    s.run_whole(ref_c)
    ref = s.dqkv.clone()
    row = {"shape": list(shape), "parts": {1: [], 2: []}}
    for part in (1, 2):
        cands = grid(part, families, warps, stages, caps)
        runs = {c: s.part(c, part) for c in cands}
        launch._compile_all(cands, lambda c: s.run_part(runs[c]))
        sl = slice(1, 3) if part == 1 else slice(0, 1)  # dK, dV or dQ of dqkv
        for c in cands:
            entry = {"candidate": c.to_json(), "label": label(c, part)}
            try:
                s.dqkv.zero_()
                s.run_part(runs[c])
                torch.cuda.synchronize()
                off = launch._disagreement((s.dqkv[:, :, sl],), (ref[:, :, sl],))
                if off > 1:
                    entry["error"] = f"disagrees with {label(ref_c)} by {off:.3g}x the bound"
                else:
                    entry["ms"] = time_spread(lambda: s.run_part(runs[c]), repeats)
            except launch.UNFIT as err:
                entry["error"] = launch.error_line(err)
            row["parts"][part].append(entry)
            print(shape, part, entry["label"], entry.get("ms", {}).get("median"), entry.get("error"),
                  flush=True)
    row["delta_ms"] = time_spread(lambda: s.launches(ref_c)[0](s.o, s.do, s.delta, H, N), repeats)
    best = {p: min((e for e in row["parts"][p] if "ms" in e), key=lambda e: e["ms"]["median"])
            for p in (1, 2)}
    pair = pair_candidate(*(launch.Candidate.from_json(best[p]["candidate"]) for p in (1, 2)))
    # the tuner's choice among the listed general candidates, timed by the tuner
    times: dict = {}
    chosen = launch._time_candidates(listed, s.run_whole, times)
    row["listed"] = [{"label": label(c), "ms": ms} for c, ms in sorted(times.items(), key=lambda t: t[1])]
    row["whole"] = {}
    for name, c in (("tuner's choice", chosen), ("best pair", pair)):
        s.run_whole(c)
        torch.cuda.synchronize()
        off = launch._disagreement((s.dqkv,), (ref,))
        row["whole"][name] = {"label": label(c), "candidate": c.to_json(),
                              "ms": time_spread(lambda: s.run_whole(c), repeats), "disagreement": off}
    return row


def _ms(t: dict) -> str:
    """A time spread as the tables print it: median (min-max), ms."""
    return f"{t['median']:.3f} ({t['min']:.3f}-{t['max']:.3f})"


def markdown(rows: list[dict], env: dict, command: str, top: int = 6) -> str:
    lines = [f"# The general backward's parts timed apart on {env['gpu']}", "",
             f"Command: `{command}`", "",
             f"Commit {env['commit']}; torch {env['torch']}, triton {env['triton']}, CUDA "
             f"{env['cuda']}; {env['date']}. bf16, no dropout. Each time: `launch._time_ms` "
             f"(CUDA events, GPU time) {env['repeats']} times, median (min-max) ms. A part's time "
             "is its launch alone; a whole time is all of a candidate's launches (split: its dQ "
             "launch, which computes delta, then its dK/dV launch; one launch: delta's, then its "
             "own). The delta launch is timed alone too. Each part's "
             f"grid: tiles {', '.join(f'{a}x{b}' for a, b in DKDV_TILES)} (dK/dV; dQ's mirrored), "
             f"warps {env.get('warps', [4, 8])}, stages {env.get('stages', [2, 3])}, dK/dV register "
             f"caps {env.get('maxnreg', [0])} (0: none).", ""]
    for r in rows:
        lines += [f"## {tuple(r['shape'])}", ""]
        for name, w in r["whole"].items():
            t = w["ms"]
            lines.append(f"- whole, {name}: {w['label']}: {_ms(t)} ms")
        d = r["delta_ms"]
        lines += [f"- delta launch: {d['median']:.3f} ms", ""]
        for part, what in ((1, "dK/dV launch"), (2, "dQ launch")):
            ok = sorted((e for e in r["parts"][part] if "ms" in e), key=lambda e: e["ms"]["median"])
            bad = [e for e in r["parts"][part] if "ms" not in e]
            lines += [f"{what}, the {min(top, len(ok))} fastest of {len(ok)} timed ({len(bad)} failed):", "",
                      "| configuration | ms |", "|---|---|"]
            lines += [f"| {e['label']} | {_ms(e['ms'])} |"
                      for e in ok[:top]]
            lines.append("")
            lines += [f"- failed: {e['label']}: {e['error']}" for e in bad]
            if bad:
                lines.append("")
        lines += ["The tuner's timings of the listed candidates (each one's better round), ms:", "",
                  "| candidate | ms |", "|---|---|"]
        lines += [f"| {e['label']} | {e['ms']:.3f} |" for e in r["listed"]]
        lines.append("")
    return "\n".join(lines) + "\n"


def parse_shape(text: str) -> tuple[int, int, int, int]:
    parts = tuple(int(x) for x in text.split(","))
    if len(parts) != 4:
        raise argparse.ArgumentTypeError(f"{text!r}: a shape is B,H,N,D, e.g. 256,12,197,64")
    return parts


def compare(runs: dict[str, dict]) -> str:
    """Markdown: the result files `runs` (name: the JSON a run wrote) side by side, per shape
    that the first run timed: each run's whole backward (the tuner's choice, its label), its
    fastest dK/dV and dQ launches, and the delta kernel timed alone, ms; "-" where a run lacks
    the shape. (Whether the whole time includes a delta launch depends on the run's kernels:
    the split candidate of a commit that computes delta in its dQ launch has none.)"""
    first = next(iter(runs.values()))
    lines = ["# The general backward's parts, runs side by side", "",
             "| run | commit | date | command |", "|---|---|---|---|"]
    lines += [f"| {name} | {r['environment'].get('commit')} | {r['environment'].get('date')} | `{r['command']}` |"
              for name, r in runs.items()]
    for shape in (row["shape"] for row in first["results"]):
        lines += ["", f"## {tuple(shape)}", "",
                  "| run | whole, tuner's choice (ms) | its candidate | fastest dK/dV (ms) | fastest dQ (ms) "
                  "| delta kernel alone (ms) |",
                  "|---|---|---|---|---|---|"]
        for name, r in runs.items():
            row = next((x for x in r["results"] if x["shape"] == shape), None)
            if row is None:
                lines.append(f"| {name} | - | - | - | - | - |")
                continue
            tuned = row["whole"]["tuner's choice"]
            fastest = [min((e for e in row["parts"][p] if "ms" in e), key=lambda e: e["ms"]["median"], default=None)
                       for p in ("1", "2")]
            cells = [f"{_ms(e['ms'])}, {e['label']}" if e else "-" for e in fastest]
            lines.append(f"| {name} | {_ms(tuned['ms'])} | {tuned['label']} | {cells[0]} | {cells[1]} "
                         f"| {row['delta_ms']['median']:.3f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", nargs="+", type=parse_shape,
                   default=[(256, 12, 197, 64), (64, 12, 577, 64), (8, 12, 4097, 64), (4, 16, 4097, 128)])
    p.add_argument("--families", nargs="+", default=["general_tma"], choices=["general", "general_tma"])
    p.add_argument("--warps", nargs="+", type=int, default=[4, 8], help="the grid's warps")
    p.add_argument("--stages", nargs="+", type=int, default=[2, 3], help="the grid's pipeline stages")
    p.add_argument("--maxnreg", nargs="+", type=int, default=[0],
                   help="register caps per thread for the dK/dV grid (0: none)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, default=Path("."))
    p.add_argument("--compare", nargs="+", metavar="NAME=JSON",
                   help="print result files of several runs side by side and exit (no GPU needed)")
    args = p.parse_args(argv)
    if args.compare:
        runs = {}
        for item in args.compare:
            name, sep, path = item.partition("=")
            if not sep or not name:
                raise SystemExit(f"--compare takes NAME=JSON, got {item!r}")
            runs[name] = json.loads(Path(path).read_text())
        print(compare(runs), end="")
        return
    if not torch.cuda.is_available():
        raise SystemExit("bwd_parts.py times kernels on a CUDA GPU; none is visible here")
    if "general_tma" in args.families and not launch.tma_loads():
        raise SystemExit("--families general_tma needs TMA loads (a Hopper GPU or newer); "
                         "pass --families general")
    env = {**environment(), "repeats": args.repeats, "warps": args.warps, "stages": args.stages,
           "maxnreg": args.maxnreg}
    command = command_line()
    stem = args.out / result_stem("bwd_parts", env)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for shape in args.shapes:
        rows.append(probe_shape(shape, tuple(args.families), args.repeats, tuple(args.warps),
                                tuple(args.stages), tuple(args.maxnreg)))
        stem.with_suffix(".json").write_text(json.dumps(
            {"command": command, "environment": env, "results": rows}, indent=1, default=str))
        stem.with_suffix(".md").write_text(markdown(rows, env, command))


if __name__ == "__main__":
    main()
