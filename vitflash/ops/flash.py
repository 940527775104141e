"""FlashAttention in Triton: forward and backward, for the (B, N, H, D) layout of ViTs.

Algorithm (Dao et al., "FlashAttention", 2022, and "FlashAttention-2", 2023):

* Forward. Each program owns BLOCK_M query rows of one (batch, head). It keeps its Q tile
  on chip and streams K and V through in tiles of BLOCK_N keys. For every tile it computes
  the scores S = Q K^T, updates a running row maximum m and normalizer l (the online
  softmax), rescales its partial output by exp(m_old - m_new) and adds P V. The N x N score
  matrix never reaches GPU memory. It writes O and the per-row log-sum-exp (LSE), the only
  statistic the backward needs.
* Backward. A small kernel computes delta = rowsum(dO * O). Then one launch does the rest:
  a dK/dV program owns a K/V tile and streams Q, dO, LSE and delta past it, recomputing
  P = exp(S - LSE) tile by tile; a dQ program does the same with the roles swapped. No
  program writes where another does, so there are no atomics and the backward is
  deterministic: the same inputs give the same bits.

Exponentials are taken base 2 with the softmax scale folded into log2(e), and the LSE is
kept in base-2 units. Sequence lengths need not be multiples of a block (ViT lengths 197,
577, 1025, ... are not): only the last key tile is masked. Head dims D <= 256 with
D % 8 == 0 are padded inside the kernel to the next power of two.

Dtypes: float16 and bfloat16, with float32 accumulation. float32 inputs are refused, as
FlashAttention refuses them: the tiles and configurations are sized for 16-bit operands on
the matrix units, and fp32 tiles would halve what fits on chip. Run the model under bf16
autocast, or use the `sdpa` / `naive` paths for fp32.

Launch configurations are autotuned on the first call for each (N, D, dtype), which takes
a few seconds; a ViT trains at one N, so that happens once per run.

On CPU the kernels run under Triton's interpreter (TRITON_INTERPRET=1, set before Triton is
first imported), which is how CI tests them. The interpreter (triton 3.8) gets bf16 wrong in
two ways: `tl.dot` on bf16 operands returns garbage, and fp32 -> bf16 casts truncate where
the GPU rounds to nearest even. So there, and only there, for bf16 inputs (BF16_FIX), tiles
are widened to fp32 just before each dot and downcasts round in integer arithmetic. Both
are exact emulations of the GPU: every bf16 value is an fp32 value, and the matrix units
multiply bf16 exactly and accumulate in fp32. The interpreter thus computes the same
roundings as the GPU, and the tests hold it to the same error bound.
"""
from __future__ import annotations

import math
import os

import torch
import triton
import triton.language as tl

from vitflash.ops.reference import check_softmax_scale

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16)
MAX_HEAD_DIM = 256
LOG2E = 1.4426950408889634


# ----------------------------------------------------------------------------------------
# Triton helpers
# ----------------------------------------------------------------------------------------
@triton.jit
def _load_tile(ptrs, offs_rows, N, offs_d, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
               MASK_ROWS: tl.constexpr):
    """Load a (rows, BLOCK_D) tile, zero-filling rows >= N (if MASK_ROWS) and padded dims."""
    if MASK_ROWS:
        if HEAD_DIM == BLOCK_D:
            return tl.load(ptrs, mask=offs_rows[:, None] < N, other=0.0)
        else:
            return tl.load(ptrs, mask=(offs_rows[:, None] < N) & (offs_d[None, :] < HEAD_DIM),
                           other=0.0)
    else:
        if HEAD_DIM == BLOCK_D:
            return tl.load(ptrs)
        else:
            return tl.load(ptrs, mask=offs_d[None, :] < HEAD_DIM, other=0.0)


@triton.jit
def _store_tile(ptrs, tile, offs_rows, N, offs_d, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr):
    if HEAD_DIM == BLOCK_D:
        tl.store(ptrs, tile, mask=offs_rows[:, None] < N)
    else:
        tl.store(ptrs, tile, mask=(offs_rows[:, None] < N) & (offs_d[None, :] < HEAD_DIM))


@triton.jit
def _dot(a, b, acc, BF16_FIX: tl.constexpr):
    """acc + a @ b in fp32. BF16_FIX (interpreter, bf16): widen the operands first."""
    if BF16_FIX:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc)
    else:
        return tl.dot(a, b, acc)


