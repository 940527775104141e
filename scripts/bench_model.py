"""Whole training step of a ViT: vitflash on its three attention paths, and timm for scale.

One step = forward, cross-entropy, backward, AdamW (fused) update, under bf16 autocast, on
random images already on the GPU. The same vitflash weights run on every path
(`model.set_attention`); timm's own VisionTransformer (its fused SDPA attention) is the
outside reference at 224/384 px. Each case is timed REPEATS times (median step time after
warm-up, each time); the table gives the median images per second and the min-max of the
repeats, and the peak GPU memory of training.

Two suites:
- cifar: the CIFAR presets (32 px, 65 tokens), eager, `torch.compile` and
  `torch.compile(mode="reduce-overhead")` (CUDA graphs), where these small models are
  launch-bound and the compiled modes are the ones that matter;
- large: ViT-S/16 and ViT-B/16 at 224 and 384 px, eager, and ViT-B/16 at 224 px under
  `torch.compile` too (the training shape where flash meets cuDNN), against timm.

    python scripts/bench_model.py --suite cifar --out benchmarks/results
writes train_step_<suite>_<gpu>.json and .md there (a GPU is required). JSON rows: model,
batch, compile (null, "default" or "reduce-overhead"), the command and commit that measured
the row, and per path img_per_s, its min and max, step_ms and peak_gib.

A whole suite compiles every case and may not fit one time-limited job: run it in parts
with --models / --compile and --append, which keeps the file's rows that this run does not
measure again (each row names its own command and commit):

    python scripts/bench_model.py --suite cifar --compile reduce-overhead
    python scripts/bench_model.py --suite cifar --compile eager default --append

`--paths` measures only some paths (the others show n/a). The path `no_attention` is a
ceiling, not an attention: every block's attention is replaced by a copy of its V (the
projections, MLPs and optimizer unchanged). No attention path can make the step faster than
that, so "ceiling" = no_attention img/s / the best other path's is the most that any
attention kernel could gain over it in that case, and "flash's share" = (t_other - t_flash) /
(t_other - t_no_attention), with t the time per image, is how much of that gain flash takes:

    python scripts/bench_model.py --suite cifar --paths flash sdpa no_attention --out <dir>

In the large suite, `--paths ... timm_flash` also times timm's own model with vitflash's kernel
(`vitflash.patch_timm_attention`), beside vitflash's model on flash; it is not one of the "other"
paths that flash's ratio divides by.

`--render <json>` prints the table of a result file again with this version's columns (no GPU
needed; pass the run's --steps, --warmup and --repeats where they were not the defaults).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
from pathlib import Path

import timm
import torch
import torch.nn.functional as F

from bench_attention import command_line, earlier_rows, environment, write_results  # scripts/ is on sys.path
import vitflash
import vitflash.model
from vitflash import build_model

SUITES = {
    "cifar": [(m, b, c) for m in ("vit_tiny_patch4_32", "vit_small_patch4_32")
              for b in (256, 1024) for c in (None, "default", "reduce-overhead")],
    "large": [("vit_small_patch16_224", 256, None), ("vit_base_patch16_224", 256, None),
              ("vit_base_patch16_224", 256, "default"), ("vit_base_patch16_384", 64, None)],
}
PATHS = {"cifar": ["flash", "sdpa", "naive"], "large": ["flash", "sdpa", "naive", "timm"]}
REPEATS = 3
CEILING = "no_attention"  # not an attention path: see the module docstring
# timm's own model with vitflash's kernel (vitflash.patch_timm_attention): opt-in with --paths, and
# not an "other" path for flash's ratio (it is flash too)
TIMM_FLASH = "timm_flash"
EXTRA = {"cifar": [CEILING], "large": [CEILING, TIMM_FLASH]}


def _copy_of_v(qkv: torch.Tensor, impl: str, softmax_scale=None, dropout_p: float = 0.0,
               mask_diagonal: bool = False) -> torch.Tensor:
    """The stand-in for attention in the ceiling case: o = V (one copy kernel each way)."""
    return qkv[:, :, 2].contiguous()


@contextlib.contextmanager
def without_attention():
    """Every vitflash block's attention call returns a copy of its V while this is active."""
    real = vitflash.model.attention_qkvpacked
    vitflash.model.attention_qkvpacked = _copy_of_v
    try:
        yield
    finally:
        vitflash.model.attention_qkvpacked = real


