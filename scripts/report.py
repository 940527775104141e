"""Compare training runs side by side: accuracy, throughput and peak memory per run.

    python scripts/train.py -m attention=flash,naive trainer=gpu      # one job per path
    python scripts/report.py outputs/train/multiruns/<time>           # -> a markdown table

Takes run folders of scripts/train.py, or sweep folders holding them (one subfolder per
job), reads each run's overrides (.hydra/overrides.yaml) and its CSVLogger metrics
(csv/metrics.csv), prints one row per run and, with --out, writes the table to a file.
"""
from __future__ import annotations

import argparse
import csv
import statistics
import sys
from pathlib import Path

import yaml

METRICS_FILE = Path("csv") / "metrics.csv"
COLUMNS = ("run", "overrides", "epochs", "best val/top1", "test/top1", "test/top5",
           "train img/s (median)", "peak GiB")


def find_runs(paths: list[Path]) -> list[Path]:
    """Run folders among `paths`: each path itself, or its direct subfolders (a sweep)."""
    runs = []
    for path in paths:
        if (path / METRICS_FILE).is_file():
            runs.append(path)
            continue
        jobs = sorted((p for p in path.iterdir() if (p / METRICS_FILE).is_file()),
                      key=lambda p: (len(p.name), p.name)) if path.is_dir() else []
        if not jobs:
            raise FileNotFoundError(
                f"{path} holds no training run: expected {METRICS_FILE} in it or in its "
                "subfolders (run folders of scripts/train.py with logger=csv)")
        runs.extend(jobs)
    return runs


def _column(rows: list[dict], name: str) -> list[float]:
    return [float(r[name]) for r in rows if r.get(name)]


def summarize(run: Path) -> dict:
    """One run's figures; a figure the run did not log is None."""
    with (run / METRICS_FILE).open() as f:
        rows = list(csv.DictReader(f))
    overrides_file = run / ".hydra" / "overrides.yaml"
    overrides = yaml.safe_load(overrides_file.read_text()) if overrides_file.is_file() else []

    def last(name):
        values = _column(rows, name)
        return values[-1] if values else None

    val = _column(rows, "val/top1")
    speed = _column(rows, "train/device/samples_per_sec")
    peak = _column(rows, "train/peak_mem_gib") + _column(rows, "test/peak_mem_gib")
    epochs = _column(rows, "epoch")
    return {
        "run": run.name,
        "overrides": " ".join(o for o in overrides or [] if not o.startswith("hydra.")),
        "epochs": int(max(epochs)) + 1 if epochs else None,
        "best val/top1": max(val) if val else None,
        "test/top1": last("test/top1"),
        "test/top5": last("test/top5"),
        "train img/s (median)": statistics.median(speed) if speed else None,
        "peak GiB": max(peak) if peak else None,
    }


def markdown(summaries: list[dict]) -> str:
    def fmt(key, value):
        if value is None:
            return "n/a"
        if key.endswith("top1") or key.endswith("top5"):
            return f"{100 * value:.2f}%"
        if key == "train img/s (median)":
            return f"{value:,.0f}"
        if key == "peak GiB":
            return f"{value:.2f}"
        return str(value)

    lines = ["| " + " | ".join(COLUMNS) + " |", "|---" * len(COLUMNS) + "|"]
    lines += ["| " + " | ".join(fmt(k, s[k]) for k in COLUMNS) + " |" for s in summaries]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("paths", nargs="+", type=Path, help="run or sweep folders")
    parser.add_argument("--out", type=Path, help="also write the table here")
    args = parser.parse_args(argv)
    try:
        table = markdown([summarize(run) for run in find_runs(args.paths)])
    except FileNotFoundError as err:
        sys.exit(f"report.py: {err}")
    if args.out:
        args.out.write_text(table)
    print(table, end="")
    return table


if __name__ == "__main__":
    main()
