"""The Gluon backward for Hopper (vitflash/ops/hopper.py: the dK/dV and dQ kernels), each
kernel called directly at several configurations, against the tuned op and cuDNN.

The op lists the kernels as its "gluon_bwd" candidates (launch.gluon_candidates); this probe
is where their configurations are compared one kernel at a time.

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
group of 4 owns 64 of the BLOCK_N keys; --dq-configs: dQ, 64 of the BLOCK_M queries), with an
"o" suffix for the form whose products into dV and dK (dQ) finish behind the next step's and
(dQ) a "d" suffix for the form that computes delta itself. --atomic-configs: the
nondeterministic kernel that adds each step's dQ share atomically (bwd_atomic_kernel, below;
D = 64; timed slower than the two deterministic kernels, not listed by the op; a "t" suffix:
its form that adds each dQ tile by one TMA bulk reduction), checked on all three gradients
and timed with its dQ zeroing and store. --ws-configs: the warp-specialized dK/dV kernel
(hopper.bwd_dkdv_ws_kernel: two 64-key consumers sharing one Q and dO ring filled by a loader
warp; BLOCK_M x 128 x STAGES x 4), and --wsdq-configs: its dQ twin (hopper.bwd_dq_ws_kernel: two
64-query consumers sharing one K and V ring, computing delta; 128 x BLOCK_N x STAGES x 4): the
op's WS and DQ_WS forms; on one H100 the WS kernel was slower than the dK/dV kernel and the
DQ_WS one faster than the dQ kernel (gpu_session_cae18ce), so DQ_WS alone stays staged
(launch.gluon_ws_bwd_candidates).
Their compile rows' registers are the kernel-wide cap: the consumers run at WS_REGS
(setmaxnreg).
"""
from __future__ import annotations

import contextlib
import functools
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
from vitflash.ops import hopper, naive_attention  # noqa: E402
# the warp-specialized kernels' consumers' registers a thread, as the op launches them
from vitflash.ops.launch import WS_REGS  # noqa: E402

# dK/dV configurations (128x128x2x8 at D = 64 compiles with 120 bytes of spills a thread,
# the "o" forms with 64-query tiles at D = 128 with 136-300: not listed; with 32-query tiles
# none, 215-232 registers: listed here, not yet timed, not in the op), and dQ ones
DEFAULT_CONFIGS = {64: ["64x128x2x8", "64x64x2x4", "64x64x2x4o", "64x64x3x4o"],
                   128: ["64x128x2x8", "64x64x2x4", "32x64x2x4o", "32x64x3x4o"]}
DQ_CONFIGS = {64: ["64x64x2x4", "128x64x2x8", "64x128x2x4", "64x64x2x4o", "64x64x2x4d", "64x64x2x4od"],
              128: ["64x64x2x4", "128x64x2x8", "64x64x2x4o", "64x64x2x4d", "64x64x2x4od"]}
# the nondeterministic kernel (bwd_atomic_kernel below: dK, dV and dQ's atomic adds), D = 64
ATOMIC_CONFIGS = {64: ["64x64x2x4", "64x64x3x4", "64x128x2x8", "64x64x2x4t", "64x128x2x8t"], 128: []}
SHAPES = ["64,12,577,64", "8,12,4097,64", "32,16,577,128", "4,16,4097,128"]
# the warp-specialized dK/dV kernel (hopper.bwd_dkdv_ws_kernel): queries x keys a program x stages x 4
WS_CONFIGS = {64: ["64x128x2x4"], 128: ["32x128x2x4", "32x128x3x4"]}
# the warp-specialized dQ kernel (hopper.bwd_dq_ws_kernel): 128 queries a program x keys x stages x 4
WSDQ_CONFIGS = {64: ["128x64x2x4"], 128: ["128x64x2x4", "128x64x3x4", "128x128x2x4"]}
KINDS = ("dkdv", "dq", "atomic", "ws", "wsdq")  # the kernels: what each config list is for


