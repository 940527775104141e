"""Compare training runs: accuracy, throughput, memory and time, as a table, JSON and plots.

    python scripts/train.py -m attention=flash,sdpa,naive trainer=gpu      # one job per path
    python scripts/report.py outputs/train/multiruns/<time> --out report --plot --targets 0.9 0.93

Takes run folders of scripts/train.py, or folders above them, down to five levels (a sweep's
jobs, a task's runs/ and multiruns/, the whole log folder); runs of the same folder name are
told apart by the folders above them. Reads each run's config (.hydra/) and its CSVLogger
metrics (csv/metrics.csv).
A run continued by `ckpt_path=<earlier run>/checkpoints/last.ckpt` lives in a new folder:
the report follows ckpt_path back through the earlier folders and joins the pieces into
one run, named by its last folder (training time and curves continue; the earlier folders
need not be listed).

Prints the markdown table; its "img/s / naive" column sets each run's training speed against
the naive run of the same dataset, model and seed (n/a where there is none, or more than one).
With --out DIR it writes DIR/report.md, DIR/summary.json (one
row per run: run, dataset, model, attention, seed, epochs, best_val_top1, test_top1, test_top5,
img_per_s, peak_gib, train_wall_s, fit_wall_s, time_to_top1, diverged) and DIR/curves.csv (per epoch: training
time, train loss, val loss and top-1); --plot adds curves.png (train loss and val top-1 per
run, overlaid), speed_memory.png (bars of train img/s and peak GPU memory) and
time_to_accuracy.png (val top-1 against training time).

Runs that differ only in their seed (e.g. `train.py -m attention=flash,naive seed=1,2,3`) are
also gathered per attention path: mean, standard deviation and range of test and val top-1.
Overrides that only name a run's output (task_name, hydra.*) do not set it apart.

`--at-epochs 99 199 299` adds the val top-1 of every run at those epochs (0-based, as the
curves count them) and its spread across the runs: runs of one recipe and seed that a time
limit stopped at different epochs (trainer.max_time) still compare at equal epochs, where
their learning-rate schedules were the same. Where runs differ only in their seed, it also
gives each such group's mean at those epochs.

`--names flash naive` names the runs in the report's order (one name per run, the pieces of
a resumed run counting once) instead of by their folders' names.

Times are Lightning's ThroughputMonitor `train/time`: training only (validation excluded),
up to the last logged step (trainer.log_every_n_steps). fit_wall_s ("fit wall (s)") is the
wall-clock time of train.py's fit, set-up, compilation, validation and checkpoints included,
added up over a run's pieces (n/a for runs logged before train.py recorded it, `fit/wall_s`).
"""
from __future__ import annotations

import argparse
import csv
import importlib
import json
import math
import os
import re
import shlex
import statistics
import sys
from pathlib import Path

import yaml

METRICS_FILE = Path("csv") / "metrics.csv"
CURVE_FIELDS = ("run", "epoch", "step", "train_time_s", "train_loss", "val_loss", "val_top1")


class ReportError(Exception):
    """Input the report cannot use; the message says what to pass instead."""


# ---------------------------------------------------------------------------------------
# Finding runs and the pieces of resumed runs


