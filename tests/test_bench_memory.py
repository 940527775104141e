"""scripts/bench_memory.py on the CPU: the largest-batch search against fake predicates, the
refusal to run without a GPU, and the table and JSON it writes from given rows."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from test_train import load_script

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPTS))  # the script imports its neighbours, as when run from scripts/
    return load_script("bench_memory")


def check_trace(result, fits, granularity, cap):
    """What holds for every search: batches on the grid, within the cap, each tried once,
    the recorded outcome is the predicate's, and the answer sits next to a failure."""
    batches = [b for b, _ in result.tries]
    assert len(batches) == len(set(batches))
    assert all(b % granularity == 0 and granularity <= b <= cap for b in batches)
    assert all(ok == fits(b) for b, ok in result.tries)
    if result.max_batch is not None:
        assert (result.max_batch, True) in result.tries
    if result.first_failure is not None:
        assert (result.first_failure, False) in result.tries
        assert result.first_failure - (result.max_batch or 0) == granularity


@pytest.mark.parametrize("granularity, expected", [(8, 1000), (16, 992), (1, 1000), (32, 992)])
def test_search_finds_the_limit_to_the_granularity(bench, granularity, expected):
    def fits(b):
        return b <= 1000

    result = bench.largest_fitting(fits, start=32, granularity=granularity, cap=8192)
    assert result.max_batch == expected and not result.capped
    check_trace(result, fits, granularity, 8192)
    # doubling 32 .. 1024 (6 tries), then halving an interval of 512 down to the granularity
    assert len(result.tries) == 6 + (512 // granularity).bit_length() - 1


def test_search_is_exact_for_every_limit(bench):
    start, granularity, cap = 24, 8, 512
    for limit in range(0, 700):
        def fits(b):
            return b <= limit

        result = bench.largest_fitting(fits, start, granularity, cap)
        best = min(limit, cap) // granularity * granularity
        assert result.max_batch == (best or None), limit
        assert result.capped == (limit >= cap), limit
        check_trace(result, fits, granularity, cap)


def test_search_below_a_start_that_does_not_fit(bench):
    result = bench.largest_fitting(lambda b: b <= 40, start=256, granularity=8, cap=1024)
    assert (result.max_batch, result.first_failure) == (40, 48)
    assert result.tries[0] == (256, False)


def test_search_when_nothing_fits(bench):
    result = bench.largest_fitting(lambda b: False, start=64, granularity=8, cap=1024)
    assert result.max_batch is None and result.first_failure == 8 and not result.capped
    assert [b for b, _ in result.tries] == [64, 32, 16, 8]


def test_search_stops_at_the_cap(bench):
    result = bench.largest_fitting(lambda b: True, start=32, granularity=8, cap=384)
    assert result.max_batch == 384 and result.capped and result.first_failure is None
    assert result.tries == [(32, True), (64, True), (128, True), (256, True), (384, True)]


@pytest.mark.parametrize("start, granularity, cap, words", [
    (30, 8, 1024, "multiples"), (32, 8, 1020, "multiples"), (4, 8, 1024, "granularity <= start"),
    (64, 8, 32, "start <= cap"), (32, 0, 64, "1 <= granularity")])
def test_search_rejects_bad_arguments(bench, start, granularity, cap, words):
    with pytest.raises(ValueError, match=words):
        bench.largest_fitting(lambda b: True, start, granularity, cap)


def test_bad_command_line_fails_before_the_gpu_check(bench, capsys):
    with pytest.raises(SystemExit) as exit_:
        bench.parse_args(["--granularity", "7"])
    assert exit_.value.code == 2 and "multiples of granularity=7" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.parse_args(["--steps", "1"])
    assert "at least 2" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.parse_args(["--models", "vit_huge"])
    assert "unknown model 'vit_huge': choose one of" in capsys.readouterr().err


def test_without_a_gpu_it_exits_with_one_line(bench, monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as exit_:
        bench.main(["--out", str(tmp_path)])
    message = exit_.value.code
    assert isinstance(message, str) and "\n" not in message and "needs a CUDA GPU" in message
    assert not any(tmp_path.iterdir())


def test_results_written_with_their_columns(bench, tmp_path):
    args = bench.parse_args(["--models", "vit_base_patch16_384", "--out", str(tmp_path)])
    env = {"gpu": "Fake GPU 141GB", "commit": "abc1234", "torch": "2.x", "triton": "3.x",
           "cuda": "13.0", "date": "2026-01-01 00:00 UTC", "gpu_total_gib": 139.8,
           "gpu_free_gib": 139.2, "alloc_conf": ""}
    tries = [{"batch": 32, "fits": True, "peak_gib": 7.0}, {"batch": 64, "fits": False, "peak_gib": None}]
    rows = [
        {"model": "vit_base_patch16_384", "img_size": 384, "attention": "flash", "max_batch": 700,
         "first_oom": 708, "capped": False, "seconds": 31.2, "tries": tries, "peak_gib": 134.0,
         "reserved_gib": 136.5, "mib_per_image": 190.4},
        {"model": "vit_base_patch16_384", "img_size": 384, "attention": "naive", "max_batch": 280,
         "first_oom": 288, "capped": False, "seconds": 20.0, "tries": tries, "peak_gib": 133.0,
         "reserved_gib": 135.0, "mib_per_image": 480.0},
        {"model": "vit_base_patch16_384", "img_size": 384, "attention": "sdpa", "max_batch": None,
         "first_oom": 8, "capped": False, "seconds": 1.0, "tries": tries[1:],
         "error": "even batch 8 does not fit"},
    ]
    table = bench.markdown(rows, env, "python scripts/bench_memory.py", args)
    bench.write_results(tmp_path, "memory", env, "python scripts/bench_memory.py", rows, table)

    saved = json.loads((tmp_path / "memory_fake_gpu_141gb.json").read_text())
    assert saved["results"] == rows and saved["environment"] == env
    assert saved["command"] == "python scripts/bench_memory.py"
    lines = (tmp_path / "memory_fake_gpu_141gb.md").read_text().splitlines()
    assert "Command: `python scripts/bench_memory.py`" in lines
    header = lines.index("| model | img | attention | max batch | / naive | peak GiB | reserved GiB "
                         "| MiB / image | first OOM | tries | s |")
    assert lines[header + 2:header + 5] == [
        "| vit_base_patch16_384 | 384 | flash | 700 | 2.50x | 134.0 | 136.5 | 190 | 708 | 2 | 31 |",
        "| vit_base_patch16_384 | 384 | naive | 280 | 1.00x | 133.0 | 135.0 | 480 | 288 | 2 | 20 |",
        "| vit_base_patch16_384 | 384 | sdpa | n/a | n/a | n/a | n/a | n/a | 8 | 1 | 1 |"]
    assert "- vit_base_patch16_384 sdpa: even batch 8 does not fit" in lines
    assert "GPU memory 139.8 GiB" in lines[4] and "bisect to 8 images (cap 8192)" in lines[4]

    # with activation checkpointing: its own rows, each set against naive with it too
    ckpt = [{**row, "grad_checkpointing": True, "max_batch": row["max_batch"] and row["max_batch"] * 4}
            for row in rows[:2]]
    lines = bench.markdown(rows + ckpt, env, "python scripts/bench_memory.py", args).splitlines()
    assert lines[header + 2] == "| vit_base_patch16_384 | 384 | flash | 700 | 2.50x | 134.0 | 136.5 | 190 | 708 | 2 | 31 |"
    assert lines[header + 5:header + 7] == [
        "| vit_base_patch16_384 | 384 | flash + grad ckpt | 2800 | 2.50x | 134.0 | 136.5 | 190 | 708 | 2 | 31 |",
        "| vit_base_patch16_384 | 384 | naive + grad ckpt | 1120 | 1.00x | 133.0 | 135.0 | 480 | 288 | 2 | 20 |"]
    assert bench.parse_args([]).grad_checkpointing == ["off"]
    assert bench.parse_args(["--grad-checkpointing", "off", "on"]).grad_checkpointing == ["off", "on"]


class FakeGPU:
    """Stands in for step_fn and the CUDA memory counters: a step at `batch` images peaks at
    1 + batch / 100 GiB; batches over `oom_first` run out of memory in their first step,
    over `oom_second` in their second (when the optimizer state exists), and `broken`
    raises an error that is not out-of-memory."""

    def __init__(self, oom_first=500, oom_second=450, broken=None):
        self.oom_first, self.oom_second, self.broken = oom_first, oom_second, broken
        self.peak = 0.0
        self.held = False  # memory of a try not yet given back by free()

    def step_fn(self, model, batch, img_size, compile_mode):
        assert compile_mode is None and img_size == model.config["img_size"]
        assert not self.held, "a try started before the previous one's memory was freed"
        self.held = True
        calls = []

        def step():
            calls.append(1)
            if batch == self.broken:
                raise RuntimeError("CUDA error: an illegal memory access was encountered")
            if batch > (self.oom_first if len(calls) == 1 else self.oom_second):
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
            self.peak = max(self.peak, 1 + batch / 100)

        return step

    def install(self, bench, monkeypatch):
        monkeypatch.setattr(bench, "step_fn", self.step_fn)
        monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda: setattr(self, "peak", 0.0))
        monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda: self.peak * 2**30)
        monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda: (self.peak + 0.5) * 2**30)
        monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
        monkeypatch.setattr(torch.cuda, "empty_cache", lambda: setattr(self, "held", False))
        monkeypatch.setattr(bench.gc, "collect", lambda: 0)  # a full collection costs 0.2 s a try on CI


