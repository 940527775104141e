"""Time flash-attention configurations beyond the autotuner's candidate lists, against cuDNN.

The autotuner (`vitflash/ops/launch.py`) picks the fastest of a short list per op and head
dim, so it can only be as good as that list. This sweep forces each configuration of a
wider grid on the op at the given shapes: the listed candidates plus other tile sizes,
warps and pipeline stages of the general kernels. It checks each one against a float64
reference under the FA2 error rule (at batch 2, two heads, the same N and D), then times it.
cuDNN's attention runs at the same shape in the same run, so every row has a ratio.

    python scripts/sweep_configs.py --op bwd --shapes 64,12,577,64 8,12,4097,64 4,16,4097,128
    python scripts/sweep_configs.py --op fwd --shapes 4,16,4097,128 128,8,197,96
    python scripts/sweep_configs.py --op fwd --shapes 4,16,4097,128 --configs general:128,128:8:3 general_tma:128,64:8:2:128

- `--op fwd` times the forward with each forward configuration.
- `--op bwd` times forward+backward: the forward is the autotuner's choice, the backward
  is each deterministic general configuration.
- `--op bwd_atomic` does the same with `deterministic=False` for the backwards that add into
  dQ atomically: element by element ("atomic") and, on Hopper, by TMA tile reductions
  ("atomic_tma").

Each case is the median of `--repeats` runs of `triton.testing.do_bench`, with their min-max
(`--timer graph`: of `do_bench_cudagraph`, bench_attention.py's GPU-time timer, which keeps
the GPU busy for its whole window). Each configuration is also timed as the autotuner times
candidates (`launch._time_ms`, windows of 10 calls; see its docstring), so
a table shows where the two timers rank configurations differently. `--listed` sweeps the
autotuner's own list at each shape only (TMA and tail-ahead twins included), not the grid.
`--configs` sweeps the configurations it names instead, each as
`FAMILY:TILES[,NAME=VALUE...]:WARPS:STAGES[:MAXNREG]` (tiles in the order of the op's block
names: BLOCK_M,BLOCK_N for the forward and the atomic backward, BLOCK_M1,BLOCK_N1,BLOCK_M2,BLOCK_N2
for the backward; a register cap makes Triton hold each thread to that many registers, e.g.
two 8-warp programs an SM where the compiler alone would take more).
Results go to `<out>/sweep_<op>_<gpu>.json` and `.md`, written after cuDNN's times and after
every configuration, so a run stopped by a time limit keeps what it measured (a shape it
stopped in is marked so). `--budget-s` stops starting new
configurations after that many seconds.
"""
from __future__ import annotations

import argparse
import itertools
import json
from functools import partial
import sys
import time
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from vitflash.files import written_whole
from vitflash.ops import flash as flash_mod
from vitflash.ops import flash_attention_qkvpacked, launch, naive_attention

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_attention import TIMERS, _timer, command_line, environment, parse_shape, result_stem, spread  # noqa: E402

ABS_FLOOR = 1e-5


def _families(op: str) -> tuple[str, ...]:
    """The candidate families a sweep of op covers: the backwards that add into dQ for
    bwd_atomic, the general kernels (pointer and TMA loads) otherwise."""
    return launch.ATOMIC_FAMILIES if op == "bwd_atomic" else ("general", "general_tma")


def _block_names(op: str) -> tuple[str, ...]:
    """The tile sizes of op's general candidates, in their order."""
    return ("BLOCK_M1", "BLOCK_N1", "BLOCK_M2", "BLOCK_N2") if op == "bwd" else ("BLOCK_M", "BLOCK_N")


def grid(op: str, d: int) -> list[launch.Candidate]:
    """The listed candidates of op at head dim d (general ones; for bwd_atomic, those that
    add into dQ), then the extra ones of the grid (tile pairs x warps x stages), without
    repeats. A backward tile pair (a, b) is dK/dV programs of b keys x a queries and dQ
    programs of b queries x a keys, as in the list; an atomic one (a, b), programs of b keys
    adding the dQ of a queries at a time, by element or (atomic_tma, on Hopper) by tile. On
    Hopper each general configuration is also swept as its TMA-load twin (general_tma)."""
    families = _families(op)
    listed = [c for c in launch.candidates(op, 4096, d) if c.family in families]
    # the families the list has here: the TMA ones only where TMA exists (Hopper)
    families = tuple(dict.fromkeys(c.family for c in listed)) or families[:1]
    if op == "fwd":
        tiles = [(64, 32), (64, 64), (64, 128), (128, 32), (128, 64), (128, 128)]
    elif op == "bwd":
        tiles = [(a, b, b, a) for a, b in ((16, 64), (16, 128), (32, 64), (32, 128), (64, 64),
                                            (64, 128))]
    else:
        tiles = [(16, 64), (16, 128), (32, 64), (32, 128), (64, 64), (64, 128)]
    extra = [launch.Candidate(f, tuple(zip(_block_names(op), t)), w, s)
             for f, t, w, s in itertools.product(families, tiles, (4, 8), (2, 3, 4))]
    return listed + [c for c in extra if c not in listed]


