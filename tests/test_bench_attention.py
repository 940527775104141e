"""scripts/bench_attention.py's record of which flash kernels gave its timings: the candidate
the op chose at a shape (here the interpreter's fixed choice), in the JSON row and the table."""
from __future__ import annotations

import json
import sys

import pytest
import torch

from test_train import load_script
from vitflash.ops import flash_attention_qkvpacked, launch

bench = load_script("bench_attention")


def test_the_candidates_a_flash_call_ran_are_recorded():
    B, H, N, D = 2, 3, 23, 40  # a shape no other test runs: nothing chosen yet in this process
    assert bench.flash_candidates((B, H, N, D)) == {"fwd": None, "bwd": None}
    qkv = torch.randn(B, N, 3, H, D, dtype=torch.bfloat16, requires_grad=True)
    flash_attention_qkvpacked(qkv).sum().backward()
    found = bench.flash_candidates((B, H, N, D))
    assert found == {op: launch.heuristic(op, N, D).to_json() for op in ("fwd", "bwd")}
    assert launch.chosen("fwd", torch.float16, N, D, B * H) is None  # another key


def test_the_tuners_own_times_are_recorded_fastest_first(monkeypatch):
    """Beside the chosen candidates, the JSON row keeps what the tuner measured for each
    candidate (None for an op whose choice was read from the cache file)."""
    B, H, N, D = 4, 6, 577, 64
    fast, slow = launch.candidates("bwd", N, D)[:2]
    key = launch._key("bwd", torch.bfloat16, N, D, B * H)
    monkeypatch.setitem(launch._timings, key, {slow: 2.5, fast: 1.25})
    assert bench.tuning_ms((B, H, N, D)) == {
        "fwd": None, "bwd": [{"candidate": fast.to_json(), "ms": 1.25},
                             {"candidate": slow.to_json(), "ms": 2.5}]}


def test_the_table_names_each_shapes_candidates():
    fwd = launch.heuristic("fwd", 65, 64).to_json()
    bwd = launch.heuristic("bwd", 65, 64).to_json()
    row = {"shape": [256, 3, 65, 64], "flash": {"fwd_tflops": 40.0, "candidates": {"fwd": fwd, "bwd": bwd}},
           **{impl: {"error": "not selected"} for impl in bench.IMPLS if impl != "flash"}}
    env = {k: "x" for k in ("gpu", "commit", "torch", "triton", "cuda", "cudnn", "python", "date")}
    lines = bench.markdown([row], {}, env, "cmd").splitlines()
    at = lines.index("## Flash candidates (chosen by the autotuner, or read from its cache)")
    cell = bench._candidate(fwd)
    assert cell.startswith(f"{fwd['family']}: M={fwd['blocks']['BLOCK_M']} ")
    assert cell.endswith(f", {fwd['num_warps']}w {fwd['num_stages']}s")
    assert lines[at + 4] == f"| (256, 3, 65, 64) | {cell} | {bench._candidate(bwd)} |"


def test_the_nondeterministic_op_gets_its_own_columns_and_candidates():
    """`--impls ... flash_atomic`: the op with deterministic=False, its ratio to cuDNN beside
    flash's and the backward candidate it ran; without it, no such column."""
    B, H, N, D = 2, 2, 150, 32  # bf16: the dtype the benchmark records candidates for
    qkv = torch.randn(B, N, 3, H, D, dtype=torch.bfloat16, requires_grad=True)
    flash_attention_qkvpacked(qkv, deterministic=False).sum().backward()
    found = bench.flash_candidates((B, H, N, D), "bwd_atomic")
    assert found["bwd"] == launch.heuristic("bwd_atomic", N, D).to_json()
    assert found["bwd"]["family"] == "atomic"
    timings = {"fwd_tflops": 10.0, "fwd_bwd_tflops": 8.0}
    row = {"shape": [B, H, N, D], "flash": dict(timings), "sdpa_cudnn": {"fwd_tflops": 10.0, "fwd_bwd_tflops": 10.0},
           "flash_atomic": {**timings, "fwd_bwd_tflops": 12.0, "candidates": found},
           **{impl: {"error": "not selected"} for impl in ("naive", "sdpa_flash", "sdpa_efficient")}}
    env = {k: "x" for k in ("gpu", "commit", "torch", "triton", "cuda", "cudnn", "python", "date")}
    lines = bench.markdown([row], {}, env, "cmd").splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("| (B, H, N, D) | fwd / best SDPA"))
    assert lines[head].endswith("flash_atomic fwd+bwd / cuDNN | flash_atomic fwd+bwd TFLOP/s |")
    assert lines[head + 2].endswith("| 0.80x | 8 | 1% | 1.20x | 12 |")  # flash 8 / 10, atomic 12 / 10
    at = lines.index("## flash_atomic backward candidates (deterministic=False)")
    assert lines[at + 4] == f"| {tuple(row['shape'])} | {bench._candidate(found['bwd'])} |"
    del row["flash_atomic"]
    assert not any("flash_atomic" in line for line in bench.markdown([row], {}, env, "cmd").splitlines())