def parse_config(text: str, kernel: str = "dkdv") -> tuple[int, int, int, int, int, int]:
    """"MxNxSxW[o][d]" -> (BLOCK_M, BLOCK_N, STAGES, warps, OVERLAP, DQ_DELTA): for the dK/dV
    kernel warps = BLOCK_N / 16 (a warp group a 64 keys), for the dQ kernel BLOCK_M / 16 (a
    warp group a 64 queries); an "o" suffix overlaps each step's dV and dK products (dQ
    product) with the next step's (the kernels' OVERLAP); a "d" suffix (dQ kernel only) has
    the dQ kernel compute delta itself from O and dO and write it (its DQ_DELTA). The atomic
    kernel ("atomic": dK, dV and dQ's adds) takes 64-query tiles and warps as the dK/dV one's,
    neither suffix, and a "t" suffix for its form that adds dQ by TMA tiles (its TMA_DQ, in
    the fifth place). The warp-specialized dK/dV kernel ("ws"): BLOCK_M x 128 keys x STAGES x 4
    (two 4-warp consumers of 64 keys each, and the loader's warp), no suffix; the
    warp-specialized dQ kernel ("wsdq"): 128 queries x BLOCK_N x STAGES x 4, computing delta."""
    if kernel in ("ws", "wsdq"):
        m, n, s, w = (int(x) for x in text.split("x"))
        rows, what = (n, "keys") if kernel == "ws" else (m, "queries")
        if (rows, w) != (128, 4):
            raise ValueError(f"{text}: the warp-specialized kernels take 128 {what} a program in two "
                             "4-warp consumers")
        return m, n, s, w, 0, int(kernel == "wsdq")  # (the dQ one computes delta)
    if kernel == "atomic":
        tma_dq = int(text.endswith("t"))
        body = text.removesuffix("t")
        if not body[-1].isdigit():
            raise ValueError(f"{text}: the atomic kernel has no 'o' or 'd' form")
        if not body.startswith("64x"):
            raise ValueError(f"{text}: the atomic kernel's query tiles are 64 rows")
        return (*parse_config(body)[:4], tma_dq, 0)
    fused = int(text.endswith("d"))
    if fused and kernel != "dq":
        raise ValueError(f"{text}: the 'd' suffix (delta computed inside) is the dQ kernel's alone")
    body = text.removesuffix("d" if fused else "")
    overlap = int(body.endswith("o"))
    m, n, s, w = (int(x) for x in body.removesuffix("o" if overlap else "").split("x"))
    rows, what = (m, "queries") if kernel == "dq" else (n, "keys")
    if w * 16 != rows:
        raise ValueError(f"{text}: {w} warps for {rows} {what}; each warp group of 4 takes 64 {what}")
    return m, n, s, w, overlap, fused


def _sig(d: int, bm: int, bn: int, kernel: str, tma_dq: int = 0) -> dict:
    def desc(rows: int) -> str:
        return f"tensordesc<bf16[1,{rows},{d}],{hopper._layout(rows, d, torch.bfloat16)!r}>"

    bn = 64 if kernel == "ws" else bn  # (a ws program's K, V, dK and dV in 64-row boxes)
    bm = 64 if kernel == "wsdq" else bm  # (and a wsdq program's Q, dO and dQ)
    out = dict(dq_desc=desc(bm)) if kernel in ("dq", "wsdq") else dict(dkv_desc=desc(bn))
    dq_acc = f"tensordesc<fp32[1,{bm},{d}],{_dq_smem_layout()!r}>" if tma_dq else "*fp32"
    extra = dict(dq=dict(O="*bf16"), wsdq=dict(O="*bf16"), atomic=dict(DQ_ACC=dq_acc)).get(kernel, {})
    consts = dict(dkdv=dict(OVERLAP="constexpr"), dq=dict(OVERLAP="constexpr", DQ_DELTA="constexpr"),
                  atomic=dict(TMA_DQ="constexpr"), ws=dict(CONSUMER_REGS="constexpr"),
                  wsdq=dict(CONSUMER_REGS="constexpr"))[kernel]
    return dict(q_desc=desc(bm), kv_desc=desc(bn), do_desc=desc(bm), **out,
                LSE="*fp32", DELTA="*fp32", **extra, qk_scale="fp32", sm_scale="fp32", H="i32",
                N="i32", HEAD_DIM="constexpr", BLOCK_M="constexpr", BLOCK_N="constexpr",
                STAGES="constexpr", num_warps="constexpr", **consts)