def parse_config(op: str, text: str) -> launch.Candidate:
    """A candidate from `FAMILY:TILES[,NAME=VALUE...]:WARPS:STAGES[:MAXNREG]` (see above)."""
    names, families = _block_names(op), _families(op)
    try:
        family, blocks, warps, stages, *cap = text.split(":")
        values = blocks.split(",")
        tiles = [int(v) for v in values[:len(names)]]
        extra = [(k, int(v)) for k, v in (item.split("=") for item in values[len(names):])]
        if len(tiles) != len(names) or len(cap) > 1 or family not in families:
            raise ValueError
        return launch.Candidate(family, tuple(zip(names, tiles)) + tuple(extra), int(warps), int(stages),
                                int(cap[0]) if cap else 0)
    except ValueError:
        raise SystemExit(f"--configs {text!r}: expected FAMILY:{','.join(names)}[,NAME=VALUE...]:WARPS:STAGES"
                         f"[:MAXNREG] with FAMILY one of {', '.join(families)}, e.g. "
                         f"{families[0]}:{','.join(['64'] * len(names))}:4:3") from None


def _forced(op: str, cand: launch.Candidate):
    """Make the flash op run `cand` for op, the autotuner's choice for the other op."""
    real = launch.choose
    flash_mod.choose = lambda o, *args, **kwargs: cand if o == op else real(o, *args, **kwargs)
    flash_mod._plans.clear()


def _restore() -> None:
    flash_mod.choose = launch.choose
    flash_mod._plans.clear()


def _out_and_grads(fn, qkv, do):
    leaf = qkv.detach().clone().requires_grad_()
    o = fn(leaf)
    (dqkv,) = torch.autograd.grad(o, leaf, do)
    return [o, *dqkv.unbind(2)]


def within_rule(n: int, d: int, nondeterministic: bool = False) -> str | None:
    """None if the op (as forced now; with deterministic=False if asked) keeps to the FA2
    rule at (2, n, 2, d), else why not: max error at most twice naive bf16's plus a floor,
    against float64."""
    gen = torch.Generator(device="cuda").manual_seed(n + d)
    qkv = torch.randn(2, n, 3, 2, d, device="cuda", generator=gen)
    do = torch.randn(2, n, 2, d, device="cuda", generator=gen)
    naive = lambda t: naive_attention(*t.unbind(2))  # noqa: E731
    ref = _out_and_grads(naive, qkv.double(), do.double())
    low = _out_and_grads(naive, qkv.bfloat16(), do.bfloat16())
    flash = partial(flash_attention_qkvpacked, deterministic=not nondeterministic)
    got = _out_and_grads(flash, qkv.bfloat16(), do.bfloat16())
    for name, r, lo, g in zip(("o", "dq", "dk", "dv"), ref, low, got):
        err, bound = (g.double() - r).abs().max().item(), 2 * (lo.double() - r).abs().max().item() + ABS_FLOOR
        if not err <= bound:
            return f"{name}: max error {err:.3g} > {bound:.3g}"
    return None


def time_case(fn, leaves, backward: bool, repeats: int, timer: str = "events") -> list[float]:
    """Milliseconds per call of fn, `repeats` times, by bench_attention.py's timer of that
    kind (under no_grad unless it runs a backward)."""
    time_ms = _timer(timer, warmup_ms=25, rep_ms=100)
    if backward:
        return [time_ms(fn, leaves) for _ in range(repeats)]
    with torch.no_grad():
        return [time_ms(fn) for _ in range(repeats)]


def tuner_case(fn, leaves, backward: bool, repeats: int) -> list[float]:
    """Milliseconds per call of fn, `repeats` times, by the autotuner's own timer
    (launch._time_ms: windows of 10 calls, timed as its docstring says).
    A backward's gradients are cleared before each call, as do_bench's grad_to_none does."""
    def call():
        for t in leaves:
            t.grad = None
        fn()

    if backward:
        return [launch._time_ms(call) for _ in range(repeats)]
    with torch.no_grad():
        return [launch._time_ms(fn) for _ in range(repeats)]


