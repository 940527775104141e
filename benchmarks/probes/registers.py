"""Probe: registers, spills and shared memory of the short kernels compiled for Hopper, and how
many programs of each fit on one SM. Runs on the CPU: Triton compiles for sm_90 without a GPU,
and its bundled ptxas reports what it allocated.

`--op bwd_general` compiles the general backward (kernels.bwd_kernel) instead, at the
configurations of --configs (BLOCK_M1 x BLOCK_N1 x warps x stages; BLOCK_M2 = BLOCK_N1 and
BLOCK_N2 = BLOCK_M1, as listed), each in its three forms: both program kinds in one launch
(PART = 0) and each kind alone (PART = 1, dK/dV; PART = 2, dQ), the two launches of a split
candidate (launch.split_twins); --tma for the general_tma twins; --maxnreg applies here too:

    python benchmarks/probes/registers.py --op bwd_general --d 64 --configs 32x128x4x3,64x64x4x3 --tma

--n N gives the backward the tail programs of length N where the op uses them
(flash._bwd_tails); --tails-anyway gives them at every head dim, to see what they would cost
where the op leaves them out (a 16-column second chunk, or past 128 columns):

    python benchmarks/probes/registers.py --op bwd_general --d 80 --configs 32x64x4x3 --tma --n 577 --tails-anyway

`--op fwd_general` does the same for the general forward (kernels.fwd_kernel; --configs as
BLOCK_M x BLOCK_N x warps x stages).

    python benchmarks/probes/registers.py --op fwd --d 64 --n 65 --tiles 64x4,32x4 --maxnreg 0,128,160

--tiles lists BLOCK_M x warps, each with an optional number of software-pipeline stages
(Triton's `num_stages`; 1, what every listed short candidate has, if not given: "16x4s2"; the
backward's loop over query chunks is the one loop they pipeline); --maxnreg lists register
caps per thread (0: the compiler's choice), passed to Triton as its `maxnreg` option; --tma
compiles the forward's short_tma twin, whose tiles come through TMA descriptors; --one-key the
twin for N = 2^k + 1 (either op, and with --tma), whose one key past the tile is done in
vector arithmetic (a tail of BLOCK_T = 1).
Programs per SM: the fewest that registers (64K a SM, allocated per warp in steps of 8 a
thread), shared memory (228 KiB, 1 KiB of it reserved per program) and the 64-warp limit allow.

    python benchmarks/probes/registers.py --op bwd --d 64 --n 65 --tiles 32x4,16x4 --one-key

--dropout traces attention dropout into the short kernels: with and without it, the two
tables show what the dropout mask costs in registers and in machine instructions.

`--plans B,H,N,D ...` (a GPU only) runs the op at those shapes and reads the registers and
spills of the binaries the tuner chose back from the driver: the check of the tables above.

Pointer parameters are compiled 16-byte aligned, as the JIT compiles every launch whose
tensors start at aligned addresses (all of vitflash's: see pointer_attrs). --unaligned drops
that, which is how this probe compiled before 2026-12-02: its tables from then
(results/registers_sm90_*.md) overstate the registers, spills and instructions of the
pointer loads.
"""
from __future__ import annotations

import argparse
import itertools
import re
import subprocess
import tempfile
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from vitflash.ops import flash, kernels, launch

PTXAS = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
CUOBJDUMP = PTXAS.with_name("cuobjdump")
SIGNATURES = {
    "fwd": dict(QKV="*bf16", O="*bf16", LSE="*fp32", SEED="*i64", qk_scale="fp32", drop_p="fp32",
                H="i32", N="i32"),
    "bwd": dict(QKV="*bf16", O="*bf16", DO="*bf16", LSE="*fp32", DQKV="*bf16", SEED="*i64",
                qk_scale="fp32", sm_scale="fp32", drop_p="fp32", H="i32", N="i32"),
}


def pointer_attrs(fn, signature: dict, aligned: bool = True) -> dict:
    """Triton's attributes for fn's pointer parameters: 16-byte alignment (`tt.divisibility`
    16), which the JIT specializes on when a launch's tensors start at aligned addresses, as
    every fresh torch allocation does and as launch.Launch requires of its direct launches.
    Without it the compiler cannot prove a row's elements contiguous and aligned, and loads
    them one by one through a pointer each: more registers and instructions than the
    binaries that run (aligned=False, --unaligned: what this probe compiled before
    2026-12-02)."""
    if not aligned:
        return {}
    return {(fn.arg_names.index(k),): [["tt.divisibility", 16]]
            for k, v in signature.items() if v.startswith("*")}


