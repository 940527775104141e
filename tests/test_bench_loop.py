"""scripts/bench_loop.py --quick on the CPU: the real loop and the bare step of one tiny case,
written as JSON rows and a markdown table."""
from __future__ import annotations

import argparse
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
    # the whole-step CUDA graph is timed only when asked for
    assert row["graph_step_img_per_s"] is None and row["graph_step_repeats"] == row["graph_step_host_ms"] == []
    table = written.with_suffix(".md").read_text()
    assert "| synthetic | cpu | vit_micro_patch4_32 | 32 | sdpa | eager |" in table
    assert "| loop host ms/step | bare host ms/step | loop GC ms/window |\n" in table and "graph step" not in table
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


def test_graph_step_columns_only_where_measured(monkeypatch):
    """The markdown gains the graph-step columns when a row has them, n/a in rows without."""
    monkeypatch.syspath_prepend(str(SCRIPTS))
    bench_loop = load_script("bench_loop")
    base = {"data": "cifar10", "pipeline": "gpu", "model": "m", "batch": 128, "attention": "flash",
            "compile_mode": "reduce-overhead", "loop_repeats": [1.0, 2.0, 3.0], "step_repeats": [4.0, 5.0, 6.0],
            "ratio": 0.4, "gpu_busy": 0.5, "loop_host_ms": [9.0, 9.5, 10.0], "step_host_ms": [5.0, 5.1, 5.2],
            "loop_gc_ms": [0.0, 0.1, 0.2], "graph_step_repeats": [], "graph_step_host_ms": []}
    graphed = {**base, "attention": "naive", "graph_step_repeats": [7000.0, 8000.0, 9000.0],
               "graph_step_host_ms": [1.0, 1.5, 2.0]}
    args = type("Args", (), {"repeats": 3, "steps": 40, "warmup": 15})()
    env = {k: "x" for k in ("gpu", "commit", "torch", "triton", "lightning", "timm", "cuda", "date")}
    lines = bench_loop.markdown([base, graphed], env, "cmd", args).splitlines()
    header = next(line for line in lines if line.startswith("| data |"))
    assert header.endswith("| loop GC ms/window | graph step img/s | graph step host ms/step |")
    start = lines.index(header) + 2
    rows = lines[start:lines.index("", start) if "" in lines[start:] else None]  # the main table's rows
    assert len(rows) == 2
    assert rows[0].endswith("| n/a | n/a |")
    assert rows[1].endswith("| 8,000 (7,000-9,000) | 1.50 (1.00-2.00) |")
    assert all(line.count("|") == header.count("|") for line in [*rows, lines[lines.index(header) + 1]])
    assert bench_loop.markdown([base], env, "cmd", args).count("graph step") == 0


def test_fastest_loop_against_fastest_bare_step(monkeypatch):
    """The closing table takes, per model, batch and attention, the fastest loop of any mode
    against the fastest bare step of any mode, graph steps included; one mode: no table."""
    monkeypatch.syspath_prepend(str(SCRIPTS))
    bench_loop = load_script("bench_loop")
    common = {"data": "cifar10", "pipeline": "gpu", "model": "m", "batch": 1024, "gpu_busy": None,
              "loop_host_ms": [1.0], "step_host_ms": [1.0], "loop_gc_ms": [0.0], "graph_step_host_ms": []}
    compiled = {**common, "attention": "flash", "compile_mode": "reduce-overhead", "loop_repeats": [70.0, 77.0, 76.0],
                "step_repeats": [90.0, 92.0, 91.0], "ratio": 0.84, "graph_step_repeats": []}
    graphed = {**common, "attention": "flash", "compile_mode": "default", "loop_graph_step": True,
               "loop_repeats": [85.0, 86.0, 84.0], "step_repeats": [60.0, 61.0, 62.0], "ratio": 1.4,
               "graph_step_repeats": [95.0, 94.0, 96.0], "graph_step_host_ms": [1.0, 1.0, 1.0]}
    alone = {**compiled, "attention": "naive"}
    args = type("Args", (), {"repeats": 3, "steps": 40, "warmup": 15})()
    env = {k: "x" for k in ("gpu", "commit", "torch", "triton", "lightning", "timm", "cuda", "date")}
    lines = bench_loop.markdown([compiled, graphed, alone], env, "cmd", args).splitlines()
    assert "| cifar10 | gpu | m | 1024 | flash | default + graph step |" in "\n".join(lines)
    title = next(i for i, line in enumerate(lines) if line.startswith("Fastest loop against"))
    table = [line for line in lines[title:] if line.startswith("| cifar10 |")]
    # flash: the graph-step loop (85) against the compiled graph step (95); naive has one mode only
    assert table == ["| cifar10 | m | 1024 | flash | 85 (default + graph step) | 95 (graph step, compiled model) | 0.895 |"]
    assert not any(line.startswith("Fastest loop") for line in bench_loop.markdown([compiled], env, "c", args).splitlines())