@triton.jit
def _round(x, dtype: tl.constexpr, BF16_FIX: tl.constexpr):
    """fp32 -> dtype, rounding to nearest even as the GPU does. BF16_FIX (interpreter,
    bf16): the interpreter truncates fp32 -> bf16, so round in integer arithmetic."""
    if BF16_FIX:
        bits = x.to(tl.uint32, bitcast=True)
        bits = bits + (((bits >> 16) & 1) + 0x7FFF)
        return (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
    else:
        return x.to(dtype)


@triton.jit
def _program_ids(pid, N, BLOCK: tl.constexpr):
    """Split a flat program id (no 65535 limit on B*H) into (tile, batch*head). Neighbouring
    programs share a (batch, head), so its K/V tiles come from L2 for all but the first."""
    num_blocks = tl.cdiv(N, BLOCK)
    return pid % num_blocks, pid // num_blocks


# ----------------------------------------------------------------------------------------
# Forward
# ----------------------------------------------------------------------------------------
@triton.jit
def _fwd_inner(acc, l_i, m_i, q, k_ptrs, v_ptrs, start, end, N, offs_n, offs_d, qk_scale,
               stride_kn, stride_vn,
               HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
               MASK_N: tl.constexpr, BF16_FIX: tl.constexpr):
    for start_n in range(start, end, BLOCK_N):
        cols = start_n + offs_n
        k = _load_tile(k_ptrs + start_n * stride_kn, cols, N, offs_d, HEAD_DIM, BLOCK_D, MASK_N)
        s = _dot(q, tl.trans(k), tl.zeros([q.shape[0], BLOCK_N], tl.float32), BF16_FIX)
        s = s * qk_scale  # (BLOCK_M, BLOCK_N), log2 units
        if MASK_N:
            s = tl.where(cols[None, :] < N, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = _load_tile(v_ptrs + start_n * stride_vn, cols, N, offs_d, HEAD_DIM, BLOCK_D, MASK_N)
        acc = _dot(_round(p, v.dtype, BF16_FIX), v, acc * alpha[:, None], BF16_FIX)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _fwd_kernel(Q, K, V, O, LSE, qk_scale,
                stride_qb, stride_qn, stride_qh,
                stride_kb, stride_kn, stride_kh,
                stride_vb, stride_vn, stride_vh,
                stride_ob, stride_on, stride_oh,
                H, N,
                HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BF16_FIX: tl.constexpr):
    pid_m, pid_bh = _program_ids(tl.program_id(0), N, BLOCK_M)
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)

    q_ptrs = Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qn + offs_d[None, :]
    k_ptrs = K + b * stride_kb + h * stride_kh + offs_n[:, None] * stride_kn + offs_d[None, :]
    v_ptrs = V + b * stride_vb + h * stride_vh + offs_n[:, None] * stride_vn + offs_d[None, :]
    q = _load_tile(q_ptrs, offs_m, N, offs_d, HEAD_DIM, BLOCK_D, True)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    n_full = (N // BLOCK_N) * BLOCK_N
    acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, k_ptrs, v_ptrs, 0, n_full, N, offs_n, offs_d,
                               qk_scale, stride_kn, stride_vn,
                               HEAD_DIM, BLOCK_D, BLOCK_N, False, BF16_FIX)
    if n_full < N:  # the one partial key tile
        acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, k_ptrs, v_ptrs, n_full, N, N, offs_n,
                                   offs_d, qk_scale, stride_kn, stride_vn,
                                   HEAD_DIM, BLOCK_D, BLOCK_N, True, BF16_FIX)

    acc = acc / l_i[:, None]
    o_ptrs = O + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_on + offs_d[None, :]
    _store_tile(o_ptrs, _round(acc, O.dtype.element_ty, BF16_FIX), offs_m, N, offs_d, HEAD_DIM, BLOCK_D)
    lse_ptrs = LSE + pid_bh.to(tl.int64) * N + offs_m  # LSE is (B, H, N) contiguous
    tl.store(lse_ptrs, m_i + tl.math.log2(l_i), mask=offs_m < N)