def test_the_table_names_its_timer():
    """`--timer graph` (CUDA-graph replays) says so in its table, and the repeat count is the
    one the run used."""
    env = {k: "x" for k in ("gpu", "commit", "torch", "triton", "cuda", "cudnn", "python", "date")}
    row = {"shape": [8, 3, 65, 64], **{impl: {"error": "not selected"} for impl in bench.IMPLS}}
    assert "`triton.testing.do_bench` (a loop of eager calls) median, each case repeated 3 times" \
        in bench.markdown([row], {}, env, "cmd")
    text = bench.markdown([row], {}, {**env, "timer": "graph", "repeats": 5}, "cmd")
    assert "`triton.testing.do_bench_cudagraph` (replays of a CUDA graph" in text
    assert "each case repeated 5 times" in text


def test_the_table_says_when_the_gluon_kernels_were_timed_too(monkeypatch):
    """A table says when flash's tuner timed the Gluon kernels too, and the staged ones
    among them, and only then. Without a Hopper GPU, --gluon and --gluon-staged are refused
    before anything runs; two of --gluon, --gluon-staged, --no-gluon is a usage error."""
    env = {k: "x" for k in ("gpu", "commit", "torch", "triton", "cuda", "cudnn", "python", "date")}
    row = {"shape": [8, 3, 577, 64], **{impl: {"error": "not selected"} for impl in bench.IMPLS}}
    note = "flash's tuner timing the Gluon kernels too (VITFLASH_GLUON=1)"
    assert note not in bench.markdown([row], {}, {**env, "gluon": False}, "cmd")
    assert note in bench.markdown([row], {}, {**env, "gluon": True}, "cmd")
    staged = "the staged ones among them (VITFLASH_GLUON=staged)"
    assert staged not in bench.markdown([row], {}, {**env, "gluon": True}, "cmd")
    assert staged in bench.markdown([row], {}, {**env, "gluon": "staged"}, "cmd")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(launch, "_GLUON", False)  # (not a Hopper)
    monkeypatch.setenv("VITFLASH_GLUON", "0")  # (restored after the script sets it to 1)
    with pytest.raises(SystemExit, match="--gluon: the Gluon kernels run only on a Hopper GPU"):
        bench.main(["--gluon", "--shape", "1,1,300,64"])
    with pytest.raises(SystemExit, match="--gluon-staged: the Gluon kernels run only on a Hopper GPU"):
        bench.main(["--gluon-staged", "--shape", "1,1,300,64"])
    for both in (["--gluon", "--no-gluon"], ["--gluon-staged", "--no-gluon"], ["--gluon", "--gluon-staged"]):
        with pytest.raises(SystemExit) as usage:  # argparse's error: not both
            bench.main([*both, "--shape", "1,1,300,64"])
        assert usage.value.code == 2, both


@pytest.mark.gpu
@pytest.mark.parametrize("impl", ["flash", "naive", "sdpa_flash"])
def test_graph_timer_times_forward_and_backward(impl):
    """The CUDA-graph timer captures each path's forward and forward+backward (the flash op's
    plan made by the first, eager call) and times them: positive, the backward adding time."""
    row = bench.bench_case(impl, (64, 3, 65, 64), torch.bfloat16, 5, 20, 2, timer="graph")
    assert "error" not in row, row
    assert 0 < row["fwd_ms"] < row["fwd_bwd_ms"]
    assert row["fwd_tflops_spread"]["n"] == 2


sweep = load_script("sweep_configs")