@pytest.mark.parametrize("flags, message", [
    (["--graph-step"], "--graph-step captures a CUDA graph and needs a CUDA GPU"),
    (["--loop-graph-step"], "--loop-graph-step captures the training step as a CUDA graph"),
    (["--loop-graph-step", "--compile", "reduce-overhead"],
     "--loop-graph-step runs with --compile false or default (the model eager or compiled inside the captured "
     "step), and got --compile reduce-overhead: add one"),
])
def test_cuda_graph_flags_refused_where_they_cannot_run(monkeypatch, capsys, flags, message):
    if torch.cuda.is_available() and "--compile" not in flags:
        pytest.skip("checks the refusal on a machine without CUDA")
    monkeypatch.syspath_prepend(str(SCRIPTS))
    bench_loop = load_script("bench_loop")
    with pytest.raises(SystemExit) as exit_:
        bench_loop.main(["--quick", *flags])
    assert exit_.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.gpu
@pytest.mark.parametrize("attention", ["flash", "sdpa"])
def test_graph_step_on_cuda(tmp_path, monkeypatch, attention):
    """The whole step captured as one CUDA graph (flash's kernels inside it) replays and is timed."""
    monkeypatch.syspath_prepend(str(SCRIPTS))
    bench_loop = load_script("bench_loop")
    (row,) = bench_loop.main(["--quick", "--graph-step", "--attention", attention, "--out", str(tmp_path)])
    assert len(row["graph_step_repeats"]) == len(row["graph_step_host_ms"]) == 3
    assert all(v > 0 for v in (*row["graph_step_repeats"], *row["graph_step_host_ms"]))
    assert row["graph_step_img_per_s"] == statistics.median(row["graph_step_repeats"])
    (table,) = tmp_path.glob("loop_*.md")
    assert "graph step img/s" in table.read_text()


@pytest.mark.gpu
def test_loop_graph_step_on_cuda(tmp_path, monkeypatch):
    """--loop-graph-step: the loop itself runs the captured step, with the model eager and
    compiled; the closing table sets the fastest loop against the fastest bare step."""
    monkeypatch.syspath_prepend(str(SCRIPTS))
    bench_loop = load_script("bench_loop")
    rows = bench_loop.main(["--quick", "--attention", "flash", "--compile", "false", "default", "--loop-graph-step",
                            "--graph-step", "--out", str(tmp_path)])
    assert [(r["compile_mode"], r["loop_graph_step"]) for r in rows] == [("eager", True), ("default", True)]
    assert all(v > 0 for r in rows for v in (*r["loop_repeats"], *r["graph_step_repeats"]))
    (table,) = tmp_path.glob("loop_*.md")
    text = table.read_text()
    assert "| flash | default + graph step |" in text and "Fastest loop against the fastest bare step" in text


