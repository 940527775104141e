"""A Gluon backward for Hopper (dK/dV and dQ kernels), against the tuned Triton one and cuDNN.

The kernels here are a first form, compiled for sm_90 but not yet run on a GPU; they join
vitflash/ops/hopper.py (and the backward's candidates) only once this probe has held it to
the FA2 rule there and timed it ahead.

Each program owns BLOCK_N keys of one (batch, head): K and V stay in shared memory while the
query tiles stream past through a ring of STAGES TMA buffers (Q and dO, an mbarrier each).
One step, in the transposed form that keeps the key rows in the accumulators' rows:
S^T = K Q_i^T and dP^T = V dO_i^T are issued together as asynchronous wgmma products; once
S^T is in, P^T = exp2(S^T * qk_scale - LSE_i) (the forward's base-2 row statistics, broadcast
along the columns) goes to the tensor cores as dV += P^T dO_i while dP^T finishes; then
dS^T = P^T * (dP^T - delta_i) and dK += dS^T Q_i. dK is scaled by the softmax scale once, at the
end. dQ has a kernel of its own in the forward's shape (Q and dO resident, K and V streaming:
dQ += dS K_j), so the two never add into the same rows and nothing is atomic.

On a Hopper GPU: at each shape, each configuration's gradients under the FA2 rule (against
float64, beside bf16 naive attention's own error; LSE from vitflash's forward, delta from
torch), then timed by `triton.testing.do_bench_cudagraph`, `--repeats` times, median and
min-max, beside vitflash's tuned forward and the whole forward+backward of vitflash and of
cuDNN (SDPA), in the same process; the table sums the fastest dK/dV and dQ configurations,
the delta and vitflash's forward into one forward+backward set against theirs.

    python benchmarks/probes/gluon_bwd.py --out <dir> [--shapes 4,16,4097,128 ...] \
        [--configs 64x128x2x8 ...] [--dq-configs 64x64x2x4 ...] [--repeats 3]

With --compile (no GPU needed): each configuration compiled for sm_90 by the installed
triton and assembled by its ptxas (registers, spills, shared memory, wgmma and barrier counts).

    python benchmarks/probes/gluon_bwd.py --compile --d 128 --configs 64x128x2x8

Configurations are BLOCK_M x BLOCK_N x STAGES x warps (--configs: dK/dV, where each warp
group of 4 owns 64 of the BLOCK_N keys; --dq-configs: dQ, 64 of the BLOCK_M queries).
"""
from __future__ import annotations

import contextlib
import json
import math
import statistics
import sys
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from gluon_fwd import (compile_header, hopper_env, probe_parser, require_gluon,  # noqa: E402
                       sass_cells, timed, write_out)
from vitflash.ops import hopper  # noqa: E402