def compile_sm90(d: int, cfg: tuple[int, int, int, int, int, int], kernel: str = "dkdv"):
    """bwd_dkdv_kernel (bwd_dq_kernel, bwd_atomic_kernel) compiled for sm_90 (bf16) by the
    installed triton, no GPU needed."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    bm, bn, stages, warps, overlap, fused = cfg
    consts = dict(HEAD_DIM=d, BLOCK_M=bm, BLOCK_N=bn, STAGES=stages, num_warps=warps)
    options = dict(num_warps=warps)
    if kernel in ("ws", "wsdq"):  # a consumer's 64 keys (queries)
        consts.update(CONSUMER_REGS=WS_REGS, **{"BLOCK_N" if kernel == "ws" else "BLOCK_M": 64})
        options["maxnreg"] = hopper.ws_maxnreg(WS_REGS)
    else:
        consts["TMA_DQ" if kernel == "atomic" else "OVERLAP"] = overlap  # (the atomic kernel's form)
    if kernel == "dq":
        consts["DQ_DELTA"] = fused
    fn = dict(dkdv=hopper.bwd_dkdv_kernel, dq=hopper.bwd_dq_kernel, atomic=bwd_atomic_kernel,
              ws=bwd_dkdv_ws_kernel, wsdq=bwd_dq_ws_kernel)[kernel]
    src = GluonASTSource(fn=fn, signature=_sig(d, bm, bn, kernel, overlap), constexprs=consts)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)


def _named(*lists: list[str]) -> list[tuple[str, str]]:
    """(kernel, config) of each config list in KINDS's order."""
    return [(kernel, text) for kernel, texts in zip(KINDS, lists) for text in texts]


def compile_rows(d: int, *lists: list[str]) -> list[str]:
    """A compile row for each config of each list (dK/dV, dQ, atomic, ws, wsdq: KINDS)."""
    rows = compile_header(d)
    for kernel, text in _named(*lists):
        cells = sass_cells(compile_sm90(d, parse_config(text, kernel), kernel))
        rows.append("| " + " | ".join([f"{kernel} {text}", *cells]) + " |")
    return rows


def gluon_grads(qkv, do, lse, delta, scale: float, cfg: tuple[int, int, int, int, int, int],
                kernel: str, dqkv: torch.Tensor | None = None, o: torch.Tensor | None = None
                ) -> torch.Tensor:
    """dqkv (B, N, 3, H, D) with one kernel's gradients filled in: dK and dV ("dkdv"), dQ
    ("dq"), all three ("atomic": into a zeroed fp32 dQ, then scaled and stored by the op's
    kernels.bwd_dq_kernel); the rest NaN in a new tensor, or what `dqkv` held. A dQ
    configuration with DQ_DELTA reads the forward's o (B, N, H, D) and writes delta into
    `delta`."""
    bm, bn, stages, warps, overlap, fused = cfg
    B, N, _, H, D = qkv.shape
    dqkv = torch.full_like(qkv, float("nan")) if dqkv is None else dqkv
    dkdv = kernel not in ("dq", "wsdq")
    grid = (triton.cdiv(N, bn if dkdv else bm) * B * H, )
    descs = hopper.bwd_descriptors(qkv, do, dqkv, 64 if kernel == "wsdq" else bm,
                                   64 if kernel == "ws" else bn, dkdv)
    tail = (scale * 1.4426950408889634, scale, H, N, D, bm, bn, stages)
    if kernel == "atomic":
        dq_acc = torch.zeros(B * H, N, D, device=qkv.device)
        target = dq_descriptor(dq_acc, bm) if overlap else dq_acc  # (TMA_DQ)
        bwd_atomic_kernel[grid](*descs, lse, delta, target, *tail, num_warps=warps, TMA_DQ=overlap)
        _dq_store(B, N, H, D)(dq_acc, dqkv, scale, H, N)
    elif kernel == "wsdq":
        bwd_dq_ws_kernel[grid](*descs, lse, delta, o, *tail[:5], 64, bn, stages, WS_REGS, num_warps=warps,
                               maxnreg=hopper.ws_maxnreg(WS_REGS))
    elif kernel == "ws":
        bwd_dkdv_ws_kernel[grid](*descs, lse, delta, *tail[:6], 64, stages, WS_REGS, num_warps=warps,
                                 maxnreg=hopper.ws_maxnreg(WS_REGS))
    elif dkdv:
        hopper.bwd_dkdv_kernel[grid](*descs, lse, delta, *tail, num_warps=warps, OVERLAP=overlap)
    else:
        hopper.bwd_dq_kernel[grid](*descs, lse, delta, o if fused else lse, *tail, num_warps=warps,
                                   OVERLAP=overlap, DQ_DELTA=fused)
    return dqkv


