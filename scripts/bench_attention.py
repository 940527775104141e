"""Attention benchmark: vitflash flash vs naive vs PyTorch SDPA backends, at ViT shapes.

Times forward and forward+backward with `triton.testing.do_bench` (median, after warm-up and
autotuning), REPEATS times per case: the tables give the median of the repeats and their
min-max. Also measures the peak memory one forward+backward adds on top of its inputs, the
synchronized time of one small call (what a launch-bound model pays per layer), and the
first call of the flash op at each shape (autotuning, or a hit in its on-disk cache), and
which flash candidates (kernel family, tiles, warps, stages) ran at each shape.
FLOPs: forward 4*B*H*N^2*D, forward+backward 3.5x that; "of peak" divides by the measured
dense bf16 matrix rate of an H200 (PEAK_TFLOPS).

Inputs are what each path gets in a ViT block: vitflash flash takes the packed
(B, N, 3, H, D) qkv tensor and writes one dqkv; naive takes q, k, v views of it. SDPA gets
contiguous (B, H, N, D) tensors, its preferred layout. Host time per call (the CPU time
to enqueue the work, measured without synchronizing) shows when a path is bound by launch
overhead rather than by the GPU.

    python scripts/bench_attention.py --out benchmarks/results
writes attention_<gpu>.json and attention_<gpu>.md there (a GPU is required).
`--impls ... flash_atomic` adds the flash op with deterministic=False (its backward may add
into dQ atomically; not measured unless asked for):

    python scripts/bench_attention.py --shapes large --impls flash flash_atomic sdpa_cudnn

`--timer graph` times each case as replays of a CUDA graph of its calls
(`triton.testing.do_bench_cudagraph`) instead of a loop of eager calls: GPU time with no host
work between the kernels, what a step captured in a CUDA graph (the training loop's default
on one GPU) pays. At the small shapes the eager loop measures the host's launches as much as
the kernels; the graph timer separates the two. Its results go to attention_graph_<gpu>.*:

    python scripts/bench_attention.py --shapes small --timer graph

On a Hopper GPU flash's tuner times the Gluon kernels (vitflash/ops/hopper.py) beside the
Triton ones, and the results go to attention_..._gluon_<gpu>.*; `--no-gluon` leaves them out
(the Triton kernels alone, files without the suffix), `--gluon` refuses to run where they
cannot be listed.

`--render <json>` prints the tables of a result file again with this version's sections (no
GPU needed), e.g. the autotuner's timings by backward launch form, from its `tuning_ms`:

    python scripts/bench_attention.py --render benchmarks/results/<run>/attention_graph_<gpu>.json
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

from vitflash.ops import flash_attention_qkvpacked, launch, naive_attention

# (B, H, N, D). CIFAR models (32 px, 4x4 patches: 65 tokens): vit_tiny_patch4_32 (3 heads)
# and vit_small_patch4_32 (6 heads) at b256 and b1024; 17 tokens (16 px or 8x8 patches).
SMALL_SHAPES = [(256, 3, 65, 64), (1024, 3, 65, 64), (256, 6, 65, 64), (1024, 6, 65, 64),
                (512, 12, 17, 64)]
# ViT-B/16 @224 b256, ViT-S/16 @224 b256, ViT-B/16 @384 b64, ViT-L/14 @448 b32,
# ViT-B/16 @1024 b8, N=4097 with D=128.
LARGE_SHAPES = [(256, 12, 197, 64), (256, 6, 197, 64), (64, 12, 577, 64), (32, 16, 1025, 64),
                (8, 12, 4097, 64), (4, 16, 4097, 128)]
SHAPES = SMALL_SHAPES + LARGE_SHAPES
# Shapes of the same kinds that the sets above leave out (other N, head dims 80 and 96, other
# B*H), for checking that a kernel change holds beyond the listed shapes (--shapes varied):
# ViT-B/32 @224 b256 (7x7 + 1 tokens), ViT-B/16 @256 b128 (16x16 + 1), ViT-H/14 @224 b64 and
# @336 b32 (16 heads of 80), a 768-wide ViT with 8 heads of 96 @224 b128, a ViT-B/14 @518 b16
# (37x37 + 1), and ViT-B/16 @224 at b1024 and b16 (4x and 1/16 the B*H of the first large shape).
VARIED_SHAPES = [(256, 12, 50, 64), (128, 12, 257, 64), (64, 16, 257, 80), (32, 16, 577, 80),
                 (128, 8, 197, 96), (16, 12, 1370, 64), (1024, 12, 197, 64), (16, 12, 197, 64)]
# One call of a CIFAR ViT layer at batch 1, forward+backward, synchronized.
LATENCY_SHAPE = (1, 3, 65, 64)
# what a table says of the Gluon kernels, by the run's env["gluon"] (False: nothing)
GLUON_NOTES = {True: "flash's tuner timing the Gluon kernels too (VITFLASH_GLUON=1), ",
               "staged": "flash's tuner timing the Gluon kernels too, the staged ones among them "
                         "(VITFLASH_GLUON=staged), "}
PEAK_TFLOPS = 790.0  # dense bf16 matrix product on random data, measured on the H200
REPEATS = 3
SDPA_BACKENDS = {"sdpa_flash": SDPBackend.FLASH_ATTENTION,
                 "sdpa_efficient": SDPBackend.EFFICIENT_ATTENTION,
                 "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION}
IMPLS = ["flash", "naive", *SDPA_BACKENDS]
OPTIONAL_IMPLS = ["flash_atomic"]  # measured only when --impls names it
# sdpa: the backend PyTorch picks itself. floor: no attention, one elementwise op with one
# kernel each way (x * scale and its gradient), through the same autograd and synchronize:
# what any op called from Python pays per call on this host, attention or not
LATENCY_IMPLS = ["flash", "naive", "sdpa", "floor"]
TIMERS = {"events": "`triton.testing.do_bench` (a loop of eager calls)",
          "graph": "`triton.testing.do_bench_cudagraph` (replays of a CUDA graph of the calls: "
                   "GPU time, no host work between kernels)"}


def make_case(impl: str, B: int, H: int, N: int, D: int, dtype: torch.dtype, dropout_p: float = 0.0):
    """Return (leaf tensors, fn() -> o, do) for one implementation, on random inputs, with
    attention dropout `dropout_p` (every path drops its weights whenever it is > 0)."""
    if impl in ("flash", "flash_atomic", "naive"):
        qkv = torch.randn(B, N, 3, H, D, device="cuda", dtype=dtype, requires_grad=True)
        do = torch.randn(B, N, H, D, device="cuda", dtype=dtype)
        if impl != "naive":
            deterministic = impl == "flash"
            return [qkv], (lambda: flash_attention_qkvpacked(qkv, dropout_p=dropout_p,
                                                             deterministic=deterministic)), do
        return [qkv], (lambda: naive_attention(*qkv.unbind(2), dropout_p=dropout_p)), do
    if impl == "floor":
        x = torch.randn(B, N, H, D, device="cuda", dtype=dtype, requires_grad=True)
        return [x], (lambda: x * 0.125), torch.randn(B, N, H, D, device="cuda", dtype=dtype)
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=dtype, requires_grad=True)
               for _ in range(3))
    if impl == "sdpa":
        return [q, k, v], (lambda: F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p)), \
            torch.randn(B, H, N, D, device="cuda", dtype=dtype)
    backend = SDPA_BACKENDS[impl]

    def fn():
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p)

    return [q, k, v], fn, torch.randn(B, H, N, D, device="cuda", dtype=dtype)


def host_us(fn, calls: int = 20) -> float:
    """CPU microseconds to enqueue one call (few calls, so the launch queue never fills)."""
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / calls * 1e6


def flash_candidates(shape, backward: str = "bwd", dropout: bool = False) -> dict:
    """The forward and backward candidates the flash op ran at this (B, H, N, D), bf16
    (backward "bwd_atomic": those of deterministic=False; dropout: those of calls with
    attention dropout), as {"fwd": ..., "bwd": ...}."""
    B, H, N, D = shape
    found = {key: launch.chosen(op, torch.bfloat16, N, D, B * H, dropout)
             for key, op in (("fwd", "fwd"), ("bwd", backward))}
    return {key: c.to_json() if c is not None else None for key, c in found.items()}


def tuning_ms(shape, backward: str = "bwd", dropout: bool = False) -> dict:
    """What the autotuner measured for each candidate at this shape when it chose, fastest
    first by its short windows ({"fwd": [{"candidate": ..., "ms": ...}, ...], "bwd": ...};
    None for an op whose choice came from the cache file). A finalist that it timed again
    in CUDA-graph replays (the choice is the fastest there) also has "graph_ms"."""
    B, H, N, D = shape
    out = {}
    for key, op in (("fwd", "fwd"), ("bwd", backward)):
        times = launch.tuning_times(op, torch.bfloat16, N, D, B * H, dropout)
        graph = launch.final_times(op, torch.bfloat16, N, D, B * H, dropout) or {}
        out[key] = None if times is None else [
            {"candidate": c.to_json(), "ms": ms, **({"graph_ms": graph[c]} if c in graph else {})}
            for c, ms in sorted(times.items(), key=lambda kv: kv[1])]
    return out


def spread(values: list[float]) -> dict:
    """Median and min-max of repeated measurements."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "n": len(values)}


