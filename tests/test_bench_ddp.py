"""scripts/bench_ddp.py --quick on the CPU: the real loop on 1 process, then on 2 under DDP
over gloo, written as JSON rows and a markdown table; --fsdp-model refused without CUDA."""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import pytest
import torch

from test_train import load_script

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
BATCH, STEPS, REPEATS = 32, 2, 2  # --quick: synthetic data, vit_micro_patch4_32 at b32, windows of 2 steps


@pytest.fixture
def bench_ddp(monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPTS))  # the script imports its neighbours, as when run from scripts/
    return load_script("bench_ddp")


def test_one_then_two_processes_write_rows(tmp_path, monkeypatch, bench_ddp):
    if torch.cuda.is_available() and torch.cuda.device_count() < 2:
        pytest.skip("one GPU: the 2-process run would ask for 2 (on the CPU it runs over gloo)")
    argv = ["--quick", "--devices", "2", "--repeats", str(REPEATS), "--attention", "sdpa"]
    monkeypatch.setattr(sys, "argv", ["scripts/bench_ddp.py", *argv, "--out", str(tmp_path)])
    rows = bench_ddp.main()

    (written,) = tmp_path.glob("ddp_*.json")
    saved = json.loads(written.read_text())
    assert saved["results"] == rows and len(rows) == 1
    assert saved["command"] == "python scripts/bench_ddp.py " + " ".join(argv)  # less --out
    (row,) = rows
    assert (row["data"], row["model"], row["batch_per_gpu"], row["devices"]) == ("synthetic", "vit_micro_patch4_32", BATCH, 2)
    assert row["img_per_s_1gpu"] > 0 and row["img_per_s_2gpu"] > 0
    assert row["scaling"] == pytest.approx(row["img_per_s_2gpu"] / row["img_per_s_1gpu"])
    assert {"peak_mem_gib_1gpu", "peak_mem_gib_2gpu"} <= set(row)
    # the first run is the plain single-device loop, the second DDP with two processes
    assert (row["strategy_1gpu"], row["strategy_2gpu"]) == ("SingleDeviceStrategy", "DDPStrategy")
    assert [r["rank"] for r in row["ranks_1gpu"]] == [0]
    assert [r["rank"] for r in row["ranks_2gpu"]] == [0, 1]  # rank 0 gathered rank 1's measurements
    if torch.cuda.is_available():
        assert row["backend"] == "nccl" and row["peak_mem_gib_1gpu"] > 0 and row["peak_mem_gib_2gpu"] > 0
    else:
        assert written.name == "ddp_cpu.json" and row["backend"] == "gloo"
        assert row["peak_mem_gib_1gpu"] is None and row["peak_mem_gib_2gpu"] is None
    # every process trained on a batch of its own per step, every window
    for ranks in (row["ranks_1gpu"], row["ranks_2gpu"]):
        for r in ranks:
            assert r["window_images"] == [BATCH * STEPS] * REPEATS
            assert len(r["window_s"]) == REPEATS and all(s > 0 for s in r["window_s"])
    # a window's rate counts both processes' images against the slower one's time
    for k, rate in enumerate(row["window_img_per_s_2gpu"]):
        slowest = max(r["window_s"][k] for r in row["ranks_2gpu"])
        assert rate == pytest.approx(2 * BATCH * STEPS / slowest)
    assert row["img_per_s_2gpu"] == statistics.median(row["window_img_per_s_2gpu"])
    table = written.with_suffix(".md").read_text()
    assert f"| {row['pipeline']} | vit_micro_patch4_32 | 32 | sdpa | {row['compile_mode']} |" in table
    assert f"{row['scaling']:.2f}x" in table


def test_fsdp_model_without_cuda_is_refused_at_once(tmp_path, monkeypatch, capsys, bench_ddp):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA, where trainer=fsdp runs")
    monkeypatch.setattr(sys, "argv", ["scripts/bench_ddp.py", "--fsdp-model", "vit_large_patch16_224", "--out", str(tmp_path)])
    with pytest.raises(SystemExit) as exit_:
        bench_ddp.main()
    assert exit_.value.code == 2
    assert "--fsdp-model runs trainer=fsdp, which needs CUDA GPUs" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())  # refused before any run


def test_one_process_is_not_a_scaling_run(monkeypatch, capsys, bench_ddp):
    monkeypatch.setattr(sys, "argv", ["scripts/bench_ddp.py", "--quick", "--devices", "1"])
    with pytest.raises(SystemExit):
        bench_ddp.main()
    assert "--devices 1: the data-parallel run needs at least 2 processes" in capsys.readouterr().err


def test_append_keeps_the_other_cases_rows(tmp_path, bench_ddp):
    env = {"gpu": "NVIDIA H200"}
    old = [{"data": "cifar10", "scaling": 1.9}, {"data": "imagenette", "scaling": 1.5}]
    (tmp_path / "ddp_nvidia_h200.json").write_text(json.dumps({"results": old}))
    assert bench_ddp.kept_rows(tmp_path, env, ["imagenette"]) == old[:1]  # imagenette is measured again
    assert bench_ddp.kept_rows(tmp_path, {"gpu": "cpu"}, ["imagenette"]) == []  # another machine's file