def find_runs(paths: list[Path]) -> list[Path]:
    """Run folders among `paths`: each path itself, else every run folder up to five levels
    below it: a sweep's jobs, a task's folder (`outputs/<task>` holds `runs/<time>/` and
    `multiruns/<time>/<job>/`) or the whole log folder (`outputs/`)."""
    runs = []
    for path in paths:
        if not path.exists():
            raise ReportError(f"{path} does not exist: give run folders of scripts/train.py or folders above them")
        if (path / METRICS_FILE).is_file():
            runs.append(path.resolve())
            continue
        below = range(1, 6) if path.is_dir() else ()
        found = {m.parents[1] for depth in below for m in path.glob("/".join(["*"] * depth + [str(METRICS_FILE)]))}
        # a job killed before its first log has its config but no metrics: say so, or a sweep
        # would look as if it had fewer jobs
        configured = {h.parent for depth in below for h in path.glob("/".join(["*"] * depth + [".hydra"]))}
        for job in sorted(configured - found, key=lambda p: (str(p.parent), len(p.name), p.name)):
            print(f"report.py: {job} has a run config (.hydra) but no {METRICS_FILE}: left out (the job stopped "
                  "before it logged, or ran without logger=csv)", file=sys.stderr)
        if not found:
            raise ReportError(
                f"{path} holds no training run: expected {METRICS_FILE} in it or in a folder up to "
                "five levels below it (run folders of scripts/train.py with logger=csv)")
        # a sweep's jobs 0, 1, ..., 10 in that order
        runs.extend(p.resolve() for p in sorted(found, key=lambda p: (str(p.parent), len(p.name), p.name)))
    # a folder given twice (`report.py sweep sweep/0`) is one run, where it first came
    return list(dict.fromkeys(runs))


def _yaml(path: Path):
    return yaml.safe_load(path.read_text()) if path.is_file() else None


def _checkpoint_dirs(run: Path) -> set[str]:
    """The checkpoint folders a run's config names (callbacks.<name>.dirpath), as written."""
    callbacks = (_yaml(run / ".hydra" / "config.yaml") or {}).get("callbacks") or {}
    return {str(Path(c["dirpath"])) for c in callbacks.values() if isinstance(c, dict) and c.get("dirpath")}


def resumed_from(run: Path, known: list[Path]) -> Path | None:
    """The run folder whose checkpoint `run` resumed from (its ckpt_path), or None.

    ckpt_path is as typed on the command line: absolute, or relative to where train.py ran.
    A checkpoint written outside its run folder (callbacks.*.dirpath set elsewhere) belongs
    to the one known run whose configured checkpoint folder holds it. Otherwise the run is
    <ckpt_path>/../.., taken as it is where it holds a run, known or not; a known folder
    with the same metrics.csv (a copy of it) stands for it, so that the run is listed once.
    Only a folder that is not here (a relative path, or runs copied from the machine that
    made them) is matched against the known ones by its last two parts (e.g. runs/<time>),
    else by its folder's name where exactly one known folder bears it: names alone are weak
    evidence, as every sweep numbers its jobs 0, 1, ..., and a job of a new sweep that
    resumed job 1 of an earlier one is not its new sibling 1."""
    ckpt = (_yaml(run / ".hydra" / "config.yaml") or {}).get("ckpt_path")
    if not ckpt:
        return None
    owners = [k for k in known if k != run and str(Path(ckpt).parent) in _checkpoint_dirs(k)]
    if len(owners) == 1:
        return owners[0]
    folder = Path(ckpt).parent.parent  # <run>/checkpoints/<file>.ckpt
    if (folder / METRICS_FILE).is_file():
        folder = folder.resolve()
        if folder == run:
            return None
        if folder not in known:
            metrics = folder / METRICS_FILE
            size = metrics.stat().st_size
            copies = [k for k in known if k != run and (k / METRICS_FILE).stat().st_size == size
                      and (k / METRICS_FILE).read_bytes() == metrics.read_bytes()]
            if len(copies) == 1:
                return copies[0]
        return folder
    for tail in (folder.parts[-2:], folder.parts[-1:]):
        matches = [k for k in known if k != run and k.parts[-len(tail):] == tail]
        if len(matches) == 1:
            return matches[0]
    return None


