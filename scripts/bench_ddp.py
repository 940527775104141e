"""Data-parallel scaling of the real training loop: 1 process, then N processes (DDP).

For each case of bench_loop.py (a data recipe, a model, a batch per device) the script runs
the Lightning loop of scripts/bench_loop.py (the same composed config, DataModule, module,
callbacks, logger; validation and checkpoints off) twice, each in a fresh process group:

- 1 process: `trainer=default` (one device, no DDP wrapper), as a single-GPU run trains;
- N processes: `trainer=ddp trainer.devices=N` (NCCL on GPUs; gloo on a CPU-only machine),
  the same batch on every process, so N times the global batch.

Timing: every process times `repeats` windows of `steps` steps after `warmup` steps with
bench_loop.LoopTimer and counts the images it trained on; rank 0 gathers them, and a window's
global img/s is all processes' images / the slowest process's time. The figures are the
median over windows; scaling = img/s on N / img/s on 1. Peak memory is
torch.cuda.max_memory_allocated of the whole run (the GPU pipeline's images included), the
largest over the processes (null on the CPU).

    python scripts/bench_ddp.py --data-root /data --devices 2 --out benchmarks/results
    python scripts/bench_ddp.py --quick --devices 2 --out /tmp/bench    # synthetic data, CPU ok

writes ddp_<gpu>.json and ddp_<gpu>.md. With `--fsdp-model vit_large_patch16_224` it runs that
model on synthetic 224 px images for a few steps under `trainer=fsdp` and `trainer=ddp` (N GPUs
each, eager) and writes their peak memory per GPU to fsdp_<gpu>.json/.md instead; FSDP runs on
CUDA only (Lightning refuses FSDP on the CPU).

Each run is a subprocess of this script (`--worker`): Lightning's DDP launcher starts the other
ranks by running the same command line again, and each measurement gets a fresh process.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import lightning as L
import timm
import torch
import torch.distributed as dist

from bench_attention import command_line, earlier_rows, environment, write_results  # scripts/ is on sys.path
from bench_loop import CASES, LoopTimer, compose_case, spread
from train import build
from vitflash.cli import check_trainer, leave_process_group, quiet
from vitflash.module import COMPILE_CHOICES

FSDP_IMG_SIZE = 224


class RankTimer(LoopTimer):
    """LoopTimer's windows on every process (no bare step: the model is wrapped for DDP or
    FSDP), plus the images each window trained on. At the end of training every rank sends
    {rank, window_s, window_images, peak_mem_gib} to all (`ranks`, indexed by rank)."""

    def __init__(self, warmup: int, steps: int, repeats: int):
        super().__init__(warmup, steps, repeats, bare_warmup=None)
        self.images, self.images_at_marks = 0, []
        self.ranks: list[dict] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.images += len(batch[1])  # a shape, not a host read
        marks = len(self.times)
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        if len(self.times) > marks:  # this batch closed a window
            self.images_at_marks.append(self.images)

    def on_train_end(self, trainer, pl_module):
        super().on_train_end(trainer, pl_module)
        device = pl_module.device
        mine = {
            "rank": trainer.global_rank, "window_s": self.loop_s,
            "window_images": [b - a for a, b in zip(self.images_at_marks, self.images_at_marks[1:])],
            "peak_mem_gib": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None,
        }
        self.ranks = [mine]
        if trainer.world_size > 1:
            self.ranks = [None] * trainer.world_size
            dist.all_gather_object(self.ranks, mine)


def global_img_per_s(ranks: list[dict]) -> list[float]:
    """img/s of each window over all processes: their images / the slowest one's seconds."""
    windows = range(len(ranks[0]["window_s"]))
    return [sum(r["window_images"][k] for r in ranks) / max(r["window_s"][k] for r in ranks) for k in windows]


