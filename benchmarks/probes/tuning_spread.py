"""Probe: which autotuning candidates ever came near the best, from the tuner's own timings.

`scripts/bench_attention.py` keeps, per shape, what the tuner measured for every candidate
(`tuning_ms` in its JSON). This reads any number of those files and prints, per op, each
candidate's best ratio to the fastest candidate of the same (file, shape), over all of them:
1.00 means it won somewhere. Candidates that never come within a few percent are what a
shorter list would drop, and the first call at a new shape compiles every one of them.

    python benchmarks/probes/tuning_spread.py benchmarks/results/gpu_session_*/run*/attn_small/*.json

`--by-head-dim` gives a table per op and head dim (the candidate lists differ by head dim).

`--twins BLOCK` compares the twins that carry the block BLOCK (e.g. TAIL_AHEAD) with the
candidates they are twins of (the same blocks without it), at each (file, shape): the spread
of twin / candidate over the pairs timed, and the fastest twin against the fastest candidate
without the block:

    python benchmarks/probes/tuning_spread.py --twins LAZY benchmarks/results/gpu_session_b7a82e1/run1/attn_large/*.json

`--against-bench` sets the tuner's time (in its short windows) of the candidate it chose
(its fastest there, or the fastest finalist in CUDA-graph replays where it timed them) beside the
benchmark's own time of the same op at the same shape, in the same run: the forward, and the
backward as forward+backward less forward. A ratio above 1 means the benchmark's timer
(`--timer graph`: replays that keep the GPU busy for a whole window) measured the chosen
kernel slower than the tuner's short windows did:

    python benchmarks/probes/tuning_spread.py --against-bench benchmarks/results/gpu_session_b7a82e1/run*/attn_*/*.json

Runs on any machine: it reads JSON only.
"""
from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
from pathlib import Path

from vitflash.ops import launch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from bench_attention import tuner_choice  # noqa: E402

# the blocks that tell candidates apart (the tail tiles follow from N and BLOCK_T = 1 from the twin)
KEYS = ("BLOCK_M", "BLOCK_N", "HEADS", "STAGES", "BLOCK_M1", "BLOCK_N1", "BLOCK_M2", "BLOCK_N2", "SPLIT",
        "WARPS2", "STAGES2")


def name(cand: dict) -> str:
    """A candidate as one short string: launch.Candidate.label of its KEYS blocks (the same
    at every N), "one-key" for a one-key-tail twin."""
    blocks = cand["blocks"]
    one_key = " one-key" if blocks.get("BLOCK_T") == 1 and blocks.get("HAS_TAIL") else ""
    kept = tuple((k, blocks[k]) for k in KEYS if k in blocks)
    return launch.Candidate(cand["family"], kept, cand["num_warps"], cand["num_stages"],
                            cand.get("maxnreg", 0)).label() + one_key


def spread(files: list[Path], by_head_dim: bool = False) -> dict[str, dict[str, tuple[float, int]]]:
    """op -> candidate name -> (its best ratio to the fastest of its shape, shapes it was timed
    at); with by_head_dim, "op, D = d" -> ...: a table per head dim, whose lists differ."""
    best: dict[str, dict[str, float]] = collections.defaultdict(dict)
    seen: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for f in files:
        for row in json.loads(f.read_text())["results"]["shapes"]:
            for op, timed in (row.get("flash", {}).get("tuning_ms") or {}).items():
                if by_head_dim:
                    op = f"{op}, D = {row['shape'][3]}"
                fastest = min(t["ms"] for t in timed)
                for t in timed:
                    key = name(t["candidate"])
                    best[op][key] = min(best[op].get(key, float("inf")), t["ms"] / fastest)
                    seen[op][key] += 1
    return {op: {k: (r, seen[op][k]) for k, r in ratios.items()} for op, ratios in best.items()}


def twins(files: list[Path], block: str) -> list[dict]:
    """Per (file, shape, op) where twins with `block` were timed: the ratios of each twin's
    time to its candidate's (the same family, blocks, warps and stages without `block`), and
    the fastest twin's time over the fastest of the candidates without the block."""
    rows = []
    for f in files:
        for row in json.loads(f.read_text())["results"]["shapes"]:
            for op, timed in (row.get("flash", {}).get("tuning_ms") or {}).items():
                plain, twin = {}, {}
                for t in timed:
                    c = t["candidate"]
                    blocks = dict(c["blocks"])
                    has = bool(blocks.pop(block, 0))
                    key = (c["family"], tuple(sorted(blocks.items())), c["num_warps"], c["num_stages"],
                           c.get("maxnreg", 0))
                    (twin if has else plain)[key] = t["ms"]
                ratios = sorted(twin[k] / plain[k] for k in twin if k in plain)
                if ratios:
                    rows.append(dict(file=str(f), shape=row["shape"], op=op, ratios=ratios,
                                     best=min(twin.values()) / min(plain.values())))
    return rows