def compile_short(op: str, d: int, n: int, block_m: int, warps: int, maxnreg: int = 0,
                  tma: bool = False, one_key: bool = False, dropout: bool = False,
                  aligned: bool = True, key_per_chunk: bool = False, stages: int = 1):
    """The short forward or backward at head dim d, length n and a BLOCK_M-row tile, compiled
    for sm_90 (bf16, one head per program; attention dropout traced in if dropout). tma: the
    forward's "short_tma" twin, its tiles loaded through TMA descriptors. one_key: the
    one-key-tail twin (launch.short_fwd / short_bwd(..., one_key=True)). aligned: pointer
    parameters 16-byte aligned, as the JIT compiles them (pointer_attrs). key_per_chunk: the
    backward's KEY_PER_CHUNK form (its register-capped twin's). stages: Triton's num_stages."""
    bd, bd2 = launch.split_d(d)
    head = dict(HEAD_DIM=d, BLOCK_D=bd, BLOCK_D2=bd2, BLOCK_M=block_m,
                BLOCK_MT=launch.tail_tile(n, block_m), DROPOUT=dropout, DIAG=False)
    signature = dict(SIGNATURES[op])
    if op == "fwd":
        tiles = launch.short_fwd(n, block_m, warps, one_key=one_key).meta  # one head, 1 stage
        tiles.pop("BLOCK_M")
        fn, consts = kernels.fwd_short_kernel, {**head, **tiles, "TMA": tma}
        # the descriptors come after the pointers, before the scalars
        scalars = {k: v for k, v in signature.items() if not v.startswith("*")}
        signature = {k: v for k, v in signature.items() if v.startswith("*")}
        # one descriptor parameter per box height (and its second-chunk twin): those of the
        # heights the tiles have, as the launcher passes them; None (a constexpr) elsewhere
        heights = {consts["BLOCK_M"], consts["BLOCK_MT"], consts["BLOCK_N"],
                   consts["BLOCK_T"] * consts["HAS_TAIL"], consts["BLOCK_T2"]}
        for rows in launch.BOX_HEIGHTS:
            for suffix, width in (("", bd), ("_2", bd2)):
                name = f"D{rows}{suffix}"
                if tma and rows in heights and width:
                    signature[name] = f"tensordesc<bf16[1,{rows},{width}]>"
                else:
                    signature[name], consts[name] = "constexpr", None
        signature.update(scalars)
    else:
        if tma:
            raise ValueError("only the forward has a TMA twin")
        tiles = {"KEY_PER_CHUNK": int(key_per_chunk),
                 **launch.short_bwd(n, block_m, warps, one_key=one_key).meta}
        tiles.pop("BLOCK_M")
        fn, consts = kernels.bwd_short_kernel, {**head, **tiles}
    signature.update(dict.fromkeys(consts, "constexpr"))
    options = _options(warps, stages, maxnreg)
    source = ASTSource(fn=fn, signature=signature, constexprs=consts,
                       attrs=pointer_attrs(fn, signature, aligned))
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)


def _descriptors(signature: dict, boxes, bd: int, bd2: int, tma: bool) -> dict:
    """Add each descriptor parameter of `boxes` ((name, rows) pairs) and its second-chunk
    twin (name + "2") to signature: with tma, a bf16 descriptor of (1, rows, chunk width);
    else, and for a missing second chunk, a None constexpr, as the launcher passes it.
    Returns those constexprs."""
    consts = {}
    for name, rows in boxes:
        for desc, width in ((name, bd), (name + "2", bd2)):
            if tma and width:
                signature[desc] = f"tensordesc<bf16[1,{rows},{width}]>"
            else:
                signature[desc], consts[desc] = "constexpr", None
    return consts