# The nondeterministic backward, timed and not listed by the op (gpu_session_1db6d3b, D = 64:
# its fastest form with delta took 0.751 and 3.176 ms at N = 577 and 4097 against 0.603 and
# 2.795 for the two deterministic Gluon kernels, 0.80x and 0.88x):
# hopper.py's dK/dV programs that also add each step's dQ share atomically. Written with
# hopper.py's own pieces (Gluon jit functions called by name).
if hopper.available():
    from vitflash.ops.hopper import (  # noqa: E402
        TensorDescriptor, _bwd_release, _cta_barrier, _dkdv_scores, _dkdv_setup, _mma, _program,
        _query_stats, _refill, _store_dkdv, bwd_dkdv_ws_kernel, bwd_dq_ws_kernel,
        fence_async_shared, gl, gluon, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait)

    # a TMA bulk add of a shared-memory tile into global memory: tma.async_atomic_add in
    # triton 3.8; in 3.6, whose Gluon builder has the op but no wrapper, one written here
    _tma_add = getattr(tma, "async_atomic_add", None)
    if _tma_add is None:
        from triton._C.libtriton import ir as _ir
        from triton.experimental.gluon.language._core import builtin as _builtin

        @_builtin
        def _tma_add(tensor_desc, coord, src, _semantic=None):
            coord = _semantic._convert_to_ir_values(coord, require_i64=False)
            _semantic.builder.create_async_tma_reduce(_ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle,
                                                      coord, src.handle)

    @gluon.jit
    def bwd_atomic_kernel(q_desc, kv_desc, do_desc, dkv_desc, LSE, DELTA, DQ_ACC, qk_scale, sm_scale,
                          H, N, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                          STAGES: gl.constexpr, num_warps: gl.constexpr, TMA_DQ: gl.constexpr = 0):
        """hopper.bwd_dkdv_kernel's dK and dV, and each step's share of dQ added into DQ_ACC
        ((B * H, N, D) fp32, zeroed before; unscaled: kernels.bwd_dq_kernel scales and stores
        it after) with atomic adds: the separate dQ kernel's recomputation of S and dP is gone
        (5 products a tile pair instead of 7), and dQ's last bits vary from run to run (the
        adds' order). A step writes dS^T to shared memory once: dK += dS^T Q reads it there,
        and dQ_i = dS_i K reads it transposed (with two warp groups, each takes half of dQ's
        columns over all BLOCK_N keys). BLOCK_M = 64, BLOCK_N = 16 * num_warps; D = 64 only
        (at D = 128 the dK/dV kernel alone takes 243-255 registers a thread: the dQ tile
        spills, 52-324 bytes in every arrangement compiled; 172-300 in the 8-warp form, 176
        with TMA_DQ).

        TMA_DQ = 0: each thread adds its share of a step's dQ tile (atomics of one or two floats).
        TMA_DQ = 1: the tile goes to shared memory and one TMA bulk add takes it into DQ_ACC,
        then a descriptor (dq_descriptor)."""
        row0, bh, b, q_col, k_col, v_col = _program(N, H, HEAD_DIM, BLOCK_N)
        dtype: gl.constexpr = kv_desc.dtype
        t_layout: gl.constexpr = _mma(num_warps, BLOCK_M)
        acc_layout: gl.constexpr = _mma(num_warps, HEAD_DIM)
        # dQ's (64 queries, D) tile: with two warp groups each takes half of D's columns
        dq_layout: gl.constexpr = _mma(num_warps, HEAD_DIM, num_warps // 4)
        op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
        col_t: gl.constexpr = gl.SliceLayout(0, t_layout)
        ds_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_M], dtype)

        cols0 = gl.arange(0, BLOCK_M, layout=col_t)
        k2, v2, kv_bar, q_smem, do_smem, q_bars, do_bars, n_tiles, base, lse, delta = _dkdv_setup(
            q_desc, kv_desc, do_desc, LSE, DELTA, b, bh, row0, q_col, k_col, v_col, N, cols0,
            BLOCK_M, BLOCK_N, HEAD_DIM, STAGES)
        ds_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, BLOCK_M], ds_layout)
        if TMA_DQ:
            dq_smem = gl.allocate_shared_memory(gl.float32, [1, BLOCK_M, HEAD_DIM], DQ_ACC.layout)
        t_zero = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, t_layout)
        dq_zero = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, dq_layout)
        dk = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, acc_layout)
        dv = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, acc_layout)
        dq_rows0 = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, dq_layout))
        dq_offs = (gl.expand_dims(dq_rows0 * HEAD_DIM, 1)
                   + gl.expand_dims(gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, dq_layout)), 0))
        mbarrier.wait(kv_bar, 0)
        for i in range(n_tiles):
            q2, do2, st, dpt = _dkdv_scores(i, q_smem, do_smem, q_bars, do_bars, k2, v2, t_zero,
                                            BLOCK_M, HEAD_DIM, STAGES)
            st = warpgroup_mma_wait(num_outstanding=1, deps=(st, ))
            pt = gl.exp2(st * qk_scale - gl.expand_dims(lse, 0))
            dv = warpgroup_mma(gl.convert_layout(pt.to(dtype), op_layout), do2, dv, is_async=True)
            dpt = warpgroup_mma_wait(num_outstanding=1, deps=(dpt, ))
            ds_smem.store((pt * (dpt - gl.expand_dims(delta, 0))).to(dtype))
            fence_async_shared()
            _cta_barrier()  # every warp's dS^T rows are in before the products read them
            dk = warpgroup_mma(ds_smem, q2, dk, is_async=True)
            dq = warpgroup_mma(ds_smem.permute((1, 0)), k2, dq_zero, use_acc=False, is_async=True)
            lse, delta = _query_stats(LSE, DELTA, base, (i + 1) * BLOCK_M + cols0, N)
            dv, dk, dq = warpgroup_mma_wait(num_outstanding=0, deps=(dv, dk, dq))
            # (keys past N add nothing: their K rows are read as zeros)
            if TMA_DQ:  # (rows past N are outside the descriptor's bounds: dropped)
                tma.store_wait(pendings=0)  # the previous step's add is done reading dq_smem
                _cta_barrier()
                dq_smem.reshape([BLOCK_M, HEAD_DIM]).store(dq)
                fence_async_shared()
                _tma_add(DQ_ACC, [bh, i * BLOCK_M, 0], dq_smem)
            else:
                gl.atomic_add(DQ_ACC + (base + i * BLOCK_M) * HEAD_DIM + dq_offs, dq,
                              mask=gl.expand_dims(i * BLOCK_M + dq_rows0 < N, 1), sem="relaxed")
            _cta_barrier()  # every warp is past its reads of this step's buffers and of dS^T
            if i + STAGES < n_tiles:
                _refill(q_desc, do_desc, b, i + STAGES, q_col, q_col, q_bars, do_bars, q_smem,
                        do_smem, i % STAGES, BLOCK_M, HEAD_DIM)

        if TMA_DQ:
            tma.store_wait(pendings=0)
        _bwd_release(kv_bar, q_bars, do_bars, STAGES)
        _store_dkdv(dkv_desc, dk, dv, sm_scale, b, row0, k_col, v_col, BLOCK_N, HEAD_DIM)


