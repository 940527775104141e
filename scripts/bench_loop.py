"""The real training loop against the bare training step of the same model, in one process.

For each case (a data recipe, an attention path, a compile mode) the script composes
configs/train.yaml through Hydra as scripts/train.py does, builds the same DataModule,
ViTModule, Trainer, callbacks and logger, and fits for `warmup + repeats * steps` steps.
Validation and checkpoints are off: they are per-epoch costs, not the loop under test.

- loop img/s: a callback times `repeats` back-to-back windows of `steps` steps after the
  warm-up (wall clock, the device synchronized at each window's ends). A window runs from
  the end of one step to the end of another, so it holds as many batch fetches as steps.
- bare-step img/s: when training ends (before Lightning moves the model back to the CPU),
  the same model, compiled the same way, runs forward, cross-entropy, backward and the
  loop's own optimizer step on the last batch, already on the device, under the Trainer's
  precision (autocast); timed the same way, `repeats` windows of `steps` steps.
- ratio: median loop img/s / median bare-step img/s.
- host ms/step: the process's CPU time (time.process_time) per step in the same windows, loop
  and bare step: the host's work per step, which a GPU step of a small model waits for; on a
  machine shared with other processes it is also steadier than the wall clock.
- loop GC ms: the time the interpreter spent in garbage collection (gc.callbacks) in each
  loop window: a collection of the oldest generation walks every object the process holds
  (compiled graphs and kernels included) and stalls the host for as long.
- graph-step img/s (`--graph-step`, CUDA only): a copy of the model with the same weights (eager,
  or compiled without CUDA graphs of its own where the case's compile mode is default)
  and a fused, capturable AdamW run forward, cross-entropy, backward and the optimizer step on
  the same batch as one CUDA graph, as `model.graph_step=true` does (`vitflash.graph_step`):
  what the bare step costs when the host launches one graph per step.
- `--loop-graph-step`: the loop runs with model.graph_step=true (the whole training step as one
  CUDA graph) in the cases compiled `false` or `default`; the compile column says "+ graph step".
  Where a case is measured in several modes, a last table sets the fastest loop against the
  fastest bare step of any mode (bare or graph step) of the same model, batch and attention.
- gpu_busy: the mean GPU utilization during the loop windows, from `nvidia-smi` sampling
  every 100 ms (NVML's share of time in which a kernel ran; torch.cuda.utilization()
  without nvidia-smi); null where it cannot be read.

    python scripts/bench_loop.py --data-root data --out benchmarks/results
    python scripts/bench_loop.py --quick --out /tmp/bench     # one tiny case, runs on a CPU

writes loop_<gpu>.json and loop_<gpu>.md into --out. `--pipeline gpu` passes
`data.pipeline=gpu` to the data config; `--override KEY=VALUE` passes any other override.
`--override experiment=<recipe>` measures a named recipe's loop: its model, batch,
augmentation, mixup and EMA, instead of the case's (the case still chooses the dataset).
"""
from __future__ import annotations

import argparse
import gc
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

import lightning as L
import timm
import torch
import torch.nn.functional as F
from hydra import compose, initialize_config_dir

from bench_attention import command_line, environment, write_results  # scripts/ is on sys.path
from train import build
import vitflash
from vitflash.graph_step import AUTOCAST, WARMUP_STEPS, WholeStepGraph
from vitflash.module import COMPILE_CHOICES
from vitflash.ops import ATTENTION_IMPLS

CONFIGS = Path(__file__).resolve().parents[1] / "configs"

