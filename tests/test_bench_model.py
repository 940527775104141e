"""scripts/bench_model.py on the CPU: --append keeps the rows a run does not measure again,
in suite order, and the table names every command and commit its rows came from."""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from test_train import load_script

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
ENV = {"gpu": "NVIDIA H200", "commit": "new", "torch": "2.11", "triton": "3.6", "cuda": "13.0",
       "date": "today"}


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPTS))  # the script imports its neighbours, as when run from scripts/
    return load_script("bench_model")


def row(model, batch, mode, img_per_s, command="cmd", commit="old"):
    per_path = {"img_per_s": img_per_s, "img_per_s_min": img_per_s, "img_per_s_max": img_per_s,
                "step_ms": 1.0, "peak_gib": 1.0}
    return {"model": model, "batch": batch, "compile": mode, "command": command, "commit": commit,
            **{p: dict(per_path) for p in ("flash", "sdpa", "naive")}}


def test_append_keeps_other_rows_and_replaces_measured_ones(bench, tmp_path):
    old = [row("vit_tiny_patch4_32", 256, None, 10.0), row("vit_tiny_patch4_32", 256, "reduce-overhead", 50.0)]
    path = tmp_path / "train_step_cifar_nvidia_h200.json"
    path.write_text(json.dumps({"command": "cmd", "environment": ENV, "results": old}))
    measured = {("vit_tiny_patch4_32", 256, "reduce-overhead")}
    kept = bench.earlier_rows(tmp_path, "train_step_cifar", ENV, lambda r: bench.row_key(r) not in measured)
    assert kept == old[:1]
    new = row("vit_tiny_patch4_32", 256, "reduce-overhead", 60.0, command="cmd2", commit="new")
    rows = bench.in_suite_order([new, *kept], bench.SUITES["cifar"])
    assert [r["compile"] for r in rows] == [None, "reduce-overhead"]  # eager first, as in the suite
    table = bench.markdown(rows, ["flash", "sdpa", "naive"], ENV, "cmd2", SimpleNamespace(steps=20, warmup=5, repeats=3))
    assert "- `cmd` (commit old)" in table and "- `cmd2` (commit new)" in table
    assert "| vit_tiny_patch4_32 | 256 | reduce-overhead | 60 (60-60) |" in table


def test_append_without_a_file_starts_empty_and_refuses_a_foreign_file(bench, tmp_path):
    assert bench.earlier_rows(tmp_path, "train_step_cifar", ENV, lambda r: True) == []
    (tmp_path / "train_step_cifar_nvidia_h200.json").write_text("[1, 2]")
    with pytest.raises(SystemExit, match="not a result file of this script"):
        bench.earlier_rows(tmp_path, "train_step_cifar", ENV, lambda r: True)


def test_one_source_keeps_the_plain_command_line(bench):
    table = bench.markdown([row("vit_tiny_patch4_32", 256, None, 10.0, commit="new")], ["flash", "sdpa", "naive"],
                           ENV, "cmd", SimpleNamespace(steps=20, warmup=5, repeats=3))
    assert "Command: `cmd`" in table and "Rows measured by" not in table


def test_the_ceiling_column_divides_the_no_attention_step_by_the_best_other_path(bench):
    r = row("vit_tiny_patch4_32", 1024, "reduce-overhead", 100.0, commit="new")
    r["sdpa"].update(img_per_s=80.0, img_per_s_min=80.0, img_per_s_max=80.0)
    r["no_attention"] = dict(r["naive"], img_per_s=120.0, img_per_s_min=110.0, img_per_s_max=130.0)
    del r["naive"]  # --paths flash sdpa no_attention: naive not measured
    table = bench.markdown([r], ["flash", "sdpa", "naive", "no_attention"], ENV, "cmd",
                           SimpleNamespace(steps=20, warmup=5, repeats=3))
    # flash / best other = 100 / 80; ceiling = 120 / 80 (no_attention is not an "other" path);
    # flash's share = (1/80 - 1/100) / (1/80 - 1/120) = 0.6
    assert "| 100 (100-100) | 80 (80-80) | n/a | 120 (110-130) | 1.25x | 1.50x | 0.60 |" in table
    assert "ceiling" in table