def _dq_smem_layout():
    """The shared-memory layout of dq_descriptor's boxes: fp32, no swizzle (a row of D floats
    is wider than the 128-byte swizzle span)."""
    return gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=3)


def dq_descriptor(dq_acc: torch.Tensor, rows: int):
    """The TMA descriptor bwd_atomic_kernel (TMA_DQ) adds its dQ tiles through: dq_acc
    (B * H, N, D) fp32 in (1, rows, D) boxes; rows past N are outside the bounds."""
    return TensorDescriptor(dq_acc, list(dq_acc.shape), list(dq_acc.stride()),
                            [1, rows, dq_acc.shape[-1]], _dq_smem_layout())


@functools.lru_cache(maxsize=None)
def _dq_store(B: int, N: int, H: int, D: int):
    """The op's launch that scales an atomic backward's fp32 dQ and stores it into dqkv
    (kernels.bwd_dq_kernel: the last launch of an atomic candidate's plan)."""
    from vitflash.ops import flash, launch
    atomic = next(c for c in launch.candidates("bwd_atomic", N, D) if c.family in launch.ATOMIC_FAMILIES)
    return flash._bwd_launches(atomic, B, N, H, D)[-1]


def reference_grads(qkv, do, scale, dtype) -> list[torch.Tensor]:
    """dQ, dK, dV (B, N, H, D) of vitflash's naive attention in `dtype` arithmetic, one batch
    at a time (its N x N scores are the memory that bounds the batch)."""
    grads = [[], [], []]
    for x, g in zip(qkv.split(1), do.split(1)):
        q, k, v = (t.to(dtype).requires_grad_() for t in x.unbind(2))
        o = naive_attention(q, k, v, scale)
        for acc, t in zip(grads, torch.autograd.grad(o, (q, k, v), g.to(dtype))):
            acc.append(t)
    return [torch.cat(t) for t in grads]