def compile_general_bwd(d: int, block_m1: int, block_n1: int, warps: int, stages: int,
                        part: int, tma: bool = False, aligned: bool = True, maxnreg: int = 0,
                        n: int = 0, tails_anyway: bool = False):
    """kernels.bwd_kernel at head dim d with tiles (BLOCK_M1, BLOCK_N1, BLOCK_N1, BLOCK_M1),
    compiled for sm_90 (bf16, no dropout) as launch PART `part`; tma: the general_tma twin,
    its tiles through descriptors in boxes of the two tile heights (flash._backward); n: the
    sequence length whose tail tiles it has (flash._bwd_tails; 0: none); tails_anyway: those
    tiles even at the head dims where flash._bwd_tails leaves them out."""
    bd, bd2 = launch.split_d(d)
    signature = dict(QKV="*bf16", O="*bf16", DO="*bf16", LSE="*fp32", DELTA="*fp32", DQKV="*bf16",
                     SEED="*i64")
    consts = _descriptors(signature, (("QKV_S", block_m1), ("QKV_L", block_n1), ("DO_S", block_m1),
                                      ("DO_L", block_n1)), bd, bd2, tma)
    signature.update(qk_scale="fp32", sm_scale="fp32", drop_p="fp32", BH="i32", H="i32", N="i32")
    consts.update(HEAD_DIM=d, BLOCK_D=bd, BLOCK_D2=bd2, BLOCK_M1=block_m1, BLOCK_N1=block_n1,
                  BLOCK_M2=block_n1, BLOCK_N2=block_m1, DROPOUT=False, TMA=tma, DIAG=False,
                  PART=part, DQ_DELTA=part == 2)
    if n:
        (flash.bwd_tail_tiles if tails_anyway else flash._bwd_tails)(consts, n)
    else:
        consts.update(BLOCK_NT1=0, BLOCK_MT2=0)
    signature.update({k: "constexpr" for k in consts})
    source = ASTSource(fn=kernels.bwd_kernel, signature=signature, constexprs=consts,
                       attrs=pointer_attrs(kernels.bwd_kernel, signature, aligned))
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=_options(warps, stages, maxnreg))


def compile_general_fwd(d: int, block_m: int, block_n: int, warps: int, stages: int,
                        tma: bool = False, aligned: bool = True, maxnreg: int = 0, n_seq: int = 0,
                        tail_ahead: bool = False):
    """kernels.fwd_kernel at head dim d with (BLOCK_M, BLOCK_N) tiles and the tail tile of
    sequence length n_seq as flash._fwd_launches sets it (0: a 16-key tail tile), compiled
    for sm_90 (bf16, no dropout); tma: the general_tma twin, Q in BLOCK_M-row and K, V in
    BLOCK_N-row descriptor boxes (flash._fwd_descriptors); tail_ahead: the TAIL_AHEAD twin
    (launch.tail_ahead_twins)."""
    bd, bd2 = launch.split_d(d)
    signature = dict(QKV="*bf16", O="*bf16", LSE="*fp32", SEED="*i64")
    consts = _descriptors(signature, (("Q_DESC", block_m), ("KV_DESC", block_n)), bd, bd2, tma)
    signature.update(qk_scale="fp32", drop_p="fp32", H="i32", N="i32")
    block_t = launch.tail_tile(n_seq, block_n) if n_seq else 16
    consts.update(HEAD_DIM=d, BLOCK_D=bd, BLOCK_D2=bd2, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_T=block_t,
                  DROPOUT=False, TMA=tma, DIAG=False, TAIL_AHEAD=tail_ahead)
    signature.update({k: "constexpr" for k in consts})
    source = ASTSource(fn=kernels.fwd_kernel, signature=signature, constexprs=consts,
                       attrs=pointer_attrs(kernels.fwd_kernel, signature, aligned))
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=_options(warps, stages, maxnreg))


def _options(warps: int, stages: int, maxnreg: int) -> dict:
    """Triton's compile options; maxnreg only where set (0: the compiler's choice)."""
    return dict(num_warps=warps, num_stages=stages, **({"maxnreg": maxnreg} if maxnreg else {}))


def assemble(compiled) -> tuple[str, str]:
    """(ptxas's report, the SASS as cuobjdump lists it) of a kernel compiled for sm_90: its
    PTX assembled for sm_90a by Triton's bundled ptxas."""
    with tempfile.TemporaryDirectory() as tmp:
        ptx = Path(tmp) / "k.ptx"
        ptx.write_text(compiled.asm["ptx"])
        cubin = ptx.with_suffix(".cubin")
        report = subprocess.run([str(PTXAS), "-arch=sm_90a", "-v", str(ptx), "-o", str(cubin)],
                                capture_output=True, text=True, check=True).stderr
        sass = subprocess.run([str(CUOBJDUMP), "-sass", str(cubin)], capture_output=True, text=True,
                              check=True).stdout
    return report, sass


