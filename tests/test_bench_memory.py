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
    with pytest.raises(ValueError, match="unknown model 'vit_huge'"):
        bench.parse_args(["--models", "vit_huge"])


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