def worker(args, spec: dict) -> None:
    """One run (every rank of it): the case's loop under spec's trainer and devices; rank 0
    writes the measurements to spec["result"]."""
    quiet()
    extra = [f"trainer={spec['trainer']}", f"trainer.devices={spec['devices']}", f"model.model_name={spec['model']}",
             f"data.batch_size={spec['batch']}", *spec["overrides"]]
    case_args = argparse.Namespace(data_root=args.data_root, pipeline=args.pipeline, override=[*extra, *args.override])
    cfg, overrides = compose_case(spec["case"], spec["attention"], spec["compile"], case_args, Path(spec["run_dir"]),
                                  args.warmup + args.repeats * args.steps)
    check_trainer(cfg.trainer)
    L.seed_everything(cfg.seed)
    torch.set_float32_matmul_precision(cfg.matmul_precision)
    timer = RankTimer(args.warmup, args.steps, args.repeats)
    datamodule, module, trainer = build(cfg, extra_callbacks=[timer])
    trainer.fit(module, datamodule=datamodule)
    backend = dist.get_backend() if dist.is_initialized() else None
    leave_process_group()  # every rank, before the results are written
    if trainer.global_rank != 0:
        return
    windows = global_img_per_s(timer.ranks)
    peaks = [r["peak_mem_gib"] for r in timer.ranks]
    result = {
        "img_per_s": statistics.median(windows), "window_img_per_s": windows,
        "peak_mem_gib": None if None in peaks else max(peaks), "ranks": timer.ranks,
        "world_size": trainer.world_size, "strategy": type(trainer.strategy).__name__,
        "backend": backend,
        "attention": module.model.attention, "compile_mode": module.compile_mode or "eager",
        "pipeline": cfg.data.get("pipeline", "cpu"), "precision": str(trainer.precision),
        "model": cfg.model.model_name, "batch_per_gpu": cfg.data.batch_size, "overrides": overrides,
    }
    Path(spec["result"]).write_text(json.dumps(result))


def launch(argv: list[str], spec: dict) -> dict:
    """Run `spec` in a subprocess of this script (its ranks in further ones) and return rank 0's
    measurements."""
    with tempfile.TemporaryDirectory() as tmp:
        spec = {**spec, "run_dir": str(Path(tmp) / "run"), "result": str(Path(tmp) / "result.json")}
        command = [sys.executable, str(Path(__file__).resolve()), *argv, "--worker", json.dumps(spec)]
        done = subprocess.run(command)
        if done.returncode != 0:
            raise RuntimeError(f"the {spec['trainer']} run of {spec['case']} on {spec['devices']} device(s) failed "
                               f"(exit status {done.returncode}); its output is above")
        return json.loads(Path(spec["result"]).read_text())


def per(key: str, n: int) -> str:
    return f"{key}_{n}gpu"


def scaling_row(case: str, args, argv: list[str]) -> dict:
    """The case on 1 process, then on args.devices processes under DDP."""
    model, batch, _ = CASES[case]
    common = {"case": case, "model": model, "batch": args.batch or batch, "attention": args.attention,
              "compile": args.compile, "overrides": []}
    one = launch(argv, {**common, "trainer": "default", "devices": 1})
    many = launch(argv, {**common, "trainer": "ddp", "devices": args.devices})
    n = args.devices
    row = {"data": case, "model": one["model"], "batch_per_gpu": one["batch_per_gpu"], "devices": n,
           "attention": one["attention"], "compile_mode": one["compile_mode"], "pipeline": one["pipeline"],
           "precision": one["precision"], "backend": many["backend"],
           per("img_per_s", 1): one["img_per_s"], per("img_per_s", n): many["img_per_s"],
           "scaling": many["img_per_s"] / one["img_per_s"],
           per("peak_mem_gib", 1): one["peak_mem_gib"], per("peak_mem_gib", n): many["peak_mem_gib"]}
    for k, run in ((1, one), (n, many)):
        row.update({per("window_img_per_s", k): run["window_img_per_s"], per("ranks", k): run["ranks"],
                    per("strategy", k): run["strategy"], per("overrides", k): run["overrides"]})
    return row | {"warmup": args.warmup, "steps": args.steps, "repeats": args.repeats}


