"""Probe: how an attention call's GPU time changes while the GPU stays busy.

The autotuner times each candidate in short windows (10 calls after a sleeping kernel,
`launch._time_ms`), while `scripts/bench_attention.py --timer graph` replays a CUDA graph of
calls for a whole window of about 100 ms. Where one call is long and keeps the matrix units
busy, the two disagree: at (4, 16, 4097, 128) the tuner timed its forward at 1.05 ms and the
benchmark at 1.20 ms (benchmarks/results/gpu_session_b7a82e1/). A GPU held at its power
limit lowers its clocks, so a call's time depends on how long the GPU has been busy.

This probe leaves the GPU idle for `--idle-s` seconds, then runs one case back to back for
`--seconds` of GPU time with a CUDA event between calls, and reports the median time per call
in windows of time since the first call began (0-2 ms, 2-10 ms, ... ). Where the SM clock can
be read (NVML, through torch.cuda.clock_rate), a thread samples it during the run, and each
window also shows the median clock sampled in it (the host's clock, so the windows' edges are
approximate: the GPU starts on the first call at once, being idle).

    python benchmarks/probes/sustained.py --shapes 4,16,4097,128 64,12,577,64 --impls flash sdpa_cudnn

Cases: `--impls` (flash: the tuned op; sdpa_cudnn, sdpa_flash: SDPA's backends) x `--ops`
(fwd, fwd_bwd) x `--shapes`, each `--repeats` times. Needs a CUDA GPU. Writes
<out>/sustained_<gpu>.json and .md.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from bench_attention import command_line, environment, make_case, parse_shape, write_results  # noqa: E402

# edges (ms since the first call began) of the windows a run is summed up in
EDGES_MS = (0, 2, 10, 30, 100, 300, 1000, 3000, 10000)


def _by_window(pairs, edges=EDGES_MS) -> dict[int, list[float]]:
    """{edges[i]: the values whose time falls in [edges[i], edges[i+1])} of (ms since the
    start, value) pairs, for the windows that hold any."""
    out: dict[int, list[float]] = {}
    for t, value in pairs:
        for lo, hi in zip(edges, edges[1:]):
            if lo <= t < hi:
                out.setdefault(lo, []).append(value)
                break
    return out


def windows(starts_ms: list[float], call_ms: list[float], edges=EDGES_MS) -> list[dict]:
    """Median ms per call of the calls that began in each window [edges[i], edges[i+1]),
    for the windows that hold any."""
    found = _by_window(zip(starts_ms, call_ms), edges)
    return [{"from_ms": lo, "to_ms": hi, "calls": len(found[lo]), "ms": statistics.median(found[lo])}
            for lo, hi in zip(edges, edges[1:]) if lo in found]


def clock_windows(samples: list[tuple[float, float]], edges=EDGES_MS) -> dict:
    """{from_ms: median MHz} of the (ms since start, MHz) samples in each window."""
    return {lo: statistics.median(v) for lo, v in _by_window(samples, edges).items()}


def _clock_reader(device: int):
    """A function that returns the SM clock in MHz, or None where NVML is not available."""
    try:
        torch.cuda.clock_rate(device)
    except Exception:  # no pynvml / amdsmi: no clocks in the table
        return None
    return lambda: torch.cuda.clock_rate(device)


def run_case(fn, leaves, backward: bool, seconds: float, idle_s: float) -> dict:
    """After idle_s of an idle GPU, fn back to back for about `seconds` of GPU time: each
    call's start (ms since the first began) and duration, and the SM clock sampled meanwhile."""
    def call():
        for t in leaves:
            t.grad = None
        fn()

    ctx = torch.enable_grad() if backward else torch.no_grad()
    with ctx:
        call()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(5):
            call()
        end.record()
        end.synchronize()
        est_ms = start.elapsed_time(end) / 5
        calls = max(10, int(seconds * 1000 / est_ms))
        events = [torch.cuda.Event(enable_timing=True) for _ in range(calls + 1)]
        read = _clock_reader(torch.cuda.current_device())
        samples: list[tuple[float, float]] = []
        stop = threading.Event()
        time.sleep(idle_s)
        t0 = time.perf_counter()

        def sample():
            while not stop.is_set():
                samples.append(((time.perf_counter() - t0) * 1e3, float(read())))
                time.sleep(0.002)

        sampler = threading.Thread(target=sample, daemon=True) if read else None
        if sampler:
            sampler.start()
        events[0].record()
        for i in range(calls):
            call()
            events[i + 1].record()
        events[-1].synchronize()
        stop.set()
        if sampler:
            sampler.join()
    call_ms = [a.elapsed_time(b) for a, b in zip(events, events[1:])]
    starts = [events[0].elapsed_time(e) for e in events[:-1]]
    return {"calls": calls, "windows": windows(starts, call_ms),
            "clock_mhz": clock_windows(samples) if sampler else None}


