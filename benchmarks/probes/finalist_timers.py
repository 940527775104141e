"""Probe: the tuner's forward finalists under every timer that has ranked them.

The tuner times every candidate in short windows (`launch._time_ms`), then its finalists
again in CUDA-graph replays (`launch._graph_times`: a graph of about 20 ms of calls each,
replayed back to back; at commit 74019cb the finalists' replays took turns, one of each
after the other), and keeps the fastest there. `scripts/bench_attention.py
--timer graph` times the op with `triton.testing.do_bench_cudagraph` (a graph of about 100 ms
of calls, replayed 10 times with a synchronization between). At some shapes the two have
ranked the same kernels differently. This probe sets, for each finalist at each shape:

- `windows`: the tuner's short windows on the bare launch (median of the repeats);
- `graph_timer`: `launch._graph_times` over all the finalists, on the bare launch (at
  74019cb, in turns: the column `graph_turns` of that commit's results);
- `bench_op`: the benchmark's timer on the op as a user calls it (`flash_attention_qkvpacked`
  with the finalist forced, its output allocated per call, autograd recording: the inputs
  require grad, as in the benchmark);
- `bench_bare`: the benchmark's timer on the bare launch (one preallocated output);
- `sustained`: the bare launch's graph replayed back to back for `--sustain-s` seconds: the
  median ms per call of the first five replays and of the last twenty.

    python benchmarks/probes/finalist_timers.py --shapes 4,16,4097,128 8,12,4097,64

Needs a CUDA GPU. Writes <out>/finalist_timers_<gpu>.json and .md.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch
import triton

from vitflash.ops import flash as flash_mod
from vitflash.ops import flash_attention_qkvpacked, launch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from bench_attention import command_line, environment, parse_shape, write_results  # noqa: E402
from sweep_configs import _forced, _restore  # noqa: E402


def _bare(qkv: torch.Tensor):
    """The bare launch of the forward plan the op made last (one preallocated o and LSE)."""
    B, N, _, H, D = qkv.shape
    (plan,) = flash_mod._plans.values()
    (step,) = plan
    o = torch.empty((B, N, H, D), dtype=qkv.dtype, device=qkv.device)
    lse = torch.empty((B, H, N), dtype=torch.float32, device=qkv.device)
    scalars = (D ** -0.5 * flash_mod.LOG2E, 0.0, H, N)
    return lambda: step(qkv, o, lse, lse, *flash_mod._fwd_descriptors(step, qkv), *scalars)


def _sustained(fn, window_ms: float, seconds: float) -> dict:
    """fn's graph (about 20 ms of calls) replayed back to back for `seconds`: the median ms
    per call of the first five replays and of the last twenty."""
    calls = max(1, min(launch.GRAPH_MAX_CALLS, round(launch.GRAPH_WINDOW_MS / window_ms)))
    graph = launch._capture(fn, calls)
    replays = max(30, round(seconds * 1e3 / (calls * window_ms)))
    marks = [torch.cuda.Event(enable_timing=True) for _ in range(replays + 1)]
    torch.cuda.synchronize()
    marks[0].record()
    for i in range(replays):
        graph.replay()
        marks[i + 1].record()
    torch.cuda.synchronize()
    per_call = [a.elapsed_time(b) / calls for a, b in zip(marks, marks[1:])]
    return {"first": statistics.median(per_call[:5]), "last": statistics.median(per_call[-20:]),
            "replays": replays, "calls": calls}


def probe_shape(shape, repeats: int, sustain_s: float) -> dict:
    B, H, N, D = shape
    qkv = torch.randn(B, N, 3, H, D, device="cuda", dtype=torch.bfloat16)
    flash_mod._plans.clear()
    with torch.no_grad():
        flash_attention_qkvpacked(qkv)  # the tuner: windows, then the finalists in graphs
    key = (torch.bfloat16, N, D, B * H)
    window = launch.tuning_times("fwd", *key)
    if window is None:
        raise SystemExit("the forward's choice came from the cache file: set VITFLASH_CACHE_DIR "
                         "to an empty folder, so that the tuner times the candidates here")
    tuner_graph = launch.final_times("fwd", *key) or {}
    kept = launch.chosen("fwd", *key)
    finals = launch.finalists(window)
    bare, rows = {}, []
    leaf = qkv.detach().clone().requires_grad_()
    for cand in finals:
        _forced("fwd", cand)
        try:
            with torch.no_grad():
                flash_attention_qkvpacked(qkv)
            bare[cand] = _bare(qkv)
            op = lambda: flash_attention_qkvpacked(leaf)  # noqa: E731 (as the benchmark calls it)
            rows.append({
                "candidate": cand.to_json(), "label": cand.label(), "kept": cand == kept,
                "tuner_windows": window[cand], "tuner_graph": tuner_graph.get(cand),
                "windows": statistics.median(launch._time_ms(bare[cand]) for _ in range(repeats)),
                "bench_op": statistics.median(triton.testing.do_bench_cudagraph(
                    op, rep=100, return_mode="median") for _ in range(repeats)),
                "bench_bare": statistics.median(triton.testing.do_bench_cudagraph(
                    bare[cand], rep=100, return_mode="median") for _ in range(repeats)),
            })
        finally:
            _restore()
    timed = [launch._graph_times(finals, window, lambda c: bare[c]()) for _ in range(repeats)]
    for row, cand in zip(rows, finals):
        row["graph_timer"] = statistics.median(t[cand] for t in timed if t)
        row["sustained"] = _sustained(bare[cand], window[cand], sustain_s)
    return {"shape": list(shape), "finalists": rows}


def markdown(results: list[dict], env: dict, command: str, repeats: int, sustain_s: float) -> str:
    lines = [f"# The tuner's forward finalists under each timer, {env['gpu']}", "",
             f"Command: `{command}`", "",
             f"Commit {env['commit']}; torch {env['torch']}, triton {env['triton']}, CUDA {env['cuda']}; "
             f"{env['date']}. bf16, ms per call, median of {repeats} (tuner: its own timings when it "
             f"chose; sustained: {sustain_s:g} s of replays). See the probe's docstring for each timer.", "",
             "| (B, H, N, D) | finalist | tuner windows | tuner graph | windows | graph timer | "
             "bench op | bench bare | sustained first | sustained last | |",
             "|---" * 11 + "|"]
    for r in results:
        for f in r["finalists"]:
            s = f["sustained"]
            tg = f"{f['tuner_graph']:.4f}" if f["tuner_graph"] is not None else "n/a"
            lines.append(f"| {tuple(r['shape'])} | {f['label']} | {f['tuner_windows']:.4f} | {tg} | "
                         f"{f['windows']:.4f} | {f['graph_timer']:.4f} | {f['bench_op']:.4f} | "
                         f"{f['bench_bare']:.4f} | {s['first']:.4f} | {s['last']:.4f} | "
                         f"{'kept' if f['kept'] else ''} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", nargs="+", type=parse_shape, required=True, help="B,H,N,D")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--sustain-s", type=float, default=2.0)
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU")
    env, command = environment(), command_line()
    results = []
    for shape in args.shapes:
        results.append(probe_shape(shape, args.repeats, args.sustain_s))
        write_results(args.out, "finalist_timers", env, command, results,
                      markdown(results, env, command, args.repeats, args.sustain_s))
        print(markdown(results[-1:], env, command, args.repeats, args.sustain_s), flush=True)


if __name__ == "__main__":
    main()