def chains(runs: list[Path]) -> list[list[Path]]:
    """One list per run, its pieces oldest first; a folder another listed run resumed from
    is a piece of that run, not a run of its own (two runs resumed from one checkpoint share
    their first pieces). Folders whose earlier pieces lead round in a loop (matched by name,
    each to another) cannot all be later pieces: each is reported as a run of its own, with
    a warning, rather than all dropped."""
    earlier: dict[Path, Path | None] = {}
    todo = list(runs)
    while todo:
        folder = todo.pop()
        if folder not in earlier:
            earlier[folder] = prev = resumed_from(folder, runs)
            if prev is not None:
                todo.append(prev)
    for start in list(earlier):
        walk, folder = [], start
        while folder is not None and folder not in walk:
            walk.append(folder)
            folder = earlier[folder]
        if folder is not None:
            loop = walk[walk.index(folder):]
            print(f"report.py: {', '.join(map(str, loop))} resumed from checkpoints that lead round in a loop, each "
                  "to another of them (the folders their ckpt_path names are not here, and were matched by name): "
                  "reported as runs of their own; the ckpt_path in their .hydra/config.yaml names their earlier "
                  "pieces", file=sys.stderr)
            for f in loop:
                earlier[f] = None
    continued = set(earlier.values())
    result = []
    for run in runs:
        if run in continued:
            continue
        pieces = [run]
        while earlier[pieces[0]] is not None:
            pieces.insert(0, earlier[pieces[0]])
        result.append(pieces)
    return result


# ---------------------------------------------------------------------------------------
# One run's figures


def _where(override: str) -> bool:
    """Whether an override only says where files go (output and checkpoint folders, data and
    log roots, the checkpoint resumed from): not part of the recipe, so not in the table."""
    key = override.split("=", 1)[0].lstrip("+~")
    return key.startswith(("hydra.", "paths.")) or key == "ckpt_path" or key.endswith(".dirpath")


def _float(value: str | None) -> float | None:
    return float(value) if value not in (None, "") else None


def _read_rows(run: Path) -> list[dict]:
    with (run / METRICS_FILE).open() as f:
        return [{k: _float(v) for k, v in row.items()} for row in csv.DictReader(f)]


def _values(rows: list[dict], name: str) -> list[float]:
    return [r[name] for r in rows if r.get(name) is not None]


def _join(pieces: list[Path]) -> list[dict]:
    """The metrics rows of all pieces as one run: a piece's rows replace the earlier pieces'
    from its first step on, and its `train/time` continues the earlier pieces' clock."""
    joined: list[dict] = []
    for piece in pieces:
        rows = _read_rows(piece)
        # the first training step of this piece (the throughput rows of validation and
        # test count their own steps from 1)
        # (none in a piece that only tested: it keeps every earlier row)
        start = min((r["step"] for r in rows if r.get("train/loss_step") is not None
                     or r.get("train/time") is not None), default=math.inf)
        joined = [r for r in joined if r.get("step") is not None and r["step"] < start]
        offset = max(_values(joined, "train/time"), default=0.0)
        for r in rows:
            if r.get("train/time") is not None:
                r["train/time"] += offset
        joined += rows
    return joined


def _fit_wall_s(pieces: list[Path]) -> float | None:
    """The wall-clock time of fit, added up over the pieces (each logs its own fit/wall_s; a
    piece that ran past the checkpoint the next one resumed from counts in full, as the clock
    ran). None where a piece has none (logged before train.py recorded it, or stopped in fit)."""
    times = [_values(_read_rows(piece), "fit/wall_s") for piece in pieces]
    return sum(t[-1] for t in times) if all(times) else None


def _attention(run: Path, config: dict) -> str:
    """The attention path the run used: attention=auto is settled when training starts,
    and vitflash.module logs the choice ("attention=auto -> sdpa") to <run>/train.log."""
    chosen = (config.get("model") or {}).get("attention", "n/a")
    log = run / "train.log"
    if chosen == "auto" and log.is_file():
        found = re.search(r"attention=auto -> (\w+)", log.read_text())
        if found:
            return found.group(1)
    return chosen


def _time_at(rows: list[dict], step: float) -> float | None:
    """Training time at the last logged step <= `step`."""
    times = [(r["step"], r["train/time"]) for r in rows if r.get("train/time") is not None and r["step"] <= step]
    return max(times)[1] if times else None