DEVICE = "cuda"  # (the CPU tests of check's arithmetic set "cpu")


def _inputs(shape, seed: int | None = 0):
    """qkv, do, the forward's LSE (vitflash's) and delta = rowsum(dO * O) (B, H, N), and its o."""
    from vitflash.ops import flash
    B, H, N, D = shape
    gen = torch.Generator(device=DEVICE).manual_seed(seed or 0)
    qkv = torch.randn(B, N, 3, H, D, device=DEVICE, generator=gen).to(torch.bfloat16)
    do = torch.randn(B, N, H, D, device=DEVICE, generator=gen).to(torch.bfloat16)
    o, lse = flash._forward(qkv, D ** -0.5)
    delta = (o.float() * do.float()).sum(-1).transpose(1, 2).contiguous()
    return qkv, do, lse, delta, o


def check(shape, *lists: list[str]) -> dict:
    """Every configuration's gradients under the FA2 rule (keyed "dkdv <config>", "dq <config>",
    "atomic <config>": the atomic kernel on all three); a dQ configuration that computes delta
    itself also the delta it wrote, against torch's (fp32 sums of the same products in another
    order: within 1e-5 of the largest)."""
    qkv, do, lse, delta, o = _inputs(shape)
    scale = shape[3] ** -0.5
    ref = reference_grads(qkv, do, scale, torch.float64)
    low = reference_grads(qkv, do, scale, torch.bfloat16)
    out = {}
    for kernel, text in _named(*lists):
        name = f"{kernel} {text}"
        cfg = parse_config(text, kernel)
        written = torch.full_like(delta, float("nan")) if cfg[5] else delta
        try:
            dqkv = gluon_grads(qkv, do, lse, written, scale, cfg, kernel, o=o)
            torch.cuda.synchronize()
        except Exception as err:  # a configuration that does not compile or fit: named
            out[name] = {"ok": False, "error": str(err).splitlines()[0][:200]}
            continue
        row = {"ok": True}
        for g in dict(dkdv=(1, 2), dq=(0, ), atomic=(0, 1, 2), ws=(1, 2), wsdq=(0, ))[kernel]:
            err = (dqkv[:, :, g].double() - ref[g]).abs().max().item()
            naive = (low[g].double() - ref[g]).abs().max().item()
            grad = ("dq", "dk", "dv")[g]
            row[f"{grad}_err"], row[f"{grad}_naive_err"] = err, naive
            row["ok"] &= math.isfinite(err) and err <= 2 * naive + 1e-5
        if cfg[5]:
            row["delta_err"] = (written - delta).abs().max().item()
            row["ok"] &= math.isfinite(row["delta_err"]) and row["delta_err"] <= 1e-5 * (
                1 + delta.abs().max().item())
        out[name] = row
    return out


