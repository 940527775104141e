"""Probe: what one step of a general kernel's main loop does on Hopper, read from its SASS.
Runs on the CPU: the kernel is compiled for sm_90 as `registers.py` compiles it (Triton's
bundled ptxas, pointers aligned as the JIT compiles them), then each loop of the machine code
(a branch back to an earlier address) is summed up: its matrix-unit instructions (HGMMA), the
waits for them (WARPGROUP.DEPBAR), the barriers across the whole program (BAR.SYNC), the
exponentials (MUFU.EX2), the tile loads (UTMALDG by TMA, LDGSTS by pointers) and its
instructions in all, with the order of those events in one line.

    python benchmarks/probes/loop_sass.py --op fwd_general --d 128 --configs 128x128x8x3,64x64x4x3 --n 4097
    python benchmarks/probes/loop_sass.py --op fwd_general --d 128 --configs 128x128x8x3 --tma --n 4097
    python benchmarks/probes/loop_sass.py --op bwd_general --d 64 --configs 32x128x4x3 --part 1 --tma --n 4097

`--budget` adds what one step of each loop asks of an SM at Hopper's peak rates, if its
program had the SM alone: clocks of the matrix units (each HGMMA is one warp group's
m x n x k product, 2048 bf16 multiply-adds a clock), of the shared-memory reads that feed
them (the B operand always, A where it is not in registers; 128 bytes a clock), of the MUFU
unit (each thread's exponentials, 16 a clock) and of instruction issue (each warp's
instructions, four schedulers issuing one a clock each), with the most frequent opcodes.
Where a step's softmax does not overlap its products, their clocks add:

    python benchmarks/probes/loop_sass.py --op fwd_general --d 128 --configs 128x128x8x3 --n 4097 --budget

`--op fwd_short` and `--op bwd_short` read the short kernels (all keys of a head on chip) at
length `--n` (65 by default), their configurations BLOCK_M x warps, with `--one-key`,
`--key-per-chunk` and `--maxnreg` as `registers.py` takes them:

    python benchmarks/probes/loop_sass.py --op bwd_short --d 64 --n 65 --configs 32x4 --one-key --key-per-chunk --maxnreg 168 --budget

`--op ws_fwd` compiles the minimal TMA forward of `warp_specialize.py` instead (its tiles loaded
through descriptors, no tail), with and without Triton's warp specialization
(`tl.range(..., warp_specialize=True)`), to see whether this Triton splits its warps into
groups that no longer meet at a barrier every step; a configuration whose compile fails is
listed with the error's first line:

    python benchmarks/probes/loop_sass.py --op ws_fwd --d 128 --configs 128x128x8x3,128x64x4x3

`--op ws_bwd` does the same for the probe's minimal dK/dV program (BLOCK_M x BLOCK_N = the
streamed query tile x the key tile on chip). A warp-specialized compile is marked "(split into
partitions)": its TTGIR holds a `ttg.warp_specialize` op, and each partition's loop gets a row:

    python benchmarks/probes/loop_sass.py --op ws_bwd --d 64 --configs 32x128x4x3,64x64x4x3

What it can show and what it cannot: where in a step the program waits for its matrix products
and where all its warps meet. Two warp groups of one program (8 warps) that meet at a
BAR.SYNC in every step run their softmax at the same time, so neither's softmax overlaps the
other's products; two programs of 4 warps on one SM are not tied that way. How long anything
takes is a GPU's to say: this counts instructions, it does not time them.
"""
from __future__ import annotations

import argparse
import collections
import importlib.util
import re
import sys
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

sys.path.insert(0, str(Path(__file__).resolve().parent))
from registers import assemble, compile_general_bwd, compile_general_fwd, compile_short  # noqa: E402

LINE = re.compile(r"^\s+/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z0-9_.]+)([^;]*);", re.M)
# the classes the summary counts: (column, opcode prefix)
CLASSES = (("HGMMA", "HGMMA"), ("waits", "WARPGROUP.DEPBAR"), ("BAR.SYNC", "BAR.SYNC"),
           ("MUFU.EX2", "MUFU.EX2"), ("TMA loads", "UTMALDG"), ("pointer loads", "LDGSTS"))


def instructions(listing: str) -> list[tuple[int, str, str, bool]]:
    """(address, opcode, operands, predicated) of each instruction of a cuobjdump listing."""
    return [(int(a, 16), op, rest.strip(), bool(pred)) for a, pred, op, rest in LINE.findall(listing)]