@pytest.mark.parametrize("op", ["fwd", "bwd"])
@pytest.mark.parametrize("D", [64, 96, 128])
def test_the_sweep_grid_holds_the_listed_candidates_and_more(op, D):
    found = sweep.grid(op, D)
    listed = [c for c in launch.candidates(op, 4096, D) if c.family == "general"]
    assert found[:len(listed)] == listed and len(set(found)) == len(found) > len(listed)
    assert all(c.family == "general" for c in found)
    names = ("BLOCK_M", "BLOCK_N") if op == "fwd" else ("BLOCK_M1", "BLOCK_N1", "BLOCK_M2", "BLOCK_N2")
    # (the listed backward's split twins carry SPLIT = 1 beside their tiles)
    assert all(tuple(k for k in dict(c.blocks) if k != "SPLIT") == names for c in found)


def test_the_sweep_table_ranks_configs_against_cudnn():
    env = {k: "x" for k in ("gpu", "commit", "torch", "triton", "cuda", "cudnn", "date")}
    fast, slow, bad = sweep.grid("bwd", 64)[:3]
    cell = lambda m: {"median": m, "min": m - 1, "max": m + 1, "n": 3}  # noqa: E731
    row = {"shape": [8, 12, 4097, 64], "cudnn": cell(400.0), "cudnn_tuner_timer": cell(500.0), "configs": [
        {"candidate": slow.to_json(), "listed": True, "error": None, "tflops": cell(300.0),
         "tflops_tuner_timer": cell(550.0)},
        {"candidate": fast.to_json(), "listed": False, "error": None, "tflops": cell(440.0),
         "tflops_tuner_timer": cell(450.0)},
        {"candidate": bad.to_json(), "listed": True, "error": "o: max error 1 > 0.1"}]}
    lines = sweep.markdown("bwd", [row], {**env, "repeats": 3}, "cmd").splitlines()
    assert "## (8, 12, 4097, 64): cuDNN 400 (399-401) TFLOP/s; 500 by the tuner's timer" in lines
    at = lines.index("| configuration | listed | TFLOP/s | / cuDNN | tuner's timer TFLOP/s | / cuDNN |")
    assert lines[at + 2] == f"| {fast.label()} |  | 440 (439-441) | 1.10x | 450 | 0.90x |"
    assert lines[at + 3] == f"| {slow.label()} | yes | 300 (299-301) | 0.75x | 550 | 1.10x |"
    # the two timers disagree on the fastest: the table says by how much that costs
    assert lines[at + 5] == (f"The fastest by this table's timer: {fast.label()}; by the tuner's: "
                             f"{slow.label()}, 0.682x the first's TFLOP/s by this table's timer.")
    assert lines[at + 7] == f"Not timed: {bad.label()}: o: max error 1 > 0.1"
    # a result saved before the tuner's timer was added renders without its columns' values
    old = {k: v for k, v in row.items() if k != "cudnn_tuner_timer"}
    old["configs"] = [{k: v for k, v in e.items() if k != "tflops_tuner_timer"} for e in row["configs"]]
    assert f"| {fast.label()} |  | 440 (439-441) | 1.10x | n/a | n/a |" in sweep.markdown(
        "bwd", [old], {**env, "repeats": 3}, "cmd").splitlines()


def test_the_sweep_refuses_a_malformed_shape():
    assert sweep.parse_shape("8,12,4097,64") == (8, 12, 4097, 64)
    for text in ("8,12,4097", "8,12,x,64", "0,12,197,64"):
        with pytest.raises(Exception, match="four positive integers"):
            sweep.parse_shape(text)