# ----------------------------------------------------------------------------------------
# Backward
# ----------------------------------------------------------------------------------------
@triton.jit
def _bwd_preprocess(O, DO, DELTA,
                    stride_ob, stride_on, stride_oh,
                    stride_dob, stride_don, stride_doh,
                    H, N,
                    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr):
    """delta = rowsum(dO * O), the diagonal term of the softmax Jacobian, per query row."""
    pid_m, pid_bh = _program_ids(tl.program_id(0), N, BLOCK_M)
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    o = _load_tile(O + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_on
                   + offs_d[None, :], offs_m, N, offs_d, HEAD_DIM, BLOCK_D, True)
    do = _load_tile(DO + b * stride_dob + h * stride_doh + offs_m[:, None] * stride_don
                    + offs_d[None, :], offs_m, N, offs_d, HEAD_DIM, BLOCK_D, True)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    tl.store(DELTA + pid_bh.to(tl.int64) * N + offs_m, delta, mask=offs_m < N)


@triton.jit
def _bwd_dkdv_inner(dk, dv, k, v, q_ptrs, do_ptrs, lse_ptrs, delta_ptrs, start, end, N,
                    offs_m, offs_d, qk_scale, stride_qn, stride_don,
                    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
                    MASK_M: tl.constexpr, BF16_FIX: tl.constexpr):
    for start_m in range(start, end, BLOCK_M):
        rows = start_m + offs_m
        q = _load_tile(q_ptrs + start_m * stride_qn, rows, N, offs_d, HEAD_DIM, BLOCK_D, MASK_M)
        do = _load_tile(do_ptrs + start_m * stride_don, rows, N, offs_d, HEAD_DIM, BLOCK_D,
                        MASK_M)
        if MASK_M:
            # Padded query rows: q = dO = 0 and LSE = +inf make their P^T column 0.
            lse = tl.load(lse_ptrs + start_m + offs_m, mask=rows < N, other=float("inf"))
            delta = tl.load(delta_ptrs + start_m + offs_m, mask=rows < N, other=0.0)
        else:
            lse = tl.load(lse_ptrs + start_m + offs_m)
            delta = tl.load(delta_ptrs + start_m + offs_m)
        # Work on transposed tiles so that dK, dV accumulate as (BLOCK_N, BLOCK_D).
        s_t = _dot(k, tl.trans(q), tl.zeros([k.shape[0], BLOCK_M], tl.float32), BF16_FIX)
        p_t = tl.math.exp2(s_t * qk_scale - lse[None, :])  # (BLOCK_N, BLOCK_M)
        dv = _dot(_round(p_t, do.dtype, BF16_FIX), do, dv, BF16_FIX)
        dp_t = _dot(v, tl.trans(do), tl.zeros([k.shape[0], BLOCK_M], tl.float32), BF16_FIX)
        ds_t = p_t * (dp_t - delta[None, :])
        dk = _dot(_round(ds_t, q.dtype, BF16_FIX), q, dk, BF16_FIX)
    return dk, dv