def loops(code: list[tuple[int, str, str, bool]]) -> list[list[tuple[int, str, str, bool]]]:
    """The bodies of the loops that hold matrix products, shortest first: for each
    predicated branch back to an earlier address (a loop's back edge), the instructions from
    that target to the branch. An unpredicated branch back is not a loop: the retry paths of
    the barrier waits, placed after the program's end, jump back into the code that way."""
    out = []
    for i, (addr, op, rest, predicated) in enumerate(code):
        target = re.match(r"(0x[0-9a-f]+)", rest)
        if not (op.startswith("BRA") and predicated and target) or int(target.group(1), 16) >= addr:
            continue
        body = [c for c in code[:i + 1] if c[0] >= int(target.group(1), 16)]
        if any(c[1].startswith("HGMMA") for c in body) and not any(c[1] == "EXIT" for c in body):
            out.append(body)
    return sorted(out, key=len)


def summary(body: list[tuple[int, str, str, bool]]) -> dict:
    """Counts of each class of CLASSES in a loop body, its length, and its events in order:
    runs of HGMMA as [n HGMMA], a wait as `wait`, a program-wide barrier as `BAR`, runs of
    exponentials as (n EX2), runs of tile loads as {n TMA} / {n LDGSTS}."""
    counts = {name: sum(op.startswith(prefix) for _, op, _, _ in body) for name, prefix in CLASSES}
    events, last = [], None
    for _, op, _, _ in body:
        kind = next((name for name, prefix in CLASSES if op.startswith(prefix)), None)
        if kind is None:
            continue
        if kind == last and kind in ("HGMMA", "MUFU.EX2", "TMA loads", "pointer loads"):
            events[-1][1] += 1
        else:
            events.append([kind, 1])
        last = kind
    label = {"HGMMA": "[{} HGMMA]", "waits": "wait", "BAR.SYNC": "BAR", "MUFU.EX2": "({} EX2)",
             "TMA loads": "{{{} TMA}}", "pointer loads": "{{{} LDGSTS}}"}
    order = " ".join(label[k].format(n) for k, n in events)  # ("wait", "BAR": no count)
    return {**counts, "instructions": len(body), "order": order}


HGMMA_SHAPE = re.compile(r"HGMMA\.(\d+)x(\d+)x(\d+)")
HMMA_SHAPE = re.compile(r"HMMA\.(\d\d)(\d)(\d+)\.")  # HMMA.16816: one warp's m16 n8 k16
LDSM_COUNT = re.compile(r"LDSM\.16\.MT?88(?:\.(\d))?")  # one warp's 1, 2 or 4 8 x 8 matrices
# Hopper's rates per SM and clock (NVIDIA's H100 figures): dense bf16 multiply-adds of the
# matrix units, bytes read from shared memory, MUFU.EX2 results, warp instructions issued
# (four schedulers)
FMA_PER_CLOCK, SMEM_BYTES_PER_CLOCK, EX2_PER_CLOCK, ISSUE_PER_CLOCK = 2048, 128, 16, 4