def _timer(kind: str, warmup_ms: int, rep_ms: int) -> Callable:
    """time(fn, grad_to_none) -> median ms per call: "events", do_bench's loop of eager calls
    between CUDA events; "graph", replays of a CUDA graph of the calls."""
    if kind == "graph":
        return lambda fn, grads=None: triton.testing.do_bench_cudagraph(
            fn, rep=rep_ms, grad_to_none=grads, return_mode="median")
    return lambda fn, grads=None: triton.testing.do_bench(
        fn, warmup=warmup_ms, rep=rep_ms, grad_to_none=grads, return_mode="median")


def bench_case(impl, shape, dtype, warmup_ms, rep_ms, repeats, dropout_p=0.0, timer="events"):
    B, H, N, D = shape
    leaves, fwd, do = make_case(impl, B, H, N, D, dtype, dropout_p)

    def fwd_bwd():
        # the gradients returned, not added into the leaves' .grad (no reset between calls)
        return torch.autograd.grad(fwd(), leaves, do)

    try:
        start = time.perf_counter()
        fwd_bwd()  # compile / autotune outside the timed region
        torch.cuda.synchronize()
        first_call_s = time.perf_counter() - start
    except RuntimeError as err:  # e.g. a backend that does not take this shape
        return {"error": str(err).splitlines()[0][:200]}

    # Peak memory that one forward+backward adds on top of its inputs (its gradients included),
    # after a collection: nothing of the first calls' autograd graphs left for a CUDA graph's
    # capture to meet (without it two captures of flash with the Gluon kernels at
    # (4, 16, 4097, 128) failed on an AccumulateGrad node of the eager calls, with .backward()
    # and with autograd.grad alike: benchmarks/results/gpu_session_f48ef01/, run1 and run2)
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fwd_bwd()
    torch.cuda.synchronize()
    peak_mib = (torch.cuda.max_memory_allocated() - base) / 2**20

    time_ms = _timer(timer, warmup_ms, rep_ms)
    fwd_ms, fwd_bwd_ms = [], []
    for _ in range(repeats):
        with torch.no_grad():
            fwd_ms.append(time_ms(fwd))
        fwd_bwd_ms.append(time_ms(fwd_bwd))
    with torch.no_grad():
        fwd_host = host_us(fwd)
    fwd_bwd_host = host_us(fwd_bwd)
    flops = 4 * B * H * N * N * D
    fwd_t = [flops / ms * 1e-9 for ms in fwd_ms]
    fwd_bwd_t = [3.5 * flops / ms * 1e-9 for ms in fwd_bwd_ms]
    return {"fwd_ms": statistics.median(fwd_ms), "fwd_bwd_ms": statistics.median(fwd_bwd_ms),
            "fwd_host_us": fwd_host, "fwd_bwd_host_us": fwd_bwd_host,
            "fwd_tflops": statistics.median(fwd_t), "fwd_bwd_tflops": statistics.median(fwd_bwd_t),
            "fwd_tflops_spread": spread(fwd_t), "fwd_bwd_tflops_spread": spread(fwd_bwd_t),
            "peak_extra_mib": peak_mib, "first_call_s": first_call_s}