@pytest.mark.parametrize(("loop_graph_step", "compile_mode", "expected"), [
    (False, "default", "model.graph_step=false"),  # the config's auto would capture it on a GPU
    (False, "reduce-overhead", "model.graph_step=false"),
    (True, "default", "model.graph_step=true"),
    (True, "reduce-overhead", "model.graph_step=false"),  # CUDA graphs of its own
])
def test_each_case_sets_the_graph_step_explicitly(monkeypatch, tmp_path, loop_graph_step, compile_mode, expected):
    """The loop runs the mode its row names (--loop-graph-step or not), whatever model.graph_step's
    default is."""
    monkeypatch.syspath_prepend(str(SCRIPTS))
    bench_loop = load_script("bench_loop")
    args = argparse.Namespace(data_root=None, pipeline=None, override=[], loop_graph_step=loop_graph_step)
    cfg, overrides = bench_loop.compose_case("cifar10", "flash", compile_mode, args, tmp_path, max_steps=4)
    assert expected in overrides
    assert cfg.model.graph_step == (expected.endswith("true"))


def test_an_experiment_override_brings_its_own_model_and_batch(monkeypatch, tmp_path):
    """--override experiment=<recipe> measures that recipe: its model, batch and training
    settings, not the case's pinned model and batch; an explicit override still wins."""
    monkeypatch.syspath_prepend(str(SCRIPTS))
    bench_loop = load_script("bench_loop")
    recipe = "experiment=cifar10_vit_h12_gap_mimetic_10min"
    args = argparse.Namespace(data_root=None, pipeline=None, override=[recipe], loop_graph_step=False)
    cfg, overrides = bench_loop.compose_case("cifar10", "flash", "default", args, tmp_path, max_steps=4)
    assert "experiment=cifar10_vit_tiny" not in overrides
    assert (cfg.model.model_name, cfg.data.batch_size) == ("vit_tiny_h12_patch4_32", 512)
    assert cfg.model.global_pool == "avg" and cfg.model.ema_decay == 0.9998
    assert cfg.data.augment.auto_augment == "autoaugment-cifar10"
    assert cfg.trainer.max_steps == 4 and cfg.model.attention == "flash"
    args.override = [recipe, "data.batch_size=256"]
    cfg, _ = bench_loop.compose_case("cifar10", "flash", "default", args, tmp_path, max_steps=4)
    assert cfg.data.batch_size == 256
    args.override = []  # without one, the case's own recipe, model and batch
    cfg, _ = bench_loop.compose_case("cifar10", "flash", "default", args, tmp_path, max_steps=4)
    assert (cfg.model.model_name, cfg.data.batch_size) == ("vit_tiny_patch4_32", 1024)


def test_imagenette_synthetic_is_imagenette_with_random_images(monkeypatch, tmp_path):
    """The imagenette_synthetic case composes the imagenette case's model, batch, step and
    augmentation over random images of Imagenette's number and size: only the data's source
    differs."""
    from hydra.utils import instantiate

    monkeypatch.syspath_prepend(str(SCRIPTS))
    bench_loop = load_script("bench_loop")
    args = argparse.Namespace(data_root=None, pipeline="gpu", override=[], loop_graph_step=False)
    real, _ = bench_loop.compose_case("imagenette", "flash", "false", args, tmp_path, max_steps=4)
    synthetic, _ = bench_loop.compose_case("imagenette_synthetic", "flash", "false", args, tmp_path, max_steps=4)
    assert synthetic.model == real.model and synthetic.trainer == real.trainer
    assert synthetic.data.augment == real.data.augment and synthetic.data.augment.auto_augment.startswith("rand")
    for key in ("num_classes", "img_size", "batch_size", "pipeline"):
        assert synthetic.data[key] == real.data[key], key
    dm = instantiate(synthetic.data, _convert_="all", train_size=40, test_size=8, batch_size=8)
    assert type(dm).__name__ == "SyntheticDataModule" and synthetic.data.train_size == 9469  # Imagenette's train split
    dm.setup("fit")
    images, labels = next(iter(dm.train_dataloader()))
    assert images.shape == (8, 3, 224, 224) and images.dtype == torch.float32 and labels.max() < 10
