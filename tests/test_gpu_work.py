"""scripts/gpu_work.py on a small hand-made trace: device time by where it was launched."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from test_train import load_script

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def _trace(path: Path) -> Path:
    def op(name, ts, dur, tid=1):
        return {"cat": "cpu_op", "name": name, "ts": ts, "dur": dur, "tid": tid, "args": {}}

    def launch(name, ts, corr, tid=1):
        return {"cat": "cuda_runtime", "name": name, "ts": ts, "dur": 1, "tid": tid, "args": {"correlation": corr}}

    def kernel(ts, dur, corr):
        return {"cat": "kernel", "name": "k", "ts": ts, "dur": dur, "tid": 7, "args": {"correlation": corr}}

    events = [
        op("## Call CompiledFxGraph fwd", 0, 50), launch("cudaGraphLaunch", 10, 1),
        kernel(20, 100, 1), kernel(120, 50, 1),  # forward graph: 150 us
        op("CompiledFunctionBackward", 200, 50, tid=2), launch("cudaGraphLaunch", 210, 2, tid=2),
        kernel(220, 300, 2),  # backward graph (another thread, the autograd engine's): 300 us
        launch("cudaGraphLaunch", 600, 3), kernel(610, 40, 3),  # outside any operator: 40 us
        op("aten::add", 700, 5), launch("cudaLaunchKernel", 701, 4), kernel(800, 10, 4),  # eager: 10 us
        {"ph": "M", "name": "process_name"},  # metadata without a duration is skipped
    ]
    out = path / "t.trace.json.gz"
    with gzip.open(out, "wt") as f:
        json.dump({"traceEvents": events}, f)
    return out


def test_device_time_by_launch_source(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPTS))
    gpu_work = load_script("gpu_work")
    work = gpu_work.gpu_work(gpu_work.load(_trace(tmp_path)))
    assert {k: v for k, v in work.items() if not k.startswith("_")} == {
        "forward graph": 150, "backward graph": 300, "graph outside any operator": 40, "eager kernels": 10}
    assert work["_busy"] == 500 and work["_span"] == 790  # 20..810, idle between the launches
    table = gpu_work.main([str(_trace(tmp_path)), "--steps", "2"])
    assert "| backward graph | 0.15 |" in table and "| total | 0.25 |" in table
    with pytest.raises(SystemExit):
        gpu_work.main([str(tmp_path / "missing.json.gz"), "--steps", "2"])
