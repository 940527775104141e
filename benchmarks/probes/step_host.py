"""Probe: where the host time of one training step goes, path by path (on a GPU).

A CIFAR model's step at batch 256 under `torch.compile(mode="default")` is host-bound: the GPU
waits for the host to enqueue each kernel. This builds the step of `scripts/bench_model.py`
(AdamW fused, bf16 autocast, random images), times synchronized steps as that script does,
then runs a few steps under `torch.profiler` and lists, for each attention path:

- the step's median wall time, and the host time the profiler attributes to each operator
  (self CPU time per step, the largest first);
- the CUDA launches per step (runtime and driver API calls) and what they cost the host;
- the GPU's busy time per step (the kernels' and copies' device time), beside the wall time:
  a step whose wall time is well above it waits on the host;
- for flash, the plans the tuner chose (`launch._chosen`) and how many of the op's plans call
  their compiled kernels directly (a launch that cannot, e.g. for a misaligned pointer, goes
  through Triton's argument binding at every call).

    python benchmarks/probes/step_host.py --model vit_tiny_patch4_32 --batch 256 --compile default --paths flash sdpa

The profiler adds its own cost to every operator, so the per-operator figures compare paths
with each other, not with the unprofiled step time above them.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
from bench_model import step_fn, timed_steps  # noqa: E402

from vitflash import build_model  # noqa: E402
from vitflash.ops import flash, launch  # noqa: E402

LAUNCH_CALLS = ("cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx", "cudaLaunchKernelExC")


def launch_line(events, steps: int) -> str:
    """CUDA launches a step and the host time of the launch calls, from the profiler's
    per-operator averages (objects with key, count and self_cpu_time_total in us) of `steps`
    steps."""
    launches = [e for e in events if e.key in LAUNCH_CALLS]
    count = sum(e.count for e in launches) / steps
    ms = sum(e.self_cpu_time_total for e in launches) / steps / 1e3
    return f"CUDA launches per step: {count:.0f}, {ms:.2f} ms of host time in the launch calls."


def device_line(events, steps: int, wall_ms: float) -> str:
    """The GPU time a step (the device time of every kernel and copy, from the profiler's
    per-operator averages: objects with device_type and self_device_time_total in us), and
    its share of the unprofiled step's wall time."""
    busy = sum(e.self_device_time_total for e in events
               if str(getattr(e, "device_type", "")).endswith("CUDA")) / steps / 1e3
    return (f"GPU busy {busy:.2f} ms a step (kernels and copies, under the profiler): "
            f"{busy / wall_ms:.0%} of the step's wall time above.")


def operator_table(events, steps: int, top: int) -> list[str]:
    """The `top` operators by self CPU time: calls and milliseconds a step."""
    lines = [f"| operator (top {top} by self CPU time) | calls / step | self CPU ms / step |", "|---|---|---|"]
    for e in sorted(events, key=lambda e: -e.self_cpu_time_total)[:top]:
        lines.append(f"| {e.key[:90]} | {e.count / steps:.0f} | {e.self_cpu_time_total / steps / 1e3:.3f} |")
    return lines


def profile_path(model_name: str, batch: int, compile_mode: str | None, path: str, args) -> list[str]:
    """The section of one attention path: a fresh model and step, --warmup steps, the step
    timed (3 x --steps), then --profiled steps under the profiler, summed up per step."""
    torch.manual_seed(0)
    model = build_model(model_name, attention=path, num_classes=10).cuda()
    step = step_fn(model, batch, int(model_name.rsplit("_", 1)[-1]), compile_mode)
    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    wall = [statistics.median(timed_steps(step, args.steps)) * 1e3 for _ in range(3)]  # ms
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(args.profiled):
            step()
        torch.cuda.synchronize()
    lines = [f"## {path}", "",
             f"Step: {statistics.median(wall):.2f} ms median of 3 x {args.steps} synchronized steps "
             f"({min(wall):.2f}-{max(wall):.2f}); {batch / statistics.median(wall) * 1e3:,.0f} img/s.", ""]
    events = prof.key_averages()
    lines += [launch_line(events, args.profiled), "",
              device_line(events, args.profiled, statistics.median(wall)), ""]
    if path == "flash":
        chosen = "; ".join(f"{k[0]} N={k[2]} D={k[3]} BH<={k[4]}: {c.label()}" for k, c in launch._chosen.items())
        direct = sum(all(one.compiled is not None for one in plan) for plan in flash._plans.values())
        lines += [f"Tuner's plans: {chosen or 'none'}. Plans whose every launch calls its compiled "
                  f"kernel directly: {direct} of {len(flash._plans)}.", ""]
    lines += operator_table(events, args.profiled, args.top)
    del model, step
    torch._dynamo.reset()
    torch.cuda.empty_cache()
    return lines + [""]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="vit_tiny_patch4_32")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--compile", choices=("eager", "default", "reduce-overhead"), default="default")
    p.add_argument("--paths", nargs="+", default=["flash", "sdpa"], choices=("flash", "sdpa", "naive"))
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--profiled", type=int, default=5)
    p.add_argument("--top", type=int, default=20)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("step_host.py needs a CUDA GPU: it profiles training steps on one.")
    mode = None if args.compile == "eager" else args.compile
    out = [f"# Host time of one training step: {args.model}, batch {args.batch}, {args.compile} "
           f"({torch.cuda.get_device_name()})", "",
           f"`python benchmarks/probes/step_host.py {' '.join(sys.argv[1:] if argv is None else argv)}`; "
           f"torch {torch.__version__}.", ""]
    for path in args.paths:
        out += profile_path(args.model, args.batch, mode, path, args)
        print("\n".join(out), flush=True)
        out = []


if __name__ == "__main__":
    main()