def test_bench_attention_takes_shapes_of_its_own(monkeypatch, capsys):
    """--shape B,H,N,D ... times those shapes instead of a --shapes set; a malformed one is
    refused by the argument parser, naming the form."""
    with pytest.raises(SystemExit):
        bench.main(["--shape", "32,16,577"])
    assert "a shape is B,H,N,D, four positive integers" in capsys.readouterr().err
    seen = []

    def first_case(impl, *shape):  # the first case the benchmark builds: stop there
        seen.append(shape)
        raise RuntimeError("stop")

    monkeypatch.setattr(bench.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(bench, "make_case", first_case)
    with pytest.raises(RuntimeError, match="stop"):
        bench.main(["--shape", "32,16,577,80", "64,16,257,80", "--first-call-only"])
    assert seen == [(32, 16, 577, 80, bench.torch.bfloat16)]


def test_the_sweep_takes_named_configurations():
    """--configs FAMILY:TILES[,NAME=VALUE...]:WARPS:STAGES[:MAXNREG] names the candidates to sweep,
    tiles in the op's block order, extra blocks and a register cap kept; a malformed one is
    refused with the form and an example, naming the families of the op."""
    c = sweep.parse_config("fwd", "general_tma:128,64,TAIL_AHEAD=1:8:2:128")
    assert c == launch.Candidate("general_tma", (("BLOCK_M", 128), ("BLOCK_N", 64), ("TAIL_AHEAD", 1)), 8, 2, 128)
    assert c.label() == "general_tma: M=128 N=64 TAIL_AHEAD=1, 8w 2s cap 128"
    b = sweep.parse_config("bwd", "general:32,128,128,64,SPLIT=1:4:3")
    assert b.meta == dict(BLOCK_M1=32, BLOCK_N1=128, BLOCK_M2=128, BLOCK_N2=64, SPLIT=1)
    assert (b.num_warps, b.num_stages, b.maxnreg) == (4, 3, 0)
    assert sweep.parse_config("bwd_atomic", "atomic_tma:32,128:4:3").family == "atomic_tma"
    bad = ["general:128:8:2", "general:128,64:8", "general:128,64:8:2:128:9", "general:128,x:8:2",
           "general:128,64,TAIL_AHEAD:8:2", "short:128,64:4:1", "atomic:32,128:4:3"]
    for text in bad:
        with pytest.raises(SystemExit, match="expected FAMILY:BLOCK_M,BLOCK_N.*one of general, general_tma"):
            sweep.parse_config("fwd", text)
    with pytest.raises(SystemExit, match="BLOCK_M1,BLOCK_N1,BLOCK_M2,BLOCK_N2"):
        sweep.parse_config("bwd", "general:32,128:4:3")


@pytest.mark.parametrize("tma", [False, True])
def test_the_sweep_grid_of_the_atomic_backward(monkeypatch, tma):
    """--op bwd_atomic sweeps the backwards that add into dQ: element-wise ("atomic") and, where
    TMA reductions exist, by tile ("atomic_tma"), each over the same tiles, warps and stages,
    and the table tells the two apart."""
    monkeypatch.setattr(launch, "_TMA", tma)
    found = sweep.grid("bwd_atomic", 64)
    families = {c.family for c in found}
    assert families == ({"atomic", "atomic_tma"} if tma else {"atomic"})
    listed = [c for c in launch.candidates("bwd_atomic", 4096, 64) if c.family in families]
    assert found[:len(listed)] == listed and len(set(found)) == len(found)
    per_family = {f: {(c.blocks, c.num_warps, c.num_stages) for c in found if c.family == f} for f in families}
    assert len({frozenset(v) for v in per_family.values()}) == 1  # the same grid for each
    assert found[0].label().startswith("atomic: M=")


@pytest.mark.parametrize("op", ["fwd", "bwd"])
@pytest.mark.parametrize("tma", [False, True])
def test_the_sweep_grid_of_tma_loads(monkeypatch, op, tma):
    """--op fwd / bwd sweep each configuration with pointer loads ("general") and, where TMA
    exists, as its TMA-load twin ("general_tma"): one grid for both families, beside the
    listed split pairs, which exist with TMA loads only (launch.split_pairs)."""
    monkeypatch.setattr(launch, "_TMA_LOADS", tma)
    found = sweep.grid(op, 64)
    families = {c.family for c in found}
    assert families == ({"general", "general_tma"} if tma else {"general"})
    assert len(set(found)) == len(found)
    pairs = [c for c in found if c in launch.split_pairs(64)]
    assert len(pairs) == (3 if op == "bwd" and tma else 0)
    per_family = {f: {(c.blocks, c.num_warps, c.num_stages) for c in found if c.family == f
                      and c not in pairs} for f in families}
    assert len({frozenset(v) for v in per_family.values()}) == 1
    assert any(c.label().startswith("general_tma: ") for c in found) is tma


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["fwd", "bwd", "bwd_atomic"])
def test_the_sweep_checks_and_times_configs_on_the_gpu(op):
    """A short sweep at a small shape: cuDNN timed, each configuration it reached within the
    FA2 rule and timed, or named as not fitting the chip; the grid cut by its time budget."""
    import time

    row = sweep.sweep_shape(op, (4, 2, 197, 64), 1, time.monotonic() + 20)
    assert row["cudnn"]["median"] > 0 and row["configs"]
    for entry in row["configs"]:
        assert "tflops" in entry or entry["error"].startswith(("OutOfResources", "CompilationError")), entry
    assert any(entry["listed"] and "tflops" in entry for entry in row["configs"])
    assert all("tflops_tuner_timer" in entry for entry in row["configs"] if "tflops" in entry)