def markdown(rows: list[dict], env: dict, command: str, idle_s: float) -> str:
    lines = [f"# Time per call while the GPU stays busy, {env['gpu']}", "", f"Command: `{command}`", "",
             f"Commit {env['commit']}; torch {env['torch']}, triton {env['triton']}, CUDA {env['cuda']}, "
             f"cuDNN {env['cudnn']}; {env['date']}. bf16. Each run starts after {idle_s:g} s of an idle "
             "GPU; a cell is the median ms per call of the calls that began in that window of time "
             "since the first call (median over the runs), with the median SM clock sampled in it "
             "(MHz) where NVML could be read.", ""]
    spans = [f"{lo}-{hi} ms" for lo, hi in zip(EDGES_MS, EDGES_MS[1:])]
    lines += ["| case | " + " | ".join(spans) + " |", "|---" * (len(spans) + 1) + "|"]
    for r in rows:
        cells = []
        for lo in EDGES_MS[:-1]:
            ms = [w["ms"] for run in r["runs"] for w in run["windows"] if w["from_ms"] == lo]
            mhz = [run["clock_mhz"][lo] for run in r["runs"]
                   if run.get("clock_mhz") and lo in run["clock_mhz"]]
            cell = f"{statistics.median(ms):.3f}" if ms else ""
            if ms and mhz:
                cell += f" ({statistics.median(mhz):.0f})"
            cells.append(cell)
        lines.append(f"| {r['impl']} {r['op']} {tuple(r['shape'])} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", nargs="+", type=parse_shape, required=True, metavar="B,H,N,D")
    parser.add_argument("--impls", nargs="+", default=["flash", "sdpa_cudnn"],
                        choices=["flash", "sdpa_cudnn", "sdpa_flash"])
    parser.add_argument("--ops", nargs="+", default=["fwd"], choices=["fwd", "fwd_bwd"])
    parser.add_argument("--seconds", type=float, default=1.0, help="GPU time of one run")
    parser.add_argument("--idle-s", type=float, default=2.0, help="idle time ahead of each run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("sustained.py needs a CUDA GPU: it times GPU kernels.")
    env, command, rows = environment(), command_line(), []
    for shape in args.shapes:
        for impl in args.impls:
            leaves, fwd, do = make_case(impl, *shape, torch.bfloat16)
            for op in args.ops:
                backward = op == "fwd_bwd"
                fn = (lambda: fwd().backward(do)) if backward else fwd
                runs = [run_case(fn, leaves, backward, args.seconds, args.idle_s) for _ in range(args.repeats)]
                rows.append({"impl": impl, "op": op, "shape": list(shape), "runs": runs})
                print(impl, op, shape, [[round(w["ms"], 3) for w in r["windows"]] for r in runs], flush=True)
                write_results(args.out, "sustained", env, command, rows,
                              markdown(rows, env, command, args.idle_s))
    print(markdown(rows, env, command, args.idle_s))


if __name__ == "__main__":
    main()