if hopper.available():
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait)

    _load, _program = hopper._load, hopper._program  # rows [j * ROWS, (j + 1) * ROWS) by TMA; the program's place

    @gluon.jit
    def bwd_dkdv_kernel(q_desc, kv_desc, do_desc, dkv_desc, LSE, DELTA, qk_scale, sm_scale, H, N,
                        HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                        STAGES: gl.constexpr, num_warps: gl.constexpr):
        """dK and dV of BLOCK_N keys of one (batch, head). Descriptors: qkv as (B, N, 3 * H * D)
        in (1, BLOCK_M, D) boxes (q_desc) and (1, BLOCK_N, D) boxes (kv_desc), do as
        (B, N, H * D) in (1, BLOCK_M, D) boxes, dqkv like qkv in (1, BLOCK_N, D) boxes (dkv_desc).
        LSE: the forward's base-2 log-sum-exp, DELTA: rowsum(dO * O), both (B, H, N) fp32."""
        row0, bh, b, q_col, k_col, v_col = _program(N, H, HEAD_DIM, BLOCK_N)
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
        tma.async_copy_global_to_shared(kv_desc, [b, row0, k_col], kv_bar, k_smem)
        tma.async_copy_global_to_shared(kv_desc, [b, row0, v_col], kv_bar, v_smem)
        n_tiles = gl.cdiv(N, BLOCK_M)
        for i in gl.static_range(STAGES):
            if i < n_tiles:
                _load(q_desc, b, i, q_col, q_bars.index(i), q_smem.index(i),
                           BLOCK_M, HEAD_DIM)
                _load(do_desc, b, i, q_col, do_bars.index(i), do_smem.index(i),
                           BLOCK_M, HEAD_DIM)

        t_zero = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, t_layout)
        dk = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, acc_layout)
        dv = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, acc_layout)
        cols0 = gl.arange(0, BLOCK_M, layout=col_t)
        k2 = k_smem.reshape([BLOCK_N, HEAD_DIM])
        v2 = v_smem.reshape([BLOCK_N, HEAD_DIM])
        base = bh.to(gl.int64) * N
        # queries past N: an infinite LSE makes their probabilities 0 (their rows are zeros)
        lse = gl.load(LSE + base + cols0, mask=cols0 < N, other=float("inf"))
        delta = gl.load(DELTA + base + cols0, mask=cols0 < N, other=0.0)
        mbarrier.wait(kv_bar, 0)
        for i in range(n_tiles):
            stage = i % STAGES
            phase = (i // STAGES) & 1
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
            # the next tile's statistics, loaded while the two products finish
            cols = (i + 1) * BLOCK_M + cols0
            lse = gl.load(LSE + base + cols, mask=cols < N, other=float("inf"))
            delta = gl.load(DELTA + base + cols, mask=cols < N, other=0.0)
            dv, dk = warpgroup_mma_wait(num_outstanding=0, deps=(dv, dk))
            if i + STAGES < n_tiles:  # every warp is past its reads of this stage's buffers
                hopper._cta_barrier()
                _load(q_desc, b, i + STAGES, q_col, q_bars.index(stage),
                           q_smem.index(stage), BLOCK_M, HEAD_DIM)
                _load(do_desc, b, i + STAGES, q_col, do_bars.index(stage),
                           do_smem.index(stage), BLOCK_M, HEAD_DIM)

        mbarrier.invalidate(kv_bar)
        for i in gl.static_range(STAGES):
            mbarrier.invalidate(q_bars.index(i))
            mbarrier.invalidate(do_bars.index(i))
        # dK, then dV, through one staging buffer (keys past N are outside the bounds: not written)
        out = gl.allocate_shared_memory(dtype, [1, BLOCK_N, HEAD_DIM], dkv_desc.layout)
        out.reshape([BLOCK_N, HEAD_DIM]).store((dk * sm_scale).to(dtype))
        fence_async_shared()
        tma.async_copy_shared_to_global(dkv_desc, [b, row0, k_col], out)
        tma.store_wait(pendings=0)
        hopper._cta_barrier()
        out.reshape([BLOCK_N, HEAD_DIM]).store(dv.to(dtype))
        fence_async_shared()
        tma.async_copy_shared_to_global(dkv_desc, [b, row0, v_col], out)
        tma.store_wait(pendings=0)

    @gluon.jit
    def bwd_dq_kernel(q_desc, kv_desc, do_desc, dq_desc, LSE, DELTA, qk_scale, sm_scale, H, N,
                      HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                      STAGES: gl.constexpr, num_warps: gl.constexpr):
        """dQ of BLOCK_M queries of one (batch, head): Q and dO stay in shared memory while the
        key tiles stream past (K and V in a ring of STAGES TMA buffers). S = Q K_j^T and
        dP = dO V_j^T issued together; P = exp2(S * qk_scale - LSE), dS = P * (dP - delta),
        dQ += dS K_j. Keys past N need no mask: their K rows are read as zeros, so their dS
        adds nothing. Descriptors as bwd_dkdv_kernel's, with K/V boxes of BLOCK_N rows and
        dq_desc (dqkv) of BLOCK_M."""
        row0, bh, b, q_col, k_col, v_col = _program(N, H, HEAD_DIM, BLOCK_M)
        dtype: gl.constexpr = kv_desc.dtype
        nbytes: gl.constexpr = dtype.primitive_bitwidth // 8

        s_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, BLOCK_N, 16])
        acc_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, HEAD_DIM, 16])
        op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
        row_s: gl.constexpr = gl.SliceLayout(1, s_layout)

        q_smem = gl.allocate_shared_memory(dtype, [1, BLOCK_M, HEAD_DIM], q_desc.layout)
        do_smem = gl.allocate_shared_memory(dtype, [1, BLOCK_M, HEAD_DIM], do_desc.layout)
        k_smem = gl.allocate_shared_memory(dtype, [STAGES, 1, BLOCK_N, HEAD_DIM], kv_desc.layout)
        v_smem = gl.allocate_shared_memory(dtype, [STAGES, 1, BLOCK_N, HEAD_DIM], kv_desc.layout)
        qdo_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        k_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        mbarrier.init(qdo_bar, count=1)
        for i in gl.static_range(STAGES):
            mbarrier.init(k_bars.index(i), count=1)
            mbarrier.init(v_bars.index(i), count=1)
        fence_async_shared()

        mbarrier.expect(qdo_bar, 2 * BLOCK_M * HEAD_DIM * nbytes)
        tma.async_copy_global_to_shared(q_desc, [b, row0, q_col], qdo_bar, q_smem)
        tma.async_copy_global_to_shared(do_desc, [b, row0, q_col], qdo_bar, do_smem)
        n_tiles = gl.cdiv(N, BLOCK_N)
        for i in gl.static_range(STAGES):
            if i < n_tiles:
                _load(kv_desc, b, i, k_col, k_bars.index(i), k_smem.index(i),
                           BLOCK_N, HEAD_DIM)
                _load(kv_desc, b, i, v_col, v_bars.index(i), v_smem.index(i),
                           BLOCK_N, HEAD_DIM)

        rows = row0 + gl.arange(0, BLOCK_M, layout=row_s)
        base = bh.to(gl.int64) * N
        # rows past N: zeros of Q and dO, so any finite statistics do; their dQ is not written
        lse = gl.load(LSE + base + rows, mask=rows < N, other=0.0)
        delta = gl.load(DELTA + base + rows, mask=rows < N, other=0.0)
        s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
        dq = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, acc_layout)
        q2 = q_smem.reshape([BLOCK_M, HEAD_DIM])
        do2 = do_smem.reshape([BLOCK_M, HEAD_DIM])
        mbarrier.wait(qdo_bar, 0)
        for j in range(n_tiles):
            stage = j % STAGES
            phase = (j // STAGES) & 1
            mbarrier.wait(k_bars.index(stage), phase)
            k2 = k_smem.index(stage).reshape([BLOCK_N, HEAD_DIM])
            s = warpgroup_mma(q2, k2.permute((1, 0)), s_zero, use_acc=False, is_async=True)
            mbarrier.wait(v_bars.index(stage), phase)
            v2 = v_smem.index(stage).reshape([BLOCK_N, HEAD_DIM])
            dp = warpgroup_mma(do2, v2.permute((1, 0)), s_zero, use_acc=False, is_async=True)
            s = warpgroup_mma_wait(num_outstanding=1, deps=(s, ))
            p = gl.exp2(s * qk_scale - gl.expand_dims(lse, 1))
            dp = warpgroup_mma_wait(num_outstanding=0, deps=(dp, ))
            ds = p * (dp - gl.expand_dims(delta, 1))
            dq = warpgroup_mma(gl.convert_layout(ds.to(dtype), op_layout), k2, dq, is_async=True)
            dq = warpgroup_mma_wait(num_outstanding=0, deps=(dq, ))
            if j + STAGES < n_tiles:  # every warp is past its reads of this stage's buffers
                hopper._cta_barrier()
                _load(kv_desc, b, j + STAGES, k_col, k_bars.index(stage),
                           k_smem.index(stage), BLOCK_N, HEAD_DIM)
                _load(kv_desc, b, j + STAGES, v_col, v_bars.index(stage),
                           v_smem.index(stage), BLOCK_N, HEAD_DIM)

        mbarrier.invalidate(qdo_bar)
        for i in gl.static_range(STAGES):
            mbarrier.invalidate(k_bars.index(i))
            mbarrier.invalidate(v_bars.index(i))
        out = gl.allocate_shared_memory(dtype, [1, BLOCK_M, HEAD_DIM], dq_desc.layout)
        out.reshape([BLOCK_M, HEAD_DIM]).store((dq * sm_scale).to(dtype))
        fence_async_shared()
        tma.async_copy_shared_to_global(dq_desc, [b, row0, q_col], out)
        tma.store_wait(pendings=0)


# dK/dV configurations (128x128x2x8 at D = 64 compiles with 120 bytes of spills a thread:
# not listed), and dQ ones
DEFAULT_CONFIGS = {64: ["64x128x2x8", "64x64x2x4"], 128: ["64x128x2x8", "64x64x2x4"]}
DQ_CONFIGS = {64: ["64x64x2x4", "128x64x2x8", "64x128x2x4"], 128: ["64x64x2x4", "128x64x2x8"]}
SHAPES = ["64,12,577,64", "8,12,4097,64", "32,16,577,128", "4,16,4097,128"]


def parse_config(text: str, kernel: str = "dkdv") -> tuple[int, int, int, int]:
    """"MxNxSxW" -> (BLOCK_M, BLOCK_N, STAGES, warps): for the dK/dV kernel warps = BLOCK_N / 16
    (a warp group a 64 keys), for the dQ kernel BLOCK_M / 16 (a warp group a 64 queries)."""
    m, n, s, w = (int(x) for x in text.split("x"))
    rows, what = (n, "keys") if kernel == "dkdv" else (m, "queries")
    if w * 16 != rows:
        raise ValueError(f"{text}: {w} warps for {rows} {what}; each warp group of 4 takes 64 {what}")
    return m, n, s, w


def _sig(d: int, bm: int, bn: int, kernel: str) -> dict:
    def desc(rows: int) -> str:
        return f"tensordesc<bf16[1,{rows},{d}],{hopper._layout(rows, d, torch.bfloat16)!r}>"

    out = dict(dkv_desc=desc(bn)) if kernel == "dkdv" else dict(dq_desc=desc(bm))
    return dict(q_desc=desc(bm), kv_desc=desc(bn), do_desc=desc(bm), **out,
                LSE="*fp32", DELTA="*fp32", qk_scale="fp32", sm_scale="fp32", H="i32", N="i32",
                HEAD_DIM="constexpr", BLOCK_M="constexpr", BLOCK_N="constexpr",
                STAGES="constexpr", num_warps="constexpr")


def compile_sm90(d: int, cfg: tuple[int, int, int, int], kernel: str = "dkdv"):
    """bwd_dkdv_kernel (or bwd_dq_kernel) compiled for sm_90 (bf16) by the installed triton,
    no GPU needed."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    bm, bn, stages, warps = cfg
    consts = dict(HEAD_DIM=d, BLOCK_M=bm, BLOCK_N=bn, STAGES=stages, num_warps=warps)
    fn = bwd_dkdv_kernel if kernel == "dkdv" else bwd_dq_kernel
    src = GluonASTSource(fn=fn, signature=_sig(d, bm, bn, kernel), constexprs=consts)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=warps))


def compile_rows(d: int, configs: list[str], dq_configs: list[str]) -> list[str]:
    rows = compile_header(d)
    for kernel, text in [("dkdv", c) for c in configs] + [("dq", c) for c in dq_configs]:
        cells = sass_cells(compile_sm90(d, parse_config(text, kernel), kernel))
        rows.append("| " + " | ".join([f"{kernel} {text}", *cells]) + " |")
    return rows


def gluon_grads(qkv, do, lse, delta, scale: float, cfg: tuple[int, int, int, int], kernel: str,
                dqkv: torch.Tensor | None = None) -> torch.Tensor:
    """dqkv (B, N, 3, H, D) with one kernel's gradients filled in: dK and dV ("dkdv") or dQ
    ("dq"); the rest NaN in a new tensor, or what `dqkv` held."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    bm, bn, stages, warps = cfg
    B, N, _, H, D = qkv.shape
    dqkv = torch.full_like(qkv, float("nan")) if dqkv is None else dqkv

    def desc(t, rows):  # as hopper.descriptors makes the forward's: (B, N, the rest)
        t = t.view(B, N, -1)
        return TensorDescriptor(t, list(t.shape), list(t.stride()), [1, rows, D],
                                hopper._layout(rows, D, t.dtype))

    fn, out_rows, tile = ((bwd_dkdv_kernel, bn, bn) if kernel == "dkdv" else (bwd_dq_kernel, bm, bm))
    grid = (triton.cdiv(N, tile) * B * H, )
    fn[grid](desc(qkv, bm), desc(qkv, bn), desc(do, bm), desc(dqkv, out_rows), lse, delta,
             scale * 1.4426950408889634, scale, H, N, D, bm, bn, stages, num_warps=warps)
    return dqkv


def reference_grads(qkv, do, scale, dtype) -> list[torch.Tensor]:
    """dQ, dK, dV (B, N, H, D) of naive attention in `dtype` arithmetic, one batch at a time."""
    grads = [[], [], []]
    for x, g in zip(qkv.unbind(0), do.unbind(0)):
        q, k, v = (t.transpose(0, 1).to(dtype).requires_grad_() for t in x.unbind(1))
        o = ((q @ k.transpose(-1, -2)) * scale).softmax(-1) @ v
        for acc, t in zip(grads, torch.autograd.grad(o, (q, k, v), g.transpose(0, 1).to(dtype))):
            acc.append(t.transpose(0, 1))
    return [torch.stack(t) for t in grads]


DEVICE = "cuda"  # (the CPU tests of check's arithmetic set "cpu")


def _inputs(shape, seed: int | None = 0):
    """qkv, do, and the forward's LSE (vitflash's) and delta = rowsum(dO * O) (B, H, N)."""
    from vitflash.ops import flash
    B, H, N, D = shape
    gen = torch.Generator(device=DEVICE).manual_seed(seed or 0)
    qkv = torch.randn(B, N, 3, H, D, device=DEVICE, generator=gen).to(torch.bfloat16)
    do = torch.randn(B, N, H, D, device=DEVICE, generator=gen).to(torch.bfloat16)
    o, lse = flash._forward(qkv, D ** -0.5)
    delta = (o.float() * do.float()).sum(-1).transpose(1, 2).contiguous()
    return qkv, do, lse, delta


def check(shape, configs: list[str], dq_configs: list[str]) -> dict:
    """Every configuration's gradients under the FA2 rule (keyed "dkdv <config>", "dq <config>")."""
    qkv, do, lse, delta = _inputs(shape)
    scale = shape[3] ** -0.5
    ref = reference_grads(qkv, do, scale, torch.float64)
    low = reference_grads(qkv, do, scale, torch.bfloat16)
    out = {}
    for kernel, text in [("dkdv", c) for c in configs] + [("dq", c) for c in dq_configs]:
        name = f"{kernel} {text}"
        try:
            dqkv = gluon_grads(qkv, do, lse, delta, scale, parse_config(text, kernel), kernel)
            torch.cuda.synchronize()
        except Exception as err:  # a configuration that does not compile or fit: named
            out[name] = {"ok": False, "error": str(err).splitlines()[0][:200]}
            continue
        row = {"ok": True}
        for g in ((1, 2) if kernel == "dkdv" else (0, )):
            err = (dqkv[:, :, g].double() - ref[g]).abs().max().item()
            naive = (low[g].double() - ref[g]).abs().max().item()
            grad = ("dq", "dk", "dv")[g]
            row[f"{grad}_err"], row[f"{grad}_naive_err"] = err, naive
            row["ok"] &= math.isfinite(err) and err <= 2 * naive + 1e-5
        out[name] = row
    return out


def time_shape(shape, ok: dict, repeats: int) -> dict:
    """GPU ms of each configuration that kept to the rule, of the delta it needs (torch), of
    vitflash's tuned forward, and of vitflash's and cuDNN's (SDPA) forward+backward, each the
    median of do_bench_cudagraph, `repeats` times."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import torch.nn.functional as F
    from vitflash.ops import flash_attention_qkvpacked
    B, H, N, D = shape
    scale = D ** -0.5
    qkv, do, lse, delta = _inputs(shape, seed=1)
    o = torch.randn(B, N, H, D, device="cuda", dtype=torch.bfloat16)
    dqkv = torch.empty_like(qkv)
    cases = {}
    for name, r in ok.items():
        if r.get("ok"):
            kernel, text = name.split()
            cfg = parse_config(text, kernel)
            cases[f"gluon {name}"] = (lambda cfg=cfg, kernel=kernel:
                                      gluon_grads(qkv, do, lse, delta, scale, cfg, kernel, dqkv))
    cases["delta (torch)"] = lambda: (o.float() * do.float()).sum(-1)
    # the whole ops, forward inside the captured calls (as bench_attention.py times them)
    leaf = qkv.detach().requires_grad_()
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    g = do.transpose(1, 2)

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v)

    cases["flash forward"] = lambda: flash_attention_qkvpacked(qkv)
    cases["flash forward+backward"] = lambda: torch.autograd.grad(flash_attention_qkvpacked(leaf), leaf, do)
    cases["cuDNN forward+backward"] = lambda: torch.autograd.grad(cudnn(), (q, k, v), g)
    result = {}
    for name, fn in cases.items():
        with torch.no_grad() if name == "flash forward" else contextlib.nullcontext():
            ms = timed(fn, repeats)
        result[name] = {"ms": statistics.median(ms), "ms_min": min(ms), "ms_max": max(ms)}
    return result


def main(argv=None) -> None:
    p = probe_parser(__doc__, SHAPES, 128)
    p.add_argument("--configs", nargs="+", default=None,
                   help="the dK/dV kernel's BLOCK_M x BLOCK_N x STAGES x warps (default: per head dim)")
    p.add_argument("--dq-configs", nargs="+", default=None, help="the dQ kernel's, likewise")
    args = p.parse_args(argv)
    require_gluon()
    if args.compile:
        print("\n".join(compile_rows(args.d, args.configs or DEFAULT_CONFIGS[args.d],
                                      args.dq_configs or DQ_CONFIGS[args.d])))
        return
    env = hopper_env()
    rows, results = [], []
    for text in args.shapes:
        shape = tuple(int(x) for x in text.split(","))
        d = shape[3]
        ok = check(shape, args.configs or DEFAULT_CONFIGS[d], args.dq_configs or DQ_CONFIGS[d])
        times = time_shape(shape, ok, args.repeats)
        results.append({"shape": shape, "check": ok, "times": times})
        print(json.dumps(results[-1]), flush=True)
        cell = lambda t: f"{t['ms']:.3f} ({t['ms_min']:.3f}-{t['ms_max']:.3f})"  # noqa: E731
        for name, t in times.items():
            rows.append(f"| {shape} | {name} | {cell(t)} |")
        rows += [f"| {shape} | {name}: outside the rule or failed: {r} | - |" for name, r in ok.items()
                 if not r.get("ok")]
        best = {k: min((t["ms"] for n, t in times.items() if n.startswith(f"gluon {k} ")), default=None)
                for k in ("dkdv", "dq")}
        if None not in best.values():
            total = best["dkdv"] + best["dq"] + times["delta (torch)"]["ms"] + times["flash forward"]["ms"]
            rows.append(f"| {shape} | **flash forward + Gluon backward (best dK/dV + best dQ + delta)** | "
                        f"{total:.3f}: {times['flash forward+backward']['ms'] / total:.2f}x flash's "
                        f"forward+backward, {times['cuDNN forward+backward']['ms'] / total:.2f}x cuDNN's |")
    table = ["# Gluon backward (dK/dV and dQ kernels) against the tuned backward and cuDNN", "",
             f"Command: `python {' '.join(sys.argv)}`", "", env + "; bf16; do_bench_cudagraph "
             f"median of each repeat; ms median (min-max) of {args.repeats}. The Gluon rows are one "
             "kernel each; the last row of a shape sums the fastest of each with the delta and "
             "flash's forward, against the whole forward+backward of flash and of cuDNN.", "",
             "| (B, H, N, D) | case | ms |", "|---|---|---|", *rows]
    print("\n".join(table))
    write_out(args.out, "gluon_bwd", table, results)


if __name__ == "__main__":
    main()
