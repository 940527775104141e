"""The probes under benchmarks/probes still run: the warp-specialization probe's kernel against
a float32 reference on a tiny case, the register probe as its command (the GPU runs that
produced their committed logs are not repeated here)."""
from __future__ import annotations

import importlib.util
import json
import re
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from vitflash.ops import launch

PROBES = Path(__file__).resolve().parents[1] / "benchmarks" / "probes"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"vitflash_probe_{name}", PROBES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("ws", [False, True])
def test_warp_specialize_probe_forward_matches_sdpa(ws):
    """The probe's TMA forward, with and without warp specialization, at a length that ends in
    a partial tile (70 = 4 * 16 + 6), against float32 SDPA: what the probe prints as `err`."""
    probe = _load("warp_specialize")
    torch.manual_seed(0)
    qkv = torch.randn(1, 70, 3, 2, 32, dtype=torch.float16)
    launch, o = probe.run(qkv, 16, 16, 4, 1, ws)
    launch()
    q, k, v = (qkv[:, :, i].transpose(1, 2).float() for i in range(3))
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    assert (o.float() - ref).abs().max().item() < 2e-3


@pytest.mark.parametrize("ws", [False, True])
def test_warp_specialize_probe_dkdv_matches_the_float32_reference(ws):
    """The probe's dK/dV program, with and without warp specialization, at a length that ends
    in a partial tile (70 = 4 * 16 + 6), given the reference's LSE and delta: its dK and dV
    against the float32 ones, what `--op bwd` prints as `err`."""
    probe = _load("warp_specialize")
    torch.manual_seed(0)
    qkv = torch.randn(1, 70, 3, 2, 32, dtype=torch.float16)
    do = torch.randn(1, 70, 2, 32, dtype=torch.float16)
    lse, delta, (dk_ref, dv_ref) = probe.bwd_inputs(qkv, do)
    launch, (dk, dv) = probe.run_bwd(qkv, do, lse, delta, 16, 16, 4, 1, ws)
    launch()
    assert dk_ref.abs().max() > 0.1 and dv_ref.abs().max() > 0.1
    assert (dk.float() - dk_ref).abs().max().item() < 4e-3
    assert (dv.float() - dv_ref).abs().max().item() < 4e-3


def test_registers_probe_reports_what_ptxas_allocated():
    """The register probe, run as its command in a process of its own (the kernels must be
    compiled, not interpreted), compiles the short backward's register-capped twin at N = 65,
    D = 64 (32-row chunks, 4 warps, KEY_PER_CHUNK) for sm_90 and reads ptxas's report: under
    a cap of 168 registers a thread it gets at most 168, so three 4-warp programs fit an SM
    by registers; uncapped it gets more and two fit (the H200's driver reported 248 for that
    binary, benchmarks/results/gpu_session_d2d37d3/run1/)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, str(PROBES / "registers.py"), "--op", "bwd", "--d", "64",
                          "--n", "65", "--tiles", "32x4", "--one-key", "--key-per-chunk", "--maxnreg", "0,168"],
                         capture_output=True, text=True, env=env, check=True).stdout
    rows = [line.strip("|").split("|") for line in out.splitlines() if line.startswith("| 65 ")]
    (free, capped) = [dict(cap=r[4].strip(), registers=int(r[5]), smem=float(r[7]), programs=int(r[8]))
                      for r in rows]
    assert (free["cap"], capped["cap"]) == ("-", "168")
    assert capped["registers"] <= 168 and capped["programs"] == 3
    assert free["registers"] > 168 and free["programs"] == 2
    assert capped["smem"] == free["smem"] > 0


def test_registers_probe_compiles_pointers_aligned_as_the_jit_does():
    """Without the pointer parameters' 16-byte alignment (what the JIT specializes on for
    every aligned tensor) the compiler loads element by element through a pointer each: the
    same short forward takes more registers and instructions. The probe compiles aligned by
    default, and --unaligned shows the difference (its tables before 2026-12-02 were
    unaligned: benchmarks/results/registers_sm90_aligned.md)."""
    aligned, unaligned = _probe_row("fwd", "64x4"), _probe_row("fwd", "64x4", "--unaligned")
    assert unaligned["registers"] > aligned["registers"] > 0
    assert unaligned["instructions"] > aligned["instructions"]


def _probe_row(op: str, tile: str, *flags: str) -> dict:
    """The register probe at N = 65, D = 64 for one tile, run as its command in a process of
    its own (compiled, not interpreted): its row as registers, spill bytes, shared KiB,
    programs per SM, SASS instructions and how many of those are asynchronous copies."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, str(PROBES / "registers.py"), "--op", op, "--d", "64", "--n", "65",
                          "--tiles", tile, *flags], capture_output=True, text=True, env=env, check=True).stdout
    (row,) = [line.strip("|").split("|") for line in out.splitlines() if line.startswith("| 65 ")]
    return dict(stages=int(row[3]), registers=int(row[5]), spills=int(row[6]), smem=float(row[7]),
                programs=int(row[8]), instructions=int(row[9]), async_copies=int(row[10]))


def test_registers_probe_compiles_the_short_backward_pipelined_on_request():
    """A tile's "sN" compiles the short kernel with N software-pipeline stages: the backward's
    loop over query chunks then issues loads ahead, as asynchronous copies into shared memory
    (LDGSTS in the SASS), which the listed one-stage kernel has none of. At
    16-row chunks in 4 warps (N = 65, one-key tail, triton 3.8 here) the two stages take more
    registers and shared memory (benchmarks/results/registers_sm90_short_bwd_stages.md)."""
    one = _probe_row("bwd", "16x4", "--one-key")
    two = _probe_row("bwd", "16x4s2", "--one-key")
    assert (one["stages"], two["stages"]) == (1, 2)
    assert one["async_copies"] == 0 < two["async_copies"]
    assert two["smem"] > one["smem"] and two["registers"] >= one["registers"]


def test_short_bwd_probe_reads_stages_from_its_configs():
    """The short-backward probe's configurations: BLOCK_M x warps, an optional register cap
    and an optional number of pipeline stages (1 where not given, as every listed candidate);
    a malformed one stops it with the form named."""
    probe = _load("short_bwd")
    assert probe.parse_config("16x4") == (16, 4, 0, 1)
    assert probe.parse_config("16x4x168s2") == (16, 4, 168, 2)
    assert probe.parse_config("32x4s3") == (32, 4, 0, 3)
    for bad in ("16", "16x4x168x2", "16x4s0", "16x4sx"):
        with pytest.raises(SystemExit, match="BLOCK_MxWARPS"):
            probe.parse_config(bad)


