"""scripts/bench_loop.py --quick on the CPU: the real loop and the bare step of one tiny case,
written as JSON rows and a markdown table."""
from __future__ import annotations

import gc
import json
import statistics
import sys
from pathlib import Path

import pytest
import torch

from test_train import load_script

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def test_quick_run_writes_positive_rows(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPTS))  # the script imports its neighbours, as when run from scripts/
    bench_loop = load_script("bench_loop")
    monkeypatch.setattr(sys, "argv", ["scripts/bench_loop.py", "--quick", "--attention", "sdpa", "--out", str(tmp_path)])
    rows = bench_loop.main()

    (written,) = tmp_path.glob("loop_*.json")
    if not torch.cuda.is_available():
        assert written.name == "loop_cpu.json"
    saved = json.loads(written.read_text())
    assert saved["results"] == rows and len(rows) == 1
    assert saved["command"] == "python scripts/bench_loop.py --quick --attention sdpa"  # less --out
    assert {"torch", "lightning", "timm", "gpu"} <= set(saved["environment"])

    (row,) = rows
    assert (row["data"], row["model"], row["batch"], row["attention"]) == ("synthetic", "vit_micro_patch4_32", 32, "sdpa")
    assert row["compile"] == "false" and row["compile_mode"] == "eager"
    assert len(row["loop_repeats"]) == len(row["step_repeats"]) == 3
    assert all(v > 0 for v in (*row["loop_repeats"], *row["step_repeats"]))
    assert row["loop_img_per_s"] > 0 and row["step_img_per_s"] > 0
    # the host's CPU time per step, in the same windows
    assert len(row["loop_host_ms"]) == len(row["step_host_ms"]) == 3
    assert all(v > 0 for v in (*row["loop_host_ms"], *row["step_host_ms"]))
    # garbage collection in each loop window (none is forced, so it may be 0)
    assert len(row["loop_gc_ms"]) == 3 and all(v >= 0 for v in row["loop_gc_ms"])
    # the reported figures are the medians of the repeats, and the ratio is theirs
    assert row["loop_img_per_s"] == statistics.median(row["loop_repeats"])
    assert row["step_img_per_s"] == statistics.median(row["step_repeats"])
    assert row["ratio"] == pytest.approx(row["loop_img_per_s"] / row["step_img_per_s"])
    if not torch.cuda.is_available():
        assert row["gpu_busy"] is None
    table = written.with_suffix(".md").read_text()
    assert "| synthetic | cpu | vit_micro_patch4_32 | 32 | sdpa | eager |" in table
    assert "| loop host ms/step | bare host ms/step | loop GC ms/window |" in table
    # the case's GC callback is gone with it
    assert not any(isinstance(getattr(cb, "__self__", None), bench_loop.GcPauses) for cb in gc.callbacks)


def test_gc_pauses_count_collections(monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPTS))
    pauses = load_script("bench_loop").GcPauses()
    try:
        gc.collect()
        gc.collect()
    finally:
        pauses.stop()
    assert pauses.collections == 2 and pauses.total_s > 0
    gc.collect()  # stopped: no longer counted
    assert pauses.collections == 2