@pytest.mark.gpu
def test_the_sweep_of_the_listed_candidates_by_the_graph_timer():
    """--listed --timer graph: exactly the autotuner's candidates at the shape, in its order,
    each timed by the CUDA-graph timer and by the tuner's own."""
    import time

    shape = (4, 2, 577, 64)
    row = sweep.sweep_shape("fwd", shape, 1, time.monotonic() + 600, timer="graph", listed_only=True)
    listed = launch.candidates("fwd", 577, 64, 8)
    assert [launch.Candidate.from_json(e["candidate"]) for e in row["configs"]] == listed
    timed = [e for e in row["configs"] if "tflops" in e]
    assert timed and all(e["listed"] and e["tflops_tuner_timer"]["median"] > 0 for e in timed)
    assert row["cudnn_tuner_timer"]["median"] > 0


def test_the_sweep_saves_each_configuration_as_it_goes(monkeypatch):
    """sweep_shape hands its row to `save` after cuDNN's times and after every configuration,
    marked unfinished until the last one has run, so that a run killed by a time limit leaves
    files that hold what it measured and say that it stopped; a time budget's stop stays
    marked as such. (Run on the CPU: the GPU work is stood in for.)"""
    ms = {"median": 1.0, "min": 1.0, "max": 1.0, "n": 1}
    monkeypatch.setattr(sweep, "_cudnn_times", lambda *a: {"cudnn": ms, "cudnn_tuner_timer": ms})
    monkeypatch.setattr(sweep, "_flash_inputs", lambda shape: (torch.zeros(1), torch.zeros(1)))
    monkeypatch.setattr(sweep, "flash_attention_qkvpacked", lambda qkv, deterministic: qkv)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(sweep, "within_rule", lambda *a: None)
    monkeypatch.setattr(sweep, "time_case", lambda *a: [0.5])
    monkeypatch.setattr(sweep, "tuner_case", lambda *a: [0.5])
    named = [sweep.parse_config("fwd", "general:64,64:4:3"), sweep.parse_config("fwd", "general:128,32:4:3")]
    saved = []
    save = lambda row: saved.append((len(row["configs"]), row.get("stopped")))  # noqa: E731
    row = sweep.sweep_shape("fwd", (1, 1, 65, 64), 1, float("inf"), configs=named, save=save)
    assert saved == [(0, sweep.UNFINISHED), (1, sweep.UNFINISHED), (2, sweep.UNFINISHED), (2, None)]
    assert "stopped" not in row and all(e["tflops"]["median"] > 0 for e in row["configs"])
    env = {k: "x" for k in ("gpu", "commit", "torch", "triton", "cuda", "cudnn", "date")}
    partial_row = {**row, "configs": row["configs"][:1], "stopped": sweep.UNFINISHED}
    assert f"Stopped early ({sweep.UNFINISHED})" in sweep.markdown("fwd", [partial_row], {**env, "repeats": 1}, "cmd")
    saved.clear()
    row = sweep.sweep_shape("fwd", (1, 1, 65, 64), 1, 0.0, configs=named, save=save)
    assert saved == [(0, sweep.UNFINISHED), (0, "time budget")] and row["stopped"] == "time budget"


