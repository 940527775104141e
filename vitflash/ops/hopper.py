"""Hopper (sm_90) kernels written in Gluon, Triton's lower-level language, where the program
says itself when each matrix product is issued and waited for: forwards and a backward.

Why a second forward: in the Triton forward (kernels.fwd_kernel), compiled for sm_90, a
program waits for every earlier product when it waits for a tile's scores, so the softmax of
a tile never runs while the tensor cores work (benchmarks/KERNEL_NOTES.md: at D = 128 the
exponentials alone take half the products' clocks). Here each warp group issues the score
product of tile j, S_j = Q K_j^T, then the product of the previous tile's probabilities,
O += P_{j-1} V_{j-1}, waits for S_j alone, and computes tile j's softmax while P_{j-1} V_{j-1}
runs: FlashAttention-3's overlap within a warp group. K and V stream through STAGES
shared-memory buffers, each filled by the tensor memory accelerator (TMA) and signalled by
its own mbarrier. fwd_ws_kernel does the same with the loads in a warp of their own, and
fwd_ws_persistent_kernel with one program an SM taking many query tiles in turn.

The backward is two kernels that never add into the same rows (nothing atomic, results the
same from run to run): bwd_dkdv_kernel holds BLOCK_N keys of a head in shared memory while
the query tiles stream past, in the transposed form that keeps the keys in the accumulators'
rows, and bwd_dq_kernel holds BLOCK_M queries while the key tiles stream past. Both read the
forward's base-2 LSE and delta = rowsum(dO * O): the op launches the dQ kernel first and it
computes its rows' delta and writes it (DQ_DELTA), for the dK/dV kernel launched after it.
bwd_dkdv_ws_kernel and bwd_dq_ws_kernel are their warp-specialized forms: two consumer warp
groups share the streamed tiles, which a loader warp brings in. launch.py can launch both
(WS, DQ_WS) but lists neither: on an H100 the dK/dV one lost to bwd_dkdv_kernel, and the dQ
one, faster than bwd_dq_kernel, is staged (launch.gluon_ws_bwd_candidates) until the op has
timed it beside the listed dK/dV kernel.
(The dQ kernel without DQ_DELTA reads a delta written before it, by kernels.bwd_delta_kernel:
the form benchmarks/probes/gluon_bwd.py compares it with.)

Scope: bf16 or fp16 qkv (B, N, 3, H, D), contiguous, D in {64, 128}, no dropout, no diagonal
mask; the same O (B, N, H, D), base-2 LSE (B, H, N) and dqkv as the Triton kernels. Only on a
CUDA device of compute capability 9.x, and only where Gluon imports (`available()`): there,
unless VITFLASH_GLUON=0 (launch.gluon_kernels), launch.py lists them as candidates beside
the Triton ones ("gluon", "gluon_ws", "gluon_bwd", launched by launch.GluonLaunch and
launch.GluonBwdLaunch), and the tuner keeps whichever is fastest. Gluon kernels do not run in
the interpreter: the CPU tests compile them for sm_90 and check what they compile to; their
results are tested on the GPU.
"""
from __future__ import annotations

import functools

import torch

try:  # Gluon is experimental: its absence or a changed API must leave the Triton path whole
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait)
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    # the CTA-wide barrier: gl.barrier in triton 3.8, gl.thread_barrier in 3.6
    _cta_barrier = getattr(gl, "barrier", None) or gl.thread_barrier
    _IMPORT_ERROR: Exception | None = None
except Exception as err:  # pragma: no cover - depends on the installed triton
    _IMPORT_ERROR = err

HEAD_DIMS = (64, 128)


def available() -> bool:
    """Whether Gluon and its Hopper module import in this triton."""
    return _IMPORT_ERROR is None