def test_search_case_counts_an_oom_in_the_second_step_as_not_fitting(bench, monkeypatch):
    FakeGPU().install(bench, monkeypatch)
    model = bench.build_model("vit_micro_patch4_32", num_classes=10)
    args = bench.parse_args(["--start", "32", "--granularity", "8", "--max-batch", "4096"])
    row = bench.search_case(model, "vit_micro_patch4_32", "naive", args)
    assert model.blocks[0].attn.impl == "naive"
    assert "error" not in row and not row["capped"]
    assert (row["max_batch"], row["first_oom"]) == (448, 456)  # 456 passes step 1, not step 2
    assert row["peak_gib"] == pytest.approx(5.48) and row["reserved_gib"] == pytest.approx(5.98)
    assert row["mib_per_image"] == pytest.approx(1024 / 100)
    assert [t["batch"] for t in row["tries"]][:5] == [32, 64, 128, 256, 512]
    assert all((t["peak_gib"] is None) == (not t["fits"]) for t in row["tries"])


def test_search_case_reports_an_error_that_is_not_oom(bench, monkeypatch):
    FakeGPU(broken=256).install(bench, monkeypatch)
    model = bench.build_model("vit_micro_patch4_32", num_classes=10)
    row = bench.search_case(model, "vit_micro_patch4_32", "sdpa", bench.parse_args([]))
    assert row == {"error": "RuntimeError: CUDA error: an illegal memory access was encountered"}


def test_search_case_when_the_smallest_batch_does_not_fit(bench, monkeypatch):
    FakeGPU(oom_first=4, oom_second=4).install(bench, monkeypatch)
    model = bench.build_model("vit_micro_patch4_32", num_classes=10)
    row = bench.search_case(model, "vit_micro_patch4_32", "sdpa", bench.parse_args([]))
    assert row["max_batch"] is None and row["first_oom"] == 8
    assert row["error"] == "even batch 8 does not fit"