def usage(compiled, warps: int) -> dict:
    """ptxas's registers and spill bytes for the compiled kernel, its shared memory, the
    programs per SM these allow, and its length in machine instructions (SASS, as cuobjdump
    lists it: the code, not how often each instruction runs), and how many of those are
    asynchronous global-to-shared copies (LDGSTS: loads the software pipeliner issues ahead)."""
    report, sass = assemble(compiled)
    opcodes = re.findall(r"^\s+/\*[0-9a-f]{4,}\*/\s+(\S+)", sass, flags=re.M)
    regs = int(re.search(r"Used (\d+) registers", report).group(1))
    spills = int(re.search(r"(\d+) bytes spill stores", report).group(1))
    smem = compiled.metadata.shared
    per_warp = (regs + 7) // 8 * 8 * 32
    programs = min(65536 // (per_warp * warps), 228 * 1024 // (smem + 1024), 64 // warps)
    return dict(registers=regs, spill_bytes=spills, smem_kib=smem / 1024, programs_per_sm=programs,
                instructions=len(opcodes), async_copies=sum(o.startswith("LDGSTS") for o in opcodes))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--op", choices=("fwd", "bwd", "bwd_general", "fwd_general"), default="fwd")
    p.add_argument("--d", type=int, default=64)
    p.add_argument("--n", type=lambda s: [int(x) for x in s.split(",")], default=None,
                   help="sequence lengths (default 65); bwd_general, fwd_general: the first one's "
                        "tail tiles (default: none; the forward a 16-key one)")
    p.add_argument("--tiles", default="64x4,32x4",
                   help="BLOCK_M x warps [s stages], comma-separated: 64x4,16x4s2")
    p.add_argument("--maxnreg", default="0", help="register caps, comma-separated (0: none)")
    p.add_argument("--tma", action="store_true", help="the forward's short_tma twin (tiles by TMA)")
    p.add_argument("--one-key", action="store_true",
                   help="the twin whose one key past the tile is vector arithmetic (N = 2^k + 1)")
    p.add_argument("--dropout", action="store_true", help="the short kernels with attention dropout traced in")
    p.add_argument("--configs", default="32x128x4x3,64x64x4x3",
                   help="bwd_general: BLOCK_M1 x BLOCK_N1 x warps x stages; fwd_general: "
                        "BLOCK_M x BLOCK_N x warps x stages; comma-separated")
    p.add_argument("--tail-ahead", action="store_true",
                   help="fwd_general: the TAIL_AHEAD twin (its tail tile loaded before the loop)")
    p.add_argument("--tails-anyway", action="store_true",
                   help="bwd_general with --n: the tail programs even at the head dims where the op "
                        "leaves them out (flash._bwd_tails)")
    p.add_argument("--key-per-chunk", action="store_true",
                   help="bwd with --one-key: the KEY_PER_CHUNK form (the register-capped twin's)")
    p.add_argument("--unaligned", action="store_true",
                   help="pointer parameters without their 16-byte alignment (not what the JIT compiles)")
    p.add_argument("--plans", nargs="+", metavar="B,H,N,D",
                   help="on a GPU: the registers of the binaries the tuner chose at these shapes")
    args = p.parse_args(argv)
    args.n_given, args.n = args.n is not None, args.n or [65]
    if args.plans:
        return plans_table(args.plans)
    aligned = not args.unaligned
    if args.op in ("bwd_general", "fwd_general"):
        return general_table(args.op, args.d, args.configs, args.tma, aligned,
                             [int(c) for c in args.maxnreg.split(",")], args.n[0] if args.n_given else 0,
                             args.tail_ahead, args.tails_anyway)
    twin = "".join(f" ({name})" for name, on in (("short_tma", args.tma), ("one-key tail", args.one_key),
                                                  ("dropout", args.dropout), ("KEY_PER_CHUNK", args.key_per_chunk),
                                                  ("unaligned", args.unaligned)) if on)
    print(f"triton {triton.__version__}, sm_90; {args.op}{twin}, D = {args.d}")
    print("| N | BLOCK_M | warps | stages | cap | registers | spill bytes | shared KiB | programs / SM "
          "| SASS instructions | of them async copies (LDGSTS) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for n in args.n:
        for tile in args.tiles.split(","):
            block_m, warps, stages = parse_tile(tile)
            for cap in map(int, args.maxnreg.split(",")):
                u = usage(compile_short(args.op, args.d, n, block_m, warps, cap, args.tma, args.one_key,
                                        args.dropout, aligned, args.key_per_chunk, stages), warps)
                print(f"| {n} | {block_m} | {warps} | {stages} | {cap or '-'} | {u['registers']} "
                      f"| {u['spill_bytes']} | {u['smem_kib']:.0f} | {u['programs_per_sm']} "
                      f"| {u['instructions']} | {u['async_copies']} |", flush=True)


def parse_tile(text: str) -> tuple[int, int, int]:
    """"64x4" -> (64, 4, 1); "16x4s2" -> (16, 4, 2): BLOCK_M, warps, pipeline stages."""
    tile, _, stages = text.partition("s")
    try:
        block_m, warps = map(int, tile.split("x"))
        if stages and int(stages) < 1:
            raise ValueError
        return block_m, warps, int(stages or 1)
    except ValueError:
        raise SystemExit(f"--tiles {text!r}: expected BLOCK_MxWARPS[sSTAGES], e.g. 64x4 or 16x4s2") from None


def plans_table(shapes: list[str]) -> None:
    """Run the flash op forward and backward at each B,H,N,D (bf16, on the GPU) and list the
    launches of the plans the tuner chose, with the registers and spills (local memory per
    thread: Triton's n_spills, which counts 4-byte words) of each binary as the JIT compiled
    it: what the tables above predict, read back from the driver."""
    import torch

    from vitflash.ops import flash, flash_attention_qkvpacked

    if not torch.cuda.is_available():
        raise SystemExit("--plans runs the op on a CUDA GPU; none is available here.")
    print(f"triton {triton.__version__}, {torch.cuda.get_device_name()}: the tuner's plans as compiled by the JIT")
    print("| (B, H, N, D) | op | kernel | constexprs | warps | stages | cap | registers | local bytes |")
    print("|---|---|---|---|---|---|---|---|---|")
    for text in shapes:
        B, H, N, D = (int(x) for x in text.split(","))
        qkv = torch.randn((B, N, 3, H, D), device="cuda", dtype=torch.bfloat16, requires_grad=True)
        flash_attention_qkvpacked(qkv).float().square().sum().backward()
        torch.cuda.synchronize()
        for key, plan in flash._plans.items():
            if key[3:7] != (B, N, H, D):
                continue
            for launch_ in plan:
                ck = launch_.compiled
                consts = " ".join(f"{k}={v}" for k, v in launch_.consts.items()
                                  if k.startswith(("BLOCK_M", "BLOCK_N", "PART", "TMA", "KEY_PER"))
                                  and v is not None)
                local = getattr(ck, "n_spills", None)
                print(f"| {(B, H, N, D)} | {key[0]} | {launch_.kernel.__name__} | {consts} | {launch_.num_warps} "
                      f"| {launch_.num_stages} | {launch_.options.get('maxnreg', '-')} | {getattr(ck, 'n_regs', '?')} "
                      f"| {'?' if local is None else 4 * local} |",
                      flush=True)


def general_table(op: str, d: int, configs: str, tma: bool, aligned: bool = True,
                  caps: list[int] = (0,), n_seq: int = 0, tail_ahead: bool = False,
                  tails_anyway: bool = False) -> None:
    """The table of --op bwd_general (each configuration in its three launch forms) or
    fwd_general, at each register cap of `caps` (0: none), with the tail tiles of sequence
    length n_seq (0: none in the backward, a 16-key one in the forward); tail_ahead: the
    forward's TAIL_AHEAD twin; tails_anyway: the backward's tail programs at any head dim."""
    fwd = op == "fwd_general"
    loads = "TMA (general_tma)" if tma else "pointers (general)"
    pointers = "" if aligned else ", pointers unaligned"
    tails = f", the tail tiles of N = {n_seq}" if n_seq else ""
    tails += " (at any head dim)" if n_seq and tails_anyway and not fwd else ""
    tails += ", the tail loaded ahead (TAIL_AHEAD)" if fwd and tail_ahead else ""
    print(f"triton {triton.__version__}, sm_90; the general {'forward' if fwd else 'backward'}, D = {d}, "
          f"tiles loaded by {loads}{pointers}{tails}")
    tiles, launch_col = ("BLOCK_M x BLOCK_N", "") if fwd else ("BLOCK_M1 x BLOCK_N1", " launch |")
    print(f"| {tiles} | warps | stages |{launch_col} cap | registers | spill bytes | shared KiB | programs / SM |")
    print("|---|---|---|" + "---|" * (5 if fwd else 6))
    parts = ((None, ""),) if fwd else ((0, " one (PART 0) |"), (1, " dK/dV (PART 1) |"), (2, " dQ (PART 2) |"))
    for config in configs.split(","):
        m, n, warps, stages = map(int, config.split("x"))
        for (part, name), cap in itertools.product(parts, caps):
            compiled = (compile_general_fwd(d, m, n, warps, stages, tma, aligned, cap, n_seq, tail_ahead) if fwd
                        else compile_general_bwd(d, m, n, warps, stages, part, tma, aligned, cap,
                                                 n_seq, tails_anyway))
            u = usage(compiled, warps)
            print(f"| {m} x {n} | {warps} | {stages} |{name} {cap or '-'} | {u['registers']} | {u['spill_bytes']} "
                  f"| {u['smem_kib']:.0f} | {u['programs_per_sm']} |", flush=True)

if __name__ == "__main__":
    main()