def fsdp_rows(args, argv: list[str]) -> list[dict]:
    """args.fsdp_model on synthetic 224 px images under trainer=fsdp, then trainer=ddp."""
    rows = []
    for trainer in ("fsdp", "ddp"):
        run = launch(argv, {"case": "synthetic", "model": args.fsdp_model, "batch": args.batch,
                            "attention": args.attention, "compile": args.compile, "trainer": trainer,
                            "devices": args.devices, "overrides": [f"data.img_size={FSDP_IMG_SIZE}"]})
        rows.append({"model": run["model"], "batch_per_gpu": run["batch_per_gpu"], "devices": run["world_size"],
                     "trainer": trainer, "strategy": run["strategy"], "peak_mem_gib": run["peak_mem_gib"],
                     "peak_mem_gib_per_rank": [r["peak_mem_gib"] for r in run["ranks"]],
                     "img_per_s": run["img_per_s"], "window_img_per_s": run["window_img_per_s"],
                     "attention": run["attention"], "compile_mode": run["compile_mode"],
                     "precision": run["precision"], "overrides": run["overrides"]})
    return rows


def gib(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}"


def scaling_markdown(rows: list[dict], env: dict, command: str, args) -> str:
    commands = list(dict.fromkeys(r.get("command", command) for r in rows))  # --append: one per case run
    lines = [f"# DDP scaling of the training loop on {env['gpu']}", "",
             *(f"Command: `{c}`" for c in commands), "",
             f"torch {env['torch']}, triton {env['triton']}, lightning {env['lightning']}, timm {env['timm']}, "
             f"CUDA {env['cuda']}; {env['date']}. The Lightning loop of bench_loop.py on 1 process "
             "(trainer=default) and on N (trainer=ddp), the same batch per process. img/s: median (min-max) "
             f"of {args.repeats} windows of {args.steps} steps after {args.warmup} warm-up steps, all processes' "
             "images over the slowest one's time. Peak memory: the largest max_memory_allocated of the processes.", "",
             "| data | pipeline | model | batch/GPU | attention | compile | N | img/s, 1 | img/s, N | scaling | "
             "peak GiB/GPU, 1 | peak GiB/GPU, N |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        n = r["devices"]
        lines.append(f"| {r['data']} | {r['pipeline']} | {r['model']} | {r['batch_per_gpu']} | {r['attention']} | "
                     f"{r['compile_mode']} | {n} | {spread(r[per('window_img_per_s', 1)])} | "
                     f"{spread(r[per('window_img_per_s', n)])} | {r['scaling']:.2f}x | "
                     f"{gib(r[per('peak_mem_gib', 1)])} | {gib(r[per('peak_mem_gib', n)])} |")
    return "\n".join(lines) + "\n"


def fsdp_markdown(rows: list[dict], env: dict, command: str, args) -> str:
    lines = [f"# FSDP against DDP: peak memory per GPU on {env['gpu']}", "", f"Command: `{command}`", "",
             f"torch {env['torch']}, lightning {env['lightning']}, CUDA {env['cuda']}; {env['date']}. "
             f"{args.warmup + args.repeats * args.steps} steps on synthetic {FSDP_IMG_SIZE} px images, "
             f"{args.devices} GPUs, AdamW. Peak memory: the largest torch.cuda.max_memory_allocated of the processes.",
             "", "| model | batch/GPU | trainer | attention | compile | peak GiB/GPU | img/s |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['batch_per_gpu']} | {r['trainer']} | {r['attention']} | {r['compile_mode']} | "
                     f"{gib(r['peak_mem_gib'])} | {spread(r['window_img_per_s'])} |")
    return "\n".join(lines) + "\n"


def kept_rows(out: Path, env: dict, cases: list[str]) -> list[dict]:
    """The rows of cases other than `cases` in out/ddp_<gpu>.json, if it exists."""
    return earlier_rows(out, "ddp", env, lambda r: r["data"] not in cases)


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--data-root", help="the data root (paths.data_dir), holding cifar10/ and imagenette/")
    parser.add_argument("--cases", nargs="+", choices=list(CASES), default=["cifar10", "imagenette"])
    parser.add_argument("--devices", type=int, default=2, help="processes (GPUs) of the DDP run (default 2)")
    parser.add_argument("--batch", type=int, help="batch per process (default: the case's; --fsdp-model: 32)")
    parser.add_argument("--attention", default="auto", help="attention=<value> (default auto: flash on CUDA, else sdpa)")
    parser.add_argument("--compile", choices=COMPILE_CHOICES,
                        help="model.compile (default auto: CUDA graphs on a GPU; --fsdp-model: false)")
    parser.add_argument("--pipeline", help="passed as data.pipeline=<value> (gpu or cpu)")
    parser.add_argument("--override", action="append", default=[], help="another Hydra override, KEY=VALUE")
    parser.add_argument("--warmup", type=int, help="steps before the first window, compiling included (default 15; "
                                                   "--fsdp-model 3, --quick 1)")
    parser.add_argument("--steps", type=int, help="steps per timed window (default 30; --fsdp-model 5, --quick 2)")
    parser.add_argument("--repeats", type=int, default=3, help="timed windows per run")
    parser.add_argument("--fsdp-model", help="instead of the cases: this model under trainer=fsdp and trainer=ddp, "
                                             "peak memory per GPU of each (CUDA only)")
    parser.add_argument("--append", action="store_true",
                        help="keep the rows of other cases already in --out's ddp_<gpu>.json (one case per command)")
    parser.add_argument("--quick", action="store_true",
                        help="one tiny case for a smoke test: synthetic data, vit_micro_patch4_32, b32, eager")
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # one run, as launched by this script
    args = parser.parse_args(argv)
    if args.quick:
        args.cases = ["synthetic"]
    # the memory of a few steps is the memory of many; the scaling cases need steady-state windows
    warmup, steps = (1, 2) if args.quick else (3, 5) if args.fsdp_model else (15, 30)
    args.warmup = warmup if args.warmup is None else args.warmup
    args.steps = steps if args.steps is None else args.steps
    if args.compile is None:
        args.compile = "false" if args.quick or args.fsdp_model else "auto"
    if args.fsdp_model and args.batch is None:
        args.batch = 32
    if min(args.warmup, args.steps, args.repeats) < 1:
        parser.error("--warmup, --steps and --repeats must be at least 1")
    if args.devices < 2:
        parser.error(f"--devices {args.devices}: the data-parallel run needs at least 2 processes")
    if args.fsdp_model and not torch.cuda.is_available():
        parser.error("--fsdp-model runs trainer=fsdp, which needs CUDA GPUs (Lightning refuses FSDP on the CPU, and "
                     "torch sees no GPU here): run it on a machine with 2 or more GPUs")
    if torch.cuda.is_available() and torch.cuda.device_count() < args.devices:
        parser.error(f"--devices {args.devices} but this machine has {torch.cuda.device_count()} GPU(s)")
    return args


def main(argv: list[str] | None = None) -> list[dict]:
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    if args.worker:
        worker(args, json.loads(args.worker))
        return []
    env = {**environment(), "lightning": L.__version__, "timm": timm.__version__}
    command = command_line()
    if args.fsdp_model:
        rows = fsdp_rows(args, argv)
        table = fsdp_markdown(rows, env, command, args)
        write_results(args.out, "fsdp", env, command, rows, table)
        print(table)
        return rows
    rows = kept_rows(args.out, env, args.cases) if args.append else []
    for case in args.cases:
        rows.append(scaling_row(case, args, argv) | {"command": command})
        r = rows[-1]
        print(f"{case} {r['model']} b{r['batch_per_gpu']}/process: {r[per('img_per_s', 1)]:,.0f} img/s on 1, "
              f"{r[per('img_per_s', args.devices)]:,.0f} on {args.devices}, scaling {r['scaling']:.2f}x", flush=True)
        table = scaling_markdown(rows, env, command, args)
        write_results(args.out, "ddp", env, command, rows, table)  # after every case: a cut-off run keeps its rows
    print(table)
    return rows


if __name__ == "__main__":
    main()
