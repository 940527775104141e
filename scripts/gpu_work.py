"""The GPU's work per training step, from a torch.profiler trace of the loop.

`bench_loop.py --profile DIR` writes `<case>.trace.json.gz` (chrome trace format) for one
window of steps. This reads it and sums the device time of every kernel, copy and memset by
where it was launched from:

- backward graph: replays of CUDA graphs (cudaGraphLaunch) issued inside the autograd
  engine's backward (an enclosing operator whose name holds "Backward");
- forward graph: replays issued inside another operator (the compiled model's forward);
- graph outside any operator: replays issued from plain Python (the gpu data pipeline replays
  its captured augmentation so);
- eager kernels: everything launched one kernel at a time.

Per step (divided by --steps), with the device's busy time (the union of the kernels'
intervals) and the window's span, both per step: span - busy is the time the GPU waited.
Profilers slow the host, so the span is longer than an unprofiled step; the device times are
what the GPU did.

    python scripts/gpu_work.py benchmarks/results/loop_graph_step_d2bc347/profile/cifar10_flash_reduce-overhead.trace.json.gz --steps 40
"""
from __future__ import annotations

import argparse
import bisect
import collections
import gzip
import json
from pathlib import Path

DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
HOST_CATS = ("cpu_op", "user_annotation")


def load(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return [e for e in json.load(f)["traceEvents"] if "dur" in e]


def _busy(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of (start, end) intervals."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total


def gpu_work(events: list[dict]) -> dict:
    """{source: device microseconds}, plus "_busy" and "_span" (microseconds), over the trace."""
    launches = {e["args"].get("correlation"): e for e in events if e.get("cat") == "cuda_runtime"}
    host = [e for e in events if e.get("cat") in HOST_CATS]
    by_tid: dict = collections.defaultdict(list)
    for e in host:
        by_tid[e.get("tid")].append(e)
    ordered = {tid: sorted(evs, key=lambda e: e["ts"]) for tid, evs in by_tid.items()}
    starts = {tid: [e["ts"] for e in evs] for tid, evs in ordered.items()}

    def enclosing(launch: dict) -> list[str]:
        tid, ts = launch.get("tid"), launch["ts"]
        evs = ordered.get(tid, [])
        i = bisect.bisect_right(starts.get(tid, []), ts)
        return [e["name"] for e in evs[:i] if e["ts"] + e["dur"] >= ts]

    source_of: dict = {}
    work: dict[str, float] = collections.defaultdict(float)
    device = [e for e in events if e.get("cat") in DEVICE_CATS]
    for e in device:
        launch = launches.get(e["args"].get("correlation"))
        if launch is None or launch["name"] != "cudaGraphLaunch":
            source = "eager kernels"
        else:
            key = id(launch)
            if key not in source_of:
                names = enclosing(launch)
                source_of[key] = ("backward graph" if any("Backward" in n for n in names)
                                  else "forward graph" if names else "graph outside any operator")
            source = source_of[key]
        work[source] += e["dur"]
    intervals = [(e["ts"], e["ts"] + e["dur"]) for e in device]
    work["_busy"] = _busy(intervals)
    work["_span"] = max(b for _, b in intervals) - min(a for a, _ in intervals) if intervals else 0.0
    return dict(work)


def table(work: dict, steps: int) -> str:
    rows = sorted(((k, v) for k, v in work.items() if not k.startswith("_")), key=lambda kv: -kv[1])
    lines = ["| work | GPU ms/step |", "|---|---|"]
    lines += [f"| {k} | {v / steps / 1e3:.2f} |" for k, v in rows]
    lines += [f"| total | {sum(v for _, v in rows) / steps / 1e3:.2f} |",
              f"| busy (union of the intervals) | {work['_busy'] / steps / 1e3:.2f} |",
              f"| span of the window, profiled | {work['_span'] / steps / 1e3:.2f} |"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("trace", type=Path, help="a .trace.json(.gz) from bench_loop.py --profile")
    parser.add_argument("--steps", type=int, required=True, help="training steps in the profiled window")
    args = parser.parse_args(argv)
    if not args.trace.is_file():
        parser.error(f"{args.trace} does not exist: give a trace that bench_loop.py --profile wrote")
    if args.steps < 1:
        parser.error("--steps must be at least 1")
    out = table(gpu_work(load(args.trace)), args.steps)
    print(out, end="")
    return out


if __name__ == "__main__":
    main()