def _img_per_s(rows: list[dict], pieces: list[Path]) -> float | None:
    """Median of the ThroughputMonitor's windows (all processes under DDP); for runs too
    short to fill a window (debug runs), samples over time between the first and last
    logged step of each piece, per process."""
    for name in ("train/samples_per_sec", "train/device/samples_per_sec"):
        if values := _values(rows, name):
            return statistics.median(values)
    samples = seconds = 0.0
    for piece in pieces:
        logged = [(r["train/time"], r["train/samples"]) for r in _read_rows(piece)
                  if r.get("train/time") is not None and r.get("train/samples") is not None]
        if len(logged) >= 2:
            samples += logged[-1][1] - logged[0][1]
            seconds += logged[-1][0] - logged[0][0]
    return samples / seconds if seconds > 0 else None


def run_names(runs: list[list[Path]]) -> list[str]:
    """A name per run (its pieces, oldest first): its last folder's name, with as many folders
    above it as make it unique ("0" of two sweeps: "<time>/0" each). The last: two runs
    resumed from one checkpoint share their first folder, and the last is a folder listed."""
    parts = [pieces[-1].relative_to(pieces[-1].anchor).parts for pieces in runs]
    depth = 1
    while True:
        names = ["/".join(p[-depth:]) for p in parts]
        if len(set(names)) == len(names) or depth >= max(map(len, parts), default=1):
            return names
        depth += 1


def chosen_names(chosen: list[str] | None, found: list[str]) -> list[str]:
    """The names given with --names, checked against the runs `found` (their default names, in
    the report's order); `found` itself when none were given."""
    if chosen is None:
        return found
    if len(chosen) != len(found):
        raise ReportError(f"--names gives {len(chosen)} name(s) for {len(found)} run(s); the runs, in order: "
                          f"{', '.join(found)}. Give one name per run (the pieces of a resumed run count once)")
    repeated = sorted({n for n in chosen if chosen.count(n) > 1})
    if repeated:
        raise ReportError(f"--names repeats {', '.join(repeated)}: each run needs a name of its own")
    return chosen


def summarize(pieces: list[Path], targets: tuple[float, ...] = (), name: str | None = None) -> tuple[dict, list[dict]]:
    """(summary row, per-epoch curve rows) of one run made of `pieces` (oldest first), named
    `name` (default: its last folder's name)."""
    name = name or pieces[-1].name
    last = pieces[-1]
    config = _yaml(last / ".hydra" / "config.yaml") or {}
    choices = ((_yaml(last / ".hydra" / "hydra.yaml") or {}).get("hydra") or {}).get("runtime", {}).get("choices", {})
    overrides = _yaml(last / ".hydra" / "overrides.yaml") or []
    rows = _join(pieces)

    # The test split is scored after fitting, in a row of its own logged at epoch = the
    # epoch count: only training rows say how many epochs ran.
    epochs = _values([r for r in rows if r.get("train/loss_epoch") is not None], "epoch")
    curves = []
    for r in rows:
        if r.get("val/top1") is None:
            continue
        train_loss = next((t["train/loss_epoch"] for t in rows
                           if t.get("train/loss_epoch") is not None and t.get("epoch") == r["epoch"]), None)
        curves.append({"run": name, "epoch": int(r["epoch"]), "step": int(r["step"]),
                       "train_time_s": _time_at(rows, r["step"]), "train_loss": train_loss,
                       "val_loss": r.get("val/loss"), "val_top1": r["val/top1"]})
    tests = [r for r in rows if r.get("test/top1") is not None]
    peak = _values(rows, "train/peak_mem_gib") + _values(rows, "test/peak_mem_gib")
    times = _values(rows, "train/time")
    last_losses = [v[-1] for k in ("train/loss_step", "train/loss_epoch", "val/loss", "test/loss") if (v := _values(rows, k))]
    summary = {
        "run": name,
        "pieces": [os.path.relpath(p) for p in pieces],  # relative: the report may be committed
        "dataset": choices.get("data", (config.get("data") or {}).get("name", "n/a")),
        "model": (config.get("model") or {}).get("model_name"),
        "attention": _attention(last, config),
        "overrides": " ".join(o for o in overrides if not _where(o)),
        "seed": config.get("seed"),
        "epochs": int(max(epochs)) + 1 if epochs else None,
        "best_val_top1": max((c["val_top1"] for c in curves), default=None),
        # data.val_size 0 (or a data module without it): validation scores the test split, so the
        # best val top-1 is the best test score over the run
        "val_split": "held out" if ((config.get("data") or {}).get("val_size") or 0) > 0 else "test",
        "test_top1": tests[-1]["test/top1"] if tests else None,
        "test_top5": tests[-1].get("test/top5") if tests else None,
        "img_per_s": _img_per_s(rows, pieces),
        "peak_gib": max(peak) if peak else None,
        "train_wall_s": max(times) if times else None,
        "fit_wall_s": _fit_wall_s(pieces),
        "time_to_top1": {
            f"{t:g}": min((c["train_time_s"] for c in curves
                           if c["val_top1"] >= t and c["train_time_s"] is not None), default=None)
            for t in targets
        },
        # NaN or inf: the accuracies above are those of a broken model
        "diverged": any(not math.isfinite(v) for v in last_losses),
    }
    return summary, curves