def time_shape(shape, ok: dict, repeats: int) -> dict:
    """GPU ms of each configuration that kept to the rule, of the delta kernel the op launches
    before the dK/dV and dQ kernels (vitflash's; none before a dQ configuration with "d"), of
    vitflash's tuned forward, and of vitflash's and cuDNN's (SDPA) forward+backward, each the
    median of do_bench_cudagraph, `repeats` times."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import torch.nn.functional as F
    from vitflash.ops import flash, flash_attention_qkvpacked, launch
    B, H, N, D = shape
    scale = D ** -0.5
    qkv, do, lse, delta, o = _inputs(shape, seed=1)
    dqkv = torch.empty_like(qkv)
    delta_launch = flash._bwd_launches(launch.heuristic("bwd", N, D), B, N, H, D)[0]
    cases = {}
    for name, r in ok.items():
        if r.get("ok"):
            kernel, text = name.split()
            cfg = parse_config(text, kernel)
            cases[f"gluon {name}"] = (lambda cfg=cfg, kernel=kernel:
                                      gluon_grads(qkv, do, lse, delta, scale, cfg, kernel, dqkv, o))
    cases["delta (vitflash)"] = lambda: delta_launch(o, do, delta, H, N)
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
    p.add_argument("--atomic-configs", nargs="*", default=None,
                   help="the atomic kernel's (dK, dV and dQ's adds; default: at D = 64)")
    p.add_argument("--ws-configs", nargs="*", default=None,
                   help="the warp-specialized dK/dV kernel's (BLOCK_M x 128 x STAGES x 4)")
    p.add_argument("--wsdq-configs", nargs="*", default=None,
                   help="the warp-specialized dQ kernel's (128 x BLOCK_N x STAGES x 4)")
    args = p.parse_args(argv)
    require_gluon()

    def lists(d: int) -> tuple[list[str], ...]:
        return (args.configs or DEFAULT_CONFIGS[d], args.dq_configs or DQ_CONFIGS[d],
                ATOMIC_CONFIGS[d] if args.atomic_configs is None else args.atomic_configs,
                WS_CONFIGS[d] if args.ws_configs is None else args.ws_configs,
                WSDQ_CONFIGS[d] if args.wsdq_configs is None else args.wsdq_configs)

    if args.compile:
        print("\n".join(compile_rows(args.d, *lists(args.d))))
        return
    env = hopper_env()
    rows, results = [], []
    for text in args.shapes:
        shape = tuple(int(x) for x in text.split(","))
        d = shape[3]
        ok = check(shape, *lists(d))
        times = time_shape(shape, ok, args.repeats)
        results.append({"shape": shape, "check": ok, "times": times})
        print(json.dumps(results[-1]), flush=True)
        cell = lambda t: f"{t['ms']:.3f} ({t['ms_min']:.3f}-{t['ms_max']:.3f})"  # noqa: E731
        for name, t in times.items():
            rows.append(f"| {shape} | {name} | {cell(t)} |")
        rows += [f"| {shape} | {name}: outside the rule or failed: {r} | - |" for name, r in ok.items()
                 if not r.get("ok")]
        # the fastest dK/dV (either kernel), and the fastest dQ with the delta kernel before it
        # (none before a "d" configuration, which computes delta itself)
        delta_ms = times["delta (vitflash)"]["ms"]
        best = {k: min((t["ms"] + (delta_ms if n.split()[1] == "dq" and not n.endswith("d") else 0)
                        for n, t in times.items() if n.split()[:2] in (["gluon", k], ["gluon", k2])),
                       default=None)
                for k, k2 in (("dkdv", "ws"), ("dq", "wsdq"))}
        if None not in best.values():
            total = best["dkdv"] + best["dq"] + times["flash forward"]["ms"]
            rows.append(f"| {shape} | **flash forward + Gluon backward (best dK/dV + best dQ with its delta)** | "
                        f"{total:.3f}: {times['flash forward+backward']['ms'] / total:.2f}x flash's "
                        f"forward+backward, {times['cuDNN forward+backward']['ms'] / total:.2f}x cuDNN's |")
        atomic = min((t["ms"] for n, t in times.items() if n.startswith("gluon atomic ")), default=None)
        if atomic is not None:  # the nondeterministic backward: delta, then the atomic kernel
            total = atomic + delta_ms + times["flash forward"]["ms"]
            rows.append(f"| {shape} | **flash forward + delta + the atomic Gluon backward (nondeterministic)** | "
                        f"{total:.3f}: {times['flash forward+backward']['ms'] / total:.2f}x flash's "
                        f"forward+backward, {times['cuDNN forward+backward']['ms'] / total:.2f}x cuDNN's |")
    table = ["# Gluon backward (dK/dV and dQ kernels) against the tuned backward and cuDNN", "",
             f"Command: `python {' '.join(sys.argv)}`", "", env + "; bf16; do_bench_cudagraph "
             f"median of each repeat; ms median (min-max) of {args.repeats}. The Gluon rows are one "
             "kernel each; the last row of a shape sums the fastest dK/dV, the fastest dQ with the "
             "delta kernel it needs (none for a 'd' form) and flash's forward, against the whole "
             "forward+backward of flash and of cuDNN; an atomic row (the kernel with its dQ zeroing "
             "and store) adds the delta kernel and the forward.", "",
             "| (B, H, N, D) | case | ms |", "|---|---|---|", *rows]
    print("\n".join(table))
    write_out(args.out, "gluon_bwd", table, results)


if __name__ == "__main__":
    main()