def test_registers_probe_refuses_a_malformed_tile():
    """A tile that is not BLOCK_MxWARPS[sSTAGES] stops the probe with a message naming the form."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, str(PROBES / "registers.py"), "--op", "bwd", "--tiles", "16x4s0"],
                         capture_output=True, text=True, env=env)
    assert run.returncode != 0 and "BLOCK_MxWARPS[sSTAGES]" in run.stderr


def test_registers_probe_traces_dropout_in_on_request():
    """--dropout compiles the short kernels with the dropout mask's code (DROPOUT traced in):
    the forward's TMA twin at 32 rows is longer with it, and its 16-bit halves compared as
    integers still leave it under 128 registers, 5 programs an SM or more (triton 3.8 here,
    pointers aligned: 2240 against 1440 instructions, 80 registers;
    benchmarks/results/registers_sm90_aligned.md)."""
    plain = _probe_row("fwd", "32x4", "--tma", "--one-key")
    dropout = _probe_row("fwd", "32x4", "--tma", "--one-key", "--dropout")
    assert dropout["instructions"] > plain["instructions"] > 0
    assert dropout["registers"] <= 128 and dropout["programs"] >= 5


def test_registers_probe_short_tma_twin_loads_by_the_copy_engine():
    """The short forward's TMA twin, compiled for sm_90 by the register probe, at the 64-row,
    4-warp tile: no spills, at most 128 registers a thread and at least 4 programs an SM,
    as the pointer-load kernel with aligned pointers (which of the two is faster is the
    tuner's to time)."""
    pointer, tma = _probe_row("fwd", "64x4"), _probe_row("fwd", "64x4", "--tma")
    for row in (pointer, tma):
        assert row["registers"] <= 128 and row["spills"] == 0 and row["programs"] >= 4


def test_registers_probe_one_key_twin_takes_fewer_registers():
    """The short backward's one-key-tail twin at N = 65 (64 + 1), compiled for sm_90 by the
    register probe: the key past the tile as vectors instead of a 16-key tile of products
    leaves smaller tiles live across the query chunks, so at the 16-row chunks in 4 warps
    (the tile of the register-capped twin, launch.SHORT_BWD_CAPPED) it takes fewer registers
    and less shared memory than the 16-key tail, neither spilling (triton 3.8 here: 203
    against 246 registers, 28 against 38 KiB); in its KEY_PER_CHUNK form fewer still (174),
    and under the cap of 168 it spills at most a few words (8 bytes here) for 3 programs an
    SM (benchmarks/results/registers_sm90_aligned.md, its last section)."""
    tile, twin = _probe_row("bwd", "16x4"), _probe_row("bwd", "16x4", "--one-key")
    assert twin["registers"] < tile["registers"] and twin["spills"] == tile["spills"] == 0
    assert 0 < twin["smem"] < tile["smem"]
    per_chunk = _probe_row("bwd", "16x4", "--one-key", "--key-per-chunk")
    assert per_chunk["registers"] < twin["registers"] and per_chunk["spills"] == 0
    capped = _probe_row("bwd", "16x4", "--one-key", "--key-per-chunk", "--maxnreg", "168")
    assert capped["registers"] <= 168 and capped["spills"] <= 32 and capped["programs"] == 3


def _table(out: str) -> list[dict]:
    """The rows of the general tables of the register probe's output, by column: registers,
    spills, programs (ints), launch and cap (text)."""
    lines = [line.strip().strip("|").split("|") for line in out.splitlines() if line.startswith("|")]
    header = [h.strip() for h in lines[0]]
    names = {"registers": "registers", "spill bytes": "spills", "programs / SM": "programs", "launch": "launch",
             "cap": "cap"}
    return [{names[h]: (int(v) if names[h] in ("registers", "spills", "programs") else v.strip())
             for h, v in zip(header, row) if h in names} for row in lines[2:]]


def test_registers_probe_split_backward_frees_the_dq_launch():
    """The premise of the backward's split twins (launch.split_twins): compiled for sm_90 as
    its own launch, the dQ part of the TMA (32, 128) tile at D = 64 takes fewer registers than
    the one launch of both parts, spills nothing and fits more programs an SM; the dK/dV
    part keeps the one launch's registers (triton 3.8: 154 registers, against 255;
    benchmarks/results/registers_sm90_aligned.md). Under a cap of 168 (--maxnreg) the dK/dV
    part fits a third program an SM (for spills: benchmarks/results/registers_sm90_capped_bwd.md;
    on the H200 that made it 1.9-2.2x slower, benchmarks/results/gpu_session_b8506ec/)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, str(PROBES / "registers.py"), "--op", "bwd_general", "--d", "64",
                          "--configs", "32x128x4x3", "--tma", "--maxnreg", "0,168"], capture_output=True,
                         text=True, env=env, check=True).stdout
    rows = {(r["launch"], r["cap"]): r for r in _table(out)}
    one, dkdv, dq = rows["one (PART 0)", "-"], rows["dK/dV (PART 1)", "-"], rows["dQ (PART 2)", "-"]
    assert dq["spills"] == 0 and dq["registers"] < one["registers"] and dq["programs"] > one["programs"]
    assert dkdv["registers"] == one["registers"]
    capped = rows["dK/dV (PART 1)", "168"]
    assert capped["registers"] <= 168 and capped["programs"] == dkdv["programs"] + 1


def test_registers_probe_general_forward_by_tma_takes_fewer_registers():
    """--op fwd_general: the general forward at a listed tile, (64, 64) in 4 warps and 3
    stages at D = 64, compiled for sm_90 with aligned pointers: neither load family spills,
    and the TMA twin takes fewer registers than the pointer loads (triton 3.8 here: 108
    against 136; benchmarks/results/registers_sm90_aligned.md)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    rows = []
    for flags in ([], ["--tma"]):
        out = subprocess.run([sys.executable, str(PROBES / "registers.py"), "--op", "fwd_general", "--d", "64",
                              "--configs", "64x64x4x3", *flags], capture_output=True, text=True, env=env,
                             check=True).stdout
        (row,) = _table(out)
        rows.append(row)
    pointer, tma = rows
    assert pointer["spills"] == tma["spills"] == 0
    assert 0 < tma["registers"] < pointer["registers"]


def test_op_dispatch_probe_times_each_way_of_calling_the_ops():
    """The dispatch probe, as its command in a process of its own (it stubs out the launches
    and registers custom_op twins): a row for each op called directly, through the Library
    op and through custom_op, each with a median inside its min-max. Which way is faster is
    for its committed output to say, not for a test."""
    out = subprocess.run([sys.executable, str(PROBES / "op_dispatch.py"), "--calls", "20"],
                         capture_output=True, text=True, check=True).stdout
    rows = [line.strip("|").split("|") for line in out.splitlines()
            if line.startswith(("| forward ", "| backward "))]
    assert [(r[0].strip(), r[1].strip().split(",")[-1].strip()) for r in rows] == [
        (op, way) for op in ("forward", "backward")
        for way in (f"the function (`flash._{op}`)", "`torch.library.Library`", "`torch.library.custom_op`")]
    whole = [line.strip("|").split("|") for line in out.splitlines()
             if line.startswith("| forward+backward ")]
    assert [r[1].strip() for r in whole] == ["`flash_attention_qkvpacked` and autograd",
                                             "an empty `autograd.Function`",
                                             "the floor: `x * 0.125` and its gradient"]
    for r in rows + whole:
        median, spread = r[2].split(" (")
        lo, hi = (float(x) for x in spread.rstrip(") ").split("-"))
        assert 0 < lo <= float(median) <= hi


def test_tuning_spread_probe_ranks_candidates_by_their_best_ratio(tmp_path):
    """The tuning-spread probe, as its command, on two bench_attention-style files it is given:
    per op, each candidate's best ratio to the fastest candidate of its shape over all files,
    and how many came within each ratio."""
    def cand(family, m, w):
        return {"family": family, "blocks": {"BLOCK_M": m, "BLOCK_N": 64, "BLOCK_T": 16, "HAS_TAIL": True},
                "num_warps": w, "num_stages": 1}

    def shape(times):
        return {"shape": [1, 1, 65, 64], "flash": {"tuning_ms": {"bwd": [
            {"candidate": cand("short", m, w), "ms": ms} for (m, w), ms in times.items()]}}}

    files = []
    for i, times in enumerate([{(32, 4): 1.0, (64, 4): 1.5, (16, 2): 3.0}, {(32, 4): 2.0, (64, 4): 1.0, (16, 2): 4.0}]):
        files.append(tmp_path / f"run{i}.json")
        files[-1].write_text(json.dumps({"results": {"shapes": [shape(times)]}}))
    out = subprocess.run([sys.executable, str(PROBES / "tuning_spread.py"), *map(str, files), "--within", "1.1", "2.5"],
                         capture_output=True, text=True, check=True).stdout
    assert "bwd: 3 candidates timed over 2 files; 2 within 1.10x, 2 within 2.50x of the best somewhere" in out
    rows = [line.strip("|").split("|") for line in out.splitlines() if line.startswith("| short")]
    assert [(r[0].strip(), float(r[1]), int(r[2])) for r in rows] == [
        ("short: M=32 N=64, 4w 1s", 1.0, 2), ("short: M=64 N=64, 4w 1s", 1.0, 2),
        ("short: M=16 N=64, 2w 1s", 3.0, 2)]
    # a split candidate is named apart from its one-launch form
    one = {"family": "general", "blocks": {"BLOCK_M1": 32, "BLOCK_N1": 64, "BLOCK_M2": 64, "BLOCK_N2": 32},
           "num_warps": 4, "num_stages": 3}
    twin = {**one, "blocks": {**one["blocks"], "SPLIT": 1}}
    probe = _load("tuning_spread")
    assert probe.name(one) == "M1=32 N1=64 M2=64 N2=32, 4w 3s" and probe.name(twin) == "M1=32 N1=64 M2=64 N2=32 SPLIT=1, 4w 3s"


def test_tuning_spread_probe_compares_twins_with_their_candidates(tmp_path):
    """--twins BLOCK: at each shape, each twin's time over that of the candidate it is a twin
    of (the same family, blocks, warps and stages without BLOCK), and the fastest twin over
    the fastest candidate without the block; shapes with no twin are left out."""
    def entry(m, ms, family="general", stages=3, **extra):
        return {"candidate": {"family": family, "blocks": {"BLOCK_M": m, "BLOCK_N": 64, **extra},
                              "num_warps": 4, "num_stages": stages}, "ms": ms}

    timed = [entry(128, 1.0), entry(128, 1.2, TAIL_AHEAD=1), entry(64, 2.0), entry(64, 1.0, TAIL_AHEAD=1),
             entry(64, 0.5, family="general_tma"), entry(32, 0.7, TAIL_AHEAD=1)]  # the last: no candidate
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"results": {"shapes": [
        {"shape": [8, 12, 577, 64], "flash": {"tuning_ms": {"fwd": timed}}},
        {"shape": [8, 12, 512, 64], "flash": {"tuning_ms": {"fwd": [entry(128, 1.0)]}}}]}}))
    rows = _load("tuning_spread").twins([path], "TAIL_AHEAD")
    assert len(rows) == 1 and rows[0]["shape"] == [8, 12, 577, 64] and rows[0]["op"] == "fwd"
    assert rows[0]["ratios"] == [0.5, 1.2]
    assert rows[0]["best"] == 0.7 / 0.5
    out = subprocess.run([sys.executable, str(PROBES / "tuning_spread.py"), str(path), "--twins", "TAIL_AHEAD"],
                         capture_output=True, text=True, check=True).stdout
    assert "| (8, 12, 577, 64) | fwd | 2 | 0.500 | 0.850 | 1.200 | 1.400 |" in out
    assert "(8, 12, 512, 64)" not in out