if _IMPORT_ERROR is None:

    @gluon.constexpr_function
    def _mma(warps, cols, groups=1):
        """The layout of a wgmma accumulator of `cols` columns over `warps` warps: each warp
        group of 4 takes 64 rows, or (groups > 1) the groups split the columns instead."""
        return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[warps // groups, groups],
                                         instr_shape=[16, cols // groups, 16])

    @gluon.jit
    def _softmax(s, m_i, l_i, qk_scale, cols, N, MASK: gl.constexpr):
        """One tile's online-softmax update: its probabilities against the new row maximum,
        that maximum, the new row sums and the factor that rescales the old ones. Scores are
        unscaled; the maximum is in log2 units (qk_scale = softmax scale * log2 e)."""
        if MASK:  # the partial key tile: keys past N count for nothing
            s = gl.where(gl.expand_dims(cols, 0) < N, s, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, axis=1) * qk_scale)
        p = gl.exp2(s * qk_scale - gl.expand_dims(m_new, 1))
        alpha = gl.exp2(m_i - m_new)
        l_i = l_i * alpha + gl.sum(p, axis=1)
        return p, m_new, l_i, alpha

    @gluon.jit
    def _load(desc, b, j, col, bar, buf, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr):
        """Rows [j * BLOCK_N, (j + 1) * BLOCK_N) of one head's K or V (column `col`) into
        `buf`, signalling `bar` when they land."""
        mbarrier.expect(bar, BLOCK_N * HEAD_DIM * desc.dtype.primitive_bitwidth // 8)
        tma.async_copy_global_to_shared(desc, [b, j * BLOCK_N, col], bar, buf)

    @gluon.jit
    def _program(N, H, HEAD_DIM: gl.constexpr, ROWS: gl.constexpr):
        """Where this program works: _tile of the program's index (one row tile a program)."""
        return _tile(gl.program_id(0), N, H, HEAD_DIM, ROWS)

    @gluon.jit
    def _tile(t, N, H, HEAD_DIM: gl.constexpr, ROWS: gl.constexpr):
        """Row tile t's first row (of ROWS queries or keys), its (batch, head) index bh and
        batch b, and the first columns of that head's Q, K and V in a qkv row (B, N, 3, H, D)
        viewed as (B, N, 3 * H * D). Tiles go over a head's rows first."""
        n_tiles = gl.cdiv(N, ROWS)
        bh = t // n_tiles
        h = bh % H
        return ((t % n_tiles) * ROWS, bh, bh // H, h * HEAD_DIM, (H + h) * HEAD_DIM,
                (2 * H + h) * HEAD_DIM)

    @gluon.jit
    def _step(j, q_smem, k_smem, v_smem, k_bars, v_bars, acc, p, m_i, l_i, s_zero, qk_scale, N,
              kv_desc, b, k_col, v_col, n_tiles, cols0,
              BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, STAGES: gl.constexpr,
              MASK: gl.constexpr, p_layout: gl.constexpr, row_o: gl.constexpr):
        """Key tile j (j >= 1): S_j issued, then P_{j-1} V_{j-1}; S_j's softmax runs while the
        second product does; then the rescale, and the freed buffers refilled: K_j's with
        K_{j+STAGES}, V_{j-1}'s with V_{j-1+STAGES}, each needed a step or more later."""
        stage = j % STAGES
        prev = (j - 1) % STAGES
        mbarrier.wait(k_bars.index(stage), (j // STAGES) & 1)
        s = warpgroup_mma(q_smem, k_smem.index(stage).reshape([BLOCK_N, HEAD_DIM]).permute((1, 0)),
                          s_zero, use_acc=False, is_async=True)
        mbarrier.wait(v_bars.index(prev), ((j - 1) // STAGES) & 1)
        acc = warpgroup_mma(p, v_smem.index(prev).reshape([BLOCK_N, HEAD_DIM]), acc,
                            is_async=True)
        s = warpgroup_mma_wait(num_outstanding=1, deps=(s, ))
        p_new, m_i, l_i, alpha = _softmax(s, m_i, l_i, qk_scale, j * BLOCK_N + cols0, N, MASK)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
        acc = acc * gl.expand_dims(gl.convert_layout(alpha, row_o), 1)
        p = gl.convert_layout(p_new.to(kv_desc.dtype), p_layout)
        if j - 1 + STAGES < n_tiles:  # every warp is past its reads of both buffers
            _cta_barrier()
            _load(kv_desc, b, j - 1 + STAGES, v_col, v_bars.index(prev), v_smem.index(prev),
                  BLOCK_N, HEAD_DIM)
            if j + STAGES < n_tiles:
                _load(kv_desc, b, j + STAGES, k_col, k_bars.index(stage), k_smem.index(stage),
                      BLOCK_N, HEAD_DIM)
        return acc, p, m_i, l_i

    @gluon.jit
    def fwd_wgmma_kernel(q_desc, kv_desc, o_desc, LSE, qk_scale, H, N,
                         HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                         STAGES: gl.constexpr, num_warps: gl.constexpr):
        """O and LSE of BLOCK_M query rows of one (batch, head). The descriptors view qkv as
        (B, N, 3 * H * D) in (1, BLOCK_M, D) boxes (q_desc) and (1, BLOCK_N, D) boxes
        (kv_desc), and o as (B, N, H * D) (o_desc, (1, BLOCK_M, D)): rows past N are outside
        their batch's bounds, read as zeros and never written."""
        row0, bh, b, q_col, k_col, v_col = _program(N, H, HEAD_DIM, BLOCK_M)
        dtype: gl.constexpr = kv_desc.dtype

        s_layout: gl.constexpr = _mma(num_warps, BLOCK_N)
        o_layout: gl.constexpr = _mma(num_warps, HEAD_DIM)
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
        row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
        row_o: gl.constexpr = gl.SliceLayout(1, o_layout)

        q_smem = gl.allocate_shared_memory(dtype, [1, BLOCK_M, HEAD_DIM], q_desc.layout)
        k_smem = gl.allocate_shared_memory(dtype, [STAGES, 1, BLOCK_N, HEAD_DIM], kv_desc.layout)
        v_smem = gl.allocate_shared_memory(dtype, [STAGES, 1, BLOCK_N, HEAD_DIM], kv_desc.layout)
        k_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        for i in gl.static_range(STAGES):
            mbarrier.init(k_bars.index(i), count=1)
            mbarrier.init(v_bars.index(i), count=1)
        mbarrier.init(q_bar, count=1)
        fence_async_shared()

        n_tiles = gl.cdiv(N, BLOCK_N)
        n_full = N // BLOCK_N
        mbarrier.expect(q_bar, BLOCK_M * HEAD_DIM * dtype.primitive_bitwidth // 8)
        tma.async_copy_global_to_shared(q_desc, [b, row0, q_col], q_bar, q_smem)
        for i in gl.static_range(STAGES):
            if i < n_tiles:
                _load(kv_desc, b, i, k_col, k_bars.index(i), k_smem.index(i), BLOCK_N, HEAD_DIM)
                _load(kv_desc, b, i, v_col, v_bars.index(i), v_smem.index(i), BLOCK_N, HEAD_DIM)

        cols0 = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
        m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, row_s)
        l_i = gl.zeros([BLOCK_M], gl.float32, row_s)
        acc = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, o_layout)
        q2 = q_smem.reshape([BLOCK_M, HEAD_DIM])

        # tile 0: its scores alone (masked: it is the partial tile when N < BLOCK_N)
        mbarrier.wait(q_bar, 0)
        mbarrier.wait(k_bars.index(0), 0)
        s = warpgroup_mma(q2, k_smem.index(0).reshape([BLOCK_N, HEAD_DIM]).permute((1, 0)),
                          s_zero, use_acc=False, is_async=True)
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s, ))
        if STAGES < n_tiles:  # K_0's buffer is free: K_STAGES into it
            _cta_barrier()
            _load(kv_desc, b, STAGES, k_col, k_bars.index(0), k_smem.index(0), BLOCK_N, HEAD_DIM)
        p_new, m_i, l_i, alpha = _softmax(s, m_i, l_i, qk_scale, cols0, N, True)
        p = gl.convert_layout(p_new.to(dtype), p_layout)

        for j in range(1, n_full):
            acc, p, m_i, l_i = _step(j, q2, k_smem, v_smem, k_bars, v_bars, acc, p, m_i, l_i, s_zero,
                                     qk_scale, N, kv_desc, b, k_col, v_col, n_tiles, cols0,
                                     BLOCK_N, HEAD_DIM, STAGES, False, p_layout, row_o)
        if n_full >= 1 and n_full < n_tiles:  # the partial key tile after full ones
            acc, p, m_i, l_i = _step(n_full, q2, k_smem, v_smem, k_bars, v_bars, acc, p, m_i, l_i, s_zero,
                                     qk_scale, N, kv_desc, b, k_col, v_col, n_tiles, cols0,
                                     BLOCK_N, HEAD_DIM, STAGES, True, p_layout, row_o)
        last = (n_tiles - 1) % STAGES
        mbarrier.wait(v_bars.index(last), ((n_tiles - 1) // STAGES) & 1)
        acc = warpgroup_mma(p, v_smem.index(last).reshape([BLOCK_N, HEAD_DIM]), acc,
                            is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))

        for i in gl.static_range(STAGES):
            mbarrier.invalidate(k_bars.index(i))
            mbarrier.invalidate(v_bars.index(i))
        mbarrier.invalidate(q_bar)

        rows = row0 + gl.arange(0, BLOCK_M, layout=row_s)
        gl.store(LSE + bh.to(gl.int64) * N + rows, m_i + gl.log2(l_i), mask=rows < N)
        o = acc / gl.expand_dims(gl.convert_layout(l_i, row_o), 1)
        o_smem = gl.allocate_shared_memory(dtype, [1, BLOCK_M, HEAD_DIM], o_desc.layout)
        o_smem.reshape([BLOCK_M, HEAD_DIM]).store(o.to(dtype))
        fence_async_shared()
        tma.async_copy_shared_to_global(o_desc, [b, row0, q_col], o_smem)
        tma.store_wait(pendings=0)


    # Warp-specialized form: no CTA-wide barrier in the loop. Two consumer partitions of one
    # warp group each own 64 (BLOCK_M) query rows of a 2 * BLOCK_M tile and share its K and V
    # buffers; a one-warp loader partition refills a buffer once both consumers have
    # signalled it empty (an mbarrier of count 2). The consumers never wait for each other,
    # so one's softmax can run beside the other's products (FlashAttention-3's overlap across
    # warp groups) as well as beside its own P V (the overlap within one).

    @gluon.jit
    def _ws_loader(q_desc, kv_desc, o_desc, LSE, qk_scale, H, N, bh, b, row0, q_col, k_col,
                   v_col, q_smem, k_smem, v_smem, q_bars, k_ready, v_ready, k_empty, v_empty,
                   HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                   STAGES: gl.constexpr):
        """Both consumers' Q rows, then every key tile's K and V, each into its buffer once
        that buffer is empty (mbarriers start in the phase before 0: the first waits pass)."""
        for r in gl.static_range(2):
            mbarrier.expect(q_bars.index(r), BLOCK_M * HEAD_DIM * q_desc.dtype.primitive_bitwidth // 8)
            tma.async_copy_global_to_shared(q_desc, [b, row0 + r * BLOCK_M, q_col], q_bars.index(r),
                                            q_smem.index(r))
        for j in range(gl.cdiv(N, BLOCK_N)):
            _ws_fill(kv_desc, kv_desc, b, j, j, k_col, v_col, k_smem, v_smem, k_ready, v_ready, k_empty,
                     v_empty, BLOCK_N, HEAD_DIM, STAGES)

    @gluon.jit
    def _ws_fill(k_desc, v_desc, b, g, j, k_col, v_col, k_smem, v_smem, k_ready, v_ready, k_empty,
                 v_empty, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, STAGES: gl.constexpr):
        """The loader's tile j of two streamed operands (K and V in the forwards; Q and dO in
        the warp-specialized backward's dK/dV kernel) into the ring's place g: the first's buffer
        once empty, then the second's."""
        stage = g % STAGES
        phase = (g // STAGES) & 1
        mbarrier.wait(k_empty.index(stage), phase ^ 1)
        _load(k_desc, b, j, k_col, k_ready.index(stage), k_smem.index(stage), BLOCK_N, HEAD_DIM)
        mbarrier.wait(v_empty.index(stage), phase ^ 1)
        _load(v_desc, b, j, v_col, v_ready.index(stage), v_smem.index(stage), BLOCK_N, HEAD_DIM)

    @gluon.jit
    def _ws_step(g, j, q, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, acc, p, m_i, l_i,
                 s_zero, qk_scale, N, cols0, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
                 STAGES: gl.constexpr, MASK: gl.constexpr, p_layout: gl.constexpr,
                 row_o: gl.constexpr):
        """Key tile j >= 1 in one consumer, as _step, signalling each buffer empty as soon as
        its product is done instead of refilling it. g: the tile's place in the buffer ring's
        sequence (j, or past the earlier query tiles' key tiles in the persistent form)."""
        stage = g % STAGES
        prev = (g - 1) % STAGES
        mbarrier.wait(k_ready.index(stage), (g // STAGES) & 1)
        s = warpgroup_mma(q, k_smem.index(stage).reshape([BLOCK_N, HEAD_DIM]).permute((1, 0)),
                          s_zero, use_acc=False, is_async=True)
        mbarrier.wait(v_ready.index(prev), ((g - 1) // STAGES) & 1)
        acc = warpgroup_mma(p, v_smem.index(prev).reshape([BLOCK_N, HEAD_DIM]), acc,
                            is_async=True)
        s = warpgroup_mma_wait(num_outstanding=1, deps=(s, ))
        mbarrier.arrive(k_empty.index(stage), count=1)
        p_new, m_i, l_i, alpha = _softmax(s, m_i, l_i, qk_scale, j * BLOCK_N + cols0, N, MASK)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
        mbarrier.arrive(v_empty.index(prev), count=1)
        acc = acc * gl.expand_dims(gl.convert_layout(alpha, row_o), 1)
        p = gl.convert_layout(p_new.to(v_smem.dtype), p_layout)
        return acc, p, m_i, l_i

    @gluon.jit
    def _ws_tile(g0, q_buf, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, q_empty, LSE, bh,
                 first_row, qk_scale, N, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                 HEAD_DIM: gl.constexpr, STAGES: gl.constexpr, RELEASE: gl.constexpr):
        """One consumer's BLOCK_M query rows from first_row (their Q in q_buf, landed) against
        every key tile, the first in ring place g0: the online softmax, then the LSE stored;
        returns O in the input dtype. RELEASE (the persistent form): the Q buffer signalled
        empty (q_empty) after the tile's last score product, and the last V buffer after the
        last P V product."""
        s_layout: gl.constexpr = _mma(4, BLOCK_N)
        o_layout: gl.constexpr = _mma(4, HEAD_DIM)
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
        row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
        row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
        dtype: gl.constexpr = v_smem.dtype
        n_tiles = gl.cdiv(N, BLOCK_N)
        n_full = N // BLOCK_N
        cols0 = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
        m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, row_s)
        l_i = gl.zeros([BLOCK_M], gl.float32, row_s)
        acc = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, o_layout)
        q = q_buf.reshape([BLOCK_M, HEAD_DIM])

        stage0 = g0 % STAGES
        mbarrier.wait(k_ready.index(stage0), (g0 // STAGES) & 1)
        s = warpgroup_mma(q, k_smem.index(stage0).reshape([BLOCK_N, HEAD_DIM]).permute((1, 0)),
                          s_zero, use_acc=False, is_async=True)
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s, ))
        mbarrier.arrive(k_empty.index(stage0), count=1)
        p_new, m_i, l_i, alpha = _softmax(s, m_i, l_i, qk_scale, cols0, N, True)
        p = gl.convert_layout(p_new.to(dtype), p_layout)
        for j in range(1, n_full):
            acc, p, m_i, l_i = _ws_step(g0 + j, j, q, k_smem, v_smem, k_ready, v_ready, k_empty,
                                        v_empty, acc, p, m_i, l_i, s_zero, qk_scale, N, cols0,
                                        BLOCK_N, HEAD_DIM, STAGES, False, p_layout, row_o)
        if n_full >= 1 and n_full < n_tiles:
            acc, p, m_i, l_i = _ws_step(g0 + n_full, n_full, q, k_smem, v_smem, k_ready, v_ready,
                                        k_empty, v_empty, acc, p, m_i, l_i, s_zero, qk_scale, N,
                                        cols0, BLOCK_N, HEAD_DIM, STAGES, True, p_layout, row_o)
        if RELEASE:  # every score product of the tile is done
            mbarrier.arrive(q_empty, count=1)
        last = (g0 + n_tiles - 1) % STAGES
        mbarrier.wait(v_ready.index(last), ((g0 + n_tiles - 1) // STAGES) & 1)
        acc = warpgroup_mma(p, v_smem.index(last).reshape([BLOCK_N, HEAD_DIM]), acc,
                            is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
        if RELEASE:
            mbarrier.arrive(v_empty.index(last), count=1)

        rows = first_row + gl.arange(0, BLOCK_M, layout=row_s)
        gl.store(LSE + bh.to(gl.int64) * N + rows, m_i + gl.log2(l_i), mask=rows < N)
        return (acc / gl.expand_dims(gl.convert_layout(l_i, row_o), 1)).to(dtype)

    @gluon.jit
    def _ws_consumer(q_desc, kv_desc, o_desc, LSE, qk_scale, H, N, bh, b, row0, q_col, k_col,
                     v_col, q_smem, k_smem, v_smem, q_bars, k_ready, v_ready, k_empty, v_empty,
                     HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                     STAGES: gl.constexpr, R: gl.constexpr):
        """Query rows row0 + R * BLOCK_M ... in one warp group: the online softmax over every
        key tile, then O (through this consumer's Q buffer, free by then) and the LSE."""
        q_buf = q_smem.index(R)
        mbarrier.wait(q_bars.index(R), 0)
        o = _ws_tile(0, q_buf, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, q_bars, LSE, bh,
                     row0 + R * BLOCK_M, qk_scale, N, BLOCK_M, BLOCK_N, HEAD_DIM, STAGES, False)
        q_buf.reshape([BLOCK_M, HEAD_DIM]).store(o)  # its last S product read this Q long ago
        fence_async_shared()
        tma.async_copy_shared_to_global(o_desc, [b, row0 + R * BLOCK_M, q_col], q_buf)
        tma.store_wait(pendings=0)

    @gluon.jit
    def _ws_consumer1(q_desc, kv_desc, o_desc, LSE, qk_scale, H, N, bh, b, row0, q_col, k_col,
                      v_col, q_smem, k_smem, v_smem, q_bars, k_ready, v_ready, k_empty, v_empty,
                      HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                      STAGES: gl.constexpr):
        """The second consumer (a worker partition: same signature as the loader's)."""
        _ws_consumer(q_desc, kv_desc, o_desc, LSE, qk_scale, H, N, bh, b, row0, q_col, k_col,
                     v_col, q_smem, k_smem, v_smem, q_bars, k_ready, v_ready, k_empty, v_empty,
                     HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, 1)

    @gluon.jit
    def _ws_ring(kv_desc, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, STAGES: gl.constexpr):
        """The warp-specialized forwards' K and V ring: STAGES buffers of each, a ready
        mbarrier a buffer (the loader's TMA) and an empty one (count 2: both consumers)."""
        k_smem = gl.allocate_shared_memory(kv_desc.dtype, [STAGES, 1, BLOCK_N, HEAD_DIM], kv_desc.layout)
        v_smem = gl.allocate_shared_memory(kv_desc.dtype, [STAGES, 1, BLOCK_N, HEAD_DIM], kv_desc.layout)
        k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(STAGES):
            mbarrier.init(k_ready.index(i), count=1)
            mbarrier.init(v_ready.index(i), count=1)
            mbarrier.init(k_empty.index(i), count=2)  # one arrival from each consumer
            mbarrier.init(v_empty.index(i), count=2)
        return k_smem, v_smem, k_ready, v_ready, k_empty, v_empty

    @gluon.jit
    def fwd_ws_kernel(q_desc, kv_desc, o_desc, LSE, qk_scale, H, N,
                      HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                      STAGES: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                      num_warps: gl.constexpr):
        """fwd_wgmma_kernel's result for 2 * BLOCK_M query rows (BLOCK_M = 64, num_warps = 4:
        the default partition is the first consumer), warp-specialized (see above)."""
        row0, bh, b, q_col, k_col, v_col = _program(N, H, HEAD_DIM, 2 * BLOCK_M)
        dtype: gl.constexpr = kv_desc.dtype
        q_smem = gl.allocate_shared_memory(dtype, [2, 1, BLOCK_M, HEAD_DIM], q_desc.layout)
        k_smem, v_smem, k_ready, v_ready, k_empty, v_empty = _ws_ring(kv_desc, BLOCK_N, HEAD_DIM, STAGES)
        q_bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        for r in gl.static_range(2):
            mbarrier.init(q_bars.index(r), count=1)
        fence_async_shared()
        gl.warp_specialize([
            (_ws_consumer, (q_desc, kv_desc, o_desc, LSE, qk_scale, H, N, bh, b, row0, q_col,
                            k_col, v_col, q_smem, k_smem, v_smem, q_bars, k_ready, v_ready,
                            k_empty, v_empty, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, 0)),
            (_ws_consumer1, (q_desc, kv_desc, o_desc, LSE, qk_scale, H, N, bh, b, row0, q_col,
                             k_col, v_col, q_smem, k_smem, v_smem, q_bars, k_ready, v_ready,
                             k_empty, v_empty, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES)),
            (_ws_loader, (q_desc, kv_desc, o_desc, LSE, qk_scale, H, N, bh, b, row0, q_col,
                          k_col, v_col, q_smem, k_smem, v_smem, q_bars, k_ready, v_ready,
                          k_empty, v_empty, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES)),
        ], [4, 1], [CONSUMER_REGS, 24])


    # Persistent form of the warp-specialized forward: as many programs as the GPU has SMs
    # (one program an SM fits), each taking query tiles t = program, program + programs, ...
    # The loader streams every tile's key tiles through one ring whose sequence runs on across
    # the program's query tiles, so the next query tile's first K and V (and its Q, once a
    # consumer has issued its last score product) load while the consumers finish the current
    # tile's last P V product and write its O, through buffers of their own; at N = 577, with
    # five key tiles a query tile, that fill and drain are a large share of a program's time.

    @gluon.jit
    def _wsp_loader(q_desc, kv_desc, o_desc, LSE, qk_scale, H, N, TILES, q_smem, o_smem, k_smem,
                    v_smem, q_ready, q_empty, k_ready, v_ready, k_empty, v_empty,
                    HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                    STAGES: gl.constexpr):
        """Each of this program's query tiles: both consumers' Q once each has released its
        buffer, then the tile's K and V tiles into the ring as buffers empty."""
        n_kv = gl.cdiv(N, BLOCK_N)
        for t in range(gl.program_id(0), TILES, gl.num_programs(0)):
            it = t // gl.num_programs(0)  # this program's how-manyth tile
            row0, bh, b, q_col, k_col, v_col = _tile(t, N, H, HEAD_DIM, 2 * BLOCK_M)
            for r in gl.static_range(2):
                mbarrier.wait(q_empty.index(r), (it & 1) ^ 1)
                mbarrier.expect(q_ready.index(r), BLOCK_M * HEAD_DIM * q_desc.dtype.primitive_bitwidth // 8)
                tma.async_copy_global_to_shared(q_desc, [b, row0 + r * BLOCK_M, q_col],
                                                q_ready.index(r), q_smem.index(r))
            for j in range(n_kv):
                _ws_fill(kv_desc, kv_desc, b, it * n_kv + j, j, k_col, v_col, k_smem, v_smem, k_ready,
                         v_ready, k_empty, v_empty, BLOCK_N, HEAD_DIM, STAGES)

    @gluon.jit
    def _wsp_consumer(q_desc, kv_desc, o_desc, LSE, qk_scale, H, N, TILES, q_smem, o_smem, k_smem,
                      v_smem, q_ready, q_empty, k_ready, v_ready, k_empty, v_empty,
                      HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                      STAGES: gl.constexpr, R: gl.constexpr):
        """_ws_consumer over this program's query tiles: Q released after the tile's last score
        product, O written through a buffer of its own (the previous tile's store waited for
        before the buffer is rewritten)."""
        n_kv = gl.cdiv(N, BLOCK_N)
        q_buf = q_smem.index(R)
        o_buf = o_smem.index(R)
        for t in range(gl.program_id(0), TILES, gl.num_programs(0)):
            it = t // gl.num_programs(0)  # this program's how-manyth tile
            row0, bh, b, q_col, k_col, v_col = _tile(t, N, H, HEAD_DIM, 2 * BLOCK_M)
            mbarrier.wait(q_ready.index(R), it & 1)
            o = _ws_tile(it * n_kv, q_buf, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty,
                         q_empty.index(R), LSE, bh, row0 + R * BLOCK_M, qk_scale, N, BLOCK_M, BLOCK_N,
                         HEAD_DIM, STAGES, True)
            tma.store_wait(pendings=0)  # the previous tile's O has left the buffer
            o_buf.reshape([BLOCK_M, HEAD_DIM]).store(o)
            fence_async_shared()
            tma.async_copy_shared_to_global(o_desc, [b, row0 + R * BLOCK_M, q_col], o_buf)
        tma.store_wait(pendings=0)

    @gluon.jit
    def _wsp_consumer1(q_desc, kv_desc, o_desc, LSE, qk_scale, H, N, TILES, q_smem, o_smem, k_smem,
                       v_smem, q_ready, q_empty, k_ready, v_ready, k_empty, v_empty,
                       HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                       STAGES: gl.constexpr):
        """The second consumer (a worker partition: same signature as the loader's)."""
        _wsp_consumer(q_desc, kv_desc, o_desc, LSE, qk_scale, H, N, TILES, q_smem, o_smem, k_smem,
                      v_smem, q_ready, q_empty, k_ready, v_ready, k_empty, v_empty,
                      HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, 1)

    @gluon.jit
    def fwd_ws_persistent_kernel(q_desc, kv_desc, o_desc, LSE, qk_scale, H, N, TILES,
                                 HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
                                 BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                                 CONSUMER_REGS: gl.constexpr, num_warps: gl.constexpr):
        """fwd_ws_kernel's result over TILES query tiles of 2 * BLOCK_M rows (B * H * tiles a
        head), launched on fewer programs that each take every num_programs-th tile."""
        dtype: gl.constexpr = kv_desc.dtype
        q_smem = gl.allocate_shared_memory(dtype, [2, 1, BLOCK_M, HEAD_DIM], q_desc.layout)
        o_smem = gl.allocate_shared_memory(dtype, [2, 1, BLOCK_M, HEAD_DIM], o_desc.layout)
        k_smem, v_smem, k_ready, v_ready, k_empty, v_empty = _ws_ring(kv_desc, BLOCK_N, HEAD_DIM, STAGES)
        q_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        q_empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        for r in gl.static_range(2):
            mbarrier.init(q_ready.index(r), count=1)
            mbarrier.init(q_empty.index(r), count=1)
        fence_async_shared()
        gl.warp_specialize([
            (_wsp_consumer, (q_desc, kv_desc, o_desc, LSE, qk_scale, H, N, TILES, q_smem, o_smem,
                             k_smem, v_smem, q_ready, q_empty, k_ready, v_ready, k_empty, v_empty,
                             HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, 0)),
            (_wsp_consumer1, (q_desc, kv_desc, o_desc, LSE, qk_scale, H, N, TILES, q_smem, o_smem,
                              k_smem, v_smem, q_ready, q_empty, k_ready, v_ready, k_empty, v_empty,
                              HEAD_DIM, BLOCK_M, BLOCK_N, STAGES)),
            (_wsp_loader, (q_desc, kv_desc, o_desc, LSE, qk_scale, H, N, TILES, q_smem, o_smem,
                           k_smem, v_smem, q_ready, q_empty, k_ready, v_ready, k_empty, v_empty,
                           HEAD_DIM, BLOCK_M, BLOCK_N, STAGES)),
        ], [4, 1], [CONSUMER_REGS, 24])

    @gluon.jit
    def _bwd_buffers(res_a_desc, res_b_desc, ring_a_desc, ring_b_desc, b, row0, res_a_col, res_b_col,
                     ring_a_col, ring_b_col, N, RES_ROWS: gl.constexpr, RING_ROWS: gl.constexpr,
                     HEAD_DIM: gl.constexpr, STAGES: gl.constexpr):
        """A backward program's shared memory: two resident tiles of RES_ROWS rows (its own
        keys' K and V, or queries' Q and dO) behind one mbarrier, and a ring of STAGES buffers
        for each of the two operands that stream past in RING_ROWS-row tiles, an mbarrier a
        buffer; the resident tiles' loads and the ring's first STAGES tiles issued. Returns
        the buffers, the barriers and the number of streamed tiles."""
        dtype: gl.constexpr = res_a_desc.dtype
        res_a = gl.allocate_shared_memory(dtype, [1, RES_ROWS, HEAD_DIM], res_a_desc.layout)
        res_b = gl.allocate_shared_memory(dtype, [1, RES_ROWS, HEAD_DIM], res_b_desc.layout)
        ring_a = gl.allocate_shared_memory(dtype, [STAGES, 1, RING_ROWS, HEAD_DIM], ring_a_desc.layout)
        ring_b = gl.allocate_shared_memory(dtype, [STAGES, 1, RING_ROWS, HEAD_DIM], ring_b_desc.layout)
        res_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        a_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        b_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        mbarrier.init(res_bar, count=1)
        for i in gl.static_range(STAGES):
            mbarrier.init(a_bars.index(i), count=1)
            mbarrier.init(b_bars.index(i), count=1)
        fence_async_shared()

        mbarrier.expect(res_bar, 2 * RES_ROWS * HEAD_DIM * dtype.primitive_bitwidth // 8)
        tma.async_copy_global_to_shared(res_a_desc, [b, row0, res_a_col], res_bar, res_a)
        tma.async_copy_global_to_shared(res_b_desc, [b, row0, res_b_col], res_bar, res_b)
        n_tiles = gl.cdiv(N, RING_ROWS)
        for i in gl.static_range(STAGES):
            if i < n_tiles:
                _refill(ring_a_desc, ring_b_desc, b, i, ring_a_col, ring_b_col, a_bars, b_bars,
                        ring_a, ring_b, i, RING_ROWS, HEAD_DIM)
        return res_a, res_b, res_bar, ring_a, ring_b, a_bars, b_bars, n_tiles

    @gluon.jit
    def _refill(a_desc, b_desc, b, j, a_col, b_col, a_bars, b_bars, ring_a, ring_b, stage,
                ROWS: gl.constexpr, HEAD_DIM: gl.constexpr):
        """Streamed tile j of both ring operands into buffer `stage` of their rings."""
        _load(a_desc, b, j, a_col, a_bars.index(stage), ring_a.index(stage), ROWS, HEAD_DIM)
        _load(b_desc, b, j, b_col, b_bars.index(stage), ring_b.index(stage), ROWS, HEAD_DIM)

    @gluon.jit
    def _bwd_release(res_bar, a_bars, b_bars, STAGES: gl.constexpr):
        """The barriers of _bwd_buffers invalidated (the program is done with its rings)."""
        mbarrier.invalidate(res_bar)
        for i in gl.static_range(STAGES):
            mbarrier.invalidate(a_bars.index(i))
            mbarrier.invalidate(b_bars.index(i))

    @gluon.jit
    def _query_stats(LSE, DELTA, base, cols, N):
        """The LSE and delta of a dK/dV step's query tile (its columns `cols` of the head at
        `base`): queries past N get an infinite LSE, so their probabilities are 0 (their rows
        of Q and dO are zeros)."""
        lse = gl.load(LSE + base + cols, mask=cols < N, other=float("inf"))
        delta = gl.load(DELTA + base + cols, mask=cols < N, other=0.0)
        return lse, delta

    @gluon.jit
    def _dkdv_scores(i, q_smem, do_smem, q_bars, do_bars, k2, v2, t_zero, BLOCK_M: gl.constexpr,
                     HEAD_DIM: gl.constexpr, STAGES: gl.constexpr):
        """A dK/dV step's opening: query tile i's Q and dO views once each has landed in its
        ring buffer, and S^T = K Q_i^T and dP^T = V dO_i^T issued (returned unfinished)."""
        stage = i % STAGES
        phase = (i // STAGES) & 1
        mbarrier.wait(q_bars.index(stage), phase)
        q2 = q_smem.index(stage).reshape([BLOCK_M, HEAD_DIM])
        st = warpgroup_mma(k2, q2.permute((1, 0)), t_zero, use_acc=False, is_async=True)
        mbarrier.wait(do_bars.index(stage), phase)
        do2 = do_smem.index(stage).reshape([BLOCK_M, HEAD_DIM])
        dpt = warpgroup_mma(v2, do2.permute((1, 0)), t_zero, use_acc=False, is_async=True)
        return q2, do2, st, dpt

    @gluon.jit
    def _dkdv_step(i, q_desc, do_desc, q_smem, do_smem, q_bars, do_bars, k2, v2, dv, dk, lse, delta,
                   t_zero, qk_scale, LSE, DELTA, base, cols0, b, q_col, N, n_tiles,
                   op_layout: gl.constexpr, PREV: gl.constexpr, BLOCK_M: gl.constexpr,
                   HEAD_DIM: gl.constexpr, STAGES: gl.constexpr):
        """Step i of bwd_dkdv_kernel: S^T and dP^T issued; then (PREV, the OVERLAP form past
        its first step) the previous step's dV and dK products, issued before them, waited for
        and that step's buffers refilled; then dV and dK of this step issued and left running.
        Returns them (unfinished: the caller waits for them at once, or the next step does)
        with the next step's row statistics."""
        dtype: gl.constexpr = q_desc.dtype
        q2, do2, st, dpt = _dkdv_scores(i, q_smem, do_smem, q_bars, do_bars, k2, v2, t_zero, BLOCK_M,
                                        HEAD_DIM, STAGES)
        if PREV:  # (wgmma groups retire in the order they were issued)
            dv, dk = warpgroup_mma_wait(num_outstanding=2, deps=(dv, dk))
            if i - 1 + STAGES < n_tiles:  # every warp is past its reads of that step's buffers
                _cta_barrier()
                _refill(q_desc, do_desc, b, i - 1 + STAGES, q_col, q_col, q_bars, do_bars, q_smem,
                        do_smem, (i - 1) % STAGES, BLOCK_M, HEAD_DIM)
        st = warpgroup_mma_wait(num_outstanding=1, deps=(st, ))
        pt = gl.exp2(st * qk_scale - gl.expand_dims(lse, 0))
        dv = warpgroup_mma(gl.convert_layout(pt.to(dtype), op_layout), do2, dv, is_async=True)
        dpt = warpgroup_mma_wait(num_outstanding=1, deps=(dpt, ))
        dst = pt * (dpt - gl.expand_dims(delta, 0))
        dk = warpgroup_mma(gl.convert_layout(dst.to(dtype), op_layout), q2, dk, is_async=True)
        lse, delta = _query_stats(LSE, DELTA, base, (i + 1) * BLOCK_M + cols0, N)
        return dv, dk, lse, delta

    @gluon.jit
    def _dkdv_setup(q_desc, kv_desc, do_desc, LSE, DELTA, b, bh, row0, q_col, k_col, v_col, N, cols0,
                    BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
                    STAGES: gl.constexpr):
        """A dK/dV program's start: _bwd_buffers with its keys' K and V resident (returned as
        (BLOCK_N, D) views) and Q and dO in the ring, the head's row offset `base` into LSE and
        DELTA, and the first query tile's LSE and delta (cols0: the tile's column indices)."""
        k_smem, v_smem, kv_bar, q_smem, do_smem, q_bars, do_bars, n_tiles = _bwd_buffers(
            kv_desc, kv_desc, q_desc, do_desc, b, row0, k_col, v_col, q_col, q_col, N,
            BLOCK_N, BLOCK_M, HEAD_DIM, STAGES)
        base = bh.to(gl.int64) * N
        lse, delta = _query_stats(LSE, DELTA, base, cols0, N)
        return (k_smem.reshape([BLOCK_N, HEAD_DIM]), v_smem.reshape([BLOCK_N, HEAD_DIM]), kv_bar,
                q_smem, do_smem, q_bars, do_bars, n_tiles, base, lse, delta)

    @gluon.jit
    def bwd_dkdv_kernel(q_desc, kv_desc, do_desc, dkv_desc, LSE, DELTA, qk_scale, sm_scale, H, N,
                        HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                        STAGES: gl.constexpr, num_warps: gl.constexpr, OVERLAP: gl.constexpr = 0):
        """dK and dV of BLOCK_N keys of one (batch, head). Descriptors: qkv as (B, N, 3 * H * D)
        in (1, BLOCK_M, D) boxes (q_desc) and (1, BLOCK_N, D) boxes (kv_desc), do as
        (B, N, H * D) in (1, BLOCK_M, D) boxes, dqkv like qkv in (1, BLOCK_N, D) boxes (dkv_desc).
        LSE: the forward's base-2 log-sum-exp, DELTA: rowsum(dO * O), both (B, H, N) fp32.

        OVERLAP = 0: each step waits for its dV and dK products before the next step begins.
        OVERLAP = 1: they finish behind the next step's S^T and dP^T products, which are
        issued first (_dkdv_step); a step waits for the previous one's two, then refills
        that step's buffers."""
        row0, bh, b, q_col, k_col, v_col = _program(N, H, HEAD_DIM, BLOCK_N)

        # (keys, queries) tiles and (keys, head dim) accumulators, each warp group 64 key rows
        t_layout: gl.constexpr = _mma(num_warps, BLOCK_M)
        acc_layout: gl.constexpr = _mma(num_warps, HEAD_DIM)
        op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
        col_t: gl.constexpr = gl.SliceLayout(0, t_layout)

        cols0 = gl.arange(0, BLOCK_M, layout=col_t)
        k2, v2, kv_bar, q_smem, do_smem, q_bars, do_bars, n_tiles, base, lse, delta = _dkdv_setup(
            q_desc, kv_desc, do_desc, LSE, DELTA, b, bh, row0, q_col, k_col, v_col, N, cols0,
            BLOCK_M, BLOCK_N, HEAD_DIM, STAGES)
        t_zero = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, t_layout)
        dk = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, acc_layout)
        dv = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, acc_layout)
        mbarrier.wait(kv_bar, 0)
        if OVERLAP:  # step 0, then each step with the previous one's dV and dK finishing behind
            dv, dk, lse, delta = _dkdv_step(0, q_desc, do_desc, q_smem, do_smem, q_bars, do_bars,
                                            k2, v2, dv, dk, lse, delta, t_zero, qk_scale, LSE,
                                            DELTA, base, cols0, b, q_col, N, n_tiles, op_layout,
                                            False, BLOCK_M, HEAD_DIM, STAGES)
            for i in range(1, n_tiles):
                dv, dk, lse, delta = _dkdv_step(i, q_desc, do_desc, q_smem, do_smem, q_bars, do_bars,
                                                k2, v2, dv, dk, lse, delta, t_zero, qk_scale, LSE,
                                                DELTA, base, cols0, b, q_col, N, n_tiles, op_layout,
                                                True, BLOCK_M, HEAD_DIM, STAGES)
            dv, dk = warpgroup_mma_wait(num_outstanding=0, deps=(dv, dk))
        else:  # each step's dV and dK waited for before the next step
            for i in range(n_tiles):
                dv, dk, lse, delta = _dkdv_step(i, q_desc, do_desc, q_smem, do_smem, q_bars, do_bars,
                                                k2, v2, dv, dk, lse, delta, t_zero, qk_scale, LSE,
                                                DELTA, base, cols0, b, q_col, N, n_tiles, op_layout,
                                                False, BLOCK_M, HEAD_DIM, STAGES)
                dv, dk = warpgroup_mma_wait(num_outstanding=0, deps=(dv, dk))
                if i + STAGES < n_tiles:  # every warp is past its reads of this step's buffers
                    _cta_barrier()
                    _refill(q_desc, do_desc, b, i + STAGES, q_col, q_col, q_bars, do_bars, q_smem,
                            do_smem, i % STAGES, BLOCK_M, HEAD_DIM)

        _bwd_release(kv_bar, q_bars, do_bars, STAGES)
        _store_dkdv(dkv_desc, dk, dv, sm_scale, b, row0, k_col, v_col, BLOCK_N, HEAD_DIM)

    @gluon.jit
    def _store_dkdv(dkv_desc, dk, dv, sm_scale, b, row0, k_col, v_col, BLOCK_N: gl.constexpr,
                    HEAD_DIM: gl.constexpr):
        """dK (times the softmax scale), then dV, through one staging buffer (keys past N are
        outside the bounds: not written)."""
        dtype: gl.constexpr = dkv_desc.dtype
        out = gl.allocate_shared_memory(dtype, [1, BLOCK_N, HEAD_DIM], dkv_desc.layout)
        out.reshape([BLOCK_N, HEAD_DIM]).store((dk * sm_scale).to(dtype))
        fence_async_shared()
        tma.async_copy_shared_to_global(dkv_desc, [b, row0, k_col], out)
        tma.store_wait(pendings=0)
        _cta_barrier()
        out.reshape([BLOCK_N, HEAD_DIM]).store(dv.to(dtype))
        fence_async_shared()
        tma.async_copy_shared_to_global(dkv_desc, [b, row0, v_col], out)
        tma.store_wait(pendings=0)

    @gluon.jit
    def _dq_step(j, kv_desc, k_smem, v_smem, k_bars, v_bars, q2, do2, dq, lse, delta, s_zero,
                 qk_scale, b, k_col, v_col, n_tiles, op_layout: gl.constexpr, PREV: gl.constexpr,
                 BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, STAGES: gl.constexpr):
        """Step j of bwd_dq_kernel: S and dP issued; then (PREV) the previous step's dQ
        product, issued before them, waited for and that step's K and V buffers refilled;
        then this step's dQ product issued and left running (returned unfinished)."""
        stage = j % STAGES
        phase = (j // STAGES) & 1
        dtype: gl.constexpr = kv_desc.dtype
        mbarrier.wait(k_bars.index(stage), phase)
        k2 = k_smem.index(stage).reshape([BLOCK_N, HEAD_DIM])
        s = warpgroup_mma(q2, k2.permute((1, 0)), s_zero, use_acc=False, is_async=True)
        mbarrier.wait(v_bars.index(stage), phase)
        v2 = v_smem.index(stage).reshape([BLOCK_N, HEAD_DIM])
        dp = warpgroup_mma(do2, v2.permute((1, 0)), s_zero, use_acc=False, is_async=True)
        if PREV:  # (wgmma groups retire in the order they were issued)
            dq = warpgroup_mma_wait(num_outstanding=2, deps=(dq, ))
            if j - 1 + STAGES < n_tiles:  # every warp is past its reads of that step's buffers
                _cta_barrier()
                _refill(kv_desc, kv_desc, b, j - 1 + STAGES, k_col, v_col, k_bars, v_bars, k_smem,
                        v_smem, (j - 1) % STAGES, BLOCK_N, HEAD_DIM)
        s = warpgroup_mma_wait(num_outstanding=1, deps=(s, ))
        p = gl.exp2(s * qk_scale - gl.expand_dims(lse, 1))
        dp = warpgroup_mma_wait(num_outstanding=0, deps=(dp, ))
        ds = p * (dp - gl.expand_dims(delta, 1))
        return warpgroup_mma(gl.convert_layout(ds.to(dtype), op_layout), k2, dq, is_async=True)

    @gluon.jit
    def _dq_delta(O, DELTA, do2, qdo_bar, b, row0, q_col, base, H, N, row_s: gl.constexpr,
                  HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, num_warps: gl.constexpr):
        """delta = rowsum(dO * O) of a dQ program's BLOCK_M rows from row0 (DQ_DELTA), written to
        DELTA and returned in row_s: O's rows (zeros past N) read through pointers while dO's
        land in do2 (qdo_bar), then multiplied row by row in fp32."""
        o_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])
        o_rows = row0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, o_layout))
        o_cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, o_layout))
        o_offs = (b.to(gl.int64) * N + o_rows) * (H * HEAD_DIM) + q_col
        o = gl.load(O + gl.expand_dims(o_offs, 1) + gl.expand_dims(o_cols, 0),
                    mask=gl.expand_dims(o_rows < N, 1), other=0.0)
        mbarrier.wait(qdo_bar, 0)
        delta = gl.sum(o.to(gl.float32) * do2.load(o_layout).to(gl.float32), axis=1)
        gl.store(DELTA + base + o_rows, delta, mask=o_rows < N)
        return gl.convert_layout(delta, row_s)

    @gluon.jit
    def bwd_dq_kernel(q_desc, kv_desc, do_desc, dq_desc, LSE, DELTA, O, qk_scale, sm_scale, H, N,
                      HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                      STAGES: gl.constexpr, num_warps: gl.constexpr, OVERLAP: gl.constexpr = 0,
                      DQ_DELTA: gl.constexpr = 0):
        """dQ of BLOCK_M queries of one (batch, head): Q and dO stay in shared memory while the
        key tiles stream past (K and V in a ring of STAGES TMA buffers). S = Q K_j^T and
        dP = dO V_j^T issued together; P = exp2(S * qk_scale - LSE), dS = P * (dP - delta),
        dQ += dS K_j. Keys past N need no mask: their K rows are read as zeros, so their dS
        adds nothing. Descriptors as bwd_dkdv_kernel's, with K/V boxes of BLOCK_N rows and
        dq_desc (dqkv) of BLOCK_M. OVERLAP as bwd_dkdv_kernel's: each step's dQ product
        finishes behind the next step's S and dP (_dq_step).

        DQ_DELTA = 1: the program computes its rows' delta = rowsum(dO * O) itself, from O
        (B, N, H, D) read through pointers and dO from its shared memory, and writes it to
        DELTA for the dK/dV kernel, launched after this one (no delta kernel before it).
        DQ_DELTA = 0: it reads DELTA, written before it; O is not read."""
        row0, bh, b, q_col, k_col, v_col = _program(N, H, HEAD_DIM, BLOCK_M)
        dtype: gl.constexpr = kv_desc.dtype

        s_layout: gl.constexpr = _mma(num_warps, BLOCK_N)
        acc_layout: gl.constexpr = _mma(num_warps, HEAD_DIM)
        op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
        row_s: gl.constexpr = gl.SliceLayout(1, s_layout)

        q_smem, do_smem, qdo_bar, k_smem, v_smem, k_bars, v_bars, n_tiles = _bwd_buffers(
            q_desc, do_desc, kv_desc, kv_desc, b, row0, q_col, q_col, k_col, v_col, N,
            BLOCK_M, BLOCK_N, HEAD_DIM, STAGES)

        rows = row0 + gl.arange(0, BLOCK_M, layout=row_s)
        base = bh.to(gl.int64) * N
        # rows past N: zeros of Q and dO, so any finite statistics do; their dQ is not written
        lse = gl.load(LSE + base + rows, mask=rows < N, other=0.0)
        if not DQ_DELTA:
            delta = gl.load(DELTA + base + rows, mask=rows < N, other=0.0)
        s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
        dq = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, acc_layout)
        q2 = q_smem.reshape([BLOCK_M, HEAD_DIM])
        do2 = do_smem.reshape([BLOCK_M, HEAD_DIM])
        if DQ_DELTA:
            delta = _dq_delta(O, DELTA, do2, qdo_bar, b, row0, q_col, base, H, N, row_s, HEAD_DIM,
                              BLOCK_M, num_warps)
        else:
            mbarrier.wait(qdo_bar, 0)
        if OVERLAP:  # step 0, then each step with the previous one's dQ product finishing behind
            dq = _dq_step(0, kv_desc, k_smem, v_smem, k_bars, v_bars, q2, do2, dq, lse, delta, s_zero,
                          qk_scale, b, k_col, v_col, n_tiles, op_layout, False, BLOCK_N, HEAD_DIM,
                          STAGES)
            for j in range(1, n_tiles):
                dq = _dq_step(j, kv_desc, k_smem, v_smem, k_bars, v_bars, q2, do2, dq, lse, delta,
                              s_zero, qk_scale, b, k_col, v_col, n_tiles, op_layout, True, BLOCK_N,
                              HEAD_DIM, STAGES)
            dq = warpgroup_mma_wait(num_outstanding=0, deps=(dq, ))
        else:  # each step's dQ product waited for before the next step
            for j in range(n_tiles):
                dq = _dq_step(j, kv_desc, k_smem, v_smem, k_bars, v_bars, q2, do2, dq, lse, delta,
                              s_zero, qk_scale, b, k_col, v_col, n_tiles, op_layout, False, BLOCK_N,
                              HEAD_DIM, STAGES)
                dq = warpgroup_mma_wait(num_outstanding=0, deps=(dq, ))
                if j + STAGES < n_tiles:  # every warp is past its reads of this stage's buffers
                    _cta_barrier()
                    _refill(kv_desc, kv_desc, b, j + STAGES, k_col, v_col, k_bars, v_bars, k_smem,
                            v_smem, j % STAGES, BLOCK_N, HEAD_DIM)

        _bwd_release(qdo_bar, k_bars, v_bars, STAGES)
        out = gl.allocate_shared_memory(dtype, [1, BLOCK_M, HEAD_DIM], dq_desc.layout)
        out.reshape([BLOCK_M, HEAD_DIM]).store((dq * sm_scale).to(dtype))
        fence_async_shared()
        tma.async_copy_shared_to_global(dq_desc, [b, row0, q_col], out)
        tma.store_wait(pendings=0)

    # The warp-specialized backward (the WS and DQ_WS forms of a "gluon_bwd" candidate): the
    # kernels above stream every Q and dO tile past each 64-key dK/dV program, and every K and
    # V tile past each 64-query dQ program; here two consumer warp groups share one stream,
    # which a one-warp loader fills, as in fwd_ws_kernel.

    @gluon.jit
    def _ws_resident_buffers(a_desc, b_desc, ROWS: gl.constexpr, HEAD_DIM: gl.constexpr):
        """A warp-specialized backward's resident tiles in shared memory: each consumer's ROWS
        rows of two operands (K and V, or Q and dO), and an mbarrier per consumer."""
        a_smem = gl.allocate_shared_memory(a_desc.dtype, [2, 1, ROWS, HEAD_DIM], a_desc.layout)
        b_smem = gl.allocate_shared_memory(b_desc.dtype, [2, 1, ROWS, HEAD_DIM], b_desc.layout)
        bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        for g in gl.static_range(2):
            mbarrier.init(bars.index(g), count=1)
        return a_smem, b_smem, bars

    @gluon.jit
    def _ws_resident(a_desc, b_desc, b, row0, a_col, b_col, bars, a_smem, b_smem, ROWS: gl.constexpr,
                     HEAD_DIM: gl.constexpr):
        """The loader's resident tiles (_ws_resident_buffers): consumer g's ROWS rows from
        row0 + g * ROWS of two operands into a_smem[g] and b_smem[g], behind bars[g]."""
        for g in gl.static_range(2):
            bar = bars.index(g)
            mbarrier.expect(bar, 2 * ROWS * HEAD_DIM * a_desc.dtype.primitive_bitwidth // 8)
            tma.async_copy_global_to_shared(a_desc, [b, row0 + g * ROWS, a_col], bar, a_smem.index(g))
            tma.async_copy_global_to_shared(b_desc, [b, row0 + g * ROWS, b_col], bar, b_smem.index(g))

    @gluon.jit
    def _wsd_loader(q_desc, kv_desc, do_desc, dkv_desc, LSE, DELTA, qk_scale, sm_scale, N, bh, b, row0,
                    q_col, k_col, v_col, k_smem, v_smem, kv_bars, q_ring, do_ring, q_ready, do_ready,
                    q_empty, do_empty, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
                    BLOCK_N: gl.constexpr, STAGES: gl.constexpr):
        """Both consumers' K and V (BLOCK_N keys each, a barrier each), then every query tile's
        Q and dO, each into its ring buffer once both consumers have signalled it empty."""
        _ws_resident(kv_desc, kv_desc, b, row0, k_col, v_col, kv_bars, k_smem, v_smem, BLOCK_N, HEAD_DIM)
        for i in range(gl.cdiv(N, BLOCK_M)):
            _ws_fill(q_desc, do_desc, b, i, i, q_col, q_col, q_ring, do_ring, q_ready, do_ready,
                     q_empty, do_empty, BLOCK_M, HEAD_DIM, STAGES)

    @gluon.jit
    def _wsd_consumer(q_desc, kv_desc, do_desc, dkv_desc, LSE, DELTA, qk_scale, sm_scale, N, bh, b, row0,
                      q_col, k_col, v_col, k_smem, v_smem, kv_bars, q_ring, do_ring, q_ready, do_ready,
                      q_empty, do_empty, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
                      BLOCK_N: gl.constexpr, STAGES: gl.constexpr, G: gl.constexpr):
        """Consumer G's BLOCK_N keys in one warp group: hopper._dkdv_step over every query tile
        of the ring (no refill: each step's Q and dO buffers are signalled empty once its dV and
        dK products are done), then its dK and dV stored."""
        t_layout: gl.constexpr = _mma(4, BLOCK_M)
        acc_layout: gl.constexpr = _mma(4, HEAD_DIM)
        op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
        cols0 = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, t_layout))
        base = bh.to(gl.int64) * N
        lse, delta = _query_stats(LSE, DELTA, base, cols0, N)
        t_zero = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, t_layout)
        dk = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, acc_layout)
        dv = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, acc_layout)
        k2 = k_smem.index(G).reshape([BLOCK_N, HEAD_DIM])
        v2 = v_smem.index(G).reshape([BLOCK_N, HEAD_DIM])
        n_tiles = gl.cdiv(N, BLOCK_M)
        mbarrier.wait(kv_bars.index(G), 0)
        for i in range(n_tiles):
            dv, dk, lse, delta = _dkdv_step(i, q_desc, do_desc, q_ring, do_ring, q_ready, do_ready,
                                            k2, v2, dv, dk, lse, delta, t_zero, qk_scale, LSE,
                                            DELTA, base, cols0, b, q_col, N, n_tiles, op_layout,
                                            False, BLOCK_M, HEAD_DIM, STAGES)
            dv, dk = warpgroup_mma_wait(num_outstanding=0, deps=(dv, dk))
            mbarrier.arrive(q_empty.index(i % STAGES), count=1)
            mbarrier.arrive(do_empty.index(i % STAGES), count=1)
        _store_dkdv(dkv_desc, dk, dv, sm_scale, b, row0 + G * BLOCK_N, k_col, v_col, BLOCK_N, HEAD_DIM)

    @gluon.jit
    def _wsd_consumer1(q_desc, kv_desc, do_desc, dkv_desc, LSE, DELTA, qk_scale, sm_scale, N, bh, b, row0,
                       q_col, k_col, v_col, k_smem, v_smem, kv_bars, q_ring, do_ring, q_ready, do_ready,
                       q_empty, do_empty, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
                       BLOCK_N: gl.constexpr, STAGES: gl.constexpr):
        """The second consumer (a worker partition: same signature as the loader's)."""
        _wsd_consumer(q_desc, kv_desc, do_desc, dkv_desc, LSE, DELTA, qk_scale, sm_scale, N, bh, b, row0,
                      q_col, k_col, v_col, k_smem, v_smem, kv_bars, q_ring, do_ring, q_ready, do_ready,
                      q_empty, do_empty, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, 1)

    @gluon.jit
    def bwd_dkdv_ws_kernel(q_desc, kv_desc, do_desc, dkv_desc, LSE, DELTA, qk_scale, sm_scale, H, N,
                           HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                           STAGES: gl.constexpr, CONSUMER_REGS: gl.constexpr, num_warps: gl.constexpr):
        """hopper.bwd_dkdv_kernel's dK and dV for 2 * BLOCK_N keys, warp-specialized: two
        consumer warp groups of BLOCK_N = 64 keys each (CONSUMER_REGS registers a thread) share
        one ring of Q and dO tiles, filled by a one-warp loader (24 registers), so each tile is
        loaded once for 128 keys and no consumer issues a copy or waits at a CTA barrier.
        Compiled for sm_90: no spills with 32-query tiles at D = 128 or 64-query ones at D = 64;
        108-120 bytes with 64-query tiles at D = 128 (not listed)."""
        row0, bh, b, q_col, k_col, v_col = _program(N, H, HEAD_DIM, 2 * BLOCK_N)
        k_smem, v_smem, kv_bars = _ws_resident_buffers(kv_desc, kv_desc, BLOCK_N, HEAD_DIM)
        q_ring, do_ring, q_ready, do_ready, q_empty, do_empty = _ws_ring(q_desc, BLOCK_M, HEAD_DIM, STAGES)
        fence_async_shared()
        gl.warp_specialize([
            (_wsd_consumer, (q_desc, kv_desc, do_desc, dkv_desc, LSE, DELTA, qk_scale, sm_scale, N, bh, b,
                             row0, q_col, k_col, v_col, k_smem, v_smem, kv_bars, q_ring, do_ring, q_ready,
                             do_ready, q_empty, do_empty, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, 0)),
            (_wsd_consumer1, (q_desc, kv_desc, do_desc, dkv_desc, LSE, DELTA, qk_scale, sm_scale, N, bh, b,
                              row0, q_col, k_col, v_col, k_smem, v_smem, kv_bars, q_ring, do_ring, q_ready,
                              do_ready, q_empty, do_empty, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES)),
            (_wsd_loader, (q_desc, kv_desc, do_desc, dkv_desc, LSE, DELTA, qk_scale, sm_scale, N, bh, b,
                           row0, q_col, k_col, v_col, k_smem, v_smem, kv_bars, q_ring, do_ring, q_ready,
                           do_ready, q_empty, do_empty, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES)),
        ], [4, 1], [CONSUMER_REGS, 24])

    @gluon.jit
    def _wsq_loader(q_desc, kv_desc, do_desc, dq_desc, LSE, DELTA, O, qk_scale, sm_scale, H, N, bh, b,
                    row0, q_col, k_col, v_col, q_smem, do_smem, qdo_bars, k_ring, v_ring, k_ready,
                    v_ready, k_empty, v_empty, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
                    BLOCK_N: gl.constexpr, STAGES: gl.constexpr):
        """Both consumers' Q and dO rows (BLOCK_M each), then every key tile's K and V, each
        into its ring buffer once both consumers have signalled it empty."""
        _ws_resident(q_desc, do_desc, b, row0, q_col, q_col, qdo_bars, q_smem, do_smem, BLOCK_M, HEAD_DIM)
        for j in range(gl.cdiv(N, BLOCK_N)):
            _ws_fill(kv_desc, kv_desc, b, j, j, k_col, v_col, k_ring, v_ring, k_ready, v_ready,
                     k_empty, v_empty, BLOCK_N, HEAD_DIM, STAGES)

    @gluon.jit
    def _wsq_consumer(q_desc, kv_desc, do_desc, dq_desc, LSE, DELTA, O, qk_scale, sm_scale, H, N, bh, b,
                      row0, q_col, k_col, v_col, q_smem, do_smem, qdo_bars, k_ring, v_ring, k_ready,
                      v_ready, k_empty, v_empty, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
                      BLOCK_N: gl.constexpr, STAGES: gl.constexpr, G: gl.constexpr):
        """Consumer G's BLOCK_M query rows in one warp group: their delta (hopper._dq_delta,
        written for the dK/dV kernel), then hopper._dq_step over every key tile of the ring
        (each step's K and V buffers signalled empty once its dQ product is done), then dQ
        stored through its Q buffer."""
        s_layout: gl.constexpr = _mma(4, BLOCK_N)
        acc_layout: gl.constexpr = _mma(4, HEAD_DIM)
        op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
        row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
        first = row0 + G * BLOCK_M
        rows = first + gl.arange(0, BLOCK_M, layout=row_s)
        base = bh.to(gl.int64) * N
        lse = gl.load(LSE + base + rows, mask=rows < N, other=0.0)
        q2 = q_smem.index(G).reshape([BLOCK_M, HEAD_DIM])
        do2 = do_smem.index(G).reshape([BLOCK_M, HEAD_DIM])
        delta = _dq_delta(O, DELTA, do2, qdo_bars.index(G), b, first, q_col, base, H, N, row_s,
                          HEAD_DIM, BLOCK_M, 4)
        s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
        dq = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, acc_layout)
        n_tiles = gl.cdiv(N, BLOCK_N)
        for j in range(n_tiles):
            dq = _dq_step(j, kv_desc, k_ring, v_ring, k_ready, v_ready, q2, do2, dq, lse, delta, s_zero,
                          qk_scale, b, k_col, v_col, n_tiles, op_layout, False, BLOCK_N, HEAD_DIM,
                          STAGES)
            dq = warpgroup_mma_wait(num_outstanding=0, deps=(dq, ))
            mbarrier.arrive(k_empty.index(j % STAGES), count=1)
            mbarrier.arrive(v_empty.index(j % STAGES), count=1)
        q_buf = q_smem.index(G)  # its last score product read this Q long ago
        q_buf.reshape([BLOCK_M, HEAD_DIM]).store((dq * sm_scale).to(q_desc.dtype))
        fence_async_shared()
        tma.async_copy_shared_to_global(dq_desc, [b, first, q_col], q_buf)
        tma.store_wait(pendings=0)

    @gluon.jit
    def _wsq_consumer1(q_desc, kv_desc, do_desc, dq_desc, LSE, DELTA, O, qk_scale, sm_scale, H, N, bh, b,
                       row0, q_col, k_col, v_col, q_smem, do_smem, qdo_bars, k_ring, v_ring, k_ready,
                       v_ready, k_empty, v_empty, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
                       BLOCK_N: gl.constexpr, STAGES: gl.constexpr):
        """The second consumer (a worker partition: same signature as the loader's)."""
        _wsq_consumer(q_desc, kv_desc, do_desc, dq_desc, LSE, DELTA, O, qk_scale, sm_scale, H, N, bh, b,
                      row0, q_col, k_col, v_col, q_smem, do_smem, qdo_bars, k_ring, v_ring, k_ready,
                      v_ready, k_empty, v_empty, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, 1)

    @gluon.jit
    def bwd_dq_ws_kernel(q_desc, kv_desc, do_desc, dq_desc, LSE, DELTA, O, qk_scale, sm_scale, H, N,
                         HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                         STAGES: gl.constexpr, CONSUMER_REGS: gl.constexpr, num_warps: gl.constexpr):
        """hopper.bwd_dq_kernel's dQ (with DQ_DELTA: delta computed and written) for 2 * BLOCK_M
        queries, warp-specialized as bwd_dkdv_ws_kernel: two consumer warp groups of BLOCK_M = 64
        queries share one ring of K and V tiles that a one-warp loader fills."""
        row0, bh, b, q_col, k_col, v_col = _program(N, H, HEAD_DIM, 2 * BLOCK_M)
        q_smem, do_smem, qdo_bars = _ws_resident_buffers(q_desc, do_desc, BLOCK_M, HEAD_DIM)
        k_ring, v_ring, k_ready, v_ready, k_empty, v_empty = _ws_ring(kv_desc, BLOCK_N, HEAD_DIM, STAGES)
        fence_async_shared()
        gl.warp_specialize([
            (_wsq_consumer, (q_desc, kv_desc, do_desc, dq_desc, LSE, DELTA, O, qk_scale, sm_scale, H, N,
                             bh, b, row0, q_col, k_col, v_col, q_smem, do_smem, qdo_bars, k_ring,
                             v_ring, k_ready, v_ready, k_empty, v_empty, HEAD_DIM, BLOCK_M, BLOCK_N,
                             STAGES, 0)),
            (_wsq_consumer1, (q_desc, kv_desc, do_desc, dq_desc, LSE, DELTA, O, qk_scale, sm_scale, H,
                              N, bh, b, row0, q_col, k_col, v_col, q_smem, do_smem, qdo_bars, k_ring,
                              v_ring, k_ready, v_ready, k_empty, v_empty, HEAD_DIM, BLOCK_M, BLOCK_N,
                              STAGES)),
            (_wsq_loader, (q_desc, kv_desc, do_desc, dq_desc, LSE, DELTA, O, qk_scale, sm_scale, H, N,
                           bh, b, row0, q_col, k_col, v_col, q_smem, do_smem, qdo_bars, k_ring, v_ring,
                           k_ready, v_ready, k_empty, v_empty, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES)),
        ], [4, 1], [CONSUMER_REGS, 24])