# ---------------------------------------------------------------------------------------
# Output


def _fmt(value, kind: str) -> str:
    if value is None:
        return "n/a"
    if kind == "pct":
        return f"{100 * value:.2f}%"
    if kind == "int":
        return f"{value:,.0f}"
    if kind == "gib":
        return f"{value:.2f}"
    if kind == "s":
        return f"{value:,.1f}"
    if kind == "x":
        return f"{value:.2f}x"
    return str(value)


def speed_vs_naive(summary: dict, summaries: list[dict]) -> float | None:
    """summary's train img/s over that of the one naive run of the same dataset, model and
    seed among `summaries` (the project's comparison: flash against naive); None where there
    is no such run, or more than one (which one would be ambiguous), or a speed is missing."""
    naive = [s for s in summaries if s["attention"] == "naive"
             and (s["dataset"], s["model"], s.get("seed")) == (summary["dataset"], summary["model"], summary.get("seed"))]
    if len(naive) != 1 or not summary["img_per_s"] or not naive[0]["img_per_s"]:
        return None
    return summary["img_per_s"] / naive[0]["img_per_s"]


def markdown(summaries: list[dict]) -> str:
    """The summary rows as a markdown table."""
    columns = [("run", "run", ""), ("dataset", "dataset", ""), ("model", "model", ""),
               ("attention", "attention", ""), ("epochs", "epochs", ""),
               ("best val top-1", "best_val_top1", "pct"), ("test top-1", "test_top1", "pct"),
               ("test top-5", "test_top5", "pct"), ("train img/s", "img_per_s", "int"),
               ("img/s / naive", "img_per_s_vs_naive", "x"),
               ("peak GiB", "peak_gib", "gib"), ("train time (s)", "train_wall_s", "s"),
               ("fit wall (s)", "fit_wall_s", "s")]
    targets = summaries[0]["time_to_top1"] if summaries else {}
    lines = ["| " + " | ".join([c[0] for c in columns] + [f"time to {100 * float(t):g}% (s)" for t in targets]
                               + ["overrides"]) + " |"]
    lines.append("|---" * (len(columns) + len(targets) + 1) + "|")
    for s in summaries:
        cells = [_fmt(speed_vs_naive(s, summaries) if key == "img_per_s_vs_naive" else s[key], kind)
                 for _, key, kind in columns]
        if s.get("val_split") == "test" and s["best_val_top1"] is not None:
            cells[columns.index(("best val top-1", "best_val_top1", "pct"))] += " *"
        if s.get("diverged"):
            cells[0] += " †"
        cells += [_fmt(s["time_to_top1"][t], "s") for t in targets]
        cells.append(s["overrides"] or "(defaults)")
        lines.append("| " + " | ".join(cells) + " |")
    if any(s.get("val_split") == "test" and s["best_val_top1"] is not None for s in summaries):
        lines.append("\n\\* validated on the test split (`data.val_size=0`, or a dataset without a held-out "
                     "split): the best val top-1 is the best test score over the run, and the tested checkpoint was "
                     "chosen on the test split unless `callbacks.model_checkpoint.monitor=null` (the last).")
    if any(s.get("diverged") for s in summaries):
        lines.append("\n† diverged: its last train, val or test loss is not finite (NaN or inf), so its accuracies "
                     "are those of a broken model (a lower learning rate, or more warm-up, may train it).")
    return "\n".join(lines) + "\n"