def test_the_sweep_files_hold_a_shape_in_progress(monkeypatch, tmp_path):
    """The command's result files as a run killed in its second shape leaves them: the first
    shape whole, the second marked unfinished with what it had measured. (Run on the CPU: the
    shapes' GPU work is stood in for.)"""
    ms = {"median": 1.0, "min": 1.0, "max": 1.0, "n": 1}

    def shape_row(op, shape, repeats, deadline, timer, listed, configs, save):
        row = {"shape": list(shape), "cudnn": ms, "cudnn_tuner_timer": ms, "configs": [],
               "stopped": sweep.UNFINISHED}
        save(row)
        if shape[0] == 2:  # killed here
            raise KeyboardInterrupt
        del row["stopped"]
        save(row)
        return row

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(sweep, "environment", lambda: {k: "x" for k in ("gpu", "commit", "torch", "triton",
                                                                         "cuda", "cudnn", "date")})
    monkeypatch.setattr(sweep, "sweep_shape", shape_row)
    monkeypatch.setattr(sys, "argv", ["sweep_configs.py", "--op", "fwd", "--shapes", "1,1,65,64", "2,1,65,64",
                                      "--out", str(tmp_path)])
    with pytest.raises(KeyboardInterrupt):
        sweep.main()
    saved = json.loads((tmp_path / "sweep_fwd_x.json").read_text())
    assert [(r["shape"][0], r.get("stopped")) for r in saved["results"]] == [(1, None), (2, sweep.UNFINISHED)]
    assert f"Stopped early ({sweep.UNFINISHED})" in (tmp_path / "sweep_fwd_x.md").read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sweep_fwd_x.json", "sweep_fwd_x.md"]


@pytest.mark.gpu
def test_the_sweep_of_named_configurations_runs_those_alone():
    """--configs: exactly the named candidates, in their order, a register-capped one included,
    each checked under the FA2 rule and timed."""
    import time

    named = [sweep.parse_config("fwd", "general:64,64:4:3"), sweep.parse_config("fwd", "general:128,32:4:3:128")]
    row = sweep.sweep_shape("fwd", (4, 2, 197, 64), 1, time.monotonic() + 600, configs=named)
    assert [launch.Candidate.from_json(e["candidate"]) for e in row["configs"]] == named
    assert all(e["error"] is None and e["tflops"]["median"] > 0 for e in row["configs"])


def test_the_one_call_table_sets_flash_and_the_floor_against_sdpa():
    """The synchronized one-call latency: flash and the floor (one elementwise op through the
    same autograd, no attention) each as a ratio of SDPA's; a file from before the floor was
    measured gives the flash ratio alone."""
    env = {k: "x" for k in ("gpu", "commit", "torch", "triton", "cuda", "cudnn", "python", "date")}
    row = {"shape": [8, 3, 65, 64], **{impl: {"error": "not selected"} for impl in bench.IMPLS}}
    spread = lambda us: {"median": us, "min": us - 10, "max": us + 10, "n": 3}  # noqa: E731
    latency = {"shape": [1, 3, 65, 64], "flash": spread(150.0), "naive": spread(600.0),
               "sdpa": spread(200.0), "floor": spread(130.0)}
    lines = bench.markdown([row], latency, env, "cmd").splitlines()
    at = lines.index("## One call at (1, 3, 65, 64), forward+backward, synchronized (us)")
    assert lines[at + 2] == "| flash | naive | sdpa | floor | flash / sdpa | floor / sdpa |"
    assert lines[at + 4] == "| 150 (140-160) | 600 (590-610) | 200 (190-210) | 130 (120-140) | 0.75x | 0.65x |"
    del latency["floor"]
    lines = bench.markdown([row], latency, env, "cmd").splitlines()
    assert lines[at + 2] == "| flash | naive | sdpa | flash / sdpa |"
    assert lines[at + 4] == "| 150 (140-160) | 600 (590-610) | 200 (190-210) | 0.75x |"
    assert not any(line.startswith(("The same call", "Flash's kernels there")) for line in lines)


def test_the_one_call_table_splits_off_the_gpu_time_and_names_the_kernels():
    """Beside the one call's wall time, its GPU time under the run's timer (the graph timer's
    is the GPU's part alone) and the flash kernels that ran it."""
    env = {k: "x" for k in ("gpu", "commit", "torch", "triton", "cuda", "cudnn", "python", "date")}
    env["timer"] = "graph"
    row = {"shape": [8, 3, 65, 64], **{impl: {"error": "not selected"} for impl in bench.IMPLS}}
    found = {op: launch.heuristic(op, 65, 64).to_json() for op in ("fwd", "bwd")}
    latency = {"shape": [1, 3, 65, 64], "flash_candidates": found,
               **{impl: {"median": us, "min": us, "max": us, "n": 3, "gpu_us": us / 10}
                  for impl, us in (("flash", 150.0), ("naive", 600.0), ("sdpa", 200.0), ("floor", 130.0))}}
    lines = bench.markdown([row], latency, env, "cmd").splitlines()
    at = lines.index("## One call at (1, 3, 65, 64), forward+backward, synchronized (us)")
    assert lines[at + 6] == (f"The same call timed by {bench.TIMERS['graph']}, us: flash 15.0, naive 60.0, "
                             "sdpa 20.0, floor 13.0.")
    assert lines[at + 8] == (f"Flash's kernels there: forward {bench._candidate(found['fwd'])}; backward "
                             f"{bench._candidate(found['bwd'])}.")


