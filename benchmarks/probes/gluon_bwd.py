"""A Gluon dK/dV backward for Hopper, against the tuned Triton backward and cuDNN: a probe.

The kernel here is a first form, compiled for sm_90 but not yet run on a GPU; it joins
vitflash/ops/hopper.py (and the backward's candidates) only once this probe has held it to
the FA2 rule there and timed it ahead.

Each program owns BLOCK_N keys of one (batch, head): K and V stay in shared memory while the
query tiles stream past through a ring of STAGES TMA buffers (Q and dO, an mbarrier each).
One step, in the transposed form that keeps the key rows in the accumulators' rows:
S^T = K Q_i^T and dP^T = V dO_i^T are issued together as asynchronous wgmma products; once
S^T is in, P^T = exp2(S^T * qk_scale - LSE_i) (the forward's base-2 row statistics, broadcast
along the columns) goes to the tensor cores as dV += P^T dO_i while dP^T finishes; then
dS^T = P^T * (dP^T - delta_i) and dK += dS^T Q_i. dK is scaled by the softmax scale once, at the
end. dQ is not computed here: with it, a plan would run the Triton backward's dQ launch (a
split candidate's, which also computes delta) and this kernel for dK and dV.

On a Hopper GPU: at each shape, dK and dV of each configuration under the FA2 rule (against
float64, beside bf16 naive attention's own error; LSE from vitflash's forward, delta from
torch), then timed by `triton.testing.do_bench_cudagraph`, `--repeats` times, median and
min-max, beside vitflash's whole tuned backward and cuDNN's (SDPA), in the same process.

    python benchmarks/probes/gluon_bwd.py --out <dir> [--shapes 4,16,4097,128 ...] \
        [--configs 64x128x2x4 ...] [--repeats 3]

With --compile (no GPU needed): each configuration compiled for sm_90 by the installed
triton and assembled by its ptxas (registers, spills, shared memory, wgmma and barrier counts).

    python benchmarks/probes/gluon_bwd.py --compile --d 128 --configs 64x128x2x8

Configurations are BLOCK_M x BLOCK_N x STAGES x warps; each warp group of 4 warps owns 64
of the BLOCK_N keys (warps = BLOCK_N / 16).
"""
from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
from collections import Counter
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from gluon_fwd import assemble  # noqa: E402
from vitflash.ops import hopper  # noqa: E402