def _not_recipe(override: str) -> bool:
    """Whether an override leaves the training itself alone for seed_groups: the seed and the
    attention path (what the groups are of and split by), and what only names or places the
    run's output (task_name, hydra.*)."""
    key = override.split("=", 1)[0].lstrip("+~")
    return key in ("seed", "attention", "task_name") or key.startswith("hydra.")


def seed_groups(summaries: list[dict]) -> list[dict]:
    """The runs that differ only in their seed, gathered: one row per (dataset, model,
    attention, other overrides) that holds two runs or more, with the mean, standard deviation
    and range of test and best val top-1 across them (runs without a test score are left out
    of its figures), and the median img/s. A single seed cannot tell a difference between
    attention paths from the spread between runs; these rows can."""
    groups: dict[tuple, list[dict]] = {}
    for s in summaries:
        # sorted: the same overrides typed in another order are the same recipe
        recipe = " ".join(sorted(o for o in (s["overrides"] or "").split() if not _not_recipe(o)))
        groups.setdefault((s["dataset"], s["model"], s["attention"], recipe), []).append(s)
    rows = []
    for (dataset, model, attention, recipe), runs in groups.items():
        if len(runs) < 2:
            continue
        row = {"dataset": dataset, "model": model, "attention": attention, "recipe": recipe,
               "runs": [r["run"] for r in runs], "seeds": [r["seed"] for r in runs]}
        for key in ("test_top1", "best_val_top1"):
            values = [r[key] for r in runs if r[key] is not None]
            row[key] = None if len(values) < 2 else {
                "n": len(values), "mean": statistics.mean(values), "sd": statistics.stdev(values),
                "min": min(values), "max": max(values)}
        speeds = [r["img_per_s"] for r in runs if r["img_per_s"] is not None]
        row["img_per_s"] = statistics.median(speeds) if speeds else None
        rows.append(row)
    return rows


def _fmt_spread(stats: dict | None) -> str:
    if stats is None:
        return "n/a"
    return (f"{100 * stats['mean']:.2f} ± {100 * stats['sd']:.2f}% "
            f"({100 * stats['min']:.2f}-{100 * stats['max']:.2f}, {stats['n']} runs)")


def markdown_groups(groups: list[dict]) -> str:
    """The seed groups as a markdown table (empty when no two runs differ only in their seed)."""
    if not groups:
        return ""
    lines = ["| dataset | model | attention | seeds | test top-1 mean ± sd (range) | best val top-1 mean ± sd (range) "
             "| train img/s (median) | recipe |", "|---" * 8 + "|"]
    for g in groups:
        lines.append(f"| {g['dataset']} | {g['model']} | {g['attention']} | {', '.join(map(str, g['seeds']))} | "
                     f"{_fmt_spread(g['test_top1'])} | {_fmt_spread(g['best_val_top1'])} | "
                     f"{_fmt(g['img_per_s'], 'int')} | {g['recipe'] or '(defaults)'} |")
    return "\n".join(lines) + "\n"


def markdown_at_epochs(summaries: list[dict], curves: list[dict], epochs: list[int]) -> str:
    """Val top-1 of each run at each of `epochs` (n/a where a run has none logged there) and
    the spread across the runs that have one, in points."""
    top1 = {(c["run"], c["epoch"]): c["val_top1"] for c in curves if c["val_top1"] is not None}
    runs = [s["run"] for s in summaries]
    lines = ["| epoch | " + " | ".join(f"{r} ({s['attention']})" for r, s in zip(runs, summaries))
             + " | spread (pt) |", "|---" * (len(runs) + 2) + "|"]
    for epoch in epochs:
        found = [top1.get((r, epoch)) for r in runs]
        have = [v for v in found if v is not None]
        spread = f"{100 * (max(have) - min(have)):.2f}" if len(have) > 1 else "n/a"
        lines.append(f"| {epoch} | " + " | ".join(_fmt(v, "pct") for v in found) + f" | {spread} |")
    return "\n".join(lines) + "\n"