def _tuned(blocks: dict, warps: int = 4, stages: int = 3) -> launch.Candidate:
    return launch.Candidate("general_tma", tuple(blocks.items()), warps, stages)


ONE = _tuned(dict(BLOCK_M1=32, BLOCK_N1=128, BLOCK_M2=128, BLOCK_N2=32))
TWIN = _tuned(dict(ONE.blocks, SPLIT=1))
PAIR = _tuned(dict(BLOCK_M1=32, BLOCK_N1=128, BLOCK_M2=64, BLOCK_N2=64, SPLIT=1))
PAIR_8W = _tuned(dict(BLOCK_M1=32, BLOCK_N1=128, BLOCK_M2=128, BLOCK_N2=32, SPLIT=1, WARPS2=8, STAGES2=3))
OTHER_ONE = _tuned(dict(BLOCK_M1=64, BLOCK_N1=64, BLOCK_M2=64, BLOCK_N2=64))


def test_a_backward_candidate_names_its_launch_form_and_its_label():
    assert [c.form for c in (ONE, TWIN, PAIR, PAIR_8W)] == ["one launch", "split twin", "split pair", "split pair"]
    assert launch.split_twins([ONE]) == [TWIN]
    assert launch.Candidate("short", (("BLOCK_M", 64),), 4, 1).form == "short"
    assert PAIR_8W.label() == "general_tma: M1=32 N1=128 M2=128 N2=32 SPLIT=1 WARPS2=8 STAGES2=3, 4w 3s"
    assert launch.Candidate("general", (("BLOCK_M", 64), ("BLOCK_N", 32)), 8, 2).label() == "M=64 N=32, 8w 2s"


def _forms_row(times: dict) -> dict:
    tuning = [{"candidate": c.to_json(), "ms": ms} for c, ms in sorted(times.items(), key=lambda kv: kv[1])]
    return {"shape": [8, 12, 4097, 64], "flash": {"fwd_tflops": 1.0, "tuning_ms": {"fwd": None, "bwd": tuning}},
            **{impl: {"error": "not selected"} for impl in bench.IMPLS if impl != "flash"}}


def test_the_tuners_backward_timings_are_summed_up_by_launch_form():
    """The table's ratios come from the tuner's own timings: pair / twin, the best split
    against the best one launch, and the best twin against its own one-launch form (not the
    fastest one launch)."""
    row = _forms_row({OTHER_ONE: 2.0, ONE: 2.5, TWIN: 2.25, PAIR: 1.8, PAIR_8W: 1.9})
    best = bench.backward_forms(row["flash"]["tuning_ms"]["bwd"])
    assert best["fastest"] == (PAIR, 1.8) and best["one launch"] == (OTHER_ONE, 2.0)
    assert best[bench.TWIN_PARENT] == (ONE, 2.5) and best["split twin"] == (TWIN, 2.25)
    env = {k: "x" for k in ("gpu", "commit", "torch", "triton", "cuda", "cudnn", "python", "date")}
    lines = bench.markdown([row], {}, env, "cmd").splitlines()
    at = lines.index("## The autotuner's backward timings, the fastest of each launch form")
    assert lines[at + 6] == ("| (8, 12, 4097, 64) | 2.0000 | 2.2500 | 1.8000 | 0.800 | 0.900 | 0.900 | "
                             f"split pair: {PAIR.label()} |")
    # no split candidate timed (e.g. a GPU without TMA): the ratios say n/a
    lines = bench.markdown([_forms_row({ONE: 2.5, OTHER_ONE: 2.0})], {}, env, "cmd").splitlines()
    assert lines[lines.index("## The autotuner's backward timings, the fastest of each launch form") + 6] == (
        f"| (8, 12, 4097, 64) | 2.0000 | n/a | n/a | n/a | n/a | n/a | one launch: {OTHER_ONE.label()} |")