def step_fn(model, batch: int, img_size: int, compile_mode: str | None):
    images = torch.randn(batch, 3, img_size, img_size, device="cuda")
    labels = torch.randint(0, 10, (batch,), device="cuda")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    forward = model if compile_mode is None else torch.compile(model, mode=compile_mode)

    def step():
        if compile_mode == "reduce-overhead":
            torch.compiler.cudagraph_mark_step_begin()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(forward(images), labels)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def measure(step, warmup: int, steps: int, repeats: int,
            peak_from_start: bool = False) -> tuple[list[float], float]:
    """Median seconds per step of each repeat, and peak GiB allocated while training: over
    the timed steps, or with peak_from_start over the warm-up steps too. Under CUDA graphs
    (reduce-overhead) the step's activations live in the graph's memory pool, allocated
    while the warm-up steps record it; replays allocate nothing, so a peak taken after the
    warm-up counts the weights and optimizer state alone."""
    if peak_from_start:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    for _ in range(warmup):  # compilation, autotuning and optimizer-state allocation
        step()
    torch.cuda.synchronize()
    if not peak_from_start:
        torch.cuda.reset_peak_memory_stats()
    medians = [statistics.median(timed_steps(step, steps)) for _ in range(repeats)]
    return medians, torch.cuda.max_memory_allocated() / 2**30