def markdown_groups_at_epochs(groups: list[dict], curves: list[dict], epochs: list[int]) -> str:
    """The seed groups' mean val top-1 at each of `epochs`, one column per group (n/a where
    a run of the group has none logged there): runs of several seeds compared at equal
    epochs. Empty without groups."""
    if not groups:
        return ""
    top1 = {(c["run"], c["epoch"]): c["val_top1"] for c in curves if c["val_top1"] is not None}
    lines = ["| epoch | " + " | ".join(f"{g['attention']}: {', '.join(g['runs'])}" for g in groups) + " |",
             "|---" * (len(groups) + 1) + "|"]
    for epoch in epochs:
        means = []
        for g in groups:
            found = [top1.get((r, epoch)) for r in g["runs"]]
            means.append(None if None in found else statistics.mean(found))
        lines.append(f"| {epoch} | " + " | ".join(_fmt(v, "pct") for v in means) + " |")
    return "\n".join(lines) + "\n"


def _label(summary: dict, summaries: list[dict]) -> str:
    attentions = [s["attention"] for s in summaries]
    return summary["attention"] if attentions.count(summary["attention"]) == 1 else f"{summary['run']} ({summary['attention']})"


def plot(summaries: list[dict], curves: list[dict], out: Path) -> list[Path]:
    """Write curves.png, speed_memory.png and time_to_accuracy.png into `out`."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    labels = {s["run"]: _label(s, summaries) for s in summaries}
    by_run = {s["run"]: [c for c in curves if c["run"] == s["run"]] for s in summaries}
    written = []

    fig, (loss_ax, top1_ax) = plt.subplots(1, 2, figsize=(11, 4))
    for run, points in by_run.items():
        epochs = [c["epoch"] + 1 for c in points]
        loss_ax.plot(epochs, [c["train_loss"] for c in points], marker="o", label=f"{labels[run]} train")
        loss_ax.plot(epochs, [c["val_loss"] for c in points], marker="x", linestyle="--", label=f"{labels[run]} val")
        top1_ax.plot(epochs, [100 * c["val_top1"] for c in points], marker="o", label=labels[run])
    loss_ax.set(xlabel="epoch", ylabel="loss", title="loss")
    top1_ax.set(xlabel="epoch", ylabel="val top-1 (%)", title="validation top-1")
    for ax in (loss_ax, top1_ax):
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    written.append(_save(fig, out / "curves.png"))

    fig, (speed_ax, mem_ax) = plt.subplots(1, 2, figsize=(11, 4))
    names = [labels[s["run"]] for s in summaries]
    speed_ax.bar(names, [s["img_per_s"] or 0 for s in summaries])
    speed_ax.set(ylabel="images / s", title="training throughput")
    mem_ax.bar(names, [s["peak_gib"] or 0 for s in summaries])
    mem_ax.set(ylabel="GiB", title="peak GPU memory (0: not on a GPU)")
    for ax in (speed_ax, mem_ax):
        ax.tick_params(axis="x", labelrotation=20)
    written.append(_save(fig, out / "speed_memory.png"))

    fig, ax = plt.subplots(figsize=(6, 4))
    for run, points in by_run.items():
        timed = [c for c in points if c["train_time_s"] is not None]
        ax.plot([c["train_time_s"] for c in timed], [100 * c["val_top1"] for c in timed], marker="o", label=labels[run])
    for t in summaries[0]["time_to_top1"] if summaries else {}:
        ax.axhline(100 * float(t), color="grey", linestyle=":", linewidth=1)
    ax.set(xlabel="training time (s)", ylabel="val top-1 (%)", title="time to accuracy")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    written.append(_save(fig, out / "time_to_accuracy.png"))
    return written


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def write(summaries: list[dict], curves: list[dict], out: Path, command: str, with_plots: bool,
          at_epochs: list[int] = ()) -> None:
    """report.md, summary.json, curves.csv and (with_plots) the PNGs, into folder `out`."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summaries, indent=2) + "\n")
    with (out / "curves.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CURVE_FIELDS)
        writer.writeheader()
        writer.writerows(curves)
    text = [f"# Training runs\n\n`{command}`\n\n", markdown(summaries)]
    groups = seed_groups(summaries)
    if table := markdown_groups(groups):
        text.append("\nAcross seeds (runs that differ only in their seed):\n\n" + table)
    if at_epochs:
        text.append("\nVal top-1 at equal epochs:\n\n" + markdown_at_epochs(summaries, curves, at_epochs))
        if means := markdown_groups_at_epochs(groups, curves, at_epochs):
            text.append("\nThe same, mean of each group of seeds:\n\n" + means)
    text.append("\nTimes: training only (validation excluded), from Lightning's ThroughputMonitor. "
                "img/s: all processes under DDP; per process for runs too short to fill its window.\n")
    if with_plots:
        for png in plot(summaries, curves, out):
            text.append(f"\n![{png.stem}]({png.name})\n")
    (out / "report.md").write_text("".join(text))


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("paths", nargs="+", type=Path, help="run or sweep folders")
    parser.add_argument("--out", type=Path, help="folder for report.md, summary.json, curves.csv (and PNGs)")
    parser.add_argument("--plot", action="store_true", help="also write PNG plots into --out (needs matplotlib)")
    parser.add_argument("--targets", type=float, nargs="*", default=[],
                        help="val top-1 levels (e.g. 0.9 0.93) whose training time to reach is reported")
    parser.add_argument("--at-epochs", type=int, nargs="*", default=[], metavar="EPOCH",
                        help="also tabulate every run's val top-1 at these epochs (0-based)")
    parser.add_argument("--names", nargs="+", metavar="NAME",
                        help="a name for each run, in the order the report lists them (resumed pieces "
                             "joined into one run); default: each run's folder name")
    args = parser.parse_args(argv)
    if args.plot and not args.out:
        parser.error("--plot writes PNG files: give the folder with --out")
    if outside := [t for t in args.targets if not 0 <= t <= 1]:
        parser.error(f"--targets {' '.join(f'{t:g}' for t in outside)}: val top-1 levels are fractions "
                     "from 0 to 1 (0.9 for 90%)")
    if args.plot:
        # before anything is written: a report without its plots is left half done
        try:
            importlib.import_module("matplotlib")
        except ImportError:
            sys.exit('report.py: --plot needs matplotlib: pip install -e ".[report]"')
    try:
        runs = chains(find_runs(args.paths))
        if not runs:
            raise ReportError(f"no run to report in {', '.join(map(str, args.paths))}")
        names = chosen_names(args.names, run_names(runs))
        results = [summarize(pieces, tuple(args.targets), name) for pieces, name in zip(runs, names)]
    except ReportError as err:
        sys.exit(f"report.py: {err}")
    summaries = [s for s, _ in results]
    curves = [c for _, run_curves in results for c in run_curves]
    if args.out:
        command = shlex.join(["python", "scripts/report.py", *(sys.argv[1:] if argv is None else argv)])
        write(summaries, curves, args.out, command, args.plot, args.at_epochs)
    print(markdown(summaries), end="")
    groups = seed_groups(summaries)
    if table := markdown_groups(groups):
        print("\n" + table, end="")
    if args.at_epochs:
        print("\n" + markdown_at_epochs(summaries, curves, args.at_epochs), end="")
        if means := markdown_groups_at_epochs(groups, curves, args.at_epochs):
            print("\n" + means, end="")
    return summaries


if __name__ == "__main__":
    main()