def test_tuning_spread_probe_sets_the_tuners_time_beside_the_benchmarks(tmp_path):
    """--against-bench: per shape whose run tuned both ops, the tuner's fastest forward and
    backward beside the benchmark's forward and forward+backward less forward, their ratios,
    and the tuner's first and second forward; a shape whose choice came from the cache file
    (no timings) is left out."""
    def entry(m, ms):
        return {"candidate": {"family": "general", "blocks": {"BLOCK_M": m, "BLOCK_N": 64},
                              "num_warps": 4, "num_stages": 3}, "ms": ms}

    bwd = [{"candidate": {"family": "general", "blocks": {"BLOCK_M1": 32, "BLOCK_N1": 128, "BLOCK_M2": 128,
                                                            "BLOCK_N2": 32}, "num_warps": 4, "num_stages": 3}, "ms": 3.0}]
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"results": {"shapes": [
        {"shape": [4, 16, 4097, 128], "sdpa_cudnn": {"fwd_ms": 1.04},
         "flash": {"fwd_ms": 1.2, "fwd_bwd_ms": 4.5, "fwd_tflops": 456.0,
                   "tuning_ms": {"fwd": [entry(128, 1.02), entry(64, 1.0)], "bwd": bwd}}},
        {"shape": [8, 12, 577, 64], "flash": {"fwd_ms": 0.2, "fwd_bwd_ms": 0.8, "tuning_ms": None}}]}}))
    probe = _load("tuning_spread")
    (row,) = probe.against_bench([path])
    assert (row["fwd_tuner"], row["fwd_bench"], row["bwd_tuner"]) == (1.0, 1.2, 3.0)
    assert row["bwd_bench"] == pytest.approx(3.3) and row["fwd_second_ratio"] == pytest.approx(1.02)
    assert (row["fwd_first"], row["fwd_second"]) == ("M=64 N=64, 4w 3s", "M=128 N=64, 4w 3s")
    out = subprocess.run([sys.executable, str(PROBES / "tuning_spread.py"), str(path), "--against-bench"],
                         capture_output=True, text=True, check=True).stdout
    assert ("| (4, 16, 4097, 128) | 1.000 | 1.200 | 1.200 | 456 | 1.040 | 3.000 | 3.300 | 1.100 | "
            "M=64 N=64, 4w 3s | M=128 N=64, 4w 3s (1.020) |") in out
    assert "(8, 12, 577, 64)" not in out
    # the same shape again with the other forward chosen: grouped apart by the choice
    other = {"shape": [4, 16, 4097, 128], "sdpa_cudnn": {"fwd_ms": 1.06},
             "flash": {"fwd_ms": 1.1, "fwd_bwd_ms": 4.4, "fwd_tflops": 480.0,
                       "tuning_ms": {"fwd": [entry(128, 1.02), entry(64, 1.03)], "bwd": bwd}}}
    second = tmp_path / "run2.json"
    second.write_text(json.dumps({"results": {"shapes": [other, other]}}))
    groups = probe.by_choice(probe.against_bench([path, second]))
    assert [(g["chosen"], g["runs"]) for g in groups] == [("M=64 N=64, 4w 3s", 1), ("M=128 N=64, 4w 3s", 2)]
    assert groups[1]["ratio"] == pytest.approx((1.1 / 1.02, 1.1 / 1.02))
    assert groups[1]["tflops"] == (480.0, 480.0, 480.0) and groups[1]["cudnn_fwd"] == (1.06, 1.06)
    out = subprocess.run([sys.executable, str(PROBES / "tuning_spread.py"), str(path), str(second), "--against-bench"],
                         capture_output=True, text=True, check=True).stdout
    assert "| (4, 16, 4097, 128) | M=128 N=64, 4w 3s | 2 | 1.08-1.08x | 480 (480-480) | 1.060-1.060 |" in out
    # a run whose tuner timed finalists in CUDA graphs: the kept forward is the graph-fastest
    # one (here second in the short windows), set first, with its short-window time
    regraphed = [dict(entry(64, 1.0), graph_ms=1.20), dict(entry(128, 1.02), graph_ms=1.10)]
    third = tmp_path / "run3.json"
    third.write_text(json.dumps({"results": {"shapes": [
        {"shape": [4, 16, 4097, 128], "flash": {"fwd_ms": 1.12, "fwd_bwd_ms": 4.4,
                                                "tuning_ms": {"fwd": regraphed, "bwd": bwd}}}]}}))
    (row,) = probe.against_bench([third])
    assert (row["fwd_first"], row["fwd_tuner"], row["fwd_second"]) == ("M=128 N=64, 4w 3s", 1.02, "M=64 N=64, 4w 3s")
    assert row["fwd_second_ratio"] == pytest.approx(1.0 / 1.02)


def test_agreement_probe_shows_rounding_well_inside_the_tuners_bound_on_its_inputs():
    """The premise of the tuner's check: on standard-normal inputs (what flash._probe gives)
    bf16 rounding moves attention by a unit or two, far inside launch.AGREE_ULPS, while
    peaked inputs move it by as much as the bound."""
    from vitflash.ops import launch

    agreement = _load("agreement")

    rows = [r.strip("|").split("|") for r in agreement.naive_rows()]
    spread = {(shape.strip(), float(scale)): (float(o), float(d)) for shape, scale, o, d in rows}
    mild = [v for (_, scale), pair in spread.items() if scale == 1 for v in pair]
    peaked = [v for (_, scale), pair in spread.items() if scale == 6 for v in pair]
    assert len(mild) == 6 and max(mild) <= launch.AGREE_ULPS / 8
    assert max(peaked) >= launch.AGREE_ULPS / 2


def test_bwd_parts_probe_pairs_the_best_part_of_each_kind():
    """The backward-parts probe (a GPU run) joins the fastest dK/dV configuration and the
    fastest dQ one into one split candidate: the dK/dV part's tiles, warps and stages, the dQ
    part's tiles, and its warps and stages as WARPS2 / STAGES2 where they differ. Its table
    lists each part's configurations fastest first and names those that failed."""
    probe = _load("bwd_parts")
    dkdv = probe.part_candidate(1, (32, 128), 4, 3)
    dq_same, dq_other = probe.part_candidate(2, (64, 64), 4, 3), probe.part_candidate(2, (128, 32), 8, 2)
    assert dkdv.meta == dict(BLOCK_M1=32, BLOCK_N1=128, BLOCK_M2=128, BLOCK_N2=32, SPLIT=1)
    assert dq_same.meta == dict(BLOCK_M1=64, BLOCK_N1=64, BLOCK_M2=64, BLOCK_N2=64, SPLIT=1)
    same = probe.pair_candidate(dkdv, dq_same)
    assert same.meta == dict(BLOCK_M1=32, BLOCK_N1=128, BLOCK_M2=64, BLOCK_N2=64, SPLIT=1)
    other = probe.pair_candidate(dkdv, dq_other)
    assert (other.meta["WARPS2"], other.meta["STAGES2"], other.num_warps, other.num_stages) == (8, 2, 4, 3)
    assert len(probe.grid(1, ("general", "general_tma"))) == 2 * len(probe.DKDV_TILES) * 4
    deep = probe.grid(2, ("general_tma",), warps=(4,), stages=(3, 4, 5))
    assert len(deep) == len(probe.DQ_TILES) * 3
    assert {(c.num_warps, c.num_stages) for c in deep} == {(4, 3), (4, 4), (4, 5)}
    # register caps: on the dK/dV grid only, carried by the pair and shown in the labels
    assert len(probe.grid(1, ("general_tma",), caps=(0, 168))) == 2 * len(probe.DKDV_TILES) * 4
    assert {c.maxnreg for c in probe.grid(2, ("general_tma",), caps=(0, 168))} == {0}
    capped = probe.part_candidate(1, (32, 128), 4, 3, maxnreg=168)
    assert probe.pair_candidate(capped, dq_other).maxnreg == 168
    assert probe.label(capped, 1) == "general_tma: M1=32 N1=128, 4w 3s cap 168"
    timed = lambda c, part, ms: {"label": probe.label(c, part), "candidate": c.to_json(),  # noqa: E731
                                 "ms": {"median": ms, "min": ms, "max": ms}}
    row = {"shape": [8, 12, 4097, 64], "delta_ms": {"median": 0.02},
           "parts": {1: [timed(probe.part_candidate(1, (64, 64), 4, 3), 1, 2.0), timed(dkdv, 1, 1.5),
                         {"label": "M1=64 N1=128, 8w 3s", "error": "OutOfResources: shared memory"}],
                     2: [timed(dq_same, 2, 1.0), timed(dq_other, 2, 0.8)]},
           "whole": {"best pair": {"label": probe.label(other), "ms": {"median": 2.4, "min": 2.3, "max": 2.5}}},
           "listed": [{"label": probe.label(same), "ms": 2.6}]}
    env = {"gpu": "H200", "commit": "abc", "torch": "2", "triton": "3", "cuda": "13", "date": "d", "repeats": 3,
           "warps": [4], "stages": [3, 4, 5]}
    lines = probe.markdown([row], env, "cmd").splitlines()
    assert "warps [4], stages [3, 4, 5], dK/dV register caps [0] (0: none)." in lines[4]
    dkdv_rows = [line for line in lines if line.startswith("| general_tma: M1=")]
    assert dkdv_rows[0].startswith("| general_tma: M1=32 N1=128, 4w 3s | 1.500")
    assert "- failed: M1=64 N1=128, 8w 3s: OutOfResources: shared memory" in lines
    assert any("SPLIT=1 WARPS2=8 STAGES2=2, 4w 3s" in line and "2.400" in line for line in lines)