def timed_steps(step, steps: int) -> list[float]:
    """Seconds of each of `steps` steps, each between CUDA events and synchronized, so that a
    step's host time counts in full, as a training loop that waits for each loss pays it."""
    times = []
    for _ in range(steps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return times


def run_case(name: str, batch: int, compile_mode: str | None, path: str, args) -> dict:
    img_size = int(name.rsplit("_", 1)[-1])
    torch.manual_seed(0)
    if path in ("timm", TIMM_FLASH):
        model = timm.create_model(name, pretrained=False, num_classes=10).cuda()
        if path == TIMM_FLASH:
            vitflash.patch_timm_attention(model, "flash")
    else:
        model = build_model(name, attention="sdpa" if path == CEILING else path, num_classes=10).cuda()
    try:
        with without_attention() if path == CEILING else contextlib.nullcontext():
            secs, gib = measure(step_fn(model, batch, img_size, compile_mode), args.warmup,
                                args.steps, args.repeats,
                                peak_from_start=compile_mode == "reduce-overhead")
    except Exception as err:  # one failing case must not lose the others' numbers
        return {"error": f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"}
    finally:
        del model
        torch._dynamo.reset()
        torch.cuda.empty_cache()
    ips = [batch / s for s in secs]
    return {"img_per_s": statistics.median(ips), "img_per_s_min": min(ips),
            "img_per_s_max": max(ips), "step_ms": statistics.median(secs) * 1e3, "peak_gib": gib}


def row_key(row: dict) -> tuple:
    return row["model"], row["batch"], row["compile"]


def in_suite_order(rows: list[dict], suite: list[tuple]) -> list[dict]:
    order = {case: i for i, case in enumerate(suite)}
    return sorted(rows, key=lambda r: order.get(row_key(r), len(order)))


def markdown(rows: list[dict], paths: list[str], env: dict, command: str, args) -> str:
    def cell(r):
        if r is None:
            return "n/a"
        if "error" in r:
            return "failed"
        return f"{r['img_per_s']:,.0f} ({r['img_per_s_min']:,.0f}-{r['img_per_s_max']:,.0f})"

    def ips(r, p):
        return r.get(p, {}).get("img_per_s")

    ceiling = CEILING in paths

    sources = list(dict.fromkeys((r.get("command", command), r.get("commit", env["commit"])) for r in rows))
    if len(sources) > 1:  # --append: rows measured by several runs
        header = ["Rows measured by:", ""] + [f"- `{c}` (commit {k})" for c, k in sources] + [""]
    else:
        header = [f"Command: `{command}`", ""]
    lines = [f"# ViT training step on {env['gpu']}", "", *header,
             f"Commit {env['commit']}; torch {env['torch']}, triton {env['triton']}, timm {env.get('timm', timm.__version__)}, "
             f"CUDA {env['cuda']}; {env['date']}. AdamW (fused), bf16 autocast, random "
             f"images on the GPU; images/s from the median of {args.steps} steps after "
             f"{args.warmup} warm-up steps, {args.repeats} repeats: median (min-max). "
             "Peak: max GPU memory allocated while training (under reduce-overhead from the "
             "first warm-up step on, whose recording allocates the CUDA graph's memory)."
             + (f" {CEILING}: each attention replaced by a copy of its V, the step that no "
                "attention path can beat; ceiling = its img/s / the best other path's, the most "
                "any attention kernel could gain over that path; flash's share = (t_other - "
                "t_flash) / (t_other - t_no_attention), t the time per image: the part of that "
                "gain flash takes." if ceiling else ""), "",
             "| model | batch | compile | " + " | ".join(f"{p} img/s" for p in paths)
             + " | flash / best other |" + (" ceiling | flash's share |" if ceiling else "")
             + " " + " | ".join(f"{p} peak GiB" for p in paths) + " |",
             "|---|---|---|" + "---|" * (2 * len(paths) + 1 + 2 * ceiling)]
    for r in rows:
        others = [ips(r, p) for p in paths if p not in ("flash", CEILING, TIMM_FLASH) and ips(r, p)]
        ratio = f"{ips(r, 'flash') / max(others):.2f}x" if others and ips(r, "flash") else "n/a"
        bound = ""
        if ceiling:
            bound = " n/a | n/a |"
            if others and ips(r, CEILING):
                t_other, t_none = 1 / max(others), 1 / ips(r, CEILING)
                share = (f"{(t_other - 1 / ips(r, 'flash')) / (t_other - t_none):.2f}"
                         if ips(r, "flash") and t_other > t_none else "n/a")
                bound = f" {t_other / t_none:.2f}x | {share} |"
        lines.append(f"| {r['model']} | {r['batch']} | {r['compile'] or 'eager'} | "
                     + " | ".join(cell(r.get(p)) for p in paths) + f" | {ratio} |{bound} "
                     + " | ".join(f"{r[p]['peak_gib']:.2f}" if "peak_gib" in r.get(p, {}) else "n/a"
                                  for p in paths) + " |")
    errors = [(r["model"], r["batch"], r["compile"], p, r[p]["error"])
              for r in rows for p in paths if "error" in r.get(p, {})]
    if errors:
        lines += ["", "Failed:"] + [f"- {e[:4]}: {e[4]}" for e in errors]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--suite", choices=sorted(SUITES), default="cifar")
    parser.add_argument("--models", nargs="*", help="only these models of the suite")
    parser.add_argument("--compile", nargs="*", dest="modes",
                        choices=("eager", "default", "reduce-overhead"),
                        help="only these compile modes")
    parser.add_argument("--paths", nargs="+", metavar="PATH",
                        help=f"only these paths of the suite, and {CEILING!r} (the ceiling: see above)")
    parser.add_argument("--render", type=Path, metavar="JSON",
                        help="print the table of a result file of this script and exit (no GPU)")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=REPEATS)
    parser.add_argument("--append", action="store_true",
                        help="keep the rows of the existing result file that this run does not measure")
    args = parser.parse_args(argv)
    if args.render:
        data = json.loads(args.render.read_text())
        rows = data["results"]
        known = dict.fromkeys([*PATHS["cifar"], *PATHS["large"], CEILING, TIMM_FLASH])
        print(markdown(rows, [p for p in known if any(p in r for r in rows)], data["environment"],
                       data["command"], args), end="")
        return
    paths = PATHS[args.suite]
    if args.paths:  # (checked before the GPU: a mistyped path is named wherever it is run)
        unknown = sorted(set(args.paths) - {*paths, *EXTRA[args.suite]})
        if unknown:
            parser.error(f"unknown path(s) {', '.join(unknown)} for --suite {args.suite}: "
                         f"choose from {', '.join([*paths, *EXTRA[args.suite]])}")
        paths = [p for p in [*paths, *EXTRA[args.suite]] if p in args.paths]
    if not torch.cuda.is_available():
        sys.exit("bench_model.py needs a CUDA GPU.")

    env = {**environment(), "timm": timm.__version__}
    command = command_line()
    suite = SUITES[args.suite]
    cases = [(name, batch, mode) for name, batch, mode in suite
             if not (args.models and name not in args.models)
             and not (args.modes and (mode or "eager") not in args.modes)]
    prefix = f"train_step_{args.suite}"
    rows = earlier_rows(args.out, prefix, env, lambda r: row_key(r) not in cases) if args.append else []
    table = ""
    for name, batch, mode in cases:
        row = {"model": name, "batch": batch, "compile": mode, "command": command, "commit": env["commit"]}
        for path in paths:
            row[path] = run_case(name, batch, mode, path, args)
            print(name, batch, mode or "eager", path, row[path], flush=True)
        rows = in_suite_order([*rows, row], suite)
        # after every row, so that a run stopped by a time limit keeps what it measured
        table = markdown(rows, paths, env, command, args)
        write_results(args.out, prefix, env, command, rows, table)
    print(table)


if __name__ == "__main__":
    main()