if hopper.available():
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait)

    @gluon.jit
    def _load_rows(desc, b, row, col, bar, buf, ROWS: gl.constexpr, HEAD_DIM: gl.constexpr):
        """Rows [row, row + ROWS) of one head's columns from `col` into `buf`, signalling
        `bar` when they land (rows past the batch's N read as zeros)."""
        mbarrier.expect(bar, ROWS * HEAD_DIM * desc.dtype.primitive_bitwidth // 8)
        tma.async_copy_global_to_shared(desc, [b, row, col], bar, buf)

    @gluon.jit
    def bwd_dkdv_kernel(q_desc, kv_desc, do_desc, dkv_desc, LSE, DELTA, qk_scale, sm_scale, H, N,
                        HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                        STAGES: gl.constexpr, num_warps: gl.constexpr):
        """dK and dV of BLOCK_N keys of one (batch, head). Descriptors: qkv as (B, N, 3 * H * D)
        in (1, BLOCK_M, D) boxes (q_desc) and (1, BLOCK_N, D) boxes (kv_desc), do as
        (B, N, H * D) in (1, BLOCK_M, D) boxes, dqkv like qkv in (1, BLOCK_N, D) boxes (dkv_desc).
        LSE: the forward's base-2 log-sum-exp, DELTA: rowsum(dO * O), both (B, H, N) fp32."""
        n_n = gl.cdiv(N, BLOCK_N)
        pid = gl.program_id(0)
        pid_n = pid % n_n
        bh = pid // n_n
        b = bh // H
        h = bh % H
        q_col = h * HEAD_DIM
        k_col = (H + h) * HEAD_DIM
        v_col = (2 * H + h) * HEAD_DIM
        dtype: gl.constexpr = kv_desc.dtype
        nbytes: gl.constexpr = dtype.primitive_bitwidth // 8

        # (keys, queries) tiles and (keys, head dim) accumulators, each warp group 64 key rows
        t_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, BLOCK_M, 16])
        acc_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, HEAD_DIM, 16])
        op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
        col_t: gl.constexpr = gl.SliceLayout(0, t_layout)

        k_smem = gl.allocate_shared_memory(dtype, [1, BLOCK_N, HEAD_DIM], kv_desc.layout)
        v_smem = gl.allocate_shared_memory(dtype, [1, BLOCK_N, HEAD_DIM], kv_desc.layout)
        q_smem = gl.allocate_shared_memory(dtype, [STAGES, 1, BLOCK_M, HEAD_DIM], q_desc.layout)
        do_smem = gl.allocate_shared_memory(dtype, [STAGES, 1, BLOCK_M, HEAD_DIM], do_desc.layout)
        kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        q_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        do_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        mbarrier.init(kv_bar, count=1)
        for i in gl.static_range(STAGES):
            mbarrier.init(q_bars.index(i), count=1)
            mbarrier.init(do_bars.index(i), count=1)
        fence_async_shared()

        mbarrier.expect(kv_bar, 2 * BLOCK_N * HEAD_DIM * nbytes)
        tma.async_copy_global_to_shared(kv_desc, [b, pid_n * BLOCK_N, k_col], kv_bar, k_smem)
        tma.async_copy_global_to_shared(kv_desc, [b, pid_n * BLOCK_N, v_col], kv_bar, v_smem)
        n_tiles = gl.cdiv(N, BLOCK_M)
        for i in gl.static_range(STAGES):
            if i < n_tiles:
                _load_rows(q_desc, b, i * BLOCK_M, q_col, q_bars.index(i), q_smem.index(i),
                           BLOCK_M, HEAD_DIM)
                _load_rows(do_desc, b, i * BLOCK_M, q_col, do_bars.index(i), do_smem.index(i),
                           BLOCK_M, HEAD_DIM)

        t_zero = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, t_layout)
        dk = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, acc_layout)
        dv = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, acc_layout)
        cols0 = gl.arange(0, BLOCK_M, layout=col_t)
        k2 = k_smem.reshape([BLOCK_N, HEAD_DIM])
        v2 = v_smem.reshape([BLOCK_N, HEAD_DIM])
        base = bh.to(gl.int64) * N
        mbarrier.wait(kv_bar, 0)
        for i in range(n_tiles):
            stage = i % STAGES
            phase = (i // STAGES) & 1
            cols = i * BLOCK_M + cols0
            # queries past N: an infinite LSE makes their probabilities 0 (their rows are zeros)
            lse = gl.load(LSE + base + cols, mask=cols < N, other=float("inf"))
            delta = gl.load(DELTA + base + cols, mask=cols < N, other=0.0)
            mbarrier.wait(q_bars.index(stage), phase)
            q2 = q_smem.index(stage).reshape([BLOCK_M, HEAD_DIM])
            st = warpgroup_mma(k2, q2.permute((1, 0)), t_zero, use_acc=False, is_async=True)
            mbarrier.wait(do_bars.index(stage), phase)
            do2 = do_smem.index(stage).reshape([BLOCK_M, HEAD_DIM])
            dpt = warpgroup_mma(v2, do2.permute((1, 0)), t_zero, use_acc=False, is_async=True)
            st = warpgroup_mma_wait(num_outstanding=1, deps=(st, ))
            pt = gl.exp2(st * qk_scale - gl.expand_dims(lse, 0))
            dv = warpgroup_mma(gl.convert_layout(pt.to(dtype), op_layout), do2, dv, is_async=True)
            dpt = warpgroup_mma_wait(num_outstanding=1, deps=(dpt, ))
            dst = pt * (dpt - gl.expand_dims(delta, 0))
            dk = warpgroup_mma(gl.convert_layout(dst.to(dtype), op_layout), q2, dk, is_async=True)
            dv, dk = warpgroup_mma_wait(num_outstanding=0, deps=(dv, dk))
            if i + STAGES < n_tiles:  # every warp is past its reads of this stage's buffers
                hopper._cta_barrier()
                _load_rows(q_desc, b, (i + STAGES) * BLOCK_M, q_col, q_bars.index(stage),
                           q_smem.index(stage), BLOCK_M, HEAD_DIM)
                _load_rows(do_desc, b, (i + STAGES) * BLOCK_M, q_col, do_bars.index(stage),
                           do_smem.index(stage), BLOCK_M, HEAD_DIM)

        mbarrier.invalidate(kv_bar)
        for i in gl.static_range(STAGES):
            mbarrier.invalidate(q_bars.index(i))
            mbarrier.invalidate(do_bars.index(i))
        # dK, then dV, through one staging buffer (keys past N are outside the bounds: not written)
        out = gl.allocate_shared_memory(dtype, [1, BLOCK_N, HEAD_DIM], dkv_desc.layout)
        out.reshape([BLOCK_N, HEAD_DIM]).store((dk * sm_scale).to(dtype))
        fence_async_shared()
        tma.async_copy_shared_to_global(dkv_desc, [b, pid_n * BLOCK_N, k_col], out)
        tma.store_wait(pendings=0)
        hopper._cta_barrier()
        out.reshape([BLOCK_N, HEAD_DIM]).store(dv.to(dtype))
        fence_async_shared()
        tma.async_copy_shared_to_global(dkv_desc, [b, pid_n * BLOCK_N, v_col], out)
        tma.store_wait(pendings=0)

# (128x128x2x8 at D = 64 compiles with 120 bytes of spills a thread: not listed)
DEFAULT_CONFIGS = {64: ["64x128x2x8", "64x64x2x4"], 128: ["64x128x2x8", "64x64x2x4"]}
SHAPES = ["64,12,577,64", "8,12,4097,64", "32,16,577,128", "4,16,4097,128"]


def parse_config(text: str) -> tuple[int, int, int, int]:
    """"MxNxSxW" -> (BLOCK_M, BLOCK_N, STAGES, warps), warps = BLOCK_N / 16 (a warp group a
    64 keys)."""
    m, n, s, w = (int(x) for x in text.split("x"))
    if w * 16 != n:
        raise ValueError(f"{text}: {w} warps for {n} keys; each warp group of 4 takes 64 keys")
    return m, n, s, w


def _sig(d: int, bm: int, bn: int) -> dict:
    def desc(rows: int) -> str:
        return f"tensordesc<bf16[1,{rows},{d}],{hopper._layout(rows, d, torch.bfloat16)!r}>"

    return dict(q_desc=desc(bm), kv_desc=desc(bn), do_desc=desc(bm), dkv_desc=desc(bn),
                LSE="*fp32", DELTA="*fp32", qk_scale="fp32", sm_scale="fp32", H="i32", N="i32",
                HEAD_DIM="constexpr", BLOCK_M="constexpr", BLOCK_N="constexpr",
                STAGES="constexpr", num_warps="constexpr")


def compile_sm90(d: int, cfg: tuple[int, int, int, int]):
    """bwd_dkdv_kernel compiled for sm_90 (bf16) by the installed triton, no GPU needed."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    bm, bn, stages, warps = cfg
    consts = dict(HEAD_DIM=d, BLOCK_M=bm, BLOCK_N=bn, STAGES=stages, num_warps=warps)
    src = GluonASTSource(fn=bwd_dkdv_kernel, signature=_sig(d, bm, bn), constexprs=consts)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=warps))


def compile_rows(d: int, configs: list[str]) -> list[str]:
    rows = [f"triton {triton.__version__}, sm_90, D = {d}, bf16", "",
            "| config | registers | spill bytes | shared KiB | HGMMA | wgmma waits | BAR.SYNC | "
            "mbarrier waits |", "|---|---|---|---|---|---|---|---|"]
    for text in configs:
        compiled = compile_sm90(d, parse_config(text))
        report, sass = assemble(compiled)
        ops = Counter(re.findall(r"^\s+/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)",
                                 sass, flags=re.M))
        count = lambda prefix: sum(v for k, v in ops.items() if k.startswith(prefix))  # noqa: E731
        regs = re.search(r"Used (\d+) registers", report).group(1)
        spills = re.search(r"(\d+) bytes spill stores", report).group(1)
        rows.append(f"| {text} | {regs} | {spills} | {compiled.metadata.shared / 1024:.0f} | "
                    f"{count('HGMMA')} | {count('WARPGROUP.DEPBAR')} | {count('BAR.SYNC')} | "
                    f"{count('SYNCS.PHASECHK')} |")
    return rows


def dkdv(qkv, do, lse, delta, scale: float, cfg: tuple[int, int, int, int]) -> torch.Tensor:
    """dqkv with this kernel's dK and dV (dQ left NaN)."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    bm, bn, stages, warps = cfg
    B, N, _, H, D = qkv.shape
    dqkv = torch.full_like(qkv, float("nan"))
    flat = qkv.view(B, N, 3 * H * D)

    def desc(t, rows):  # as hopper.descriptors makes the forward's
        return TensorDescriptor(t, list(t.shape), list(t.stride()), [1, rows, D],
                                hopper._layout(rows, D, t.dtype))

    grid = (triton.cdiv(N, bn) * B * H, )
    bwd_dkdv_kernel[grid](desc(flat, bm), desc(flat, bn), desc(do.view(B, N, H * D), bm),
                          desc(dqkv.view(B, N, 3 * H * D), bn), lse, delta,
                          scale * 1.4426950408889634, scale, H, N, D, bm, bn, stages, num_warps=warps)
    return dqkv


def reference_grads(qkv, do, scale, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """dK, dV (B, N, H, D) of naive attention in `dtype` arithmetic, one batch at a time."""
    dks, dvs = [], []
    for x, g in zip(qkv.unbind(0), do.unbind(0)):
        q, k, v = (t.transpose(0, 1).to(dtype).requires_grad_() for t in x.unbind(1))
        o = ((q @ k.transpose(-1, -2)) * scale).softmax(-1) @ v
        dk, dv = torch.autograd.grad(o, (k, v), g.transpose(0, 1).to(dtype))
        dks.append(dk.transpose(0, 1))
        dvs.append(dv.transpose(0, 1))
    return torch.stack(dks), torch.stack(dvs)


def check(shape, configs: list[str]) -> dict:
    """Every configuration's dK and dV under the FA2 rule."""
    from vitflash.ops import flash
    B, H, N, D = shape
    gen = torch.Generator(device="cuda").manual_seed(0)
    qkv = torch.randn(B, N, 3, H, D, device="cuda", generator=gen).to(torch.bfloat16)
    do = torch.randn(B, N, H, D, device="cuda", generator=gen).to(torch.bfloat16)
    scale = D ** -0.5
    o, lse = flash._forward(qkv, scale)
    delta = (o.float() * do.float()).sum(-1).transpose(1, 2).contiguous()  # (B, H, N)
    ref = reference_grads(qkv, do, scale, torch.float64)
    low = reference_grads(qkv, do, scale, torch.bfloat16)
    out = {}
    for text in configs:
        try:
            dqkv = dkdv(qkv, do, lse, delta, scale, parse_config(text))
            torch.cuda.synchronize()
        except Exception as err:  # a configuration that does not compile or fit: named
            out[text] = {"error": str(err).splitlines()[0][:200]}
            continue
        row = {"ok": True}
        for name, got, r, lo in (("dk", dqkv[:, :, 1], ref[0], low[0]), ("dv", dqkv[:, :, 2], ref[1], low[1])):
            err = (got.double() - r).abs().max().item()
            naive = (lo.double() - r).abs().max().item()
            row[f"{name}_err"], row[f"{name}_naive_err"] = err, naive
            row["ok"] &= math.isfinite(err) and err <= 2 * naive + 1e-5
        out[text] = row
    return out


def time_shape(shape, configs: list[str], ok: dict, repeats: int) -> dict:
    """GPU ms of each checked configuration, of vitflash's tuned backward (dQ, dK, dV) and of
    cuDNN's backward (SDPA), each the median of do_bench_cudagraph, `repeats` times."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import torch.nn.functional as F
    from vitflash.ops import flash, flash_attention_qkvpacked
    B, H, N, D = shape
    scale = D ** -0.5
    qkv = torch.randn(B, N, 3, H, D, device="cuda", dtype=torch.bfloat16)
    do = torch.randn(B, N, H, D, device="cuda", dtype=torch.bfloat16)
    o, lse = flash._forward(qkv, scale)
    delta = (o.float() * do.float()).sum(-1).transpose(1, 2).contiguous()
    cases = {}
    for text in configs:
        if ok.get(text, {}).get("ok"):
            cfg = parse_config(text)
            cases[f"gluon dK/dV {text}"] = lambda cfg=cfg: dkdv(qkv, do, lse, delta, scale, cfg)
    leaf = qkv.detach().requires_grad_()
    out_f = flash_attention_qkvpacked(leaf)
    cases["flash backward (tuned, dQ dK dV)"] = lambda: torch.autograd.grad(out_f, leaf, do, retain_graph=True)
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        out_c = F.scaled_dot_product_attention(q, k, v)
    g = do.transpose(1, 2)
    cases["cuDNN backward (dQ dK dV)"] = lambda: torch.autograd.grad(out_c, (q, k, v), g, retain_graph=True)
    result = {}
    for name, fn in cases.items():
        fn()
        torch.cuda.synchronize()
        ms = [triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median") for _ in range(repeats)]
        result[name] = {"ms": statistics.median(ms), "ms_min": min(ms), "ms_max": max(ms)}
    return result


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", nargs="+", default=SHAPES, help="B,H,N,D")
    p.add_argument("--configs", nargs="+", default=None, help="BLOCK_M x BLOCK_N x STAGES x warps")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--compile", action="store_true", help="compile for sm_90 only (no GPU)")
    p.add_argument("--d", type=int, default=128, help="--compile: the head dim")
    args = p.parse_args(argv)
    if not hopper.available():
        sys.exit(f"Gluon does not import in triton {triton.__version__}: {hopper._IMPORT_ERROR}")
    if args.compile:
        print("\n".join(compile_rows(args.d, args.configs or DEFAULT_CONFIGS[args.d])))
        return
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        sys.exit("needs a Hopper GPU (compute capability 9.x); --compile needs none")
    env = (f"{torch.cuda.get_device_name()}; torch {torch.__version__}, triton "
           f"{triton.__version__}, cuDNN {torch.backends.cudnn.version()}")
    rows, results = [], []
    for text in args.shapes:
        shape = tuple(int(x) for x in text.split(","))
        configs = args.configs or DEFAULT_CONFIGS[shape[3]]
        ok = check(shape, configs)
        times = time_shape(shape, configs, ok, args.repeats)
        results.append({"shape": shape, "check": ok, "times": times})
        print(json.dumps(results[-1]), flush=True)
        for name, t in times.items():
            fails = "" if not name.startswith("gluon") else ("" if ok[name.split()[-1]]["ok"] else " (outside the rule)")
            rows.append(f"| {shape} | {name}{fails} | {t['ms']:.3f} ({t['ms_min']:.3f}-{t['ms_max']:.3f}) |")
        rows += [f"| {shape} | {c}: {r} | - |" for c, r in ok.items() if not r.get("ok")]
    table = ["# Gluon dK/dV backward against the tuned backward and cuDNN", "",
             f"Command: `python {' '.join(sys.argv)}`", "", env + "; bf16; do_bench_cudagraph "
             f"median of each repeat; ms median (min-max) of {args.repeats}. The Gluon rows are "
             "dK and dV alone; the others all three gradients.", "",
             "| (B, H, N, D) | case | ms |", "|---|---|---|", *rows]
    print("\n".join(table))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gluon_bwd.md").write_text("\n".join(table) + "\n")
        (args.out / "gluon_bwd.json").write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