def test_bwd_parts_probe_compares_saved_runs_without_a_gpu(monkeypatch, tmp_path, capsys):
    """--compare sets the result files of several runs side by side, per shape of the first:
    each run's whole backward (the tuner's choice), its fastest dK/dV and dQ launches, its
    delta launch; a run without the shape gets dashes. A malformed argument is refused."""
    probe = _load("bwd_parts")
    part = lambda label, ms: {"label": label, "ms": {"median": ms, "min": ms, "max": ms + 0.001}}  # noqa: E731

    def run(commit, shapes, scale):
        rows = [{"shape": list(shape), "delta_ms": {"median": 0.04},
                 "parts": {"1": [part("M1=32 N1=128", 0.3 * scale), part("M1=32 N1=64", 0.28 * scale),
                                 {"label": "M1=64 N1=128", "error": "OutOfResources"}],
                           "2": [part("M2=64 N2=32", 0.17 * scale)]},
                 "whole": {"tuner's choice": {"label": f"tuned {commit}", "ms": {"median": 0.5 * scale, "min": 0.49 * scale,
                                                                                  "max": 0.51 * scale}}}}
                for shape in shapes]
        path = tmp_path / f"{commit}.json"
        path.write_text(json.dumps({"command": "python bwd_parts.py", "environment": {"commit": commit, "date": "d"},
                                    "results": rows}))
        return path

    a = run("aaa", [(256, 12, 197, 64), (256, 12, 256, 64)], 1.0)
    b = run("bbb", [(256, 12, 197, 64)], 0.8)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    probe.main(["--compare", f"main={a}", f"branch={b}"])
    out = capsys.readouterr().out.splitlines()
    assert "| main | aaa | d | `python bwd_parts.py` |" in out and "| branch | bbb | d | `python bwd_parts.py` |" in out
    at_197 = out[out.index("## (256, 12, 197, 64)"):out.index("## (256, 12, 256, 64)")]
    assert "| main | 0.500 (0.490-0.510) | tuned aaa | 0.280 (0.280-0.281), M1=32 N1=64 | 0.170 (0.170-0.171), M2=64 N2=32 | 0.040 |" in at_197
    assert any(line.startswith("| branch | 0.400 (0.392-0.408) | tuned bbb | 0.224") for line in at_197)
    assert "| branch | - | - | - | - | - |" in out[out.index("## (256, 12, 256, 64)"):]
    with pytest.raises(SystemExit, match="NAME=JSON"):
        probe.main(["--compare", str(a)])


FIRST_CALL_ENV = {"gpu": "H200", "commit": "abc", "torch": "2", "triton": "3", "date": "d", "repeats": 3}


def _first_call_rows() -> list[dict]:
    """Six first-call runs as the probe's children report them: two lists, three rounds."""
    def run(variant, fwd_s, bwd_s):
        return {"shape": [256, 12, 197, 64], "variant": variant, "fwd_s": fwd_s, "bwd_s": bwd_s,
                "fwd_candidates": {"listed": 8, "v15": 22}[variant], "bwd_candidates": 15,
                "fwd_chosen": "M=128 N=32, 4w 3s", "bwd_chosen": "M1=32 N1=128 M2=64 N2=64 SPLIT=1, 4w 3s"}

    return [run("listed", 6.0, 5.0), run("v15", 15.0, 5.2), run("v15", 14.0, 4.8),
            run("listed", 7.0, 4.0), run("listed", 5.0, 4.5), run("v15", 16.0, 5.0)]


def test_first_call_probe_puts_back_what_versions_15_and_16_took_off_the_hopper_lists(monkeypatch):
    """The first-call probe (a GPU run) times the tuner's first call with today's candidate
    lists and with earlier versions': "v15" puts back the short forwards past 128 keys, "v14"
    those and the 8-warp general backwards (the 8-warp tile of the head dim's class with its
    TMA twin, D >= 64: below it they are still listed, and the two 8-warp TMA-only
    configurations); nothing where TMA loads do not exist. Its table reports each list's
    first forward and backward and their differences from today's."""
    probe = _load("first_call")
    monkeypatch.setattr(launch, "_TMA_LOADS", True)
    monkeypatch.setattr(launch, "_TMA", True)
    original = launch.candidates
    monkeypatch.setattr(launch, "candidates", original)  # restored after the test
    monkeypatch.setattr(launch, "_short_fwd_cut", launch._short_fwd_cut)
    cut = launch._short_fwd_cut
    for d in (64, 128):
        listed = original("bwd", 577, d, 96)
        extras = probe.v14_extras("bwd", 577, d)
        assert len(extras) == 4 and {c.num_warps for c in extras} == {8}
        assert [c.family for c in extras].count("general") == 1 and not set(extras) & set(listed)
        fwd_197 = original("fwd", 197, d, 96)
        assert {c.family for c in fwd_197} == {"general", "general_tma"}
        probe.use_list("v15")
        shorts = [c for c in launch.candidates("fwd", 197, d, 96) if c not in fwd_197]
        assert launch.candidates("fwd", 197, d, 96) == fwd_197 + shorts
        assert shorts and {c.family for c in shorts} == {"short", "short_tma"}
        assert launch.candidates("bwd", 577, d, 96) == listed
        launch._short_fwd_cut = cut
        probe.use_list("v14")
        assert launch.candidates("bwd", 577, d, 96) == listed + extras
        assert launch.candidates("fwd", 197, d, 96) == fwd_197 + shorts
        launch.candidates, launch._short_fwd_cut = original, cut
    probe.use_list("listed")
    assert launch.candidates is original and launch._short_fwd_cut is cut
    assert [c.family for c in probe.v14_extras("bwd", 577, 48)] == ["general_tma"] * 2
    assert probe.v14_extras("fwd", 577, 64) == []
    monkeypatch.setattr(launch, "_TMA_LOADS", False)
    monkeypatch.setattr(launch, "_TMA", False)
    assert probe.v14_extras("bwd", 577, 64) == []

    rows = _first_call_rows()
    summary = probe.summarize(rows)
    assert [(r["variant"], r["fwd_candidates"], r["fwd_s"]["median"]) for r in summary] == [
        ("listed", 8, 6.0), ("v15", 22, 15.0)]
    lines = probe.markdown(summary, FIRST_CALL_ENV, "cmd").splitlines()
    assert ("| (256, 12, 197, 64) | listed | 8 / 15 | 6.00 (5.00-7.00) | 4.50 (4.00-5.00) | "
            "M=128 N=32, 4w 3s | M1=32 N1=128 M2=64 N2=64 SPLIT=1, 4w 3s |") in lines
    assert "| (256, 12, 197, 64) | v15 | +9.00 | +0.50 | 0.40 | 0.90 |" in lines


def test_first_call_probe_times_the_one_pass_finalists_and_can_share_a_warm_compile_cache(monkeypatch, tmp_path):
    """"one_pass" keeps today's lists and times the finalists in one pass of blocks (cache
    version 26's timer), to show what the second pass costs. With --warm-compile every case
    gets one compile cache, filled by an untimed first call at each shape; without it, each
    case gets an empty one of its own. Either way each case has an empty tuning cache."""
    probe = _load("first_call")
    original = launch.candidates
    monkeypatch.setattr(launch, "GRAPH_PASSES", launch.GRAPH_PASSES)  # restored after the test
    assert launch.GRAPH_PASSES == 2
    probe.use_list("one_pass")
    assert launch.GRAPH_PASSES == 1 and launch.candidates is original
    # the children's environments, as run_child starts them
    envs = []

    class Done:
        returncode, stderr = 0, ""
        stdout = json.dumps(_first_call_rows()[0]) + "\n"

    def fake_run(cmd, env, **kw):
        envs.append((cmd[cmd.index("--variant") + 1], env["TRITON_CACHE_DIR"], env["VITFLASH_CACHE_DIR"]))
        return Done()

    monkeypatch.setattr(probe.subprocess, "run", fake_run)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(launch, "tma_loads", lambda: True)
    monkeypatch.setattr(probe, "environment", lambda: dict(FIRST_CALL_ENV))
    written = {}
    monkeypatch.setattr(probe, "write_results", lambda out, name, env, command, results, table:
                        written.update(env=env, table=table))
    probe.main(["--shapes", "4,16,4097,128", "--variants", "listed", "one_pass", "--repeats", "2",
                "--warm-compile", "--out", str(tmp_path)])
    assert [v for v, _, _ in envs] == ["listed", "listed", "one_pass", "one_pass", "listed"]
    assert len({c for _, c, _ in envs}) == 1  # one compile cache: the untimed call's, shared
    assert len({t for _, _, t in envs}) == 5  # a tuning cache of its own each
    assert written["env"]["warm_compile"] is True and "filled (--warm-compile)" in written["table"]
    envs.clear()
    probe.main(["--shapes", "4,16,4097,128", "--variants", "listed", "one_pass", "--repeats", "1",
                "--out", str(tmp_path)])
    assert [v for v, _, _ in envs] == ["listed", "one_pass"] and len({c for _, c, _ in envs}) == 2
    assert "an empty compile cache" in written["table"]