@functools.lru_cache(maxsize=None)
def _layout(rows: int, d: int, dtype: torch.dtype):
    """The shared-memory layout of a (1, rows, d) TMA box of `dtype` (128-byte swizzle)."""
    return gl.NVMMASharedLayout.get_default_for(
        [1, rows, d], gl.bfloat16 if dtype == torch.bfloat16 else gl.float16)


def descriptor(t: torch.Tensor, rows: int):
    """A TMA descriptor of t (B, N, ...), contiguous, viewed as (B, N, the rest), in boxes of
    (1, rows, D): the batch a dimension of its own, so that rows past N are outside the
    bounds (zeros when read, dropped when written), not the next batch's first rows."""
    D = t.shape[-1]
    flat = t.view(t.shape[0], t.shape[1], -1)
    return TensorDescriptor(flat, list(flat.shape), list(flat.stride()), [1, rows, D],
                            _layout(rows, D, t.dtype))


def descriptors(qkv: torch.Tensor, o: torch.Tensor, block_m: int, block_n: int) -> tuple:
    """The TMA descriptors fwd_wgmma_kernel and fwd_ws_kernel read qkv (B, N, 3, H, D) and
    write o (B, N, H, D) through: Q in boxes of block_m rows, K and V of block_n, O of block_m."""
    return descriptor(qkv, block_m), descriptor(qkv, block_n), descriptor(o, block_m)


def bwd_descriptors(qkv: torch.Tensor, do: torch.Tensor, dqkv: torch.Tensor, block_m: int,
                    block_n: int, dkdv: bool) -> tuple:
    """The TMA descriptors of bwd_dkdv_kernel (dkdv) or bwd_dq_kernel: qkv's in boxes of
    block_m rows (Q) and block_n rows (K, V), dO's of block_m, and dqkv's in boxes of the
    rows the kernel writes (block_n keys' dK, dV, or block_m queries' dQ)."""
    return (descriptor(qkv, block_m), descriptor(qkv, block_n), descriptor(do, block_m),
            descriptor(dqkv, block_n if dkdv else block_m))


def ws_maxnreg(consumer_regs: int) -> int:
    """The kernel-wide register cap of fwd_ws_kernel: three warp groups (two consumers and
    the loader's one warp, allocated as a group) whose caps sum to three times it."""
    return -(-(2 * consumer_regs + 24) // 24) * 8