def latency_us(impl: str, shape, dtype, calls: int = 200, repeats: int = REPEATS,
               dropout_p: float = 0.0) -> dict:
    """Wall microseconds of one forward+backward followed by a synchronize: per-call
    overhead (host work and launches), which is what a small layer costs without CUDA graphs."""
    B, H, N, D = shape
    leaves, fwd, do = make_case(impl, B, H, N, D, dtype, dropout_p)
    for _ in range(20):
        fwd().backward(do)
    torch.cuda.synchronize()
    medians = []
    for _ in range(repeats):
        times = []
        for _ in range(calls):
            start = time.perf_counter()
            fwd().backward(do)
            torch.cuda.synchronize()
            times.append((time.perf_counter() - start) * 1e6)
        medians.append(statistics.median(times))
    return spread(medians)


def latency_gpu_us(impl: str, shape, dtype, timer: str, warmup_ms: int, rep_ms: int,
                   dropout_p: float = 0.0) -> float:
    """The same call as latency_us, forward+backward at `shape`, timed by the run's timer:
    with "graph", its GPU time alone, which splits one call's wall time into the GPU's part
    and the host's."""
    B, H, N, D = shape
    leaves, fwd, do = make_case(impl, B, H, N, D, dtype, dropout_p)
    return _timer(timer, warmup_ms, rep_ms)(lambda: torch.autograd.grad(fwd(), leaves, do)) * 1e3