def test_first_call_probe_remakes_each_launch_at_every_call_as_the_tuner_did_before(monkeypatch):
    """"remade" keeps today's lists but makes each launch afresh at every call (the tuner
    before 2dc8b0e), so that the probe can show what making them once saves a first call:
    a plan's launches then build a new Launch per call, with the same kernel, grid,
    constants, warps and stages, and compute the same result."""
    from vitflash.ops import flash, flash_attention_qkvpacked

    probe = _load("first_call")
    for name in ("_fwd_launches", "_bwd_launches", "_plans"):
        monkeypatch.setattr(flash, name, getattr(flash, name))  # restored after the test
    qkv = torch.randn(1, 17, 3, 2, 32, dtype=torch.float16, generator=torch.Generator().manual_seed(0))
    monkeypatch.setattr(flash, "_plans", {})
    with torch.no_grad():
        expected = flash_attention_qkvpacked(qkv)
    made = []

    class Counted(launch.Launch):
        __slots__ = ()

        def __init__(self, kernel, grid, consts, num_warps, num_stages, n_tensors, maxnreg=0):
            made.append((kernel, grid, dict(consts), num_warps, num_stages))
            super().__init__(kernel, grid, consts, num_warps, num_stages, n_tensors, maxnreg)

    probe.use_list("remade")
    monkeypatch.setattr(flash, "_plans", {})
    monkeypatch.setattr(launch, "Launch", Counted)
    with torch.no_grad():
        first = flash_attention_qkvpacked(qkv)
        (plan,) = flash._plans.values()
        assert plan and all(isinstance(x, probe.Remade) for x in plan)
        before = len(made)
        second = flash_attention_qkvpacked(qkv)
    assert len(made) == before + len(plan)  # one new Launch per launch of the plan, per call
    assert made[-len(plan):] == [(x.kernel, x.grid, x.consts, x.num_warps, x.num_stages) for x in plan]
    assert torch.equal(first, expected) and torch.equal(second, expected)


LISTING = """
        /*0100*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
        /*0110*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR12], RZ, !UPT ;
        /*0120*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR12], R24, gsb0 ;
        /*0130*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
        /*0140*/                   MUFU.EX2 R10, R10 ;
        /*0150*/                   FFMA R11, R12, R13, R14 ;
        /*0160*/                   MUFU.EX2 R11, R11 ;
        /*0170*/                   HGMMA.64x128x16.F32.BF16 R88, R152, gdesc[UR4].tnspB, R88, gsb0 ;
        /*0180*/                   LDGSTS.E.BYPASS.128 [R49], desc[UR16][R24.64], !P0 ;
        /*0190*/               @!P0 BRA 0x100 ;
        /*01a0*/                   EXIT ;
        /*01b0*/                   SYNCS.PHASECHK.TRANS64 P0, [UR9], R8 ;
        /*01c0*/               @!P0 BRA 0x1b0 ;
        /*01d0*/                   BRA 0x130 ;
"""


def test_loop_sass_probe_sums_up_each_loop_of_the_machine_code():
    """The loop probe finds a loop by its predicated branch back (not the barrier waits'
    retry paths, which jump back unpredicated from past the program's end, nor a loop with
    no matrix products) and counts, in order, its products, waits, program-wide barriers,
    exponentials and loads."""
    probe = _load("loop_sass")
    (body,) = probe.loops(probe.instructions(LISTING))
    assert [a for a, *_ in body] == list(range(0x100, 0x1a0, 0x10))
    s = probe.summary(body)
    assert (s["HGMMA"], s["waits"], s["BAR.SYNC"], s["MUFU.EX2"], s["pointer loads"], s["instructions"]) == (
        3, 1, 1, 2, 1, 10)
    assert s["order"] == "BAR [2 HGMMA] wait (2 EX2) [1 HGMMA] {1 LDGSTS}"


def test_loop_sass_probe_budgets_a_step_at_hoppers_peak_rates():
    """The budget of a loop step: each HGMMA is a warp group's m x n x k product (2048
    multiply-adds a clock), made by every warp group of the program; its B operand always
    comes from shared memory and its A operand where the listing names a descriptor rather
    than registers (128 bytes a clock); each thread's exponentials go through MUFU (16 a
    clock) and each warp's instructions through four schedulers."""
    probe = _load("loop_sass")
    (body,) = probe.loops(probe.instructions(LISTING))
    one = probe.budget(body, 4)
    # three 64 x 128 x 16 products; A from shared memory in the first two, from R152 in the third
    assert one["tensor"] == 3 * 64 * 128 * 16 / 2048
    assert one["smem"] == (2 * 2 * (128 * 16 + 64 * 16) + 2 * 128 * 16) / 128
    assert (one["ex2"], one["issue"]) == (2 * 128 / 16, 10 * 4 / 4)
    assert one["top"][0] == ("HGMMA", 3)
    two = probe.budget(body, 8)  # two warp groups: twice each
    assert all(two[k] == 2 * one[k] for k in ("tensor", "smem", "ex2", "issue"))


def test_loop_sass_probe_budgets_the_older_warp_products_and_their_shared_memory_loads():
    """mma.sync products (HMMA.16816: one warp's 16 x 8 x 16) count once per warp, and the
    8 x 8 matrices that LDSM loads for them count as shared-memory reads (.4: four of them)."""
    probe = _load("loop_sass")
    listing = """
        /*0100*/                   LDSM.16.MT88.4 R4, [R2] ;
        /*0110*/                   LDSM.16.M88.2 R8, [R2+0x200] ;
        /*0120*/                   HMMA.16816.F32.BF16 R12, R4, R8, R12 ;
        /*0130*/                   HGMMA.64x32x16.F32.BF16 R24, gdesc[UR12], RZ, !UPT ;
        /*0140*/               @!P0 BRA 0x100 ;
"""
    (body,) = probe.loops(probe.instructions(listing))
    b = probe.budget(body, 4)
    assert b["tensor"] == (16 * 8 * 16 * 4 + 64 * 32 * 16) / 2048
    assert b["smem"] == ((4 + 2) * 8 * 8 * 2 * 4 + 2 * (32 * 16 + 64 * 16)) / 128