# name: (model, batch, Hydra overrides). cifar10 is the recipe (RandAugment, random
# erasing, mixup/cutmix); imagenette the fine-tuning one, from random weights (the speed is
# the same, and nothing is fetched). imagenette_synthetic is imagenette with random images of
# the same number and size in place of the files: the same model, step, augmentation and
# batches, for timing the loop where the dataset is not at hand (its cost does not depend on
# the pixels).
IMAGENETTE = ["experiment=imagenette_finetune", "model.pretrained=null"]
CASES = {
    "cifar10": ("vit_tiny_patch4_32", 1024, ["experiment=cifar10_vit_tiny"]),
    "imagenette": ("vit_small_patch16_224", 256, IMAGENETTE),
    "imagenette_synthetic": ("vit_small_patch16_224", 256, [
        *IMAGENETTE, "data._target_=vitflash.data.SyntheticDataModule", "~data.root", "~data.in_memory",
        "~data.cache_size", "data.expected_sizes=null", "+data.train_size=9469", "+data.test_size=512"]),
    "synthetic": ("vit_micro_patch4_32", 32, ["data=synthetic"]),
}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class GcPauses:
    """The interpreter's time in garbage collection since this was made (`total_s`, seconds;
    `collections`), from gc.callbacks, until stop()."""

    def __init__(self):
        self.total_s, self.collections, self._start = 0.0, 0, None
        gc.callbacks.append(self._on)

    def _on(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        elif self._start is not None:
            self.total_s += time.perf_counter() - self._start
            self.collections += 1
            self._start = None

    def stop(self) -> None:
        if self._on in gc.callbacks:
            gc.callbacks.remove(self._on)


class LoopTimer(L.Callback):
    """Times `repeats` windows of `steps` training steps after `warmup` steps, then the bare
    step of the same model (see the module docstring; `bare_warmup=None`: no bare step).
    Results: `loop_s`, `bare_s` (seconds per window) and `windows` ((start, end) wall-clock
    times of the loop windows)."""

    def __init__(self, warmup: int, steps: int, repeats: int, bare_warmup: int | None, profile: Path | None = None,
                 graph_step: bool = False):
        self.warmup, self.steps, self.repeats, self.bare_warmup = warmup, steps, repeats, bare_warmup
        self.graph_step = graph_step
        self.marks = {warmup - 1 + k * steps for k in range(repeats + 1)}  # batch ends that bound windows
        # one more window after the timed ones, under the profilers (its time is not reported)
        self.profile, self.profiled = profile, warmup - 1 + (repeats + 1) * steps
        self._profilers = None
        self.times: list[float] = []
        self.cpu_times: list[float] = []
        self.gc = GcPauses()
        self.gc_times: list[float] = []
        self.batch = None
        self.loop_s: list[float] = []
        self.bare_s: list[float] = []
        self.loop_cpu_s: list[float] = []
        self.bare_cpu_s: list[float] = []
        self.graph_s: list[float] = []
        self.graph_cpu_s: list[float] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        step = trainer.global_step - 1  # this batch's step, counted from 0
        if step in self.marks:
            sync(pl_module.device)
            self.times.append(time.time())  # the clock of nvidia-smi's timestamps (GpuBusy)
            self.cpu_times.append(time.process_time())
            self.gc_times.append(self.gc.total_s)
        if step == max(self.marks):
            x, y = batch
            self.batch = (x.clone(), y.clone())
            if self.profile is not None:
                self._profilers = start_profilers()
        if step == self.profiled and self._profilers is not None:
            sync(pl_module.device)
            stop_profilers(self._profilers, self.profile)
            self._profilers = None

    @property
    def windows(self) -> list[tuple[float, float]]:
        return list(zip(self.times[:-1], self.times[1:]))

    def on_train_end(self, trainer, pl_module):
        if len(self.times) != self.repeats + 1:
            raise RuntimeError(f"the loop ran {trainer.global_step} steps, fewer than warmup + repeats * steps: "
                               "does the dataset hold enough batches? (max_steps sets the length)")
        self.loop_s = [b - a for a, b in self.windows]
        self.loop_cpu_s = [b - a for a, b in zip(self.cpu_times[:-1], self.cpu_times[1:])]
        self.loop_gc_s = [b - a for a, b in zip(self.gc_times[:-1], self.gc_times[1:])]
        self.gc.stop()
        if self.bare_warmup is None:
            return
        self.bare_s, self.bare_cpu_s = self._time(self._bare_step(trainer, pl_module), pl_module.device)
        if self.graph_step:
            self.graph_s, self.graph_cpu_s = self._time(self._graph_step(trainer, pl_module), pl_module.device)

    def _time(self, step, device: torch.device) -> tuple[list[float], list[float]]:
        """(wall, CPU) seconds of each of `repeats` windows of `steps` calls of `step`, after
        `bare_warmup` calls."""
        for _ in range(self.bare_warmup):
            step()
        wall, cpu = [], []
        for _ in range(self.repeats):
            sync(device)
            start, start_cpu = time.perf_counter(), time.process_time()
            for _ in range(self.steps):
                step()
            sync(device)
            wall.append(time.perf_counter() - start)
            cpu.append(time.process_time() - start_cpu)
        return wall, cpu

    def _bare_step(self, trainer, module):
        x, y = self.batch
        model, optimizer = module.model, trainer.optimizers[0]
        cudagraphs = module.compile_mode == "reduce-overhead"

        def step():
            if cudagraphs:
                torch.compiler.cudagraph_mark_step_begin()
            with trainer.precision_plugin.forward_context():  # the loop's autocast
                loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        return step

    def _graph_step(self, trainer, module):
        """The whole step (forward, loss, backward, AdamW) as one CUDA graph, as model.graph_step
        runs it (`vitflash.graph_step.WholeStepGraph`), on a copy of the model (eager, or compiled
        without CUDA graphs where the loop's compile mode is default) with a fused, capturable
        AdamW: three eager steps, the capture, then a replay per call."""
        precision = str(trainer.precision)
        if precision not in AUTOCAST:
            raise ValueError(f"--graph-step times bf16-mixed or 32-bit steps, not precision {precision}: fp16 "
                             "needs a gradient scaler, whose step waits for the GPU")
        hp = module.hparams
        model = vitflash.create_model(hp.model_name, attention=module.model.attention, num_classes=hp.num_classes,
                                      img_size=hp.img_size, drop_path_rate=hp.drop_path_rate,
                                      attn_drop_rate=hp.get("attn_drop_rate", 0.0))
        model.load_state_dict(module.model.state_dict())
        model.to(module.device).train()
        if module.compile_mode == "default":  # as model.graph_step=true model.compile=default runs it
            model.compile(mode="default")
        lr = float(trainer.optimizers[0].param_groups[0]["lr"])
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr, fused=True, capturable=True)
        whole = WholeStepGraph(model, F.cross_entropy, optimizer, clip=None, precision=precision)
        x, y = self.batch
        for _ in range(WARMUP_STEPS + 1):  # the eager steps and the capture, before any timed window
            whole.step(x, y)
        return lambda: whole.step(x, y)