def budget(body: list[tuple[int, str, str, bool]], warps: int) -> dict:
    """Clocks that one step of a loop body asks of an SM at Hopper's peak rates, if its
    program had the SM alone: "tensor" (each HGMMA one warp group's m x n x k product, made
    by each of the program's warp groups; each HMMA, the older mma.sync, one warp's, made by
    each warp, counted at the same peak, which mma.sync does not reach on Hopper), "smem" (the
    bf16 operands those products read from shared memory: an HGMMA's B always and its A
    unless it comes from registers; the 8 x 8 matrices that LDSM loads into registers for
    HMMA), "ex2" (each thread's MUFU.EX2) and "issue" (each warp's instructions); and the
    eight most frequent opcodes per thread. A model of the code, not a timing."""
    group_fmas = group_bytes = warp_fmas = warp_bytes = 0
    for _, op, rest, _ in body:
        # (the listing's opcode stops at the shape's "x": HGMMA.64 | x128x16.F32.BF16 R24, ...)
        shape = HGMMA_SHAPE.match(op + rest)
        if shape:
            m, n, k = map(int, shape.groups())
            a_operand = rest.split(None, 1)[1].split(",")[1].strip()  # dst, A, B, ...
            group_fmas += m * n * k
            group_bytes += 2 * (n * k + (m * k if a_operand.startswith("gdesc") else 0))
        elif mma := HMMA_SHAPE.match(op):
            m, n, k = map(int, mma.groups())
            warp_fmas += m * n * k
        elif ldsm := LDSM_COUNT.match(op):
            warp_bytes += int(ldsm.group(1) or 1) * 8 * 8 * 2
    groups = max(warps // 4, 1)
    ex2 = sum(op.startswith("MUFU.EX2") for _, op, _, _ in body)
    top = collections.Counter(op.split(".")[0] for _, op, _, _ in body).most_common(8)
    return {"tensor": (group_fmas * groups + warp_fmas * warps) / FMA_PER_CLOCK,
            "smem": (group_bytes * groups + warp_bytes * warps) / SMEM_BYTES_PER_CLOCK,
            "ex2": ex2 * warps * 32 / EX2_PER_CLOCK, "issue": len(body) * warps / ISSUE_PER_CLOCK, "top": top}


def _compile_ws(kernel: str, signature: dict, d: int, block_m: int, block_n: int, warps: int,
                stages: int, ws: bool):
    """warp_specialize.py's `kernel` at head dim d, compiled for sm_90 (bf16), its loop
    warp-specialized or not; signature: its runtime arguments' types."""
    spec = importlib.util.spec_from_file_location("vitflash_ws_probe", Path(__file__).with_name("warp_specialize.py"))
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    consts = dict(HEAD_DIM=d, BLOCK_M=block_m, BLOCK_N=block_n, WS=ws)
    signature = {**signature, **dict.fromkeys(consts, "constexpr")}
    return triton.compile(ASTSource(fn=getattr(probe, kernel), signature=signature, constexprs=consts),
                          target=GPUTarget("cuda", 90, 32), options=dict(num_warps=warps, num_stages=stages))


def compile_ws_fwd(d: int, block_m: int, block_n: int, warps: int, stages: int, ws: bool):
    """warp_specialize.py's TMA forward, its key loop warp-specialized or not."""
    signature = dict(O="*bf16", LSE="*fp32", QD=f"tensordesc<bf16[1,{block_m},{d}]>",
                     KD=f"tensordesc<bf16[1,{block_n},{d}]>", qk_scale="fp32", H="i32", N="i32")
    return _compile_ws("fwd_tma", signature, d, block_m, block_n, warps, stages, ws)


def compile_ws_bwd(d: int, block_m: int, block_n: int, warps: int, stages: int, ws: bool):
    """warp_specialize.py's dK/dV program, its query loop warp-specialized or not."""
    signature = dict(DK="*bf16", DV="*bf16", LSE="*fp32", DELTA="*fp32",
                     QD=f"tensordesc<bf16[1,{block_m},{d}]>", DOD=f"tensordesc<bf16[1,{block_m},{d}]>",
                     KD=f"tensordesc<bf16[1,{block_n},{d}]>", qk_scale="fp32", sm_scale="fp32", H="i32", N="i32")
    return _compile_ws("bwd_dkdv_tma", signature, d, block_m, block_n, warps, stages, ws)


WS_OPS = ("ws_fwd", "ws_bwd")
SHORT = ("fwd_short", "bwd_short")


def table(op: str, d: int, configs: str, tma: bool, n_seq: int, part: int, with_budget: bool = False,
          short: dict | None = None) -> str:
    """The markdown table of every loop of each configuration (BLOCK_M x BLOCK_N x warps x
    stages; the backward's BLOCK_M1 x BLOCK_N1 in launch form `part`; ws_fwd: each
    configuration without and with warp specialization; the short kernels: BLOCK_M x warps,
    compiled with `short`'s options of registers.compile_short); with_budget: then a table of
    each loop's budget()."""
    short = short or {}
    if op in WS_OPS:
        title = (f"warp_specialize.py's {'TMA forward' if op == 'ws_fwd' else 'dK/dV program'}, D = {d}, "
                 "without and with warp specialization")
    elif op in SHORT:
        n_seq = n_seq or 65
        title = (f"the short {'forward' if op == 'fwd_short' else 'backward'}, D = {d}, N = {n_seq}"
                 + "".join(f", {k}={v}" for k, v in short.items() if v))
    else:
        fwd = op == "fwd_general"
        form = "" if fwd else f", launch {('one (PART 0)', 'dK/dV (PART 1)', 'dQ (PART 2)')[part]}"
        title = (f"the general {'forward' if fwd else 'backward'}{form}, D = {d}, tiles loaded by "
                 f"{'TMA' if tma else 'pointers'}" + (f", the tail tiles of N = {n_seq}" if n_seq else ""))
    head = [f"triton {triton.__version__}, sm_90; {title}", "",
            "| tiles | warps | stages | loop | instructions | " + " | ".join(n for n, _ in CLASSES)
            + " | order of events |",
            "|---|---|---|---|---|" + "---|" * len(CLASSES) + "---|"]
    budgets = ["", "What one step of each loop asks of an SM at peak rates, in clocks (`budget`: a model "
               "of the code, not a timing)", "",
               "| tiles | warps | loop | tensor | shared-memory reads | MUFU.EX2 | issue | reads / tensor | "
               "EX2 / tensor | issue / tensor | most frequent opcodes, per thread |",
               "|---|---|---|---|---|---|---|---|---|---|---|"]
    for config in configs.split(","):
        if op in SHORT:  # BLOCK_M x warps: one stage, the keys all on chip
            m, warps = map(int, config.split("x"))
            n, stages = n_seq, 1
        else:
            m, n, warps, stages = map(int, config.split("x"))
        for ws in ((False, True) if op in WS_OPS else (None,)):
            tiles = f"{m} x {n}" + ("" if ws is None else f", warp_specialize={ws}")
            try:
                compiled = (compile_ws_fwd(d, m, n, warps, stages, ws) if op == "ws_fwd"
                            else compile_ws_bwd(d, m, n, warps, stages, ws) if op == "ws_bwd"
                            else compile_short(op[:3], d, n, m, warps, tma=tma, **short) if op in SHORT
                            else compile_general_fwd(d, m, n, warps, stages, tma, n_seq=n_seq) if op == "fwd_general"
                            else compile_general_bwd(d, m, n, warps, stages, part, tma, n=n_seq))
            except RuntimeError as err:  # a compiler pass that aborts
                first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
                head.append(f"| {tiles} | {warps} | {stages} | - | does not compile: {first} |"
                            + " |" * len(CLASSES) + " |")
                continue
            if ws and "ttg.warp_specialize" in compiled.asm["ttgir"]:
                tiles += " (split into partitions)"
            bodies = loops(instructions(assemble(compiled)[1]))
            if not bodies:  # the short forward: one pass over its keys
                head.append(f"| {tiles} | {warps} | {stages} | - | no loop with matrix products |"
                            + " |" * len(CLASSES) + " |")
            for i, body in enumerate(bodies):
                s = summary(body)
                head.append(f"| {tiles} | {warps} | {stages} | {i + 1} | {s['instructions']} | "
                            + " | ".join(str(s[name]) for name, _ in CLASSES) + f" | {s['order']} |")
                b = budget(body, warps)
                t = b["tensor"] or float("nan")
                budgets.append(f"| {tiles} | {warps} | {i + 1} | {b['tensor']:.0f} | {b['smem']:.0f} | {b['ex2']:.0f} | "
                               f"{b['issue']:.0f} | {b['smem'] / t:.2f} | {b['ex2'] / t:.2f} | {b['issue'] / t:.2f} | "
                               + ", ".join(f"{name} {count}" for name, count in b["top"]) + " |")
    return "\n".join(head + (budgets if with_budget else [])) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--op", choices=("fwd_general", "bwd_general", *WS_OPS) + SHORT, default="fwd_general")
    p.add_argument("--d", type=int, default=128)
    p.add_argument("--configs", default="128x128x8x3",
                   help="BLOCK_M x BLOCK_N x warps x stages (the backward's BLOCK_M1 x BLOCK_N1; the short "
                        "kernels' BLOCK_M x warps), comma-separated")
    p.add_argument("--tma", action="store_true", help="the general_tma twin (tiles by TMA descriptors)")
    p.add_argument("--n", type=int, default=0, help="the sequence length whose tail tiles the kernel has (0: none)")
    p.add_argument("--part", type=int, choices=(0, 1, 2), default=1,
                   help="the backward's launch form: 0 both program kinds, 1 dK/dV, 2 dQ")
    p.add_argument("--budget", action="store_true",
                   help="also what one step of each loop asks of an SM at Hopper's peak rates, in clocks")
    p.add_argument("--one-key", action="store_true", help="the short kernels' one-key-tail twin")
    p.add_argument("--key-per-chunk", action="store_true", help="the short backward's KEY_PER_CHUNK form")
    p.add_argument("--maxnreg", type=int, default=0, help="the short kernels' register cap (0: none)")
    args = p.parse_args(argv)
    short = dict(one_key=args.one_key, key_per_chunk=args.key_per_chunk, maxnreg=args.maxnreg)
    if args.op not in SHORT and any(short.values()):
        p.error("--one-key, --key-per-chunk and --maxnreg apply to --op fwd_short and bwd_short")
    if args.op == "fwd_short" and short.pop("key_per_chunk"):
        p.error("--key-per-chunk applies to --op bwd_short (the forward has no such form)")
    print(table(args.op, args.d, args.configs, args.tma, args.n, args.part, args.budget,
                short if args.op in SHORT else None), end="")


if __name__ == "__main__":
    main()