@triton.jit
def _bwd_dkdv(pid, Q, K, V, DO, LSE, DELTA, DK, DV, qk_scale, sm_scale,
              stride_qb, stride_qn, stride_qh,
              stride_kb, stride_kn, stride_kh,
              stride_vb, stride_vn, stride_vh,
              stride_dob, stride_don, stride_doh,
              stride_dkb, stride_dkn, stride_dkh,
              stride_dvb, stride_dvn, stride_dvh,
              H, N,
              HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BF16_FIX: tl.constexpr):
    """dK, dV of one BLOCK_N key tile; Q, dO, LSE, delta stream past in BLOCK_M tiles."""
    pid_n, pid_bh = _program_ids(pid, N, BLOCK_N)
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)

    k = _load_tile(K + b * stride_kb + h * stride_kh + offs_n[:, None] * stride_kn
                   + offs_d[None, :], offs_n, N, offs_d, HEAD_DIM, BLOCK_D, True)
    v = _load_tile(V + b * stride_vb + h * stride_vh + offs_n[:, None] * stride_vn
                   + offs_d[None, :], offs_n, N, offs_d, HEAD_DIM, BLOCK_D, True)
    q_ptrs = Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qn + offs_d[None, :]
    do_ptrs = DO + b * stride_dob + h * stride_doh + offs_m[:, None] * stride_don + offs_d[None, :]
    lse_ptrs = LSE + pid_bh.to(tl.int64) * N
    delta_ptrs = DELTA + pid_bh.to(tl.int64) * N

    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    m_full = (N // BLOCK_M) * BLOCK_M
    dk, dv = _bwd_dkdv_inner(dk, dv, k, v, q_ptrs, do_ptrs, lse_ptrs, delta_ptrs, 0, m_full, N,
                             offs_m, offs_d, qk_scale, stride_qn, stride_don,
                             HEAD_DIM, BLOCK_D, BLOCK_M, False, BF16_FIX)
    if m_full < N:
        dk, dv = _bwd_dkdv_inner(dk, dv, k, v, q_ptrs, do_ptrs, lse_ptrs, delta_ptrs, m_full, N,
                                 N, offs_m, offs_d, qk_scale, stride_qn, stride_don,
                                 HEAD_DIM, BLOCK_D, BLOCK_M, True, BF16_FIX)

    dk = dk * sm_scale
    _store_tile(DK + b * stride_dkb + h * stride_dkh + offs_n[:, None] * stride_dkn
                + offs_d[None, :], _round(dk, DK.dtype.element_ty, BF16_FIX), offs_n, N, offs_d, HEAD_DIM, BLOCK_D)
    _store_tile(DV + b * stride_dvb + h * stride_dvh + offs_n[:, None] * stride_dvn
                + offs_d[None, :], _round(dv, DV.dtype.element_ty, BF16_FIX), offs_n, N, offs_d, HEAD_DIM, BLOCK_D)


@triton.jit
def _bwd_dq_inner(dq, q, do, lse, delta, k_ptrs, v_ptrs, start, end, N, offs_n, offs_d,
                  qk_scale, stride_kn, stride_vn,
                  HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
                  MASK_N: tl.constexpr, BF16_FIX: tl.constexpr):
    for start_n in range(start, end, BLOCK_N):
        cols = start_n + offs_n
        k = _load_tile(k_ptrs + start_n * stride_kn, cols, N, offs_d, HEAD_DIM, BLOCK_D, MASK_N)
        v = _load_tile(v_ptrs + start_n * stride_vn, cols, N, offs_d, HEAD_DIM, BLOCK_D, MASK_N)
        s = _dot(q, tl.trans(k), tl.zeros([q.shape[0], BLOCK_N], tl.float32), BF16_FIX)
        p = tl.math.exp2(s * qk_scale - lse[:, None])  # (BLOCK_M, BLOCK_N)
        if MASK_N:
            # Padded keys have k = 0, so exp2(-lse) could overflow: zero them explicitly.
            p = tl.where(cols[None, :] < N, p, 0.0)
        dp = _dot(do, tl.trans(v), tl.zeros([q.shape[0], BLOCK_N], tl.float32), BF16_FIX)
        ds = p * (dp - delta[:, None])
        dq = _dot(_round(ds, k.dtype, BF16_FIX), k, dq, BF16_FIX)
    return dq


@triton.jit
def _bwd_dq(pid, Q, K, V, DO, LSE, DELTA, DQ, qk_scale, sm_scale,
            stride_qb, stride_qn, stride_qh,
            stride_kb, stride_kn, stride_kh,
            stride_vb, stride_vn, stride_vh,
            stride_dob, stride_don, stride_doh,
            stride_dqb, stride_dqn, stride_dqh,
            H, N,
            HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BF16_FIX: tl.constexpr):
    """dQ of one BLOCK_M query tile; K, V stream past in BLOCK_N tiles."""
    pid_m, pid_bh = _program_ids(pid, N, BLOCK_M)
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)

    q = _load_tile(Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qn
                   + offs_d[None, :], offs_m, N, offs_d, HEAD_DIM, BLOCK_D, True)
    do = _load_tile(DO + b * stride_dob + h * stride_doh + offs_m[:, None] * stride_don
                    + offs_d[None, :], offs_m, N, offs_d, HEAD_DIM, BLOCK_D, True)
    lse = tl.load(LSE + pid_bh.to(tl.int64) * N + offs_m, mask=offs_m < N, other=0.0)
    delta = tl.load(DELTA + pid_bh.to(tl.int64) * N + offs_m, mask=offs_m < N, other=0.0)
    k_ptrs = K + b * stride_kb + h * stride_kh + offs_n[:, None] * stride_kn + offs_d[None, :]
    v_ptrs = V + b * stride_vb + h * stride_vh + offs_n[:, None] * stride_vn + offs_d[None, :]

    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    n_full = (N // BLOCK_N) * BLOCK_N
    dq = _bwd_dq_inner(dq, q, do, lse, delta, k_ptrs, v_ptrs, 0, n_full, N, offs_n, offs_d,
                       qk_scale, stride_kn, stride_vn, HEAD_DIM, BLOCK_D, BLOCK_N, False, BF16_FIX)
    if n_full < N:
        dq = _bwd_dq_inner(dq, q, do, lse, delta, k_ptrs, v_ptrs, n_full, N, N, offs_n, offs_d,
                           qk_scale, stride_kn, stride_vn, HEAD_DIM, BLOCK_D, BLOCK_N, True,
                           BF16_FIX)

    dq = dq * sm_scale
    _store_tile(DQ + b * stride_dqb + h * stride_dqh + offs_m[:, None] * stride_dqn
                + offs_d[None, :], _round(dq, DQ.dtype.element_ty, BF16_FIX), offs_m, N, offs_d, HEAD_DIM, BLOCK_D)



@triton.jit
def _bwd_kernel(Q, K, V, DO, LSE, DELTA, DQ, DK, DV, qk_scale, sm_scale,
                stride_qb, stride_qn, stride_qh,
                stride_kb, stride_kn, stride_kh,
                stride_vb, stride_vn, stride_vh,
                stride_dob, stride_don, stride_doh,
                stride_dqb, stride_dqn, stride_dqh,
                stride_dkb, stride_dkn, stride_dkh,
                stride_dvb, stride_dvn, stride_dvh,
                BH, H, N,
                HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                BLOCK_M1: tl.constexpr, BLOCK_N1: tl.constexpr,
                BLOCK_M2: tl.constexpr, BLOCK_N2: tl.constexpr, BF16_FIX: tl.constexpr):
    """One launch for the whole backward: the first cdiv(N, BLOCK_N1) * B * H programs
    compute dK, dV (one key tile each), the rest dQ (one query tile each). One launch
    rather than two fills the GPU without a tail between them and halves launch cost."""
    pid = tl.program_id(0)
    n_dkdv = tl.cdiv(N, BLOCK_N1) * BH
    if pid < n_dkdv:
        _bwd_dkdv(pid, Q, K, V, DO, LSE, DELTA, DK, DV, qk_scale, sm_scale,
                  stride_qb, stride_qn, stride_qh, stride_kb, stride_kn, stride_kh,
                  stride_vb, stride_vn, stride_vh, stride_dob, stride_don, stride_doh,
                  stride_dkb, stride_dkn, stride_dkh, stride_dvb, stride_dvn, stride_dvh,
                  H, N, HEAD_DIM, BLOCK_D, BLOCK_M1, BLOCK_N1, BF16_FIX)
    else:
        _bwd_dq(pid - n_dkdv, Q, K, V, DO, LSE, DELTA, DQ, qk_scale, sm_scale,
                stride_qb, stride_qn, stride_qh, stride_kb, stride_kn, stride_kh,
                stride_vb, stride_vn, stride_vh, stride_dob, stride_don, stride_doh,
                stride_dqb, stride_dqn, stride_dqh,
                H, N, HEAD_DIM, BLOCK_D, BLOCK_M2, BLOCK_N2, BF16_FIX)

# ----------------------------------------------------------------------------------------
# Launch configurations
# ----------------------------------------------------------------------------------------
def _configs(shapes, names):
    return [triton.Config(dict(zip(names, blocks)), num_warps=w, num_stages=st)
            for *blocks, w, st in shapes]


_FWD_CONFIGS = _configs([(128, 64, 4, 3), (128, 128, 8, 3), (64, 64, 4, 3), (128, 32, 4, 3)],
                        ("BLOCK_M", "BLOCK_N"))
# Backward: (BLOCK_M1, BLOCK_N1) tile the dK/dV programs, (BLOCK_M2, BLOCK_N2) the dQ ones.
_BWD_CONFIGS = _configs([(32, 128, 128, 32, 4, 3), (64, 128, 128, 64, 8, 3),
                         (64, 64, 64, 64, 4, 3), (32, 64, 64, 32, 4, 3)],
                        ("BLOCK_M1", "BLOCK_N1", "BLOCK_M2", "BLOCK_N2"))
# Under the interpreter every program runs one after another in numpy: one fixed
# configuration, no autotuning, keeps CI fast; tests at N = 17, 65, 128, 197, 577 still cover single,
# multiple, full and partial tiles.
_INTERPRETER_FWD = {"BLOCK_M": 64, "BLOCK_N": 64}
_INTERPRETER_BWD = {"BLOCK_M1": 64, "BLOCK_N1": 64, "BLOCK_M2": 64, "BLOCK_N2": 64}


def _prune(configs, named_args, **kwargs):
    """Drop tiles too large for shared memory or registers at this head dim."""
    block_d = named_args.get("BLOCK_D", kwargs.get("BLOCK_D"))
    limit = 128 * 128 if block_d <= 64 else (128 * 64 if block_d <= 128 else 64 * 64)

    def tile(c):
        k = c.kwargs
        return max(k.get("BLOCK_M", 0) * k.get("BLOCK_N", 0),
                   k.get("BLOCK_M1", 0) * k.get("BLOCK_N1", 0),
                   k.get("BLOCK_M2", 0) * k.get("BLOCK_N2", 0))

    kept = [c for c in configs if tile(c) <= limit and (block_d <= 128 or c.num_stages <= 2)]
    return kept or configs[-1:]


def _autotuned(kernel, configs):
    return triton.autotune(configs, key=["N", "HEAD_DIM"],
                           prune_configs_by={"early_config_prune": _prune})(kernel)


_fwd_kernel_tuned = _autotuned(_fwd_kernel, _FWD_CONFIGS)
_bwd_kernel_tuned = _autotuned(_bwd_kernel, _BWD_CONFIGS)


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _launch(plain, tuned, interpreter_config, n_blocks_of, *args, **constexprs):
    """Launch on a flat grid; autotuned on a GPU, one fixed config in the interpreter."""
    if _interpreting():
        cfg = interpreter_config
        plain[(n_blocks_of(cfg),)](*args, **constexprs, **cfg)
    else:
        tuned[lambda meta: (n_blocks_of(meta),)](*args, **constexprs)


# ----------------------------------------------------------------------------------------
# Host launchers (no autograd here)
# ----------------------------------------------------------------------------------------
# Host-side integer helpers in plain Python: triton.cdiv and friends are jit functions whose
# host call costs microseconds each, on a path that runs every layer of every step.
def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _strides(*tensors: torch.Tensor) -> list[int]:
    """(batch, token, head) strides of each (B, N, H, D) tensor, flattened."""
    return [s for t in tensors for s in t.stride()[:3]]


def _head_dims(d: int) -> dict:
    return {"HEAD_DIM": d, "BLOCK_D": max(16, 1 << (d - 1).bit_length())}


def _needs_bf16_fix(t: torch.Tensor) -> bool:
    return _interpreting() and t.dtype == torch.bfloat16


def _attn_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, softmax_scale: float
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """o (B, N, H, D) contiguous and lse (B, H, N) fp32, base-2 units."""
    B, N, H, D = q.shape
    o = torch.empty((B, N, H, D), dtype=q.dtype, device=q.device)
    lse = torch.empty((B, H, N), dtype=torch.float32, device=q.device)
    _launch(_fwd_kernel, _fwd_kernel_tuned, _INTERPRETER_FWD,
            lambda meta: _cdiv(N, meta["BLOCK_M"]) * B * H,
            q, k, v, o, lse, softmax_scale * LOG2E,
            *_strides(q, k, v, o),
            H, N, **_head_dims(D), BF16_FIX=_needs_bf16_fix(q))
    return o, lse


def _backward(do, q, k, v, o, lse, sm_scale: float, dq, dk, dv) -> None:
    """Write dq, dk, dv (any (B, N, H, D) views with unit last stride) in place."""
    B, N, H, D = q.shape
    if do.stride(-1) != 1:
        do = do.contiguous()
    dims = _head_dims(D)
    delta = torch.empty_like(lse)
    block = 64
    _bwd_preprocess[(_cdiv(N, block) * B * H,)](
        o, do, delta,
        *_strides(o, do),
        H, N, **dims, BLOCK_M=block)
    _launch(_bwd_kernel, _bwd_kernel_tuned, _INTERPRETER_BWD,
            lambda meta: (_cdiv(N, meta["BLOCK_N1"]) + _cdiv(N, meta["BLOCK_M2"]))
            * B * H,
            q, k, v, do, lse, delta, dq, dk, dv, sm_scale * LOG2E, sm_scale,
            *_strides(q, k, v, do, dq, dk, dv),
            B * H, H, N, **dims, BF16_FIX=_needs_bf16_fix(q))


# ----------------------------------------------------------------------------------------
# Autograd, and torch.library ops for torch.compile
# ----------------------------------------------------------------------------------------
def _attn_bwd(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              o: torch.Tensor, lse: torch.Tensor, softmax_scale: float
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    dq, dk, dv = (torch.empty(q.shape, dtype=q.dtype, device=q.device) for _ in range(3))
    _backward(do, q, k, v, o, lse, softmax_scale, dq, dk, dv)
    return dq, dk, dv


def _packed_fwd(qkv: torch.Tensor, softmax_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    return _attn_fwd(*qkv.unbind(2), softmax_scale)


def _packed_bwd(do: torch.Tensor, qkv: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
                softmax_scale: float) -> torch.Tensor:
    dqkv = torch.empty(qkv.shape, dtype=qkv.dtype, device=qkv.device)  # (B, N, 3, H, D)
    _backward(do, *qkv.unbind(2), o, lse, softmax_scale, *dqkv.unbind(2))
    return dqkv


# Each launcher is also a custom op, so that torch.compile sees one opaque node with a fake
# (shape-only) implementation instead of tracing into Triton's launcher.
_OPS = {fn: torch.library.custom_op(f"vitflash::flash{fn.__name__}", fn, mutates_args=())
        for fn in (_attn_fwd, _attn_bwd, _packed_fwd, _packed_bwd)}


@_OPS[_attn_fwd].register_fake
def _(q, k, v, softmax_scale):
    B, N, H, D = q.shape
    return q.new_empty((B, N, H, D)), q.new_empty((B, H, N), dtype=torch.float32)


@_OPS[_attn_bwd].register_fake
def _(do, q, k, v, o, lse, softmax_scale):
    return tuple(q.new_empty(q.shape) for _ in range(3))


@_OPS[_packed_fwd].register_fake
def _(qkv, softmax_scale):
    B, N, _, H, D = qkv.shape
    return qkv.new_empty((B, N, H, D)), qkv.new_empty((B, H, N), dtype=torch.float32)


@_OPS[_packed_bwd].register_fake
def _(do, qkv, o, lse, softmax_scale):
    return qkv.new_empty(qkv.shape)


def _run(fn, *args):
    """The custom op while torch.compile traces; the plain launcher in eager mode, where the
    op's dispatch would cost more host time than a small attention takes on the GPU."""
    return _OPS[fn](*args) if torch.compiler.is_compiling() else fn(*args)


class _FlashAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, softmax_scale):
        o, lse = _run(_attn_fwd, q, k, v, softmax_scale)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.softmax_scale = softmax_scale
        return o

    @staticmethod
    def backward(ctx, do):
        dq, dk, dv = _run(_attn_bwd, do, *ctx.saved_tensors, ctx.softmax_scale)
        return dq, dk, dv, None


class _FlashAttentionQKVPacked(torch.autograd.Function):
    @staticmethod
    def forward(ctx, qkv, softmax_scale):
        o, lse = _run(_packed_fwd, qkv, softmax_scale)
        ctx.save_for_backward(qkv, o, lse)
        ctx.softmax_scale = softmax_scale
        return o

    @staticmethod
    def backward(ctx, do):
        return _run(_packed_bwd, do, *ctx.saved_tensors, ctx.softmax_scale), None


# ----------------------------------------------------------------------------------------
# Public API
# ----------------------------------------------------------------------------------------
def _check(name: str, t: torch.Tensor, shape: tuple, ref: torch.Tensor) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in SUPPORTED_DTYPES:
        raise TypeError(
            f"flash attention supports torch.float16 and torch.bfloat16, but {name} is "
            f"{t.dtype}: cast the inputs (e.g. run under torch.autocast('cuda', "
            f"dtype=torch.bfloat16)) or use the 'sdpa' or 'naive' attention path")
    if t.dtype != ref.dtype:
        raise TypeError(f"{name} is {t.dtype} but q is {ref.dtype}: give q, k, v one dtype")
    if t.device != ref.device:
        raise ValueError(f"{name} is on {t.device} but q is on {ref.device}: "
                         "put q, k, v on one device")
    if tuple(t.shape) != shape:
        raise ValueError(f"{name} has shape {tuple(t.shape)}, expected {shape} "
                         "(B, N, H, D) like q")
    if t.stride(-1) != 1:
        raise ValueError(f"{name}'s last dim is not contiguous (strides {t.stride()}): "
                         "the head dim must have stride 1; call .contiguous() first")


def check_head_dim(d: int) -> None:
    """Raise a ValueError unless the kernel supports head dim `d` (multiple of 8, <= 256)."""
    if d % 8 != 0 or not 8 <= d <= MAX_HEAD_DIM:
        raise ValueError(
            f"head dim {d} is not supported by flash attention: it needs a multiple of 8 no "
            f"larger than {MAX_HEAD_DIM} (e.g. 32, 64, 80, 96, 128); change embed_dim or "
            "num_heads, or use the 'sdpa' or 'naive' attention path")


def _check_inputs(q, k, v) -> None:
    if not isinstance(q, torch.Tensor):
        raise TypeError(f"q must be a torch.Tensor, got {type(q).__name__}")
    if q.dim() != 4:
        raise ValueError(f"q must be 4-d (B, N, H, D), got shape {tuple(q.shape)}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check(name, t, tuple(q.shape), q)
    B, N, H, D = q.shape
    check_head_dim(D)
    if min(B, N, H) < 1:
        raise ValueError(f"empty input of shape {tuple(q.shape)}: B, N and H must be >= 1")
    if q.device.type == "cpu":
        if not _interpreting():
            raise ValueError(
                "flash attention got CPU tensors: it is a Triton GPU kernel and needs CUDA "
                "tensors. On a machine without a GPU use the 'sdpa' or 'naive' attention "
                "path (or set TRITON_INTERPRET=1 before importing triton to run the kernel "
                "slowly in Triton's interpreter, as the tests do)")
    elif q.device.type != "cuda":
        raise ValueError(f"flash attention needs CUDA tensors, got {q.device}")


def _scale(softmax_scale: float | None, d: int) -> float:
    softmax_scale = check_softmax_scale(softmax_scale)
    return float(softmax_scale) if softmax_scale is not None else 1.0 / math.sqrt(d)


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    softmax_scale: float | None = None) -> torch.Tensor:
    """Exact attention softmax(q k^T * scale) v without materializing the scores.

    Args:
        q, k, v: (B, N, H, D), float16 or bfloat16, on one CUDA device; any strides as long
            as the last dim is contiguous, so `qkv.view(B, N, 3, H, D).unbind(2)` goes in
            without a copy. D a multiple of 8, at most 256; any N >= 1.
        softmax_scale: defaults to 1/sqrt(D).
    Returns:
        o: (B, N, H, D), contiguous, so `o.reshape(B, N, H * D)` is free.
    Differentiable in q, k, v (deterministic backward).
    """
    _check_inputs(q, k, v)
    return _FlashAttention.apply(q, k, v, _scale(softmax_scale, q.shape[-1]))


def flash_attention_qkvpacked(qkv: torch.Tensor, softmax_scale: float | None = None
                              ) -> torch.Tensor:
    """flash_attention on a packed qkv tensor.

    Args:
        qkv: (B, N, 3, H, D), e.g. `linear(x).view(B, N, 3, H, D)`; same dtype, device and
            head-dim rules as `flash_attention`.
    Returns:
        o: (B, N, H, D), contiguous.
    The backward writes a single dqkv (B, N, 3, H, D) tensor: no cat/stack copies.
    """
    if not isinstance(qkv, torch.Tensor):
        raise TypeError(f"qkv must be a torch.Tensor, got {type(qkv).__name__}")
    if qkv.dim() != 5 or qkv.shape[2] != 3:
        raise ValueError(f"qkv must be (B, N, 3, H, D), got shape {tuple(qkv.shape)}")
    _check_inputs(*qkv.unbind(2))
    return _FlashAttentionQKVPacked.apply(qkv, _scale(softmax_scale, qkv.shape[-1]))