def start_profilers():
    """torch.profiler (operators on the host, kernels and synchronizations) and cProfile (the
    Python functions of the loop), both on."""
    import cProfile

    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    ops = torch.profiler.profile(activities=activities)
    ops.__enter__()
    py = cProfile.Profile()
    py.enable()
    return ops, py


def stop_profilers(profilers, prefix: Path) -> None:
    """Writes <prefix>.ops.txt (operators by host time, then by device time; the
    synchronizations show as cudaStreamSynchronize/cudaDeviceSynchronize/cudaMemcpy rows),
    <prefix>.python.txt (Python functions by own time, and by cumulative time),
    <prefix>.python.prof (the same for pstats or snakeviz, with callers) and
    <prefix>.trace.json.gz (chrome://tracing or Perfetto)."""
    import gzip
    import io
    import pstats

    ops, py = profilers
    py.disable()
    ops.__exit__(None, None, None)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    table = ops.key_averages()
    text = [table.table(sort_by="self_cpu_time_total", row_limit=60)]
    if torch.cuda.is_available():
        text.append(table.table(sort_by="self_cuda_time_total", row_limit=40))
    prefix.with_name(prefix.name + ".ops.txt").write_text("\n\n".join(text))
    buf = io.StringIO()
    stats = pstats.Stats(py, stream=buf)
    stats.sort_stats("tottime").print_stats(60)
    stats.sort_stats("cumulative").print_stats(80)
    prefix.with_name(prefix.name + ".python.txt").write_text(buf.getvalue())
    py.dump_stats(prefix.with_name(prefix.name + ".python.prof"))
    trace = prefix.with_name(prefix.name + ".trace.json")
    ops.export_chrome_trace(str(trace))
    with trace.open("rb") as f, gzip.open(f"{trace}.gz", "wb") as z:
        z.write(f.read())
    trace.unlink()