def test_render_prints_a_result_files_table_without_a_gpu(bench, tmp_path, capsys):
    r = row("vit_tiny_patch4_32", 1024, "reduce-overhead", 100.0, commit="new")
    r["sdpa"].update(img_per_s=80.0, img_per_s_min=80.0, img_per_s_max=80.0)
    r["no_attention"] = dict(r.pop("naive"), img_per_s=120.0, img_per_s_min=120.0, img_per_s_max=120.0)
    path = tmp_path / "train_step_cifar_nvidia_h200.json"
    path.write_text(json.dumps({"command": "cmd", "environment": {**ENV, "timm": "1.0"}, "results": [r]}))
    bench.main(["--render", str(path)])
    out = capsys.readouterr().out
    assert "| flash img/s | sdpa img/s | no_attention img/s | flash / best other | ceiling |" in out
    assert "| 1.25x | 1.50x | 0.60 |" in out and "Command: `cmd`" in out


def test_without_attention_makes_the_blocks_ignore_queries_and_keys(bench):
    import torch

    from vitflash import build_model

    model = build_model("vit_tiny_patch4_32", attention="naive", num_classes=10)
    x = torch.randn(2, 3, 32, 32)
    with bench.without_attention():
        model(x).sum().backward()
    weight = model.blocks[0].attn.qkv.weight.grad  # rows: q, k, v projections, dim each
    dim = weight.shape[1]
    assert weight[:2 * dim].abs().max() == 0  # o = V: queries and keys get no gradient
    assert weight[2 * dim:].abs().max() > 0
    model.zero_grad()
    model(x).sum().backward()  # outside the context: attention again
    assert model.blocks[0].attn.qkv.weight.grad[:dim].abs().max() > 0


def test_a_mistyped_path_is_named_before_the_gpu_is_needed(bench, capsys):
    with pytest.raises(SystemExit):
        bench.main(["--suite", "cifar", "--paths", "flash", "no_atention"])
    err = capsys.readouterr().err
    assert "unknown path(s) no_atention for --suite cifar" in err
    assert "choose from flash, sdpa, naive, no_attention" in err


@pytest.mark.parametrize("from_start", [False, True])
def test_the_peak_covers_the_warmup_where_cuda_graphs_allocate_their_memory(bench, monkeypatch, from_start):
    """Under reduce-overhead the warm-up steps record the CUDA graphs, whose pool holds the
    step's activations; replays allocate nothing. So that case's peak is reset before the
    warm-up, the others' after it (compilation and autotuning are not the step's)."""
    import torch

    calls = []

    class Event:  # every step takes 2 ms
        def __init__(self, **kwargs):
            pass

        def record(self):
            pass

        def synchronize(self):
            pass

        def elapsed_time(self, end):
            return 2.0

    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda: calls.append("reset"))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda: 3 * 2**30)
    monkeypatch.setattr(torch.cuda, "Event", Event)
    secs, gib = bench.measure(lambda: calls.append("step"), warmup=2, steps=3, repeats=2,
                              peak_from_start=from_start)
    first_reset = calls.index("reset")
    assert calls.count("reset") == 1 and calls.count("step") == 2 + 3 * 2
    assert first_reset == (0 if from_start else 2)
    assert secs == [0.002, 0.002] and gib == 3.0


def test_timm_flash_is_a_large_suite_path_that_flash_is_not_divided_by(bench, capsys):
    r = row("vit_base_patch16_224", 256, None, 100.0, commit="new")
    r["sdpa"].update(img_per_s=90.0, img_per_s_min=90.0, img_per_s_max=90.0)
    r["naive"].update(img_per_s=60.0, img_per_s_min=60.0, img_per_s_max=60.0)
    r["timm_flash"] = dict(r["flash"], img_per_s=120.0, img_per_s_min=120.0, img_per_s_max=120.0)
    table = bench.markdown([r], ["flash", "sdpa", "naive", "timm_flash"], ENV, "cmd",
                           SimpleNamespace(steps=20, warmup=5, repeats=3))
    assert "| 100 (100-100) | 90 (90-90) | 60 (60-60) | 120 (120-120) | 1.11x |" in table  # 100 / 90, not / 120
    with pytest.raises(SystemExit):
        bench.main(["--suite", "cifar", "--paths", "flash", "timm_flash"])
    assert "unknown path(s) timm_flash for --suite cifar" in capsys.readouterr().err