def _cudnn_times(shape, backward: bool, repeats: int, timer: str, tflops) -> dict:
    """cuDNN's attention at `shape` by the sweep's timer and by the tuner's, as TFLOP/s spreads;
    its (B, H, N, D) tensors are freed on return, before the flash configurations run."""
    B, H, N, D = shape
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    do = torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16)

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            o = F.scaled_dot_product_attention(q, k, v)
        if backward:
            o.backward(do)

    return {"cudnn": spread(tflops(time_case(cudnn, [q, k, v], backward, repeats, timer))),
            "cudnn_tuner_timer": spread(tflops(tuner_case(cudnn, [q, k, v], backward, repeats)))}


def _flash_inputs(shape) -> tuple[torch.Tensor, torch.Tensor]:
    """The packed bf16 qkv (B, N, 3, H, D), a leaf, and dO (B, N, H, D) of a shape, on the GPU."""
    B, H, N, D = shape
    qkv = torch.randn(B, N, 3, H, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    return qkv, torch.randn(B, N, H, D, device="cuda", dtype=torch.bfloat16)


# what a shape's row says while its configurations are still running: what a result file
# written then keeps if the run is stopped there (a time limit), until the shape finishes
UNFINISHED = "the run ended while this shape's configurations were running"


def sweep_shape(op: str, shape, repeats: int, deadline: float, timer: str = "events",
                listed_only: bool = False, configs: list[launch.Candidate] | None = None,
                save: Callable[[dict], None] | None = None) -> dict:
    """The row of one shape: cuDNN's times, then each configuration's check and times.
    save(row), if given, after cuDNN's and after each configuration, the row marked
    "stopped": UNFINISHED until the last one has run (a time budget's stop stays marked)."""
    B, H, N, D = shape
    backward = op != "fwd"
    flops = 4 * B * H * N * N * D * (3.5 if backward else 1.0)
    tflops = lambda ms: [flops / t * 1e-9 for t in ms]  # noqa: E731
    row = {"shape": list(shape), **_cudnn_times(shape, backward, repeats, timer, tflops), "configs": [],
           "stopped": UNFINISHED}
    print(tuple(shape), op, "cuDNN", row["cudnn"]["median"], row["cudnn_tuner_timer"]["median"], flush=True)
    save = save or (lambda row: None)
    save(row)
    qkv, do = _flash_inputs(shape)

    def flash():
        o = flash_attention_qkvpacked(qkv, deterministic=op != "bwd_atomic")
        if backward:
            o.backward(do)

    listed = launch.candidates(op, N, D, B * H)
    for cand in configs or (listed if listed_only else grid(op, D)):
        if time.monotonic() > deadline:
            row["stopped"] = "time budget"
            save(row)
            return row
        entry = {"candidate": cand.to_json(), "listed": cand in listed}
        _forced(op, cand)
        try:
            flash()
            torch.cuda.synchronize()
            entry["error"] = within_rule(N, D, op == "bwd_atomic")
            if entry["error"] is None:
                entry["tflops"] = spread(tflops(time_case(flash, [qkv], backward, repeats, timer)))
                entry["tflops_tuner_timer"] = spread(tflops(tuner_case(flash, [qkv], backward, repeats)))
        except (*launch.UNFIT, RuntimeError) as err:  # too big for the chip, or refused by the compiler
            entry["error"] = launch.error_line(err)
        finally:
            _restore()
        row["configs"].append(entry)
        print(tuple(shape), op, cand.label(), entry.get("tflops", {}).get("median"),
              entry.get("tflops_tuner_timer", {}).get("median"), entry["error"], flush=True)
        save(row)
    del row["stopped"]
    save(row)
    return row


def markdown(op: str, rows: list[dict], env: dict, command: str) -> str:
    what = {"fwd": "forward", "bwd": "forward+backward (the forward is the autotuner's choice)",
            "bwd_atomic": "forward+backward with deterministic=False (the forward is the "
                          "autotuner's choice)"}[op]
    timer = TIMERS[env.get("timer", "events")]
    lines = [f"# Flash configurations swept on {env['gpu']}: {what}", "", f"Command: `{command}`", "",
             f"Commit {env['commit']}; torch {env['torch']}, triton {env['triton']}, CUDA {env['cuda']}, "
             f"cuDNN {env['cudnn']}; {env['date']}. bf16, the median of each run by {timer}; "
             f" {env['repeats']} runs: median (min-max) TFLOP/s. Listed: in the autotuner's "
             "candidate list at this shape. Each configuration was checked against float64 "
             "under the FA2 rule first. Tuner's timer: the same calls timed as the autotuner "
             "times candidates (`launch._time_ms`, windows of 10 calls), median of the runs.",
             ""]
    name = lambda e: launch.Candidate.from_json(e["candidate"]).label()  # noqa: E731
    for r in rows:
        c, ct = r["cudnn"], r.get("cudnn_tuner_timer")
        by_tuner = f"; {ct['median']:.0f} by the tuner's timer" if ct else ""
        lines += [f"## {tuple(r['shape'])}: cuDNN {c['median']:.0f} ({c['min']:.0f}-{c['max']:.0f}) TFLOP/s{by_tuner}",
                  "", "| configuration | listed | TFLOP/s | / cuDNN | tuner's timer TFLOP/s | / cuDNN |",
                  "|---|---|---|---|---|---|"]
        ok = [e for e in r["configs"] if "tflops" in e]
        for e in sorted(ok, key=lambda e: -e["tflops"]["median"]):
            t, tt = e["tflops"], e.get("tflops_tuner_timer")
            tuner = (f"{tt['median']:.0f} | {tt['median'] / ct['median']:.2f}x" if tt and ct else "n/a | n/a")
            lines.append(f"| {name(e)} | {'yes' if e['listed'] else ''} | "
                         f"{t['median']:.0f} ({t['min']:.0f}-{t['max']:.0f}) | {t['median'] / c['median']:.2f}x | {tuner} |")
        if ok and all("tflops_tuner_timer" in e for e in ok):
            first = max(ok, key=lambda e: e["tflops"]["median"])
            tuners = max(ok, key=lambda e: e["tflops_tuner_timer"]["median"])
            lines += ["", f"The fastest by this table's timer: {name(first)}; by the tuner's: {name(tuners)}"
                      + ("" if first is tuners else
                         f", {tuners['tflops']['median'] / first['tflops']['median']:.3f}x the first's "
                         "TFLOP/s by this table's timer") + "."]
        bad = [e for e in r["configs"] if "tflops" not in e]
        if bad:
            lines += ["", "Not timed: " + "; ".join(f"{name(e)}: {e['error']}" for e in bad)]
        if r.get("stopped"):
            lines += ["", f"Stopped early ({r['stopped']}): the grid's other configurations were not run."]
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--op", choices=("fwd", "bwd", "bwd_atomic"), required=True)
    parser.add_argument("--shapes", nargs="+", type=parse_shape, required=True, metavar="B,H,N,D")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--budget-s", type=float, default=float("inf"),
                        help="start no new configuration after this many seconds")
    parser.add_argument("--timer", choices=sorted(TIMERS), default="events",
                        help="; ".join(f"{k}: {v}" for k, v in TIMERS.items()))
    parser.add_argument("--listed", action="store_true",
                        help="only the autotuner's candidates at each shape, not the wider grid")
    parser.add_argument("--configs", nargs="+", metavar="FAMILY:TILES:WARPS:STAGES[:MAXNREG]",
                        help="only these configurations (see above), not the grid")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args()
    configs = [parse_config(args.op, c) for c in args.configs or ()]
    if not torch.cuda.is_available():
        sys.exit("sweep_configs.py needs a CUDA GPU: it times GPU kernels.")
    deadline = time.monotonic() + args.budget_s
    env = {**environment(), "repeats": args.repeats, "timer": args.timer}
    command, rows = command_line(), []
    stem = result_stem(f"sweep_{args.op}", env)
    args.out.mkdir(parents=True, exist_ok=True)

    def save(row: dict) -> None:  # every row so far and this one, as it stands; each file whole
        done = rows + [row]
        for suffix, text in ((".json", json.dumps({"command": command, "environment": env, "results": done},
                                                  indent=1)),
                             (".md", markdown(args.op, done, env, command))):
            with written_whole(args.out / f"{stem}{suffix}") as tmp:
                Path(tmp).write_text(text)

    for shape in args.shapes:
        rows.append(sweep_shape(args.op, shape, args.repeats, deadline, args.timer, args.listed, configs,
                                save))
    print(markdown(args.op, rows, env, command))


if __name__ == "__main__":
    main()