class GpuBusy:
    """GPU utilization samples (NVML's percent of time in which a kernel ran) every
    `interval_ms`: from `nvidia-smi -lms`, in its own process, so that sampling takes no time
    from the loop's Python thread; else from torch.cuda.utilization() (pynvml) in a thread;
    no samples without CUDA or either of them."""

    def __init__(self, interval_ms: int = 100):
        self.samples: list[tuple[float, float]] = []  # (time.time(), percent)
        self.proc = None
        self.running = True
        if not torch.cuda.is_available():
            return
        if shutil.which("nvidia-smi"):
            uuid = str(torch.cuda.get_device_properties(torch.cuda.current_device()).uuid)
            self.proc = subprocess.Popen(
                ["nvidia-smi", "--id=" + (uuid if uuid.startswith("GPU-") else "GPU-" + uuid),
                 "--query-gpu=timestamp,utilization.gpu", "--format=csv,noheader,nounits", "-lms", str(interval_ms)],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            threading.Thread(target=self._read, daemon=True).start()
        else:
            threading.Thread(target=self._poll, args=(interval_ms / 1e3,), daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            try:
                stamp, percent = line.split(",")
                when = datetime.strptime(stamp.strip(), "%Y/%m/%d %H:%M:%S.%f").timestamp()  # local time
                self.samples.append((when, float(percent)))
            except ValueError:
                continue  # e.g. "[N/A]"

    def _poll(self, interval_s: float) -> None:
        while self.running:
            try:
                self.samples.append((time.time(), float(torch.cuda.utilization())))
            except Exception:  # no pynvml, or NVML refused: gpu_busy stays null
                return
            time.sleep(interval_s)

    def stop(self) -> None:
        self.running = False
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait()

    def mean(self, windows: list[tuple[float, float]]) -> float | None:
        """Mean busy fraction (0-1) of the samples inside `windows`, or None if there are none."""
        inside = [p for t, p in self.samples if any(a <= t <= b for a, b in windows)]
        return statistics.mean(inside) / 100 if inside else None


GRAPH_STEP_COMPILE = ("false", "default")  # model.compile values that model.graph_step=true runs with


def compose_case(case: str, attention: str, compile_mode: str, args, out_dir: Path, max_steps: int):
    model, batch, overrides = CASES[case]
    pins = [f"model.model_name={model}", f"data.batch_size={batch}"]
    if any(o.split("=", 1)[0].lstrip("+") == "experiment" for o in args.override):
        # a recipe given with --override experiment=<name> replaces the case's, and brings its
        # own model and batch: pinned here they would win over the recipe's (Hydra ranks
        # command-line keys above any config group's)
        overrides = [o for o in overrides if not o.startswith("experiment=")]
        pins = []
    overrides = [
        *overrides, *pins, f"attention={attention}",
        f"model.compile={compile_mode}", f"paths.output_dir={out_dir}", "logger=csv",
        f"+trainer.max_steps={max_steps}", "trainer.max_epochs=null",
        "trainer.limit_val_batches=0", "+trainer.num_sanity_val_steps=0", "+trainer.enable_checkpointing=false",
        "callbacks.model_checkpoint=null", "callbacks.last_checkpoint=null", "callbacks.step_checkpoint=null",
    ]
    if args.data_root:
        overrides.append(f"paths.data_dir={args.data_root}")
    if args.pipeline:
        overrides.append(f"data.pipeline={args.pipeline}")
    # explicit either way: the config's default (auto) would capture every eligible case.
    # getattr: bench_ddp.py composes its cases here with arguments that have no --loop-graph-step
    graphed = getattr(args, "loop_graph_step", False) and compile_mode in GRAPH_STEP_COMPILE
    overrides.append(f"model.graph_step={'true' if graphed else 'false'}")
    overrides += args.override
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        return compose("train", overrides=overrides), overrides


def run_case(case: str, attention: str, compile_mode: str, args) -> dict:
    max_steps = args.warmup + (args.repeats + bool(args.profile)) * args.steps
    profile = args.profile / f"{case}_{attention}_{compile_mode}{args.profile_tag}" if args.profile else None
    with tempfile.TemporaryDirectory() as tmp:
        cfg, overrides = compose_case(case, attention, compile_mode, args, Path(tmp), max_steps)
        L.seed_everything(cfg.seed)
        torch.set_float32_matmul_precision(cfg.matmul_precision)
        timer = LoopTimer(args.warmup, args.steps, args.repeats, bare_warmup=max(args.warmup // 2, 2),
                          profile=profile, graph_step=args.graph_step)
        datamodule, module, trainer = build(cfg, extra_callbacks=[timer])
        busy = GpuBusy()
        try:
            trainer.fit(module, datamodule=datamodule)
        finally:
            busy.stop()
            timer.gc.stop()
    batch = cfg.data.batch_size
    loop = [batch * args.steps / s for s in timer.loop_s]
    bare = [batch * args.steps / s for s in timer.bare_s]
    graph = [batch * args.steps / s for s in timer.graph_s]
    row = {
        "data": case, "model": cfg.model.model_name, "batch": batch, "attention": module.model.attention,
        "compile": compile_mode, "compile_mode": module.compile_mode or "eager",
        # the loop ran the whole step as one CUDA graph (model.graph_step=true, --loop-graph-step)
        "loop_graph_step": module.graph_step,
        "pipeline": cfg.data.get("pipeline", "cpu"), "precision": str(trainer.precision),
        "loop_img_per_s": statistics.median(loop), "step_img_per_s": statistics.median(bare),
        "ratio": statistics.median(loop) / statistics.median(bare), "gpu_busy": busy.mean(timer.windows),
        "loop_repeats": loop, "step_repeats": bare, "warmup": args.warmup, "steps": args.steps,
        "loop_host_ms": [1e3 * s / args.steps for s in timer.loop_cpu_s],
        "step_host_ms": [1e3 * s / args.steps for s in timer.bare_cpu_s],
        "loop_gc_ms": [1e3 * s for s in timer.loop_gc_s],
        # the whole step as one CUDA graph (--graph-step): null when not measured
        "graph_step_img_per_s": statistics.median(graph) if graph else None, "graph_step_repeats": graph,
        "graph_step_host_ms": [1e3 * s / args.steps for s in timer.graph_cpu_s],
        "overrides": overrides,
    }
    del datamodule, module, trainer, timer
    torch._dynamo.reset()  # frees the compiled graphs and their CUDA-graph memory pools
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return row


def spread(values: list[float], digits: int = 0) -> str:
    return f"{statistics.median(values):,.{digits}f} ({min(values):,.{digits}f}-{max(values):,.{digits}f})"


def markdown(rows: list[dict], env: dict, command: str, args) -> str:
    lines = [f"# Training loop vs bare step on {env['gpu']}", "", f"Command: `{command}`", "",
             f"Commit {env['commit']}; torch {env['torch']}, triton {env['triton']}, lightning {env['lightning']}, "
             f"timm {env['timm']}, "
             f"CUDA {env['cuda']}; {env['date']}. Median (min-max) of {args.repeats} windows of {args.steps} "
             f"steps after {args.warmup} warm-up steps. Loop: Lightning's fit with the configured data, "
             "augmentation, callbacks and logger (no validation or checkpoints). Bare step: the same model and "
             "optimizer on one batch already on the device. GPU busy: nvidia-smi utilization during the loop. "
             "Host ms/step: the process's CPU time per step in the same windows. Loop GC ms: garbage "
             "collection in each loop window.", ""]
    graphs = any(r.get("graph_step_repeats") for r in rows)
    if graphs:
        lines += ["Graph step: the same step on a copy of the model (eager, or compiled in default mode as the "
                  "case's model is), forward, backward and a fused, "
                  "capturable AdamW captured as one CUDA graph and replayed (`--graph-step`); host ms/step beside "
                  "it.", ""]
    head = ("| data | pipeline | model | batch | attention | compile | loop img/s | bare step img/s | loop/bare | "
            "GPU busy | loop host ms/step | bare host ms/step | loop GC ms/window |")
    lines += [head + (" graph step img/s | graph step host ms/step |" if graphs else ""),
              "|---" * (13 + 2 * graphs) + "|"]
    for r in rows:
        busy = "n/a" if r["gpu_busy"] is None else f"{100 * r['gpu_busy']:.0f}%"
        line = (f"| {r['data']} | {r['pipeline']} | {r['model']} | {r['batch']} | {r['attention']} | "
                f"{loop_mode(r)} | {spread(r['loop_repeats'])} | {spread(r['step_repeats'])} | "
                f"{r['ratio']:.3f} | {busy} | {spread(r['loop_host_ms'], 2)} | {spread(r['step_host_ms'], 2)} | "
                f"{spread(r['loop_gc_ms'], 1)} |")
        if graphs:
            line += (f" {spread(r['graph_step_repeats'])} | {spread(r['graph_step_host_ms'], 2)} |"
                     if r.get("graph_step_repeats") else " n/a | n/a |")
        lines.append(line)
    return "\n".join(lines + fastest(rows)) + "\n"


def loop_mode(row: dict) -> str:
    """How the row's loop ran: its compile mode, and whether the whole step was one CUDA graph."""
    return row["compile_mode"] + (" + graph step" if row.get("loop_graph_step") else "")


def fastest(rows: list[dict]) -> list[str]:
    """Markdown lines: per data, model, batch and attention measured in more than one way, the
    fastest loop against the fastest bare step of any mode in this run (bare step or graph
    step): how close the loop comes to the step in its fastest mode. No lines otherwise."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["data"], r["model"], r["batch"], r["attention"]), []).append(r)
    out = []
    for (data, model, batch, attention), group in groups.items():
        bares = [(statistics.median(r["step_repeats"]), f"bare step, {r['compile_mode']}") for r in group]
        bares += [(statistics.median(r["graph_step_repeats"]),
                   f"graph step, {'compiled' if r['compile_mode'] == 'default' else 'eager'} model")
                  for r in group if r.get("graph_step_repeats")]
        if len(bares) < 2:
            continue
        loop = max(group, key=lambda r: statistics.median(r["loop_repeats"]))
        loop_ips = statistics.median(loop["loop_repeats"])
        bare_ips, bare_mode = max(bares)
        out.append(f"| {data} | {model} | {batch} | {attention} | {loop_ips:,.0f} ({loop_mode(loop)}) | "
                   f"{bare_ips:,.0f} ({bare_mode}) | {loop_ips / bare_ips:.3f} |")
    if not out:
        return []
    return ["", "Fastest loop against the fastest bare step of any mode, the same model, batch and attention in "
            "this run (medians):", "", "| data | model | batch | attention | fastest loop img/s | "
            "fastest bare img/s | loop / bare |", "|---" * 7 + "|", *out]


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--data-root", help="the data root (paths.data_dir), holding cifar10/ and imagenette/")
    parser.add_argument("--cases", nargs="+", choices=list(CASES), default=["cifar10", "imagenette"])
    parser.add_argument("--attention", nargs="+", choices=ATTENTION_IMPLS,
                        help=f"default: {' '.join(ATTENTION_IMPLS)} (--quick: sdpa)")
    parser.add_argument("--compile", nargs="+", choices=COMPILE_CHOICES,
                        help="model.compile values, each case runs with each; default: reduce-overhead false "
                             "(--quick: false)")
    parser.add_argument("--pipeline", help="passed as data.pipeline=<value> (gpu or cpu)")
    parser.add_argument("--override", action="append", default=[], help="another Hydra override, KEY=VALUE")
    parser.add_argument("--warmup", type=int, default=15, help="steps before the first window (compiling included)")
    parser.add_argument("--steps", type=int, default=30, help="steps per timed window")
    parser.add_argument("--repeats", type=int, default=3, help="timed windows per case")
    parser.add_argument("--profile", type=Path, metavar="DIR",
                        help="after the timed windows, profile one more window of each case (torch.profiler and "
                             "cProfile) and write the tables and a trace into DIR")
    parser.add_argument("--profile-tag", default="", help="appended to the profile files' names")
    parser.add_argument("--graph-step", action="store_true",
                        help="also time the bare step captured whole (forward, backward, AdamW) as one CUDA graph "
                             "(needs CUDA)")
    parser.add_argument("--loop-graph-step", action="store_true",
                        help="run the loop with model.graph_step=true (the whole step as one CUDA graph) in the "
                             f"cases whose --compile value allows it ({', '.join(GRAPH_STEP_COMPILE)}); needs CUDA")
    parser.add_argument("--quick", action="store_true",
                        help="one tiny case for a smoke test: synthetic data, vit_micro_patch4_32, b32, sdpa, eager")
    args = parser.parse_args(argv)
    if args.quick:
        args.cases, args.warmup, args.steps = ["synthetic"], 1, 2
    args.attention = args.attention or (["sdpa"] if args.quick else list(ATTENTION_IMPLS))
    args.compile = args.compile or (["false"] if args.quick else ["reduce-overhead", "false"])
    if min(args.warmup, args.steps, args.repeats) < 1:
        parser.error("--warmup, --steps and --repeats must be at least 1")
    if args.graph_step and not torch.cuda.is_available():
        parser.error("--graph-step captures a CUDA graph and needs a CUDA GPU: leave it out on this machine")
    if args.loop_graph_step and not set(args.compile) & set(GRAPH_STEP_COMPILE):
        parser.error(f"--loop-graph-step runs with --compile {' or '.join(GRAPH_STEP_COMPILE)} (the model eager or "
                     f"compiled inside the captured step), and got --compile {' '.join(args.compile)}: add one")
    if args.loop_graph_step and not torch.cuda.is_available():
        parser.error("--loop-graph-step captures the training step as a CUDA graph and needs a CUDA GPU: "
                     "leave it out on this machine")
    if "flash" in args.attention and not torch.cuda.is_available():
        parser.error("attention flash needs a CUDA GPU: choose --attention sdpa naive on this machine")

    env = {**environment(), "lightning": L.__version__, "timm": timm.__version__}
    command = command_line()
    rows = []
    for case in args.cases:
        for compile_mode in args.compile:
            for attention in args.attention:
                rows.append(run_case(case, attention, compile_mode, args))
                r = rows[-1]
                print(f"{case} {r['model']} b{r['batch']} {r['attention']} compile={loop_mode(r)}: "
                      f"loop {spread(r['loop_repeats'])} img/s, bare {spread(r['step_repeats'])} img/s, "
                      f"ratio {r['ratio']:.2f}, GPU busy {r['gpu_busy']}, host ms/step: loop "
                      f"{spread(r['loop_host_ms'], 2)}, bare {spread(r['step_host_ms'], 2)}, loop GC ms/window "
                      f"{spread(r['loop_gc_ms'], 1)}", flush=True)
                table = markdown(rows, env, command, args)
                write_results(args.out, "loop", env, command, rows, table)  # after every case: a cut-off run keeps its rows
    print(table)
    return rows


if __name__ == "__main__":
    main()