def against_bench(files: list[Path]) -> list[dict]:
    """Per (file, shape) whose run tuned both ops: the tuner's time (short windows) of the
    forward and of the backward it kept (bench_attention.tuner_choice) and the benchmark's
    time of the same ops (the backward as forward+backward less forward), in ms, the
    benchmark's forward TFLOP/s and cuDNN's forward ms where the run has them, and the
    forward kept and the fastest other one in the windows (its time over the kept one's)."""
    rows = []
    for f in files:
        for row in json.loads(f.read_text())["results"]["shapes"]:
            flash = row.get("flash", {})
            timed = flash.get("tuning_ms") or {}
            if not (timed.get("fwd") and timed.get("bwd") and "fwd_ms" in flash):
                continue
            kept = tuner_choice(timed["fwd"])  # the fastest unless graph replays re-ranked
            fwd = [kept] + sorted((t for t in timed["fwd"] if t is not kept), key=lambda t: t["ms"])
            rows.append(dict(file=str(f), shape=row["shape"],
                             fwd_tuner=fwd[0]["ms"], fwd_bench=flash["fwd_ms"],
                             fwd_first=name(fwd[0]["candidate"]),
                             fwd_second=name(fwd[1]["candidate"]) if len(fwd) > 1 else None,
                             fwd_second_ratio=fwd[1]["ms"] / fwd[0]["ms"] if len(fwd) > 1 else None,
                             bwd_tuner=tuner_choice(timed["bwd"])["ms"],
                             bwd_bench=flash["fwd_bwd_ms"] - flash["fwd_ms"],
                             fwd_tflops=flash.get("fwd_tflops"),
                             cudnn_fwd=row.get("sdpa_cudnn", {}).get("fwd_ms")))
    return rows


def by_choice(rows: list[dict]) -> list[dict]:
    """against_bench's rows grouped by (shape, the forward the tuner chose): how many runs
    chose it, the spread of benchmark / tuner over them, and the benchmark's forward TFLOP/s
    (median, min, max) and cuDNN's forward ms (min, max) in those runs."""
    groups: dict[tuple, list[dict]] = collections.defaultdict(list)
    for r in rows:
        groups[tuple(r["shape"]), r["fwd_first"]].append(r)
    out = []
    for (shape, chosen), rs in groups.items():
        ratios = [r["fwd_bench"] / r["fwd_tuner"] for r in rs]
        tflops = [r["fwd_tflops"] for r in rs if r["fwd_tflops"]]
        cudnn = [r["cudnn_fwd"] for r in rs if r["cudnn_fwd"]]
        out.append(dict(shape=list(shape), chosen=chosen, runs=len(rs), ratio=(min(ratios), max(ratios)),
                        tflops=(statistics.median(tflops), min(tflops), max(tflops)) if tflops else None,
                        cudnn_fwd=(min(cudnn), max(cudnn)) if cudnn else None))
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("files", nargs="+", type=Path, help="bench_attention.py JSON files")
    p.add_argument("--within", type=float, nargs="+", default=[1.05, 1.10, 1.25],
                   help="ratios to count the candidates under")
    p.add_argument("--by-head-dim", action="store_true", help="a table per op and head dim")
    p.add_argument("--twins", metavar="BLOCK",
                   help="compare the twins with this block (e.g. TAIL_AHEAD) with their candidates")
    p.add_argument("--against-bench", action="store_true",
                   help="the tuner's time of its choice beside the benchmark's time of the same op")
    args = p.parse_args(argv)
    if args.against_bench:
        print("| file | shape | fwd: tuner ms | bench ms | bench / tuner | fwd TFLOP/s (bench) "
              "| cuDNN fwd ms (bench) | bwd: tuner ms | bench ms | bench / tuner | fwd chosen "
              "| tuner's second (its time / the chosen's) |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for r in against_bench(args.files):
            tflops = f"{r['fwd_tflops']:.0f}" if r["fwd_tflops"] else "n/a"
            cudnn = f"{r['cudnn_fwd']:.3f}" if r["cudnn_fwd"] else "n/a"
            second = f"{r['fwd_second']} ({r['fwd_second_ratio']:.3f})" if r["fwd_second"] else "n/a"
            print(f"| {r['file']} | {tuple(r['shape'])} | {r['fwd_tuner']:.3f} | {r['fwd_bench']:.3f} | "
                  f"{r['fwd_bench'] / r['fwd_tuner']:.3f} | {tflops} | {cudnn} | {r['bwd_tuner']:.3f} | "
                  f"{r['bwd_bench']:.3f} | {r['bwd_bench'] / r['bwd_tuner']:.3f} | {r['fwd_first']} | {second} |")
        print("\nBy shape and the forward the tuner chose:\n")
        print("| shape | fwd chosen | runs | bench / tuner | fwd TFLOP/s (bench): median (min-max) "
              "| cuDNN fwd ms (bench) |")
        print("|---|---|---|---|---|---|")
        for g in by_choice(against_bench(args.files)):
            t, c = g["tflops"], g["cudnn_fwd"]
            print(f"| {tuple(g['shape'])} | {g['chosen']} | {g['runs']} | {g['ratio'][0]:.2f}-{g['ratio'][1]:.2f}x | "
                  + (f"{t[0]:.0f} ({t[1]:.0f}-{t[2]:.0f})" if t else "n/a") + " | "
                  + (f"{c[0]:.3f}-{c[1]:.3f}" if c else "n/a") + " |")
        return
    if args.twins:
        print(f"| file | shape | op | pairs | {args.twins} twin / its candidate: min | median | max "
              f"| fastest twin / fastest without |")
        print("|---|---|---|---|---|---|---|---|")
        for r in twins(args.files, args.twins):
            q = r["ratios"]
            print(f"| {r['file']} | {tuple(r['shape'])} | {r['op']} | {len(q)} | {q[0]:.3f} | "
                  f"{statistics.median(q):.3f} | {q[-1]:.3f} | {r['best']:.3f} |")
        return
    for op, table in sorted(spread(args.files, args.by_head_dim).items()):
        counts = ", ".join(f"{sum(r <= w for r, _ in table.values())} within {w:.2f}x" for w in args.within)
        print(f"\n{op}: {len(table)} candidates timed over {len(args.files)} files; {counts} of the best somewhere\n")
        print("| candidate | best ratio to the fastest | shapes timed |")
        print("|---|---|---|")
        for key, (ratio, n) in sorted(table.items(), key=lambda kv: kv[1][0]):
            print(f"| {key} | {ratio:.3f} | {n} |")


if __name__ == "__main__":
    main()