def git_commit() -> str:
    """The commit the numbers come from: $VITFLASH_COMMIT (a copy of the tree without .git),
    else git's HEAD, else "unknown"."""
    if os.environ.get("VITFLASH_COMMIT"):
        return os.environ["VITFLASH_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def environment() -> dict:
    return {"gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
            "commit": git_commit(), "torch": torch.__version__,
            "triton": triton.__version__, "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version(), "python": platform.python_version(),
            "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}


def command_line() -> str:
    """The command as run, less where it wrote (that does not change a number)."""
    argv = [a for i, a in enumerate(sys.argv)
            if a != "--out" and (i == 0 or sys.argv[i - 1] != "--out")]
    return "python " + " ".join(argv)


def result_stem(prefix: str, env: dict) -> str:
    """<prefix>_<gpu>: the name of the result files of this machine's GPU (or "cpu")."""
    return prefix + "_" + re.sub(r"[^A-Za-z0-9]+", "_", env["gpu"]).strip("_").lower()


def earlier_rows(out: Path, prefix: str, env: dict, keep: Callable[[dict], bool]) -> list[dict]:
    """The rows of an earlier <out>/<prefix>_<gpu>.json (this machine's GPU) for which
    keep(row) holds, [] without that file: what a script's --append keeps."""
    path = out / f"{result_stem(prefix, env)}.json"
    if not path.is_file():
        return []
    try:
        rows = json.loads(path.read_text())["results"]
        return [r for r in rows if keep(r)]
    except (ValueError, KeyError, TypeError) as err:
        raise SystemExit(f"--append: {path} is not a result file of this script ({err!r}); "
                         "move it away or run without --append") from err


def parse_shape(text: str) -> tuple[int, int, int, int]:
    try:
        shape = tuple(int(x) for x in text.split(","))
    except ValueError:
        shape = ()
    if len(shape) != 4 or min(shape) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: a shape is B,H,N,D, four positive integers")
    return shape


def write_results(out: Path, prefix: str, env: dict, command: str, results: list | dict,
                  table: str) -> None:
    """<out>/<prefix>_<gpu>.json (command, environment, results) and .md (the table)."""
    out.mkdir(parents=True, exist_ok=True)
    stem = result_stem(prefix, env)
    (out / f"{stem}.json").write_text(
        json.dumps({"command": command, "environment": env, "results": results}, indent=1))
    (out / f"{stem}.md").write_text(table)


def _ratio(a: dict, b: dict, key: str) -> str:
    return f"{a[key] / b[key]:.2f}x" if key in a and key in b else "n/a"


def _best_sdpa(row: dict, key: str) -> dict:
    """The fastest SDPA backend of a row at `key` (empty if none ran)."""
    ran = [row[i] for i in SDPA_BACKENDS if key in row[i]]
    return max(ran, key=lambda r: r[key]) if ran else {}


def _candidate(c: dict | None) -> str:
    """A candidate (its JSON) as one cell: launch.Candidate.label."""
    return "n/a" if c is None else launch.Candidate.from_json(c).label()


FORMS = ("one launch", "split twin", "split pair")  # launch.Candidate.form of a general backward
TWIN_PARENT = "twin's one launch"


def _without(c: launch.Candidate, name: str) -> launch.Candidate:
    """c without its block `name` (SPLIT, PIPE): the candidate whose twin c is."""
    return launch.Candidate(c.family, tuple(kv for kv in c.blocks if kv[0] != name), c.num_warps,
                            c.num_stages)


def tuner_choice(tuning: list[dict]) -> dict:
    """The entry of tuning_ms's list for one op that the tuner kept: the fastest finalist in
    CUDA-graph replays where it timed finalists so ("graph_ms"), else the fastest in its
    short windows (runs of commits before the graph re-timing have no "graph_ms")."""
    finals = [e for e in tuning if "graph_ms" in e]
    return min(finals, key=lambda e: e["graph_ms"]) if finals else min(tuning, key=lambda e: e["ms"])


def finals_table(results: list[dict]) -> list[str]:
    """Markdown lines: per shape and op, the tuner's finalists, each one's time in its
    short windows and in CUDA-graph replays (none where no row has graph timings)."""
    lines = []
    for r in results:
        for op, tuning in sorted((r["flash"].get("tuning_ms") or {}).items()):
            finals = [e for e in tuning or [] if "graph_ms" in e]
            if not finals:
                continue
            kept = tuner_choice(tuning)
            first = finals[0]  # the fastest in the short windows (the list is in their order)
            for e in finals:
                c = launch.Candidate.from_json(e["candidate"])
                lines.append(f"| {tuple(r['shape'])} | {op} | {c.label()} | {e['ms']:.4f} | "
                             f"{e['graph_ms']:.4f} | {e['graph_ms'] / first['graph_ms']:.3f} | "
                             f"{'kept' if e is kept else ''} |")
    if not lines:
        return []
    return ["## The autotuner's finalists", "",
            "The candidates within `launch.FINAL_MARGIN` of the fastest in the tuner's short "
            "windows (`ms`: each one's better round of two), timed again as CUDA-graph replays "
            "(`graph_ms`: a block of `launch.GRAPH_ROUNDS` replays, its median, in each of "
            "`launch.GRAPH_PASSES` passes over the finalists, the best block); the tuner keeps the "
            "fastest there. The ratio is of graph times against the short windows' fastest "
            "candidate: below 1, faster than it.", "",
            "| (B, H, N, D) | op | finalist | windows ms | graph ms | graph / windows' first | |",
            "|---|---|---|---|---|---|---|", *lines, ""]


def backward_forms(tuning: list[dict]) -> dict:
    """From the tuner's own timings of the backward candidates at one shape (tuning_ms's
    "bwd" list), {form: (candidate, ms)}: the fastest of each launch form; TWIN_PARENT, the
    one-launch candidate whose split twin is the fastest twin (where it was timed); and
    "fastest", the tuner's choice (tuner_choice) with its time in the short windows."""
    timed = [(launch.Candidate.from_json(e["candidate"]), e["ms"]) for e in tuning]
    kept = tuner_choice(tuning)
    best = {"fastest": (launch.Candidate.from_json(kept["candidate"]), kept["ms"])}
    for c, ms in timed:
        if c.form in FORMS and (c.form not in best or ms < best[c.form][1]):
            best[c.form] = (c, ms)
    if "split twin" in best:
        twin = best["split twin"][0]
        parent = _without(twin, "SPLIT")
        best.update({TWIN_PARENT: (c, ms) for c, ms in timed if c == parent})
    return best


def forms_table(results: list[dict]) -> list[str]:
    """Markdown lines: per shape, the tuner's best backward time of each launch form and
    their ratios (none where no row holds the tuner's backward timings)."""
    rows = [(r["shape"], backward_forms(r["flash"]["tuning_ms"]["bwd"])) for r in results
            if (r["flash"].get("tuning_ms") or {}).get("bwd")]
    if not rows:
        return []

    def ratio(best: dict, a: str, b: str) -> str:
        return f"{best[a][1] / best[b][1]:.3f}" if a in best and b in best else "n/a"

    lines = ["## The autotuner's backward timings, the fastest of each launch form", "",
             "What the tuner measured when it chose the backward at each shape (`tuning_ms`: "
             "each candidate's better round of two, ms). Forms (`launch.Candidate.form`): one "
             "launch of both kinds of program; a split twin, the same tiles in two launches; a "
             "split pair, a dQ launch with tiles, warps or stages of its own. Ratios are of "
             "times: below 1, the first is faster.", "",
             "| (B, H, N, D) | " + " | ".join(f"{f}, ms" for f in FORMS)
             + " | pair / twin | best split / one launch | best twin / its one launch | chosen |",
             "|---" * (len(FORMS) + 5) + "|"]
    for shape, best in rows:
        split = min((best[f] for f in ("split twin", "split pair") if f in best), key=lambda cm: cm[1],
                    default=None)
        vs_one = ratio({"split": split, **best}, "split", "one launch") if split else "n/a"
        chosen = best["fastest"][0]
        lines.append(f"| {tuple(shape)} | "
                     + " | ".join(f"{best[f][1]:.4f}" if f in best else "n/a" for f in FORMS)
                     + f" | {ratio(best, 'split pair', 'split twin')} | {vs_one}"
                     f" | {ratio(best, 'split twin', TWIN_PARENT)} | {chosen.form}: {chosen.label()} |")
    return lines + [""]


def pipe_table(results: list[dict]) -> list[str]:
    """Markdown lines: per shape and op, the tuner's timings of the PIPE twins (each tile's
    scores one step ahead; listed at commit 60f6e25 only, benchmarks/results/
    gpu_session_60f6e25/) against the same candidates without PIPE (none where no row holds
    a PIPE candidate's timing)."""
    lines = []
    for r in results:
        for op, tuning in sorted((r["flash"].get("tuning_ms") or {}).items()):
            timed = {launch.Candidate.from_json(e["candidate"]): e["ms"] for e in tuning or []}
            pairs = [ms / timed[_without(c, "PIPE")] for c, ms in timed.items()
                     if c.meta.get("PIPE") and _without(c, "PIPE") in timed]
            if not pairs:
                continue
            piped = min(ms for c, ms in timed.items() if c.meta.get("PIPE"))
            rest = min(ms for c, ms in timed.items() if not c.meta.get("PIPE"))
            chosen = launch.Candidate.from_json(tuner_choice(tuning)["candidate"])
            lines.append(f"| {tuple(r['shape'])} | {op} | {piped:.4f} | {rest:.4f} | "
                         f"{piped / rest:.3f} | {len(pairs)}: {min(pairs):.3f}-{max(pairs):.3f}"
                         f" (median {statistics.median(pairs):.3f}) | {chosen.label()} |")
    if not lines:
        return []
    return ["## The autotuner's timings of the PIPE twins", "",
            "What the tuner measured at each shape (`tuning_ms`: each candidate's better round "
            "of two, ms): the fastest candidate with PIPE (each tile's scores one step ahead, "
            "the twins listed at commit 60f6e25) and without; each PIPE candidate against its "
            "twin without PIPE (same tiles, warps, stages), as a ratio of times: below 1, PIPE "
            "is faster.", "",
            "| (B, H, N, D) | op | fastest PIPE, ms | fastest without, ms | PIPE / without "
            "| PIPE / its twin: count, range | chosen |",
            "|---|---|---|---|---|---|---|", *lines, ""]


def markdown(results: list[dict], latency: dict, env: dict, command: str) -> str:
    def cell(r, key, fmt):
        if key not in r:
            return "n/a"
        sp = r.get(key + "_spread")
        if sp:
            return (fmt + " ({}-{})").format(sp["median"], fmt.format(sp["min"]),
                                             fmt.format(sp["max"]))
        return fmt.format(r[key])

    lines = [f"# Attention benchmark on {env['gpu']}", "",
             f"Command: `{command}`", "",
             f"Commit {env['commit']}; torch {env['torch']}, triton {env['triton']}, CUDA "
             f"{env['cuda']}, cuDNN {env['cudnn']}, Python {env['python']}; {env['date']}. bf16, non-causal, "
             + (f"attention dropout p = {env['dropout_p']} in every path, " if env.get("dropout_p") else "")
             + GLUON_NOTES.get(env.get("gluon"), "") +
             "random inputs, " + TIMERS[env.get("timer", "events")] + " median, each case repeated "
             f"{env.get('repeats', REPEATS)} times: median of the repeats (min-max). TFLOP/s count 4*B*H*N^2*D "
             "for the forward, 3.5x that for forward+backward. Peak extra memory: what one "
             "forward+backward allocates on top of its inputs.", ""]
    impls = IMPLS + [i for i in OPTIONAL_IMPLS if results and i in results[0]]
    atomic = "flash_atomic" in impls
    lines += ["## vitflash flash against the best SDPA backend and cuDNN, same run", "",
              "| (B, H, N, D) | fwd / best SDPA | fwd+bwd / best SDPA | fwd / cuDNN | "
              f"fwd+bwd / cuDNN | flash fwd+bwd TFLOP/s | of {PEAK_TFLOPS:.0f} peak |"
              + (" flash_atomic fwd+bwd / cuDNN | flash_atomic fwd+bwd TFLOP/s |" if atomic else ""),
              "|---|---|---|---|---|---|---|" + ("---|---|" if atomic else "")]
    for r in results:
        f, c = r["flash"], r["sdpa_cudnn"]
        frac = f"{f['fwd_bwd_tflops'] / PEAK_TFLOPS:.0%}" if "fwd_bwd_tflops" in f else "n/a"
        extra = (f" {_ratio(r['flash_atomic'], c, 'fwd_bwd_tflops')} | "
                 f"{cell(r['flash_atomic'], 'fwd_bwd_tflops', '{:.0f}')} |") if atomic else ""
        lines.append(f"| {tuple(r['shape'])} | {_ratio(f, _best_sdpa(r, 'fwd_tflops'), 'fwd_tflops')} | "
                     f"{_ratio(f, _best_sdpa(r, 'fwd_bwd_tflops'), 'fwd_bwd_tflops')} | "
                     f"{_ratio(f, c, 'fwd_tflops')} | {_ratio(f, c, 'fwd_bwd_tflops')} | "
                     f"{cell(f, 'fwd_bwd_tflops', '{:.0f}')} | {frac} |" + extra)
    lines.append("")
    if latency:
        shape = tuple(latency["shape"])
        timed = [i for i in LATENCY_IMPLS if i in latency]  # files from before "floor" lack it
        ratios = [("flash", "sdpa")] + [("floor", "sdpa")] * ("floor" in latency)
        lines += [f"## One call at {shape}, forward+backward, synchronized (us)", "",
                  "| " + " | ".join(timed + [f"{a} / {b}" for a, b in ratios]) + " |",
                  "|---" * (len(timed) + len(ratios)) + "|",
                  "| " + " | ".join("{:.0f} ({:.0f}-{:.0f})".format(
                      latency[i]["median"], latency[i]["min"], latency[i]["max"]) for i in timed)
                  + "".join(f" | {latency[a]['median'] / latency[b]['median']:.2f}x" for a, b in ratios)
                  + " |", ""]
        if "gpu_us" in latency["flash"]:  # files from before it lack it
            lines += [f"The same call timed by {TIMERS[env.get('timer', 'events')]}, us: " + ", ".join(
                          f"{i} {latency[i]['gpu_us']:.1f}" for i in timed) + ".", ""]
        if latency.get("flash_candidates"):
            found = latency["flash_candidates"]
            lines += [f"Flash's kernels there: forward {_candidate(found['fwd'])}; backward "
                      f"{_candidate(found['bwd'])}.", ""]
        if "floor" in latency:
            lines += ["floor: one elementwise op and its gradient (one kernel each way) through the "
                      "same autograd and synchronize, no attention: no attention op called this way "
                      "(a kernel or more each way) can take less on this host.", ""]
    for metric, title, fmt in (("fwd_tflops", "Forward TFLOP/s", "{:.0f}"),
                               ("fwd_bwd_tflops", "Forward+backward TFLOP/s", "{:.0f}"),
                               ("fwd_ms", "Forward ms", "{:.3f}"),
                               ("fwd_bwd_ms", "Forward+backward ms", "{:.3f}"),
                               ("peak_extra_mib", "Peak extra memory of forward+backward, MiB",
                                "{:.0f}"),
                               ("fwd_bwd_host_us", "Host time per forward+backward call, us",
                                "{:.0f}"),
                               ("first_call_s", "First call (autotuning, compilation), s",
                                "{:.2f}")):
        lines += [f"## {title}", "", "| (B, H, N, D) | " + " | ".join(impls) + " |",
                  "|---" * (len(impls) + 1) + "|"]
        for r in results:
            lines.append(f"| {tuple(r['shape'])} | "
                         + " | ".join(cell(r[i], metric, fmt) for i in impls) + " |")
        lines.append("")
    picked = [(r["shape"], r["flash"]["candidates"]) for r in results if "candidates" in r["flash"]]
    if picked:
        lines += ["## Flash candidates (chosen by the autotuner, or read from its cache)", "",
                  "| (B, H, N, D) | forward | backward |", "|---|---|---|"]
        lines += [f"| {tuple(s)} | {_candidate(c['fwd'])} | {_candidate(c['bwd'])} |" for s, c in picked]
        lines.append("")
    picked = [(r["shape"], r["flash_atomic"]["candidates"]) for r in results
              if atomic and "candidates" in r["flash_atomic"]]
    if picked:
        lines += ["## flash_atomic backward candidates (deterministic=False)", "",
                  "| (B, H, N, D) | backward |", "|---|---|"]
        lines += [f"| {tuple(s)} | {_candidate(c['bwd'])} |" for s, c in picked]
        lines.append("")
    lines += finals_table(results) + forms_table(results) + pipe_table(results)
    errors = [(r["shape"], i, r[i]["error"]) for r in results for i in impls if "error" in r[i]]
    if errors:
        lines += ["", "Not run:"] + [f"- {tuple(s)} {i}: {e}" for s, i, e in errors]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--impls", nargs="+", default=IMPLS, choices=IMPLS + OPTIONAL_IMPLS)
    parser.add_argument("--shapes", choices=("all", "small", "large", "varied"), default="all",
                        help="all: small + large; varied: shapes of the same kinds outside those sets")
    parser.add_argument("--shape", nargs="+", type=parse_shape, metavar="B,H,N,D",
                        help="these shapes instead of a --shapes set")
    parser.add_argument("--warmup-ms", type=int, default=25)
    parser.add_argument("--rep-ms", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=REPEATS)
    gluon = parser.add_mutually_exclusive_group()
    gluon.add_argument("--gluon", action="store_true",
                       help="require flash's tuner to time the Gluon kernels too (the default where "
                            "they run: Hopper; refused elsewhere)")
    gluon.add_argument("--gluon-staged", action="store_true",
                       help="as --gluon, and the staged Gluon kernels too (VITFLASH_GLUON=staged: "
                            "launch.gluon_ws_bwd_candidates, not listed by default)")
    gluon.add_argument("--no-gluon", action="store_true",
                       help="leave the Gluon kernels out of flash's tuning (VITFLASH_GLUON=0): the "
                            "Triton kernels alone")
    parser.add_argument("--timer", choices=tuple(TIMERS), default="events",
                        help="events: eager calls between CUDA events (host time shows where it "
                             "exceeds the GPU's); graph: CUDA-graph replays (results go to "
                             "attention_graph_<gpu>.*)")
    parser.add_argument("--dropout", type=float, default=0.0, metavar="P",
                        help="attention dropout in every path (the results go to attention_dropout_<gpu>.*)")
    parser.add_argument("--first-call-only", action="store_true",
                        help="only time the flash op's first call at each shape and exit (run "
                             "twice: the second process reads the autotuning cache)")
    parser.add_argument("--render", type=Path, metavar="JSON",
                        help="print the tables of this result file again and exit (no GPU needed)")
    args = parser.parse_args(argv)
    if args.render:
        try:
            data = json.loads(args.render.read_text())
            results, env, command = data["results"], data["environment"], data["command"]
        except (OSError, ValueError, KeyError) as err:
            sys.exit(f"--render {args.render}: not a result file of this script ({err!r})")
        print(markdown(results["shapes"], results.get("latency") or {}, env, command), end="")
        return
    if not torch.cuda.is_available():
        sys.exit("bench_attention.py needs a CUDA GPU: it times GPU kernels.")
    if args.gluon or args.gluon_staged or args.no_gluon:  # read at the first choice (launch.gluon_kernels)
        os.environ["VITFLASH_GLUON"] = "0" if args.no_gluon else "staged" if args.gluon_staged else "1"
        if not args.no_gluon and not launch.gluon_kernels():
            flag = "--gluon-staged" if args.gluon_staged else "--gluon"
            sys.exit(f"{flag}: the Gluon kernels run only on a Hopper GPU (compute capability 9.x) "
                     f"with a triton whose Gluon imports; run without {flag} here")
    shapes = args.shape or {"all": SHAPES, "small": SMALL_SHAPES, "large": LARGE_SHAPES,
                            "varied": VARIED_SHAPES}[args.shapes]

    if args.first_call_only:
        for shape in shapes:
            leaves, fwd, do = make_case("flash", *shape, torch.bfloat16)
            start = time.perf_counter()
            fwd().backward(do)
            torch.cuda.synchronize()
            print(f"first call {shape}: {time.perf_counter() - start:.2f} s", flush=True)
        return

    if not 0 <= args.dropout < 1:
        parser.error(f"--dropout {args.dropout}: the dropout probability must be in [0, 1)")
    env = environment()
    prefix = "attention"
    if args.dropout:
        env["dropout_p"], prefix = args.dropout, "attention_dropout"
    env["repeats"] = args.repeats
    if args.timer == "graph":
        env["timer"], prefix = "graph", prefix + "_graph"
    env["gluon"] = "staged" if launch.gluon_staged() else launch.gluon_kernels()
    if env["gluon"]:
        prefix += "_gluon" + ("_staged" if env["gluon"] == "staged" else "")
    command = command_line()
    latency = {"shape": list(LATENCY_SHAPE)}
    for impl in LATENCY_IMPLS:
        latency[impl] = latency_us(impl, LATENCY_SHAPE, torch.bfloat16, repeats=args.repeats,
                                   dropout_p=args.dropout)
        latency[impl]["gpu_us"] = latency_gpu_us(impl, LATENCY_SHAPE, torch.bfloat16, args.timer,
                                                 args.warmup_ms, args.rep_ms, args.dropout)
        print("latency", LATENCY_SHAPE, impl, latency[impl], flush=True)
    dropout = args.dropout > 0
    latency["flash_candidates"] = flash_candidates(LATENCY_SHAPE, dropout=dropout)
    latency["flash_tuning_ms"] = tuning_ms(LATENCY_SHAPE, dropout=dropout)
    results = []
    for shape in shapes:
        row = {"shape": list(shape)}
        for impl in IMPLS + [i for i in OPTIONAL_IMPLS if i in args.impls]:
            row[impl] = (bench_case(impl, shape, torch.bfloat16, args.warmup_ms, args.rep_ms,
                                    args.repeats, args.dropout, args.timer)
                         if impl in args.impls else {"error": "not selected"})
            if impl.startswith("flash") and "error" not in row[impl]:  # which kernels gave these timings
                backward = "bwd" if impl == "flash" else "bwd_atomic"
                row[impl]["candidates"] = flash_candidates(shape, backward, dropout)
                row[impl]["tuning_ms"] = tuning_ms(shape, backward, dropout)
            torch.cuda.empty_cache()
            print(shape, impl, {k: round(v, 3) if isinstance(v, float) else v
                                for k, v in row[impl].items() if not k.endswith("spread")},
                  flush=True)
        results.append(row)
        # after every shape, so that a run stopped by a time limit keeps what it measured
        env["fast_launch_plans"] = launch.fast_launches()  # plans calling compiled kernels directly
        table = markdown(results, latency, env, command)
        write_results(args.out, prefix, env, command,
                      {"latency": latency, "shapes": results}, table)
    print(table)


if __name__ == "__main__":
    main()