def test_loop_sass_probe_reads_the_short_backward():
    """`--op bwd_short` compiles the short backward (the keys of a head on chip) with the
    options registers.py takes: the tuner's register-capped one-key form at N = 65 has one
    loop, over 32-row query chunks, whose products are the five of a chunk (S^T, dP^T, dV,
    dK, dQ: 32 x 64 x 64 multiply-adds each, 4 warps) for the 64 keys of the tile; the
    options are refused for the general kernels. Run as its command in a process of its own."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    cmd = [sys.executable, str(PROBES / "loop_sass.py"), "--op", "bwd_short", "--d", "64", "--n", "65",
           "--configs", "32x4", "--one-key", "--key-per-chunk", "--maxnreg", "168", "--budget"]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True).stdout.splitlines()
    assert "the short backward, D = 64, N = 65, one_key=True, key_per_chunk=True, maxnreg=168" in out[0]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in out if line.startswith("| 32 x 65")]
    (loop, step) = rows
    assert loop[3] == "1" and step[2] == "1"
    assert float(step[3]) == 5 * 32 * 64 * 64 / 2048
    wrong = subprocess.run(cmd[:2] + ["--op", "bwd_general", "--one-key"], capture_output=True, text=True, env=env)
    assert wrong.returncode == 2 and "apply to --op fwd_short and bwd_short" in wrong.stderr
    wrong = subprocess.run(cmd[:2] + ["--op", "fwd_short", "--key-per-chunk"], capture_output=True, text=True, env=env)
    assert wrong.returncode == 2 and "applies to --op bwd_short" in wrong.stderr
    # the short forward makes one pass over its keys: a row says it has no loop
    out = subprocess.run(cmd[:2] + ["--op", "fwd_short", "--d", "64", "--configs", "64x4"], capture_output=True,
                         text=True, env=env, check=True).stdout.splitlines()
    assert [line for line in out if line.startswith("| 64 x 65")] == [
        "| 64 x 65 | 4 | 1 | - | no loop with matrix products |" + " |" * 7]


def test_loop_sass_probe_lists_a_configuration_that_does_not_compile(monkeypatch):
    """A configuration whose compile aborts in a Triton pass (warp specialization did, on
    triton 3.8 for sm_90) gets a row that says so, with the error's first line, and the
    table goes on."""
    probe = _load("loop_sass")

    def fails(*args, **kwargs):
        raise RuntimeError("PassManager::run failed\n(the MLIR reproducer)")

    monkeypatch.setattr(probe, "compile_ws_fwd", fails)
    out = probe.table("ws_fwd", 128, "128x64x4x3", False, 0, 1).splitlines()
    assert out[0].endswith("TMA forward, D = 128, without and with warp specialization")
    rows = [line for line in out if line.startswith("| 128 x 64")]
    assert rows == [f"| 128 x 64, warp_specialize={ws} | 4 | 3 | - | does not compile: PassManager::run failed |"
                    + " |" * len(probe.CLASSES) + " |" for ws in (False, True)]
    assert all(len(r.split("|")) == len(out[2].split("|")) for r in rows)  # the header's columns


def test_loop_sass_probe_on_a_compiled_forward():
    """Compiled for sm_90 on the CPU, the general forward's main loop at (128 x 128) tiles in 8
    warps (D = 64) holds the two products of a key tile (D / 16 + BLOCK_N / 16 HGMMA), one
    exponential per score of each thread's share and one per row it holds (the rescale), one
    wait, and a barrier of the whole program: both warp groups meet in every step. Run as its
    command in a process of its own: the kernels must be compiled, not interpreted."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, str(PROBES / "loop_sass.py"), "--op", "fwd_general", "--d", "64",
                          "--configs", "128x128x8x3", "--n", "4097", "--budget"],
                         capture_output=True, text=True, env=env, check=True).stdout.splitlines()
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in out if line.startswith("| 128 x 128")]
    loops, budgets = rows[:len(rows) // 2], rows[len(rows) // 2:]
    main = max(loops, key=lambda r: int(r[4]))  # the loop over the full key tiles
    hgmma, waits, bars, ex2 = (int(main[i]) for i in (5, 6, 7, 8))
    assert hgmma == 64 // 16 + 128 // 16 and waits == 1 and bars >= 1
    assert ex2 == 128 * 128 // 256 + 2
    # its budget: S = Q K^T and P V, 128 x 128 x 64 multiply-adds each, at 2048 a clock
    (step,) = [b for b in budgets if b[2] == main[3]]
    assert float(step[3]) == 2 * 128 * 128 * 64 / 2048 and float(step[5]) == ex2 * 256 / 16
    assert main[-1].startswith("BAR [4 HGMMA] wait (66 EX2) [8 HGMMA]")


def test_loop_sass_probe_marks_a_warp_specialized_dkdv_loop():
    """Compiled for sm_90 on the CPU, the probe's dK/dV program at 64 x 64 tiles in 4 warps: with
    warp specialization its loop is split into partitions, whose matrix-product loops load
    nothing themselves (the loads went to another partition); without it, one loop loads its
    tiles through TMA. Run as its command in a process of its own: the kernels must be compiled,
    not interpreted."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, str(PROBES / "loop_sass.py"), "--op", "ws_bwd", "--d", "64",
                          "--configs", "64x64x4x3"], capture_output=True, text=True, env=env,
                         check=True).stdout.splitlines()
    assert out[0].endswith("dK/dV program, D = 64, without and with warp specialization")
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in out if line.startswith("| 64 x 64")]
    plain = [r for r in rows if r[0] == "64 x 64, warp_specialize=False"]
    split = [r for r in rows if r[0] == "64 x 64, warp_specialize=True (split into partitions)"]
    assert len(plain) == 1 and int(plain[0][9]) >= 2  # its Q and dO tiles through TMA
    assert split and all(int(r[9]) == 0 and int(r[5]) > 0 for r in split)


def test_first_call_probe_renders_a_saved_result_without_a_gpu(monkeypatch, tmp_path, capsys):
    """--render prints the tables of a result file again from its runs, on any machine; a
    result written before the forward-chosen column gets the column empty, not an error."""
    probe = _load("first_call")
    rows, env = _first_call_rows(), FIRST_CALL_ENV
    old = [{k: v for k, v in r.items() if k != "fwd_chosen"} for r in rows[:2]]
    for runs, cell in ((rows, " | M=128 N=32, 4w 3s | "), (old, " | 6.00 (6.00-6.00) | 5.00 (5.00-5.00) |  | ")):
        saved = tmp_path / "first_call.json"
        saved.write_text(json.dumps({"command": "python probe", "environment": env, "results": {"runs": runs}}))
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
        probe.main(["--render", str(saved)])
        out = capsys.readouterr().out
        assert out.startswith("# First call at a new shape") and "`python probe`" in out
        assert cell in out


def test_same_state_probe_tells_equal_checkpoints_from_different_ones(tmp_path, capsys):
    """The probe that compares two training checkpoints: equal on a file and its copy, and
    naming the parts that differ after one more step."""
    probe = _load("same_state")

    def ckpt(step: int, w: float) -> dict:
        return {"state_dict": {"w": torch.full((3,), w)}, "global_step": step,
                "optimizer_states": [{"state": {0: {"exp_avg": torch.full((3,), w / 2)}}}],
                "SyntheticDataModule": {"train_loader": {"epoch": 1, "batches": step}}}
    paths = []
    for i, (step, w) in enumerate([(5, 1.0), (5, 1.0), (6, 1.5)]):
        paths.append(tmp_path / f"{i}.ckpt")
        torch.save(ckpt(step, w), paths[-1])
    assert probe.main(str(paths[0]), str(paths[1])) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "same state"
    assert probe.main(str(paths[0]), str(paths[2])) == 1
    out = capsys.readouterr().out
    assert "weights: 0 of 1 tensors identical" in out and "loader: 1 of 2 tensors identical" in out
    assert out.splitlines()[-1] == "states differ"


def test_augment_same_probe_finds_a_checkout_equal_to_itself(capsys):
    """The AutoAugment comparison across checkouts, on this checkout twice: the same bits."""
    probe = _load("augment_same")
    root = str(PROBES.parents[1])
    assert probe.main(root, root) == 0
    assert "the same bits in both checkouts (largest difference 0)" in capsys.readouterr().out


def test_sustained_probe_sums_a_run_up_by_time_since_its_start():
    """Each window holds the calls that began in it (median ms per call), and the clock samples
    taken in it (median MHz); the table shows both per case and window."""
    probe = _load("sustained")
    starts = [0.0, 1.0, 2.0, 6.0, 12.0, 40.0]
    ms = [1.0, 1.0, 1.1, 1.3, 1.2, 1.25]
    got = probe.windows(starts, ms)
    assert [(w["from_ms"], w["calls"]) for w in got] == [(0, 2), (2, 2), (10, 1), (30, 1)]
    assert got[1]["ms"] == pytest.approx(1.2)
    clocks = probe.clock_windows([(0.5, 1980.0), (1.5, 1970.0), (50.0, 1700.0)])
    assert clocks == {0: 1975.0, 30: 1700.0}
    env = {k: "x" for k in ("gpu", "commit", "torch", "triton", "cuda", "cudnn", "date")}
    rows = [{"impl": "flash", "op": "fwd", "shape": [4, 16, 4097, 128],
             "runs": [{"windows": got, "clock_mhz": clocks}, {"windows": got, "clock_mhz": None}]}]
    table = probe.markdown(rows, env, "cmd", 2.0).splitlines()
    row = next(line for line in table if line.startswith("| flash fwd"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1:6] == ["1.000 (1975)", "1.200", "1.200", "1.250 (1700)", ""]


@pytest.mark.gpu
@pytest.mark.parametrize("impl, backward", [("flash", False), ("sdpa_cudnn", True)])
def test_sustained_probe_times_calls_back_to_back_on_the_gpu(impl, backward):
    """A short run of the probe on CUDA: calls enough for about 50 ms, each timed, summed up in
    windows from the first (0-2 ms at least), each window's median positive."""
    probe = _load("sustained")
    leaves, fwd, do = probe.make_case(impl, 8, 4, 257, 64, torch.bfloat16)
    fn = (lambda: fwd().backward(do)) if backward else fwd
    run = probe.run_case(fn, leaves, backward, seconds=0.05, idle_s=0.1)
    assert run["calls"] >= 10 and run["windows"][0]["from_ms"] == 0
    assert sum(w["calls"] for w in run["windows"]) == run["calls"]
    assert all(w["ms"] > 0 for w in run["windows"])


def test_finalist_timers_table_sets_each_timer_beside_the_others():
    """The finalist-timers probe's table: one row per finalist with the tuner's own timings
    (n/a where it timed none in graphs) and each timer's, the kept one marked."""
    probe = _load("finalist_timers")
    env = {k: "x" for k in ("gpu", "commit", "torch", "triton", "cuda", "date")}
    sustained = {"first": 1.1, "last": 1.2, "replays": 30, "calls": 19}
    rows = [{"shape": [4, 16, 4097, 128], "finalists": [
        {"label": "M=128 N=128, 8w 3s", "kept": False, "tuner_windows": 1.0636, "tuner_graph": 1.2346,
         "windows": 1.06, "graph_timer": 1.23, "bench_op": 1.13, "bench_bare": 1.12, "sustained": sustained},
        {"label": "general_tma: M=64 N=64, 4w 3s", "kept": True, "tuner_windows": 1.0686, "tuner_graph": None,
         "windows": 1.07, "graph_timer": 1.15, "bench_op": 1.21, "bench_bare": 1.2, "sustained": sustained}]}]
    lines = probe.markdown(rows, env, "cmd", 3, 2.0).splitlines()
    assert lines[-2] == ("| (4, 16, 4097, 128) | M=128 N=128, 8w 3s | 1.0636 | 1.2346 | 1.0600 | 1.2300 | "
                         "1.1300 | 1.1200 | 1.1000 | 1.2000 |  |")
    assert lines[-1].endswith("| 1.0686 | n/a | 1.0700 | 1.1500 | 1.2100 | 1.2000 | 1.1000 | 1.2000 | kept |")


@pytest.mark.gpu
def test_finalist_timers_probe_times_every_finalist_on_the_gpu(monkeypatch, tmp_path):
    """A short run of the probe at one shape, every candidate a finalist: each timer gives a
    positive time for each, and the kept one is the tuner's choice."""
    probe = _load("finalist_timers")
    monkeypatch.setenv("VITFLASH_CACHE_DIR", str(tmp_path))
    for name, value in (("_disk", None), ("_chosen", {}), ("_timings", {}), ("_graph_timings", {}),
                        ("FINAL_MARGIN", float("inf")), ("FINALISTS", 2)):
        monkeypatch.setattr(launch, name, value)
    got = probe.probe_shape((2, 2, 577, 64), repeats=1, sustain_s=0.05)
    assert len(got["finalists"]) == 2 and sum(f["kept"] for f in got["finalists"]) == 1
    for f in got["finalists"]:
        assert all(f[k] > 0 for k in ("windows", "graph_timer", "bench_op", "bench_bare"))
        assert f["sustained"]["first"] > 0 and f["sustained"]["last"] > 0


def test_step_host_probe_sums_launches_and_ranks_operators_per_step():
    """The step-host probe's summaries of the profiler's averages: CUDA launches a step (runtime
    and driver calls together) with their host time, and the operators by self CPU time, per
    step, the largest first."""
    from types import SimpleNamespace as Event

    probe = _load("step_host")
    events = [Event(key="cuLaunchKernel", count=600, self_cpu_time_total=4000.0),
              Event(key="cudaLaunchKernel", count=40, self_cpu_time_total=600.0),
              Event(key="vitflash::flash_attn_forward", count=18, self_cpu_time_total=1300.0),
              Event(key="aten::mm", count=150, self_cpu_time_total=4200.0)]
    assert probe.launch_line(events, 2) == "CUDA launches per step: 320, 2.30 ms of host time in the launch calls."
    table = probe.operator_table(events, 2, 2)
    assert table[2:] == ["| aten::mm | 75 | 2.100 |", "| cuLaunchKernel | 300 | 2.000 |"]


def test_step_host_probe_sums_the_gpus_busy_time_per_step():
    """The GPU's time a step counts device events only (kernels and copies), not the host
    operators that launched them, and gives its share of the step's wall time."""
    from types import SimpleNamespace as Event

    probe = _load("step_host")
    events = [Event(key="cutlass_gemm", device_type="DeviceType.CUDA", self_device_time_total=3000.0),
              Event(key="Memcpy DtoD", device_type="DeviceType.CUDA", self_device_time_total=1000.0),
              Event(key="aten::mm", device_type="DeviceType.CPU", self_device_time_total=3000.0)]
    assert probe.device_line(events, 2, 4.0) == (
        "GPU busy 2.00 ms a step (kernels and copies, under the profiler): 50% of the step's wall time above.")


def test_step_host_probe_needs_a_gpu(monkeypatch):
    probe = _load("step_host")
    monkeypatch.setattr(probe.torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        probe.main(["--paths", "flash"])


@pytest.mark.gpu
def test_step_host_probe_profiles_a_step_on_the_gpu(capsys):
    """Two eager steps of the smallest preset on flash: the step time, its launches, the tuner's
    plans (every one calling its kernels directly) and the operator table."""
    probe = _load("step_host")
    probe.main(["--model", "vit_micro_patch4_32", "--batch", "32", "--compile", "eager", "--paths", "flash",
                "--warmup", "2", "--steps", "2", "--profiled", "1", "--top", "5"])
    out = capsys.readouterr().out
    assert "## flash" in out and "CUDA launches per step: " in out
    direct = re.search(r"directly: (\d+) of (\d+)\.", out)
    assert direct and direct.group(1) == direct.group(2) != "0"
    assert out.count("\n| ") >= 6


def test_gluon_fwd_probe_compiles_both_forms_for_sm90():
    """The Gluon forwards compile for sm_90 with this triton (no GPU needed; outside the
    interpreter, whose jit functions Gluon cannot call), at the configurations launch.py lists
    and an 8-warp one: no spills, wgmma products in the binary, mbarrier waits for the TMA
    loads; the warp-specialized form's consumers get the registers asked for (setmaxnreg)
    and the loader its 24; so does the persistent warp-specialized form ("p"), whose
    O buffers of its own take its shared memory from 160 to 192 KiB at D = 128."""
    probe = _load("gluon_fwd")
    if not probe.hopper.available():
        pytest.skip(f"Gluon does not import in this triton: {probe.hopper._IMPORT_ERROR}")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    cells = []
    for d, configs in ((128, ["64x128x2x4w240", "64x128x2x4w240p", "128x128x2x8"]), (64, ["64x128x2x4"])):
        out = subprocess.run([sys.executable, str(PROBES / "gluon_fwd.py"), "--compile", "--d", str(d),
                              "--configs", *configs], capture_output=True, text=True, env=env, check=True).stdout
        cells += [[c.strip() for c in r.strip("|").split("|")] for r in out.splitlines() if re.match(r"\| \d", r)]
    assert [c[0] for c in cells] == ["64x128x2x4w240", "64x128x2x4w240p", "128x128x2x8", "64x128x2x4"]
    for config, regs, spills, smem, hgmma, waits, bars, mbar_waits, moves in cells:
        assert int(spills) == 0 and int(regs) <= 255, config
        assert int(hgmma) > 0 and int(mbar_waits) > 0, config
        moves = moves.split(", ")
        assert ("dec 24" in moves and "inc 240" in moves) if "w" in config else moves == ["-"], config
    smem = {c[0]: int(c[3]) for c in cells}
    assert (smem["64x128x2x4w240"], smem["64x128x2x4w240p"]) == (160, 192)


def test_gluon_fwd_probe_reads_both_forms_from_its_configs():
    probe = _load("gluon_fwd")
    assert probe.parse_config("128x64x3x8") == (128, 64, 3, 8, 0, 0)
    assert probe.parse_config("64x128x2x4w240") == (64, 128, 2, 4, 240, 0)
    assert probe.parse_config("64x128x2x4w240p") == (64, 128, 2, 4, 240, 1)
    with pytest.raises(ValueError):
        probe.parse_config("64x128x2")
    with pytest.raises(ValueError, match="warp-specialized"):
        probe.parse_config("64x128x2x4p")


def test_gluon_bwd_probe_compiles_its_kernel_for_sm90():
    """The Gluon backward's kernels (the warp-specialized ones among them) and the probe's
    atomic one compile for sm_90 at both head dims with no spills: one loop step's products as wgmma (the dK/dV kernel's four, the
    dQ kernel's three; the overlapped dK/dV form, whose first step is apart from its loop,
    twice four; the atomic kernel's five, at D = 64; the warp-specialized dK/dV and dQ kernels'
    four and three in each of their two consumers), and mbarrier waits for their TMA loads."""
    probe = _load("gluon_bwd")
    if not probe.hopper.available():
        pytest.skip(f"Gluon does not import in this triton: {probe.hopper._IMPORT_ERROR}")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    for d in (64, 128):
        out = subprocess.run([sys.executable, str(PROBES / "gluon_bwd.py"), "--compile", "--d", str(d)],
                             capture_output=True, text=True, env=env, check=True).stdout
        cells = [[c.strip() for c in r.strip("|").split("|")] for r in out.splitlines()
                 if re.match(r"\| (dkdv|dq|atomic|ws|wsdq) ", r)]
        assert [c[0] for c in cells] == ([f"dkdv {c}" for c in probe.DEFAULT_CONFIGS[d]]
                                         + [f"dq {c}" for c in probe.DQ_CONFIGS[d]]
                                         + [f"atomic {c}" for c in probe.ATOMIC_CONFIGS[d]]
                                         + [f"ws {c}" for c in probe.WS_CONFIGS[d]]
                                         + [f"wsdq {c}" for c in probe.WSDQ_CONFIGS[d]])
        assert probe.ATOMIC_CONFIGS[d] or d == 128  # (at D = 128 the atomic kernel spills)
        for config, regs, spills, smem, hgmma, waits, bars, mbar_waits in cells:
            assert int(spills) == 0 and int(regs) <= 255, (d, config)
            m, n = (int(x) for x in config.split()[1].split("x")[:2])
            # the loop's products in 16-deep steps: dK/dV's S^T and dP^T over d, dV and dK over
            # the query tile; dQ's S and dP over d, dQ over the key tile; the atomic kernel's
            # S^T, dP^T, dV, dK and dQ
            products = 2 * d // 16 + dict(dkdv=2 * m // 16, dq=n // 16,
                                          atomic=2 * m // 16 + n // 16, ws=2 * m // 16,
                                          wsdq=n // 16)[config.split()[0]]
            kind, text = config.split()  # (the atomic kernel's fifth place is its TMA_DQ)
            # (twice over: the overlapped forms' first step, the warp-specialized form's two consumers)
            products *= 2 if kind in ("ws", "wsdq") or kind != "atomic" and probe.parse_config(text, kind)[4] else 1
            assert int(hgmma) == products and int(mbar_waits) > 0, (d, config)


_WS_LAUNCHES = """
import sys
import torch
sys.path[:0] = sys.argv[1:3]
import hopper_standin  # noqa: F401  (an sm_90 GPU stands in for this CPU from here on)
import gluon_bwd as probe


class WarmUp:  # kernel[grid](...) compiled for sm_90 without launching
    def __init__(self, name):
        self.name, self.kernel = name, getattr(probe, name)

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            ck = self.kernel.warmup(*args, grid=grid, **kwargs)
            print(self.name, grid[0], ck.metadata.num_warps, "wgmma" in ck.asm["ptx"])
        return run


for name in ("bwd_dkdv_ws_kernel", "bwd_dq_ws_kernel"):
    setattr(probe, name, WarmUp(name))
B, N, H, D = 2, 300, 3, 128
qkv, do = torch.zeros(B, N, 3, H, D, dtype=torch.bfloat16), torch.zeros(B, N, H, D, dtype=torch.bfloat16)
lse, delta = torch.zeros(B, H, N), torch.zeros(B, H, N)
for kind, text in (("ws", "32x128x2x4"), ("wsdq", "128x64x2x4")):
    probe.gluon_grads(qkv, do, lse, delta, D ** -0.5, probe.parse_config(text, kind), kind, o=torch.zeros_like(do))
"""


def test_gluon_bwd_probe_launches_the_warp_specialized_kernels_with_their_arguments():
    """The probe's own launches of its warp-specialized kernels (gluon_grads, as a GPU run calls
    them) bind every argument and compile for sm_90, through a stand-in Hopper driver: 128 keys
    (queries) a program over 300 rows and 6 heads, 18 programs, 12 warps (two consumer groups
    and the loader's warp)."""
    probe = _load("gluon_bwd")
    if not probe.hopper.available():
        pytest.skip(f"Gluon does not import in this triton: {probe.hopper._IMPORT_ERROR}")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", _WS_LAUNCHES, str(Path(__file__).parent), str(PROBES)],
                         capture_output=True, text=True, env=env, check=True).stdout.split("\n")
    assert out[:2] == ["bwd_dkdv_ws_kernel 18 12 True", "bwd_dq_ws_kernel 18 12 True"]


def test_gluon_bwd_probe_refuses_warps_that_do_not_match_its_rows():
    probe = _load("gluon_bwd")
    assert probe.parse_config("64x128x2x8") == (64, 128, 2, 8, 0, 0)
    assert probe.parse_config("64x64x3x4o") == (64, 64, 3, 4, 1, 0)
    assert probe.parse_config("64x64x2x4od", "dq") == (64, 64, 2, 4, 1, 1)
    assert probe.parse_config("64x64x2x4d", "dq") == (64, 64, 2, 4, 0, 1)
    with pytest.raises(ValueError, match="dQ kernel's alone"):
        probe.parse_config("64x64x2x4d")
    assert probe.parse_config("64x64x3x4", "atomic") == (64, 64, 3, 4, 0, 0)
    assert probe.parse_config("64x128x2x8", "atomic") == (64, 128, 2, 8, 0, 0)
    assert probe.parse_config("64x128x2x8t", "atomic") == (64, 128, 2, 8, 1, 0)
    assert probe.parse_config("32x128x3x4", "ws") == (32, 128, 3, 4, 0, 0)
    with pytest.raises(ValueError, match="128 keys a program in two 4-warp consumers"):
        probe.parse_config("64x64x2x4", "ws")
    assert probe.parse_config("128x64x2x4", "wsdq") == (128, 64, 2, 4, 0, 1)  # (delta computed)
    with pytest.raises(ValueError, match="128 queries a program in two 4-warp consumers"):
        probe.parse_config("64x64x2x4", "wsdq")
    with pytest.raises(ValueError, match="each warp group of 4 takes 64 keys"):
        probe.parse_config("64x128x2x4t", "atomic")
    with pytest.raises(ValueError, match="query tiles are 64 rows"):
        probe.parse_config("32x64x2x4", "atomic")
    with pytest.raises(ValueError, match="no 'o' or 'd' form"):
        probe.parse_config("64x64x2x4o", "atomic")
    with pytest.raises(ValueError, match="each warp group of 4 takes 64 keys"):
        probe.parse_config("64x128x2x4")
    assert probe.parse_config("128x64x2x8", "dq") == (128, 64, 2, 8, 0, 0)
    with pytest.raises(ValueError, match="each warp group of 4 takes 64 queries"):
        probe.parse_config("128x64x2x4", "dq")


def test_gluon_bwd_probe_holds_each_kernels_gradients_to_the_rule(monkeypatch):
    """The probe's check, its kernels stood in for on the CPU: gradients as exact as float32
    naive attention's pass, each kernel judged on its own gradients only (dK and dV; dQ), and
    a dQ off by 1% anywhere fails; the failure is named by kernel and configuration. A dQ
    configuration that computes delta ("d") is judged on the delta it wrote too: off by 1e-3
    in one row, it fails. The atomic kernel is judged on dQ, dK and dV: a dK off in one
    element fails it."""
    probe = _load("gluon_bwd")
    monkeypatch.setattr(probe, "DEVICE", "cpu")
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)

    def stand_in(qkv, do, lse, delta, scale, cfg, kernel, dqkv=None, o=None):
        grads = probe.reference_grads(qkv, do, scale, torch.float32)
        dqkv = torch.full_like(qkv, float("nan"))
        for g in dict(dkdv=(1, 2), dq=(0, ), atomic=(0, 1, 2))[kernel]:
            dqkv[:, :, g] = grads[g] * (1.05 if kernel == "dq" and cfg[0] == 128 else 1.0)
        if kernel == "atomic" and cfg[2] == 3:  # its dK off in one element
            dqkv[0, 1, 1, 0, 0] += 0.05
        if cfg[5]:  # the "d" forms write delta: the "od" one off in one row
            delta.copy_((o.float() * do.float()).sum(-1).transpose(1, 2))
            delta[0, 1, 3] += 1e-3 * cfg[4]
        return dqkv

    monkeypatch.setattr(probe, "gluon_grads", stand_in)
    ok = probe.check((1, 2, 20, 64), ["64x128x2x8"], ["64x64x2x4", "128x64x2x8", "64x64x2x4d", "64x64x2x4od"],
                     ["64x64x2x4", "64x64x3x4"])
    assert list(ok) == ["dkdv 64x128x2x8", "dq 64x64x2x4", "dq 128x64x2x8", "dq 64x64x2x4d", "dq 64x64x2x4od",
                        "atomic 64x64x2x4", "atomic 64x64x3x4"]
    # the atomic kernel judged on all three gradients
    assert ok["atomic 64x64x2x4"]["ok"] and {"dq_err", "dk_err", "dv_err"} <= set(ok["atomic 64x64x2x4"])
    assert not ok["atomic 64x64x3x4"]["ok"]
    assert ok["dkdv 64x128x2x8"]["ok"] and set(ok["dkdv 64x128x2x8"]) == {
        "ok", "dk_err", "dk_naive_err", "dv_err", "dv_naive_err"}
    assert ok["dq 64x64x2x4"]["ok"] and not ok["dq 128x64x2x8"]["ok"]
    assert ok["dq 64x64x2x4d"]["ok"] and ok["dq 64x64x2x4d"]["delta_err"] < 1e-5
    assert not ok["dq 64x64x2x4od"]["ok"] and ok["dq 64x64x2x4od"]["delta_err"] > 5e-4