def test_the_tuners_finalists_are_tabled_and_the_graph_fastest_is_its_choice():
    """Where the tuner timed finalists in CUDA-graph replays ("graph_ms"), its choice is the
    fastest of them (not the fastest in its short windows): the finalists' table marks it,
    the launch-form table names it; a run without graph timings has no finalists' table."""
    row = _forms_row({PAIR: 1.8, PAIR_8W: 1.85, ONE: 2.5})
    tuning = row["flash"]["tuning_ms"]["bwd"]
    tuning[0]["graph_ms"], tuning[1]["graph_ms"] = 2.0, 1.9
    assert bench.tuner_choice(tuning) is tuning[1]
    assert bench.tuner_choice([dict(e) for e in tuning if "graph_ms" not in e]) == tuning[2]
    assert bench.backward_forms(tuning)["fastest"] == (PAIR_8W, 1.85)
    env = {k: "x" for k in ("gpu", "commit", "torch", "triton", "cuda", "cudnn", "python", "date")}
    lines = bench.markdown([row], {}, env, "cmd").splitlines()
    at = lines.index("## The autotuner's finalists")
    assert lines[at + 4:at + 8] == [
        "| (B, H, N, D) | op | finalist | windows ms | graph ms | graph / windows' first | |",
        "|---|---|---|---|---|---|---|",
        f"| (8, 12, 4097, 64) | bwd | {PAIR.label()} | 1.8000 | 2.0000 | 1.000 |  |",
        f"| (8, 12, 4097, 64) | bwd | {PAIR_8W.label()} | 1.8500 | 1.9000 | 0.950 | kept |"]
    at = lines.index("## The autotuner's backward timings, the fastest of each launch form")
    assert lines[at + 6].endswith(f"| split pair: {PAIR_8W.label()} |")
    plain = bench.markdown([_forms_row({ONE: 2.0, OTHER_ONE: 2.5})], {}, env, "cmd")
    assert "finalists" not in plain


def test_the_pipe_twins_timings_are_set_against_their_twins():
    """gpu_session_60f6e25's table: per op, the fastest PIPE candidate against the fastest
    without, and each PIPE candidate against its own twin (the same blocks without PIPE);
    a PIPE candidate whose twin was not timed is left out of the range; no section where
    no PIPE candidate was timed."""
    piped = _tuned(dict(ONE.blocks, PIPE=1))
    piped_other = _tuned(dict(OTHER_ONE.blocks, PIPE=1))
    lonely = _tuned(dict(BLOCK_M1=16, BLOCK_N1=64, BLOCK_M2=64, BLOCK_N2=16, PIPE=1))
    row = _forms_row({ONE: 2.0, piped: 3.0, OTHER_ONE: 2.5, piped_other: 2.25, lonely: 1.5})
    env = {k: "x" for k in ("gpu", "commit", "torch", "triton", "cuda", "cudnn", "python", "date")}
    lines = bench.markdown([row], {}, env, "cmd").splitlines()
    at = lines.index("## The autotuner's timings of the PIPE twins")
    assert lines[at + 6] == ("| (8, 12, 4097, 64) | bwd | 1.5000 | 2.0000 | 0.750 | 2: 0.900-1.500 "
                             f"(median 1.200) | {lonely.label()} |")
    assert lines[at + 7] == ""
    plain = bench.markdown([_forms_row({ONE: 2.0, OTHER_ONE: 2.5})], {}, env, "cmd")
    assert "PIPE" not in plain


def test_render_prints_a_result_files_tables_without_a_gpu(tmp_path, capsys):
    row = _forms_row({ONE: 2.5, TWIN: 2.25})
    env = {k: "x" for k in ("gpu", "commit", "torch", "triton", "cuda", "cudnn", "python", "date")}
    path = tmp_path / "attention_graph_h200.json"
    path.write_text(json.dumps({"command": "the run's command", "environment": env,
                                "results": {"latency": {}, "shapes": [row]}}))
    bench.main(["--render", str(path)])
    out = capsys.readouterr().out
    assert "Command: `the run's command`" in out
    assert "| (8, 12, 4097, 64) | 2.5000 | 2.2500 | n/a | n/a | 0.900 | 0.900 |" in out
    path.write_text("{}")
    with pytest.raises(SystemExit, match="not a result file"):
        bench.main(["--render", str(path)])
