"""FlashAttention kernels in Triton, for the packed qkv layout of ViTs.

Algorithm (Dao et al., "FlashAttention", 2022, and "FlashAttention-2", 2023):

* Forward. A program owns BLOCK_M query rows of one (batch, head). It keeps its Q tile on
  chip and streams K and V past it in tiles of BLOCK_N keys, keeping a running row maximum
  m and normalizer l (the online softmax): each tile rescales the partial output by
  exp(m_old - m_new) and adds P V. The N x N scores never reach GPU memory. It writes O and
  the per-row log-sum-exp (LSE), the one statistic the backward needs.
* Backward. A small kernel computes delta = rowsum(dO * O); then one launch does the rest:
  a dK/dV program owns a key tile and streams Q, dO, LSE, delta past it, recomputing
  P = exp(S - LSE) tile by tile; a dQ program does the same with the roles swapped. Split
  in two launches, the dQ programs run first and compute delta of their rows themselves,
  and no delta kernel runs. No program writes where another does: no atomics, so the
  backward is deterministic.
* Nondeterministic backward (deterministic=False, op "bwd_atomic"): one program kind, a
  dK/dV program per key tile as above, that also adds each query tile's dS K into an fp32
  dQ accumulator with atomic adds (bwd_atomic_kernel), then bwd_dq_kernel scales and
  stores dQ. The adds go element by element, or on Hopper as one bulk reduction per tile
  through a TMA tensor descriptor (that kernel, "atomic_tma", loads its tiles by TMA as
  well: see the next point). Five matrix products per tile pair instead of seven (the
  dQ programs above compute S and dP again), at the price of dQ's last bits depending on
  the order of the adds. Only on request; the short backward below needs neither.
* Tile loads by the copy engine (TMA, a constexpr of the general forward and of both
  general backwards; candidates of family "general_tma" and "atomic_tma", Hopper only).
  Compiled for sm_90 (triton 3.8, pointers 16-byte aligned as the JIT compiles them), the
  pointer-tile backwards use all 255 registers a thread at the listed tiles and spill
  12-56 bytes a thread at D = 64, 180 at D = 128: the pointer tiles that feed the
  asynchronous copies, and K, V or Q held in registers as operands, take what the fp32
  accumulators need. Through TMA descriptors (`_load_tma`) the tiles go from memory
  straight into shared memory, where the matrix units read them: the TMA backwards spill
  0-24 bytes, and the TMA forwards take 16-46 registers fewer than the pointer ones (which
  spill nothing either; benchmarks/results/registers_sm90_aligned.md).
* Short sequences (all keys of a head fit on chip, e.g. the 65 tokens of a CIFAR ViT, as
  a 64-key tile and a 16-key tail tile; the forward takes a second tail tile where that
  saves work, 197 keys = 128 + 64 + 16).
  The forward is one pass with a plain softmax, no rescaling loop; the backward is a single
  launch with one program per (batch, head) that holds K and V on chip, walks the query
  rows in BLOCK_M chunks, computes delta itself, writes each chunk's dQ as it goes and dK,
  dV at the end. That program owns every gradient of its head, so again nothing is atomic.
  The query rows are cut like the keys: full BLOCK_M tiles, then the rows past the last
  one in a BLOCK_MT tile, the power of two (>= 16) that covers them, so 65 rows cost
  64 + 16 rows of work, not 128. The forward's program of the partial tile and the
  backward's last chunk run the same code (a helper) on the smaller tile.

Dropout (DROPOUT, a constexpr: without it no dropout code is traced). Each probability P_ij
of head bh is kept where a counter-based random number, Philox keyed by seed + bh, is >= p
(`_keep`: one Philox call at counter i * ceil(N / 8) + j // 8 gives four 32-bit numbers,
whose eight 16-bit halves decide the keys 8 (j // 8) .. + 7, an eighth of the calls of one
per key; p is compared in steps of 1/65536), and the kept ones are scaled by 1 / (1 - p).
The seed is read from a device tensor, so a CUDA graph replays fresh masks. The forward
applies the mask to P V (the normalizer sums the whole row); the backward regenerates the
same mask instead of storing it: dV = (P o Z)^T dO and dP = (dO V^T) o Z, with Z the scaled
mask, and delta = rowsum(dO * O) still holds, since O is the dropped output.

Layout. Q, K and V are the (B, N, 3, H, D) tensor a fused qkv projection gives, contiguous:
every address follows from (N, H, HEAD_DIM), so no strides are passed, and the gradient
dQKV has the same layout. O and dO are (B, N, H, D), contiguous; LSE and delta (B, H, N).

Exponentials are base 2 with the softmax scale folded into log2(e) (qk_scale); the LSE is
kept in base-2 units. The scores stay unscaled until the exponential: the row maximum is
taken on them and scaled once per row, so exp2(s * qk_scale - m) costs one FMA per score.
N need not be a multiple of a block (197, 577, ... are not): out-of-range rows
and keys are masked. The general forward's key tail tile BLOCK_T and the short kernels'
query tail tile BLOCK_MT are sized by the launcher from N (`launch.tail_tile`); 0 means
that the block divides N, and then no tail code is traced.

Head dims: D <= 256 with D % 8 == 0. A D that is the sum of two powers of two A > B >= 16
(48, 80 = 64 + 16, 96 = 64 + 32, 144, 160, 192) is split (BLOCK_D = A, BLOCK_D2 = B, from
`launch.split_d`): every tile over the head dim is held as two column chunks, [0, A) and
[A, A + B), with no padding. Q K^T and dO V^T sum two products, P V, dS K, dS^T Q and
P^T dO fill two accumulators, delta sums over both chunks. Any other D (BLOCK_D2 = 0) is
padded to BLOCK_D, a power of two, and its padded columns masked; the code of the second
chunk is not traced then (see the note above `_chunk_ptrs`).

Under Triton's CPU interpreter (TRITON_INTERPRET=1, read once when this module is
imported) two bf16 operations are wrong in triton 3.8: `tl.dot` on bf16 operands returns
garbage and fp32 -> bf16 casts truncate where the GPU rounds to nearest even. There, and
only there, `_dot` widens bf16 tiles to fp32 first and `_round` rounds in integer
arithmetic. Both emulate the GPU exactly (every bf16 value is an fp32 value, and the matrix
units multiply bf16 exactly and accumulate in fp32), so the tests hold the interpreter to
the GPU's error bound. The choice is made when a kernel is traced, not passed per call.
"""
from __future__ import annotations

import os

import triton
import triton.language as tl

INTERPRET = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") == "1")


# ----------------------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------------------
@triton.jit
def _head_ptrs(base, bh, rows, offs_d, N, H, PACK: tl.constexpr, WHICH: tl.constexpr,
               HEAD_DIM: tl.constexpr):
    """Pointers (len(rows), len(offs_d)) to the columns offs_d of rows `rows` of head
    bh = b * H + h: the one place that knows the layout. PACK=3 addresses q, k, v (WHICH 0,
    1, 2) of a contiguous (B, N, 3, H, D) tensor; PACK=1, WHICH=0 a contiguous (B, N, H, D)
    one (O, dO)."""
    b = (bh // H).to(tl.int64)
    row_stride = PACK * H * HEAD_DIM
    head = base + b * N * row_stride + (WHICH * H + bh % H) * HEAD_DIM
    return head + rows[:, None].to(tl.int64) * row_stride + offs_d[None, :]


@triton.jit
def _load(ptrs, rows, N, offs_d, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
          MASK_ROWS: tl.constexpr):
    """Load a (rows, BLOCK_D) tile of the columns offs_d, zero-filling rows >= N (if
    MASK_ROWS) and padded dims: columns >= HEAD_DIM, which only a tile wider than the head
    has (a padded head dim; each chunk of a split one lies within the head)."""
    if MASK_ROWS:
        if BLOCK_D <= HEAD_DIM:
            return tl.load(ptrs, mask=rows[:, None] < N, other=0.0)
        else:
            return tl.load(ptrs, mask=(rows[:, None] < N) & (offs_d[None, :] < HEAD_DIM),
                           other=0.0)
    else:
        if BLOCK_D <= HEAD_DIM:
            return tl.load(ptrs)
        else:
            return tl.load(ptrs, mask=offs_d[None, :] < HEAD_DIM, other=0.0)


@triton.jit
def _store(ptrs, tile, rows, N, offs_d, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr):
    """Store a (rows, BLOCK_D) tile at the columns offs_d: rows < N, columns < HEAD_DIM."""
    tile = _round(tile, ptrs.dtype.element_ty)
    if BLOCK_D <= HEAD_DIM:
        tl.store(ptrs, tile, mask=rows[:, None] < N)
    else:
        tl.store(ptrs, tile, mask=(rows[:, None] < N) & (offs_d[None, :] < HEAD_DIM))


# Head-dim tiles in two column chunks. Every tile that spans the head dim (Q, K, V, O, dO,
# their gradients, the accumulators) is a pair: columns [0, BLOCK_D) and, "_hi",
# [BLOCK_D, BLOCK_D + BLOCK_D2). With a split head dim (BLOCK_D2 > 0: HEAD_DIM =
# BLOCK_D + BLOCK_D2, two powers of two, launch.split_d) neither chunk is padded: 80 = 64 + 16
# columns of work, not 128. Without one (BLOCK_D2 = 0) the first chunk is the whole head,
# padded to BLOCK_D, and the "_hi" one is only a name: the helpers below give back the
# first chunk again in its place (no code is traced for it, every use is under
# `if BLOCK_D2 > 0`), and where a loop assigns it, it assigns it unchanged, a loop-carried
# value that the compiler drops. So with BLOCK_D2 = 0 the kernels compile to what they
# were before the split existed.
@triton.jit
def _chunk_ptrs(base, bh, rows, N, H, PACK: tl.constexpr, WHICH: tl.constexpr,
                HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_D2: tl.constexpr):
    """_head_ptrs of both chunks of rows `rows` of head bh."""
    ptrs = _head_ptrs(base, bh, rows, tl.arange(0, BLOCK_D), N, H, PACK, WHICH, HEAD_DIM)
    ptrs_hi = ptrs
    if BLOCK_D2 > 0:
        ptrs_hi = _head_ptrs(base, bh, rows, BLOCK_D + tl.arange(0, BLOCK_D2), N, H, PACK,
                             WHICH, HEAD_DIM)
    return ptrs, ptrs_hi


@triton.jit
def _load_chunks(ptrs, ptrs_hi, rows, N, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                 BLOCK_D2: tl.constexpr, MASK_ROWS: tl.constexpr):
    """_load of both chunks, from their pointers (_chunk_ptrs, shifted by whole rows)."""
    tile = _load(ptrs, rows, N, tl.arange(0, BLOCK_D), HEAD_DIM, BLOCK_D, MASK_ROWS)
    tile_hi = tile
    if BLOCK_D2 > 0:
        tile_hi = _load(ptrs_hi, rows, N, BLOCK_D + tl.arange(0, BLOCK_D2), HEAD_DIM, BLOCK_D2,
                        MASK_ROWS)
    return tile, tile_hi


@triton.jit
def _load_rows(base, bh, rows, N, H, PACK: tl.constexpr, WHICH: tl.constexpr,
               HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_D2: tl.constexpr,
               MASK_ROWS: tl.constexpr):
    """Both chunks of the tile of rows `rows` of head bh: _chunk_ptrs, then _load_chunks."""
    ptrs, ptrs_hi = _chunk_ptrs(base, bh, rows, N, H, PACK, WHICH, HEAD_DIM, BLOCK_D, BLOCK_D2)
    return _load_chunks(ptrs, ptrs_hi, rows, N, HEAD_DIM, BLOCK_D, BLOCK_D2, MASK_ROWS)


@triton.jit
def _store_rows(base, tile, tile_hi, bh, rows, N, H, PACK: tl.constexpr, WHICH: tl.constexpr,
                HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_D2: tl.constexpr):
    """Store the chunks `tile`, `tile_hi` (read only if BLOCK_D2 > 0) into rows `rows` (< N)
    of head bh."""
    ptrs, ptrs_hi = _chunk_ptrs(base, bh, rows, N, H, PACK, WHICH, HEAD_DIM, BLOCK_D, BLOCK_D2)
    _store(ptrs, tile, rows, N, tl.arange(0, BLOCK_D), HEAD_DIM, BLOCK_D)
    if BLOCK_D2 > 0:
        _store(ptrs_hi, tile_hi, rows, N, BLOCK_D + tl.arange(0, BLOCK_D2), HEAD_DIM, BLOCK_D2)


@triton.jit
def _load_tma(desc, desc_hi, bh, row, H, WHICH: tl.constexpr, ROWS: tl.constexpr,
              HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_D2: tl.constexpr):
    """Both chunks of the ROWS-row tile from row `row` of head bh (of q, k or v: WHICH), by
    the tensor memory accelerator (Hopper): `desc`, `desc_hi` are TMA descriptors of the
    tensor viewed as (B, N, PACK * H * HEAD_DIM), in (1, ROWS, BLOCK_D) and (1, ROWS,
    BLOCK_D2) boxes (flash._tma_descriptors). The copy engine writes the tile straight into
    shared memory, where the matrix units read it: no pointer tiles, no registers on the
    way, and rows past N come back as zeros (the descriptor's bounds), as _load's mask
    gives them. Only for a head dim that its chunks cover exactly (no padded columns)."""
    b = bh // H
    col = (WHICH * H + bh % H) * HEAD_DIM
    tile = desc.load([b, row, col]).reshape(ROWS, BLOCK_D)
    tile_hi = tile
    if BLOCK_D2 > 0:
        tile_hi = desc_hi.load([b, row, col + BLOCK_D]).reshape(ROWS, BLOCK_D2)
    return tile, tile_hi


@triton.jit
def _head_tile(desc, desc_hi, base, bh, start, N, H, PACK: tl.constexpr, WHICH: tl.constexpr,
               ROWS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
               BLOCK_D2: tl.constexpr, TMA: tl.constexpr):
    """Both chunks of the ROWS-row tile from row `start` of head bh, loaded once: through
    the descriptors (TMA: _load_tma), or by pointers from `base` (_load_rows, rows past N
    masked)."""
    if TMA:
        tile, tile_hi = _load_tma(desc, desc_hi, bh, start, H, WHICH, ROWS, HEAD_DIM, BLOCK_D,
                                  BLOCK_D2)
    else:
        tile, tile_hi = _load_rows(base, bh, start + tl.arange(0, ROWS), N, H, PACK, WHICH,
                                   HEAD_DIM, BLOCK_D, BLOCK_D2, True)
    return tile, tile_hi


@triton.jit
def _stream_tile(desc, desc_hi, ptrs, ptrs_hi, bh, start, N, H, PACK: tl.constexpr,
                 WHICH: tl.constexpr, ROWS: tl.constexpr, HEAD_DIM: tl.constexpr,
                 BLOCK_D: tl.constexpr, BLOCK_D2: tl.constexpr, MASK_ROWS: tl.constexpr,
                 TMA: tl.constexpr):
    """Both chunks of the ROWS-row tile from row `start` of head bh, as a loop over a
    head's tiles reads them: through the descriptors (TMA: _load_tma), or from `ptrs`,
    `ptrs_hi`, the pointer tiles of the head's first ROWS rows (_chunk_ptrs), shifted by
    `start` rows (_load_chunks)."""
    if TMA:
        tile, tile_hi = _load_tma(desc, desc_hi, bh, start, H, WHICH, ROWS, HEAD_DIM, BLOCK_D,
                                  BLOCK_D2)
    else:
        shift = start * PACK * H * HEAD_DIM
        tile, tile_hi = _load_chunks(ptrs + shift, ptrs_hi + shift, start + tl.arange(0, ROWS),
                                     N, HEAD_DIM, BLOCK_D, BLOCK_D2, MASK_ROWS)
    return tile, tile_hi


@triton.jit
def _zeros(ROWS: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_D2: tl.constexpr):
    """An fp32 accumulator of ROWS rows over the head dim, as its two chunks of zeros."""
    acc = tl.zeros([ROWS, BLOCK_D], tl.float32)
    acc_hi = acc
    if BLOCK_D2 > 0:
        acc_hi = tl.zeros([ROWS, BLOCK_D2], tl.float32)
    return acc, acc_hi


@triton.jit
def _dot_t(a, a_hi, b, b_hi, BLOCK_D2: tl.constexpr):
    """a b^T in fp32, (len(a), len(b)), contracting the head dim (S = Q K^T, dP = dO V^T):
    with a split head dim, the first chunks' product plus the second chunks'."""
    acc = _dot(a, tl.trans(b), tl.zeros([a.shape[0], b.shape[0]], tl.float32))
    if BLOCK_D2 > 0:
        acc = _dot(a_hi, tl.trans(b_hi), acc)
    return acc


@triton.jit
def _dot_d(a, b, b_hi, acc, acc_hi, BLOCK_D2: tl.constexpr):
    """(acc + a b, acc_hi + a b_hi): a product into the head dim (P V, dS K, ...), chunk by
    chunk."""
    acc = _dot(a, b, acc)
    if BLOCK_D2 > 0:
        acc_hi = _dot(a, b_hi, acc_hi)
    return acc, acc_hi


@triton.jit
def _rowdot(a, a_hi, b, b_hi, BLOCK_D2: tl.constexpr):
    """rowsum(a * b) in fp32 over the head dim (delta = rowsum(dO * O))."""
    out = tl.sum(a.to(tl.float32) * b.to(tl.float32), 1)
    if BLOCK_D2 > 0:
        out += tl.sum(a_hi.to(tl.float32) * b_hi.to(tl.float32), 1)
    return out


@triton.jit
def _dot(a, b, acc):
    """acc + a @ b in fp32 (in the interpreter, bf16 operands are widened first)."""
    if INTERPRET:
        if a.dtype == tl.bfloat16:
            return tl.dot(a.to(tl.float32), b.to(tl.float32), acc)
    return tl.dot(a, b, acc)


@triton.jit
def _round(x, dtype: tl.constexpr):
    """fp32 -> dtype, rounding to nearest even as the GPU does (the interpreter truncates
    fp32 -> bf16, so there it rounds in integer arithmetic)."""
    if INTERPRET:
        if dtype == tl.bfloat16:
            bits = x.to(tl.uint32, bitcast=True)
            bits = bits + (((bits >> 16) & 1) + 0x7FFF)
            return (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
    return x.to(dtype)


@triton.jit
def _keep(seed, bh, q_rows, k_start, N, drop_p, BLOCK_K: tl.constexpr, TRANS: tl.constexpr):
    """Which probabilities of head bh survive dropout, for the query rows q_rows and the
    BLOCK_K keys from k_start (both multiples of 8): (len(q_rows), BLOCK_K) booleans, or their
    transpose if TRANS. One Philox call gives four 32-bit numbers, eight 16-bit halves:
    those of counter i * ceil(N / 8) + c decide the keys 8c .. 8c + 7 of query i (key
    8c + 2w + h: half h, low first, of number w), so the mask is one function of (query,
    key) in the forward and the backward whatever the tiles. A half is kept where it is at
    least p * 65536 (rounded): the keep rate is 1 - p within 1/131072. The halves are
    compared as integers, with no conversion to floats, before they are put side by side, so
    that the reshuffle into the tile moves booleans, not 32-bit numbers (compiled for sm_90:
    fewer instructions than four keys a call compared as floats, in every short kernel
    measured; benchmarks/results/registers_sm90_dropout.md)."""
    tl.static_assert(BLOCK_K % 8 == 0, "dropout tiles cover whole groups of 8 keys")
    octets = k_start // 8 + tl.arange(0, BLOCK_K // 8)
    r0, r1, r2, r3 = tl.randint4x(seed + bh, q_rows[:, None] * ((N + 7) // 8) + octets[None, :])
    t = _drop_threshold(drop_p)
    lo0, lo1, lo2, lo3 = (r0 & 0xFFFF) >= t, (r1 & 0xFFFF) >= t, (r2 & 0xFFFF) >= t, (r3 & 0xFFFF) >= t
    hi0, hi1, hi2, hi3 = (r0 >> 16) >= t, (r1 >> 16) >= t, (r2 >> 16) >= t, (r3 >> 16) >= t
    # (rows, octets, 2, 2, 2) -> (rows, BLOCK_K): the eight halves' verdicts of an octet side by
    # side, in order. A join's choice is the new last, fastest-varying, dimension, so the
    # outermost join picks the half (h), the middle one bit 0 of w, the innermost bit 1 of w.
    keep = tl.join(tl.join(tl.join(lo0, lo2), tl.join(lo1, lo3)),
                   tl.join(tl.join(hi0, hi2), tl.join(hi1, hi3)))
    keep = tl.reshape(keep, [q_rows.shape[0], BLOCK_K])
    if TRANS:
        keep = tl.trans(keep)
    return keep


@triton.jit
def _drop_threshold(drop_p):
    """p in 16-bit steps, the least 16-bit half that is kept: round(p * 65536)."""
    return tl.cast(drop_p * 65536.0 + 0.5, tl.uint32)


@triton.jit
def _mask_diagonal(s, q_rows, k_cols):
    """Scores s (len(q_rows), len(k_cols)) with -inf where a query meets its own key: the
    diagonal masking of locality self-attention (Lee et al., arXiv 2112.13492), which makes
    each token attend to the others only. The backward zeroes the same probabilities."""
    return tl.where(q_rows[:, None] == k_cols[None, :], float("-inf"), s)


@triton.jit
def _keep_one(seed, bh, q_rows, key, N, drop_p):
    """_keep for the single key `key`: (len(q_rows),) booleans, from the same half of the
    same Philox numbers that decide it in a tile."""
    r0, r1, r2, r3 = tl.randint4x(seed + bh, q_rows * ((N + 7) // 8) + key // 8)
    lane = key % 8
    word = tl.where(lane < 4, tl.where(lane < 2, r0, r1), tl.where(lane < 6, r2, r3))
    half = tl.where(lane % 2 == 0, word & 0xFFFF, word >> 16)
    return half >= _drop_threshold(drop_p)


@triton.jit
def dropout_mask_kernel(SEED, MASK, drop_p, N, BLOCK: tl.constexpr):
    """MASK (B * H, N, N) uint8: the keep mask `_keep` gives the attention kernels (for tests
    and inspection). One program per (query row, batch * head)."""
    row, bh = tl.program_id(0), tl.program_id(1)
    seed = tl.load(SEED)
    rows = row + tl.arange(0, 1)
    for start in range(0, N, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        keep = _keep(seed, bh, rows, start, N, drop_p, BLOCK, False)
        ptrs = MASK + (bh.to(tl.int64) * N + rows[:, None]) * N + cols[None, :]
        tl.store(ptrs, keep.to(tl.uint8), mask=cols[None, :] < N)


@triton.jit
def _split_pid(pid, N, BLOCK: tl.constexpr):
    """A flat program id (no 65535 limit on B*H) -> (tile, batch*head). Neighbouring
    programs share a (batch, head), so its K/V tiles come from L2 for all but the first."""
    num_blocks = tl.cdiv(N, BLOCK)
    return pid % num_blocks, pid // num_blocks


# ----------------------------------------------------------------------------------------
# Forward
# ----------------------------------------------------------------------------------------
@triton.jit
def _fwd_inner(acc, acc_hi, l_i, m_i, q, q_hi, k_ptrs, k_ptrs_hi, v_ptrs, v_ptrs_hi, KV_DESC,
               KV_DESC2, start, end, N, H, offs_n, qk_scale, seed, bh, offs_m, drop_p,
               HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_D2: tl.constexpr,
               BLOCK_N: tl.constexpr, MASK_N: tl.constexpr, DROPOUT: tl.constexpr,
               TMA: tl.constexpr, DIAG: tl.constexpr, LOADED: tl.constexpr = False):
    """The online softmax over the key tiles from `start` to `end`. LOADED (the tail tile's
    call, one step): the K and V tiles were loaded before the loop over the full tiles, and
    k_ptrs, k_ptrs_hi, v_ptrs, v_ptrs_hi are those tiles rather than their pointers."""
    for start_n in range(start, end, BLOCK_N):
        cols = start_n + offs_n
        # (TMA: full tiles only; the tail tile's call passes TMA=False)
        if LOADED:
            k, k_hi = k_ptrs, k_ptrs_hi
        else:
            k, k_hi = _stream_tile(KV_DESC, KV_DESC2, k_ptrs, k_ptrs_hi, bh, start_n, N, H, 3,
                                   1, BLOCK_N, HEAD_DIM, BLOCK_D, BLOCK_D2, MASK_N, TMA)
        s = _dot_t(q, q_hi, k, k_hi, BLOCK_D2)  # (BLOCK_M, BLOCK_N), unscaled
        if MASK_N:
            s = tl.where(cols[None, :] < N, s, float("-inf"))
        if DIAG:
            s = _mask_diagonal(s, offs_m, cols)
        # The row maximum in log2 units (qk_scale > 0 commutes with max); the scale and the
        # subtraction are then one FMA per score.
        m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
        p = tl.math.exp2(s * qk_scale - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        if DROPOUT:  # the normalizer above sums every probability; P V only the kept ones
            p = tl.where(_keep(seed, bh, offs_m, start_n, N, drop_p, BLOCK_N, False), p, 0.0)
        if LOADED:
            v, v_hi = v_ptrs, v_ptrs_hi
        else:
            v, v_hi = _stream_tile(KV_DESC, KV_DESC2, v_ptrs, v_ptrs_hi, bh, start_n, N, H, 3,
                                   2, BLOCK_N, HEAD_DIM, BLOCK_D, BLOCK_D2, MASK_N, TMA)
        p = _round(p, v.dtype)
        acc = _dot(p, v, acc * alpha[:, None])
        if BLOCK_D2 > 0:  # (otherwise acc_hi is never assigned: the loop does not carry it)
            acc_hi = _dot(p, v_hi, acc_hi * alpha[:, None])
        m_i = m_new
    return acc, acc_hi, l_i, m_i


@triton.jit
def fwd_kernel(QKV, O, LSE, SEED, Q_DESC, Q_DESC2, KV_DESC, KV_DESC2, qk_scale, drop_p, H, N,
               HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_D2: tl.constexpr,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr,
               DROPOUT: tl.constexpr, TMA: tl.constexpr, DIAG: tl.constexpr,
               TAIL_AHEAD: tl.constexpr):
    """O and LSE of BLOCK_M query rows; K, V stream past in BLOCK_N tiles, the keys past the
    last full tile in one BLOCK_T tile (197 = 3 x 64 + a 16-key tail, not a fourth 64;
    BLOCK_T = 0 when BLOCK_N divides N). With TMA, the Q tile and the full K, V tiles come
    through the descriptors of qkv Q_DESC(2) ((1, BLOCK_M, chunk) boxes) and KV_DESC(2)
    ((1, BLOCK_N, chunk) boxes): see _load_tma. Without it, any argument stands in for them.

    TAIL_AHEAD: the tail tile's K and V are loaded before the loop over the full tiles, so
    that their latency passes while the loop runs instead of after it (compiled for sm_90,
    the loaded tile goes to shared memory, not registers); the same arithmetic, the same
    bits."""
    pid_m, bh = _split_pid(tl.program_id(0), N, BLOCK_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    q, q_hi = _head_tile(Q_DESC, Q_DESC2, QKV, bh, pid_m * BLOCK_M, N, H, 3, 0, BLOCK_M, HEAD_DIM,
                         BLOCK_D, BLOCK_D2, TMA)
    k_ptrs, k_ptrs_hi = _chunk_ptrs(QKV, bh, offs_n, N, H, 3, 1, HEAD_DIM, BLOCK_D, BLOCK_D2)
    v_ptrs, v_ptrs_hi = _chunk_ptrs(QKV, bh, offs_n, N, H, 3, 2, HEAD_DIM, BLOCK_D, BLOCK_D2)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc, acc_hi = _zeros(BLOCK_M, BLOCK_D, BLOCK_D2)
    seed = tl.load(SEED) if DROPOUT else 0
    n_full = (N // BLOCK_N) * BLOCK_N
    if TAIL_AHEAD and BLOCK_T > 0:  # the partial key tile's K and V now, used after the loop
        offs_t = n_full + tl.arange(0, BLOCK_T)
        k_t, k_t_hi = _load_rows(QKV, bh, offs_t, N, H, 3, 1, HEAD_DIM, BLOCK_D, BLOCK_D2, True)
        v_t, v_t_hi = _load_rows(QKV, bh, offs_t, N, H, 3, 2, HEAD_DIM, BLOCK_D, BLOCK_D2, True)
    acc, acc_hi, l_i, m_i = _fwd_inner(acc, acc_hi, l_i, m_i, q, q_hi, k_ptrs, k_ptrs_hi,
                                       v_ptrs, v_ptrs_hi, KV_DESC, KV_DESC2, 0, n_full, N, H,
                                       offs_n, qk_scale, seed, bh, offs_m, drop_p, HEAD_DIM,
                                       BLOCK_D, BLOCK_D2, BLOCK_N, False, DROPOUT, TMA, DIAG)
    if TAIL_AHEAD and BLOCK_T > 0:
        acc, acc_hi, l_i, m_i = _fwd_inner(acc, acc_hi, l_i, m_i, q, q_hi, k_t, k_t_hi, v_t,
                                           v_t_hi, KV_DESC, KV_DESC2, n_full, N, N, H,
                                           tl.arange(0, BLOCK_T), qk_scale, seed, bh, offs_m,
                                           drop_p, HEAD_DIM, BLOCK_D, BLOCK_D2, BLOCK_T, True,
                                           DROPOUT, False, DIAG, True)
    elif BLOCK_T > 0:  # the one partial key tile
        offs_t = tl.arange(0, BLOCK_T)
        kt_ptrs, kt_ptrs_hi = _chunk_ptrs(QKV, bh, offs_t, N, H, 3, 1, HEAD_DIM, BLOCK_D, BLOCK_D2)
        vt_ptrs, vt_ptrs_hi = _chunk_ptrs(QKV, bh, offs_t, N, H, 3, 2, HEAD_DIM, BLOCK_D, BLOCK_D2)
        acc, acc_hi, l_i, m_i = _fwd_inner(acc, acc_hi, l_i, m_i, q, q_hi, kt_ptrs, kt_ptrs_hi,
                                           vt_ptrs, vt_ptrs_hi, KV_DESC, KV_DESC2, n_full, N, N,
                                           H, offs_t, qk_scale, seed, bh, offs_m, drop_p,
                                           HEAD_DIM, BLOCK_D, BLOCK_D2, BLOCK_T, True, DROPOUT,
                                           False, DIAG)

    scale = (_keep_scale(drop_p, DROPOUT) / l_i)[:, None]
    _store_rows(O, acc * scale, acc_hi * scale, bh, offs_m, N, H, 1, 0, HEAD_DIM, BLOCK_D,
                BLOCK_D2)
    tl.store(LSE + bh.to(tl.int64) * N + offs_m, m_i + tl.math.log2(l_i), mask=offs_m < N)


@triton.jit
def _keep_scale(drop_p, DROPOUT: tl.constexpr):
    """1 / (1 - p), the scale of the kept probabilities (1 without dropout)."""
    if DROPOUT:
        return 1.0 / (1.0 - drop_p)
    return 1.0


@triton.jit
def _fwd_short_scores(q, q_hi, QKV, desc, desc_hi, bh, start, N, H, q_rows,
                      HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_D2: tl.constexpr,
                      ROWS: tl.constexpr, TMA: tl.constexpr, DIAG: tl.constexpr):
    """Scores of q (the query rows q_rows) against the ROWS keys from `start` (unscaled, -inf
    past N and, with DIAG, where query and key are one token) and their V tile (its two
    chunks). With TMA, K and V come through the descriptors `desc`, `desc_hi` (ROWS-row boxes
    of qkv; see _load_tma), else by masked pointer loads."""
    k, k_hi = _head_tile(desc, desc_hi, QKV, bh, start, N, H, 3, 1, ROWS, HEAD_DIM, BLOCK_D,
                         BLOCK_D2, TMA)
    v, v_hi = _head_tile(desc, desc_hi, QKV, bh, start, N, H, 3, 2, ROWS, HEAD_DIM, BLOCK_D,
                         BLOCK_D2, TMA)
    s = _dot_t(q, q_hi, k, k_hi, BLOCK_D2)
    offs = start + tl.arange(0, ROWS)
    s = tl.where(offs[None, :] < N, s, float("-inf"))
    if DIAG:
        s = _mask_diagonal(s, q_rows, offs)
    return s, v, v_hi


@triton.jit
def _fwd_short_rows(QKV, O, LSE, SEED, Q_DESC, Q_DESC2, K_DESC, K_DESC2, KT_DESC, KT_DESC2,
                    KT2_DESC, KT2_DESC2, qk_scale, drop_p, H, N, group, start_m,
                    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_D2: tl.constexpr,
                    ROWS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr,
                    HAS_TAIL: tl.constexpr, BLOCK_T2: tl.constexpr, HEADS: tl.constexpr,
                    STAGES: tl.constexpr, MASK_M: tl.constexpr, DROPOUT: tl.constexpr,
                    TMA: tl.constexpr, DIAG: tl.constexpr):
    """The body of fwd_short_kernel on a tile of ROWS query rows from start_m, for each of
    the HEADS (batch, head)s of `group`. MASK_M: the tile may reach past row N - 1. With
    TMA, the Q tile comes through Q_DESC(2) (ROWS-row boxes), the key tiles through K_DESC(2),
    KT_DESC(2) and KT2_DESC(2) (BLOCK_N, BLOCK_T and BLOCK_T2 rows)."""
    offs_m = start_m + tl.arange(0, ROWS)
    seed = tl.load(SEED) if DROPOUT else 0
    for i in tl.range(0, HEADS, num_stages=STAGES):
        bh = group * HEADS + i
        if TMA:
            q, q_hi = _load_tma(Q_DESC, Q_DESC2, bh, start_m, H, 0, ROWS, HEAD_DIM, BLOCK_D,
                                BLOCK_D2)
        else:
            q, q_hi = _load_rows(QKV, bh, offs_m, N, H, 3, 0, HEAD_DIM, BLOCK_D, BLOCK_D2,
                                 MASK_M)
        s, v, v_hi = _fwd_short_scores(q, q_hi, QKV, K_DESC, K_DESC2, bh, 0, N, H, offs_m,
                                       HEAD_DIM, BLOCK_D, BLOCK_D2, BLOCK_N, TMA, DIAG)
        m = tl.max(s, 1)
        if HAS_TAIL:
            if BLOCK_T == 1:  # one key past the tile (N = BLOCK_N + 1): vectors, by pointers
                key = BLOCK_N + tl.arange(0, 1)
                k_t, k_t_hi = _load_rows(QKV, bh, key, N, H, 3, 1, HEAD_DIM, BLOCK_D, BLOCK_D2,
                                         False)
                v_t, v_t_hi = _load_rows(QKV, bh, key, N, H, 3, 2, HEAD_DIM, BLOCK_D, BLOCK_D2,
                                         False)
                s_t = _rowdot(q, q_hi, k_t, k_t_hi, BLOCK_D2)  # (ROWS,)
                if DIAG:
                    s_t = tl.where(offs_m == BLOCK_N, float("-inf"), s_t)
                m = tl.maximum(m, s_t)
            else:
                s_t, v_t, v_t_hi = _fwd_short_scores(q, q_hi, QKV, KT_DESC, KT_DESC2, bh, BLOCK_N,
                                                     N, H, offs_m, HEAD_DIM, BLOCK_D, BLOCK_D2,
                                                     BLOCK_T, TMA, DIAG)
                m = tl.maximum(m, tl.max(s_t, 1))
        if BLOCK_T2 > 0:
            s_t2, v_t2, v_t2_hi = _fwd_short_scores(q, q_hi, QKV, KT2_DESC, KT2_DESC2, bh,
                                                    BLOCK_N + BLOCK_T, N, H, offs_m, HEAD_DIM,
                                                    BLOCK_D, BLOCK_D2, BLOCK_T2, TMA, DIAG)
            m = tl.maximum(m, tl.max(s_t2, 1))
        m = m * qk_scale  # the row maximum in log2 units; then one FMA per score below
        p = tl.math.exp2(s * qk_scale - m[:, None])
        l = tl.sum(p, 1)
        if DROPOUT:
            p = tl.where(_keep(seed, bh, offs_m, 0, N, drop_p, BLOCK_N, False), p, 0.0)
        acc, acc_hi = _zeros(ROWS, BLOCK_D, BLOCK_D2)
        acc, acc_hi = _dot_d(_round(p, v.dtype), v, v_hi, acc, acc_hi, BLOCK_D2)
        if HAS_TAIL:
            if BLOCK_T == 1:  # p of the one key, in fp32, times its value row
                p_t = tl.math.exp2(s_t * qk_scale - m)
                l += p_t
                if DROPOUT:
                    p_t = tl.where(_keep_one(seed, bh, offs_m, BLOCK_N, N, drop_p), p_t, 0.0)
                acc += p_t[:, None] * v_t.to(tl.float32)
                if BLOCK_D2 > 0:
                    acc_hi += p_t[:, None] * v_t_hi.to(tl.float32)
            else:
                p_t = tl.math.exp2(s_t * qk_scale - m[:, None])
                l += tl.sum(p_t, 1)
                if DROPOUT:
                    p_t = tl.where(_keep(seed, bh, offs_m, BLOCK_N, N, drop_p, BLOCK_T, False),
                                   p_t, 0.0)
                acc, acc_hi = _dot_d(_round(p_t, v.dtype), v_t, v_t_hi, acc, acc_hi, BLOCK_D2)
        if BLOCK_T2 > 0:
            p_t2 = tl.math.exp2(s_t2 * qk_scale - m[:, None])
            l += tl.sum(p_t2, 1)
            if DROPOUT:
                p_t2 = tl.where(_keep(seed, bh, offs_m, BLOCK_N + BLOCK_T, N, drop_p, BLOCK_T2, False),
                                p_t2, 0.0)
            acc, acc_hi = _dot_d(_round(p_t2, v.dtype), v_t2, v_t2_hi, acc, acc_hi, BLOCK_D2)
        scale = (_keep_scale(drop_p, DROPOUT) / l)[:, None]
        _store_rows(O, acc * scale, acc_hi * scale, bh, offs_m, N, H, 1, 0, HEAD_DIM, BLOCK_D,
                    BLOCK_D2)
        tl.store(LSE + bh.to(tl.int64) * N + offs_m, m + tl.math.log2(l), mask=offs_m < N)


@triton.jit
def _box(ROWS: tl.constexpr, D16, D32, D64, D128, D256):
    """Of the descriptors whose boxes are 16-256 rows high, the one of ROWS rows (chosen when
    the kernel is traced; the others may be None)."""
    if ROWS == 16:
        desc = D16
    elif ROWS == 32:
        desc = D32
    elif ROWS == 64:
        desc = D64
    elif ROWS == 128:
        desc = D128
    else:
        desc = D256
    return desc


@triton.jit
def fwd_short_kernel(QKV, O, LSE, SEED, D16, D16_2, D32, D32_2, D64, D64_2, D128, D128_2, D256,
                     D256_2, qk_scale, drop_p, H, N,
                     HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_D2: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_MT: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_T: tl.constexpr, HAS_TAIL: tl.constexpr, BLOCK_T2: tl.constexpr,
                     HEADS: tl.constexpr, STAGES: tl.constexpr, DROPOUT: tl.constexpr,
                     TMA: tl.constexpr, DIAG: tl.constexpr):
    """fwd_kernel when all keys fit on chip: one pass, a plain softmax, no rescaling. The
    keys are a BLOCK_N tile plus, if HAS_TAIL, a BLOCK_T tail tile (65 = 64 + 16 keys rather
    than a 128-key tile: 80 columns of work instead of 128) and, unless BLOCK_T2 = 0, a
    second tail tile (197 = 128 + 64 + 16: 208 columns, not 256); BLOCK_T = 1: the tail is
    one key (N = BLOCK_N + 1), loaded by pointers and done in vector arithmetic (as
    _bwd_one_key does in the backward). The query rows likewise:
    the program of the partial last BLOCK_M tile computes a BLOCK_MT-row tile (65 rows = a
    64-row program and a 16-row one); BLOCK_MT = 0 when BLOCK_M divides N. A program takes
    the same query rows of HEADS consecutive (batch, head)s in a loop that Triton can
    pipeline (STAGES): the next head's tiles load while this one computes, which a program
    per head, too short to overlap anything, cannot do. B * H must be a multiple of HEADS.

    With TMA (family "short_tma", Hopper) every Q, K and V tile comes through a descriptor
    of qkv whose box has the tile's height, D16 ... D256 (16 ... 256 rows), each with its
    second-chunk twin (_2). The copy engine puts the tiles in shared memory, where the
    matrix units read them, so no pointer tiles take registers, and rows past N come back
    as zeros. Only the heights that the tiles have are passed (at N = 65: 64 and 16); the
    rest are None, as are all of them without TMA and the twins of an unsplit head dim: each
    descriptor passed costs the launch host time to encode."""
    pid_m, group = _split_pid(tl.program_id(0), N, BLOCK_M)
    start_m = pid_m * BLOCK_M
    k_desc = _box(BLOCK_N, D16, D32, D64, D128, D256)
    k_desc2 = _box(BLOCK_N, D16_2, D32_2, D64_2, D128_2, D256_2)
    kt_desc = _box(BLOCK_T, D16, D32, D64, D128, D256)
    kt_desc2 = _box(BLOCK_T, D16_2, D32_2, D64_2, D128_2, D256_2)
    kt2_desc = _box(BLOCK_T2, D16, D32, D64, D128, D256)
    kt2_desc2 = _box(BLOCK_T2, D16_2, D32_2, D64_2, D128_2, D256_2)
    q_desc = _box(BLOCK_M, D16, D32, D64, D128, D256)
    q_desc2 = _box(BLOCK_M, D16_2, D32_2, D64_2, D128_2, D256_2)
    if BLOCK_MT == 0:  # every query tile is full
        _fwd_short_rows(QKV, O, LSE, SEED, q_desc, q_desc2, k_desc, k_desc2, kt_desc, kt_desc2,
                        kt2_desc, kt2_desc2, qk_scale, drop_p, H, N, group, start_m, HEAD_DIM,
                        BLOCK_D, BLOCK_D2, BLOCK_M, BLOCK_N, BLOCK_T, HAS_TAIL, BLOCK_T2, HEADS,
                        STAGES, False, DROPOUT, TMA, DIAG)
    elif start_m + BLOCK_M <= N:
        _fwd_short_rows(QKV, O, LSE, SEED, q_desc, q_desc2, k_desc, k_desc2, kt_desc, kt_desc2,
                        kt2_desc, kt2_desc2, qk_scale, drop_p, H, N, group, start_m, HEAD_DIM,
                        BLOCK_D, BLOCK_D2, BLOCK_M, BLOCK_N, BLOCK_T, HAS_TAIL, BLOCK_T2, HEADS,
                        STAGES, False, DROPOUT, TMA, DIAG)
    else:  # the partial last tile, in a tile of its own size
        _fwd_short_rows(QKV, O, LSE, SEED, _box(BLOCK_MT, D16, D32, D64, D128, D256),
                        _box(BLOCK_MT, D16_2, D32_2, D64_2, D128_2, D256_2), k_desc, k_desc2,
                        kt_desc, kt_desc2, kt2_desc, kt2_desc2, qk_scale, drop_p, H, N, group,
                        start_m, HEAD_DIM, BLOCK_D, BLOCK_D2, BLOCK_MT, BLOCK_N, BLOCK_T,
                        HAS_TAIL, BLOCK_T2, HEADS, STAGES, True, DROPOUT, TMA, DIAG)


# ----------------------------------------------------------------------------------------
# Backward
# ----------------------------------------------------------------------------------------
@triton.jit
def bwd_delta_kernel(O, DO, DELTA, H, N,
                     HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_D2: tl.constexpr,
                     BLOCK_M: tl.constexpr):
    """delta = rowsum(dO * O), the diagonal term of the softmax Jacobian, per query row."""
    pid_m, bh = _split_pid(tl.program_id(0), N, BLOCK_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    o, o_hi = _load_rows(O, bh, offs_m, N, H, 1, 0, HEAD_DIM, BLOCK_D, BLOCK_D2, True)
    do, do_hi = _load_rows(DO, bh, offs_m, N, H, 1, 0, HEAD_DIM, BLOCK_D, BLOCK_D2, True)
    delta = _rowdot(o, o_hi, do, do_hi, BLOCK_D2)
    tl.store(DELTA + bh.to(tl.int64) * N + offs_m, delta, mask=offs_m < N)


@triton.jit
def _bwd_dkdv_step(dk, dk_hi, dv, dv_hi, k, k_hi, v, v_hi, q, q_hi, do, do_hi, lse, delta,
                   qk_scale, seed, bh, rows, k_start, N, drop_p,
                   BLOCK_D2: tl.constexpr, DROPOUT: tl.constexpr, DIAG: tl.constexpr):
    """One query tile's share of dK, dV, on transposed tiles so that they accumulate as
    (BLOCK_N, head dim) chunks. Returns dS^T too, for a caller that also wants dQ. rows,
    k_start: the tile's query rows and its first key (for the dropout mask)."""
    s_t = _dot_t(k, k_hi, q, q_hi, BLOCK_D2)
    p_t = tl.math.exp2(s_t * qk_scale - lse[None, :])  # (BLOCK_N, BLOCK_M)
    if DIAG:
        p_t = tl.where((k_start + tl.arange(0, k.shape[0]))[:, None] == rows[None, :], 0.0, p_t)
    dp_t = _dot_t(v, v_hi, do, do_hi, BLOCK_D2)
    if DROPOUT:
        keep_t = _keep(seed, bh, rows, k_start, N, drop_p, k.shape[0], True)
        scale = _keep_scale(drop_p, DROPOUT)
        dv, dv_hi = _dot_d(_round(tl.where(keep_t, p_t * scale, 0.0), do.dtype), do, do_hi,
                           dv, dv_hi, BLOCK_D2)
        dp_t = tl.where(keep_t, dp_t * scale, 0.0)
    else:
        dv, dv_hi = _dot_d(_round(p_t, do.dtype), do, do_hi, dv, dv_hi, BLOCK_D2)
    ds_t = p_t * (dp_t - delta[None, :])
    dk, dk_hi = _dot_d(_round(ds_t, q.dtype), q, q_hi, dk, dk_hi, BLOCK_D2)
    return dk, dk_hi, dv, dv_hi, ds_t


@triton.jit
def _bwd_dkdv_tile(pid_n, bh, QKV, DO, LSE, DELTA, DQKV, DQ_ACC, DQ_DESC, DQ_DESC2, Q_DESC,
                   Q_DESC2, DO_DESC, DO_DESC2, KV_DESC, KV_DESC2, seed, qk_scale, sm_scale,
                   drop_p, H, N, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                   BLOCK_D2: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   ROWS: tl.constexpr, DROPOUT: tl.constexpr, ATOMIC_DQ: tl.constexpr,
                   TMA_DQ: tl.constexpr, TMA_KV: tl.constexpr, TMA: tl.constexpr,
                   DIAG: tl.constexpr):
    """dK, dV of the ROWS keys from pid_n * BLOCK_N of head bh (_bwd_dkdv): K and V through
    KV_DESC(2) if TMA_KV, else by pointers; the query tiles through Q_DESC(2), DO_DESC(2) if
    TMA."""
    k_start = pid_n * BLOCK_N
    offs_n = k_start + tl.arange(0, ROWS)
    offs_m = tl.arange(0, BLOCK_M)
    k, k_hi = _head_tile(KV_DESC, KV_DESC2, QKV, bh, k_start, N, H, 3, 1, ROWS, HEAD_DIM,
                         BLOCK_D, BLOCK_D2, TMA_KV)
    v, v_hi = _head_tile(KV_DESC, KV_DESC2, QKV, bh, k_start, N, H, 3, 2, ROWS, HEAD_DIM,
                         BLOCK_D, BLOCK_D2, TMA_KV)
    q_ptrs, q_ptrs_hi = _chunk_ptrs(QKV, bh, offs_m, N, H, 3, 0, HEAD_DIM, BLOCK_D, BLOCK_D2)
    do_ptrs, do_ptrs_hi = _chunk_ptrs(DO, bh, offs_m, N, H, 1, 0, HEAD_DIM, BLOCK_D, BLOCK_D2)
    if ATOMIC_DQ and not TMA_DQ:
        acc_ptrs, acc_ptrs_hi = _acc_ptrs(DQ_ACC, bh, offs_m, N, HEAD_DIM, BLOCK_D, BLOCK_D2)
    stats = bh.to(tl.int64) * N

    dk, dk_hi = _zeros(ROWS, BLOCK_D, BLOCK_D2)
    dv, dv_hi = _zeros(ROWS, BLOCK_D, BLOCK_D2)
    for start_m in range(0, N, BLOCK_M):
        m0 = start_m
        if ATOMIC_DQ:
            m0 = (start_m + pid_n * BLOCK_M) % (tl.cdiv(N, BLOCK_M) * BLOCK_M)
        rows = m0 + offs_m
        # Padded query rows: q = dO = 0 and LSE = +inf make their column of P^T zero.
        q, q_hi = _stream_tile(Q_DESC, Q_DESC2, q_ptrs, q_ptrs_hi, bh, m0, N, H, 3, 0, BLOCK_M,
                               HEAD_DIM, BLOCK_D, BLOCK_D2, True, TMA)
        do, do_hi = _stream_tile(DO_DESC, DO_DESC2, do_ptrs, do_ptrs_hi, bh, m0, N, H, 1, 0,
                                 BLOCK_M, HEAD_DIM, BLOCK_D, BLOCK_D2, True, TMA)
        lse = tl.load(LSE + stats + rows, mask=rows < N, other=float("inf"))
        delta = tl.load(DELTA + stats + rows, mask=rows < N, other=0.0)
        dk, dk_hi, dv, dv_hi, ds_t = _bwd_dkdv_step(dk, dk_hi, dv, dv_hi, k, k_hi, v, v_hi, q,
                                                    q_hi, do, do_hi, lse, delta, qk_scale, seed,
                                                    bh, rows, k_start, N, drop_p, BLOCK_D2,
                                                    DROPOUT, DIAG)
        if ATOMIC_DQ:
            # Padded keys (k = v = 0) get p = exp2(-lse) != 0 in _bwd_dkdv_step: they must
            # not reach dQ.
            ds = tl.trans(_round(tl.where(offs_n[:, None] < N, ds_t, 0.0), k.dtype))
            dq, dq_hi = _zeros(BLOCK_M, BLOCK_D, BLOCK_D2)
            dq, dq_hi = _dot_d(ds, k, k_hi, dq, dq_hi, BLOCK_D2)
            if TMA_DQ:
                DQ_DESC.atomic_add([bh, m0, 0], dq.reshape(1, BLOCK_M, BLOCK_D))
                if BLOCK_D2 > 0:
                    DQ_DESC2.atomic_add([bh, m0, BLOCK_D], dq_hi.reshape(1, BLOCK_M, BLOCK_D2))
            else:
                acc_shift = m0 * HEAD_DIM
                _atomic_add_chunks(acc_ptrs + acc_shift, acc_ptrs_hi + acc_shift, dq, dq_hi,
                                   rows, N, HEAD_DIM, BLOCK_D, BLOCK_D2)

    _store_rows(DQKV, dk * sm_scale, dk_hi * sm_scale, bh, offs_n, N, H, 3, 1, HEAD_DIM,
                BLOCK_D, BLOCK_D2)
    _store_rows(DQKV, dv, dv_hi, bh, offs_n, N, H, 3, 2, HEAD_DIM, BLOCK_D, BLOCK_D2)


@triton.jit
def _bwd_dkdv(pid, QKV, DO, LSE, DELTA, DQKV, DQ_ACC, DQ_DESC, DQ_DESC2, Q_DESC, Q_DESC2,
              DO_DESC, DO_DESC2, KV_DESC, KV_DESC2, DO_WIDE, DO_WIDE2, seed, qk_scale, sm_scale,
              drop_p, H, N,
              HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_D2: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_NT: tl.constexpr,
              DROPOUT: tl.constexpr, ATOMIC_DQ: tl.constexpr, TMA_DQ: tl.constexpr,
              TMA: tl.constexpr, DIAG: tl.constexpr):
    """dK, dV of one BLOCK_N key tile; Q, dO, LSE, delta stream past in BLOCK_M tiles.
    BLOCK_NT > 0: the program of the keys past the last full BLOCK_N tile computes a tile of
    BLOCK_NT keys, loaded by pointers (197 = 3 x 64 + a 16-key tile, not a fourth 64), and
    takes the queries in BLOCK_N-row steps, Q through KV_DESC(2) and dO through DO_WIDE(2)
    (BLOCK_N-row boxes of dO); 0: its tile is a full one, masked. With ATOMIC_DQ
    (bwd_atomic_kernel) it also adds each query tile's share of dQ, dS K, into the fp32
    DQ_ACC with atomic adds, and starts its walk over the query tiles at its own index
    (wrapping round), so that the programs of a head add into different dQ rows at a time.
    With TMA_DQ too, each tile's adds are one bulk
    reduction of the tensor memory accelerator (Hopper) through the descriptors DQ_DESC (its
    first BLOCK_D columns) and DQ_DESC2 (the BLOCK_D2 after them) of DQ_ACC viewed as
    (B * H, N, HEAD_DIM): the L2 cache adds whole tiles, where plain atomics send one add per
    element. Rows past N fall outside the descriptor's bounds and are dropped. With TMA, K
    and V come through the qkv descriptors KV_DESC(2) (BLOCK_N-row boxes), each query tile's
    Q and dO through Q_DESC(2) and DO_DESC(2) (BLOCK_M-row boxes): see _load_tma."""
    pid_n, bh = _split_pid(pid, N, BLOCK_N)
    if BLOCK_NT > 0 and (pid_n + 1) * BLOCK_N > N:  # the key tail's program
        # its few keys take the queries in steps of BLOCK_N rows, through the BLOCK_N-row
        # boxes of qkv (KV_DESC) and dO (DO_WIDE): fewer, larger steps than BLOCK_M's
        _bwd_dkdv_tile(pid_n, bh, QKV, DO, LSE, DELTA, DQKV, DQ_ACC, DQ_DESC, DQ_DESC2, KV_DESC,
                       KV_DESC2, DO_WIDE, DO_WIDE2, KV_DESC, KV_DESC2, seed, qk_scale, sm_scale,
                       drop_p, H, N, HEAD_DIM, BLOCK_D, BLOCK_D2, BLOCK_N, BLOCK_N, BLOCK_NT,
                       DROPOUT, ATOMIC_DQ, TMA_DQ, False, TMA, DIAG)
    else:
        _bwd_dkdv_tile(pid_n, bh, QKV, DO, LSE, DELTA, DQKV, DQ_ACC, DQ_DESC, DQ_DESC2, Q_DESC,
                       Q_DESC2, DO_DESC, DO_DESC2, KV_DESC, KV_DESC2, seed, qk_scale, sm_scale,
                       drop_p, H, N, HEAD_DIM, BLOCK_D, BLOCK_D2, BLOCK_M, BLOCK_N, BLOCK_N,
                       DROPOUT, ATOMIC_DQ, TMA_DQ, TMA, TMA, DIAG)


@triton.jit
def _bwd_dq_tile(q_start, bh, QKV, O, DO, LSE, DELTA, DQKV, Q_DESC, Q_DESC2, DO_DESC,
                 DO_DESC2, KV_DESC, KV_DESC2, seed, qk_scale, sm_scale, drop_p, H, N,
                 HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_D2: tl.constexpr,
                 ROWS: tl.constexpr, BLOCK_N: tl.constexpr, DROPOUT: tl.constexpr,
                 TMA_Q: tl.constexpr, TMA: tl.constexpr, DIAG: tl.constexpr,
                 DQ_DELTA: tl.constexpr):
    """dQ of the ROWS queries from q_start of head bh (_bwd_dq): Q and dO through
    Q_DESC(2), DO_DESC(2) if TMA_Q, else by pointers; the key tiles through KV_DESC(2) if
    TMA. DQ_DELTA: delta = rowsum(dO * O) of these rows computed here from O and stored into
    DELTA (for the dK/dV launch after this one), else read from DELTA."""
    offs_m = q_start + tl.arange(0, ROWS)
    offs_n = tl.arange(0, BLOCK_N)
    q, q_hi = _head_tile(Q_DESC, Q_DESC2, QKV, bh, q_start, N, H, 3, 0, ROWS, HEAD_DIM,
                         BLOCK_D, BLOCK_D2, TMA_Q)
    do, do_hi = _head_tile(DO_DESC, DO_DESC2, DO, bh, q_start, N, H, 1, 0, ROWS, HEAD_DIM,
                           BLOCK_D, BLOCK_D2, TMA_Q)
    stats = bh.to(tl.int64) * N
    lse = tl.load(LSE + stats + offs_m, mask=offs_m < N, other=0.0)
    if DQ_DELTA:  # as bwd_delta_kernel computes it (rows past N: O = dO = 0, delta = 0)
        o, o_hi = _load_rows(O, bh, offs_m, N, H, 1, 0, HEAD_DIM, BLOCK_D, BLOCK_D2, True)
        delta = _rowdot(o, o_hi, do, do_hi, BLOCK_D2)
        tl.store(DELTA + stats + offs_m, delta, mask=offs_m < N)
    else:
        delta = tl.load(DELTA + stats + offs_m, mask=offs_m < N, other=0.0)
    k_ptrs, k_ptrs_hi = _chunk_ptrs(QKV, bh, offs_n, N, H, 3, 1, HEAD_DIM, BLOCK_D, BLOCK_D2)
    v_ptrs, v_ptrs_hi = _chunk_ptrs(QKV, bh, offs_n, N, H, 3, 2, HEAD_DIM, BLOCK_D, BLOCK_D2)

    dq, dq_hi = _zeros(ROWS, BLOCK_D, BLOCK_D2)
    for start_n in range(0, N, BLOCK_N):
        cols = start_n + offs_n
        k, k_hi = _stream_tile(KV_DESC, KV_DESC2, k_ptrs, k_ptrs_hi, bh, start_n, N, H, 3, 1,
                               BLOCK_N, HEAD_DIM, BLOCK_D, BLOCK_D2, True, TMA)
        v, v_hi = _stream_tile(KV_DESC, KV_DESC2, v_ptrs, v_ptrs_hi, bh, start_n, N, H, 3, 2,
                               BLOCK_N, HEAD_DIM, BLOCK_D, BLOCK_D2, True, TMA)
        s = _dot_t(q, q_hi, k, k_hi, BLOCK_D2)
        # Padded keys have k = 0, so exp2(-lse) could be anything: zero them explicitly.
        p = tl.where(cols[None, :] < N, tl.math.exp2(s * qk_scale - lse[:, None]), 0.0)
        if DIAG:
            p = tl.where(offs_m[:, None] == cols[None, :], 0.0, p)
        dp = _dot_t(do, do_hi, v, v_hi, BLOCK_D2)
        if DROPOUT:
            dp = tl.where(_keep(seed, bh, offs_m, start_n, N, drop_p, BLOCK_N, False),
                          dp * _keep_scale(drop_p, DROPOUT), 0.0)
        ds = p * (dp - delta[:, None])
        dq, dq_hi = _dot_d(_round(ds, k.dtype), k, k_hi, dq, dq_hi, BLOCK_D2)

    _store_rows(DQKV, dq * sm_scale, dq_hi * sm_scale, bh, offs_m, N, H, 3, 0, HEAD_DIM,
                BLOCK_D, BLOCK_D2)


@triton.jit
def _bwd_dq(pid, QKV, O, DO, LSE, DELTA, DQKV, Q_DESC, Q_DESC2, DO_DESC, DO_DESC2, KV_DESC,
            KV_DESC2, seed, qk_scale, sm_scale, drop_p, H, N,
            HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_D2: tl.constexpr,
            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_MT: tl.constexpr,
            DROPOUT: tl.constexpr, TMA: tl.constexpr, DIAG: tl.constexpr,
            DQ_DELTA: tl.constexpr):
    """dQ of one BLOCK_M query tile; K, V stream past in BLOCK_N tiles. BLOCK_MT > 0: the
    program of the queries past the last full BLOCK_M tile computes a tile of BLOCK_MT rows,
    loaded by pointers, and takes the keys in BLOCK_M-row steps through Q_DESC(2); 0: its
    tile is a full one, masked. With TMA, Q and dO come through
    Q_DESC(2) and DO_DESC(2) (BLOCK_M-row boxes), K and V through KV_DESC(2) (BLOCK_N-row
    boxes): see _load_tma."""
    pid_m, bh = _split_pid(pid, N, BLOCK_M)
    q_start = pid_m * BLOCK_M
    if BLOCK_MT > 0 and q_start + BLOCK_M > N:  # the query tail's program
        # its few rows take the keys in steps of BLOCK_M, through the BLOCK_M-row boxes of
        # qkv (Q_DESC): fewer, larger steps than BLOCK_N's
        _bwd_dq_tile(q_start, bh, QKV, O, DO, LSE, DELTA, DQKV, Q_DESC, Q_DESC2, DO_DESC,
                     DO_DESC2, Q_DESC, Q_DESC2, seed, qk_scale, sm_scale, drop_p, H, N, HEAD_DIM,
                     BLOCK_D, BLOCK_D2, BLOCK_MT, BLOCK_M, DROPOUT, False, TMA, DIAG, DQ_DELTA)
    else:
        _bwd_dq_tile(q_start, bh, QKV, O, DO, LSE, DELTA, DQKV, Q_DESC, Q_DESC2, DO_DESC,
                     DO_DESC2, KV_DESC, KV_DESC2, seed, qk_scale, sm_scale, drop_p, H, N, HEAD_DIM,
                     BLOCK_D, BLOCK_D2, BLOCK_M, BLOCK_N, DROPOUT, TMA, TMA, DIAG, DQ_DELTA)


@triton.jit
def bwd_kernel(QKV, O, DO, LSE, DELTA, DQKV, SEED, QKV_S, QKV_S2, QKV_L, QKV_L2, DO_S, DO_S2,
               DO_L, DO_L2, qk_scale, sm_scale, drop_p, BH, H, N,
               HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_D2: tl.constexpr,
               BLOCK_M1: tl.constexpr, BLOCK_N1: tl.constexpr,
               BLOCK_M2: tl.constexpr, BLOCK_N2: tl.constexpr, BLOCK_NT1: tl.constexpr,
               BLOCK_MT2: tl.constexpr, DROPOUT: tl.constexpr, TMA: tl.constexpr,
               DIAG: tl.constexpr, PART: tl.constexpr, DQ_DELTA: tl.constexpr):
    """The general backward (after bwd_delta_kernel, but where DQ_DELTA: below). PART = 0,
    one launch of both program kinds: the first cdiv(N, BLOCK_N1) * B * H programs compute
    dK, dV (one key tile each), the rest dQ (one query tile each); one launch rather than two
    fills the GPU without a tail between them. PART = 1: a launch of the dK/dV programs only;
    PART = 2: of the dQ programs only. Compiled apart, each kind gets the registers it needs
    rather than the larger kind's count (launch.split_twins). DQ_DELTA (PART = 2): the dQ
    programs compute delta from O and dO themselves and store it, and the dK/dV launch runs
    after them: a split backward needs no delta launch.

    Tail programs (flash._bwd_tails; 0: none, the last program's tile is a full one,
    masked): the dK/dV program of the keys past the last full BLOCK_N1 tile takes a tile of
    BLOCK_NT1 keys, the dQ program of the rows past the last full BLOCK_M2 tile one of
    BLOCK_MT2 rows, each loaded by pointers; the loops inside the programs keep full tiles.

    With TMA every full tile comes through descriptors (_load_tma) of qkv and dO, in boxes
    of the two tile heights that the FA2 shapes use, BLOCK_M1 = BLOCK_N2 rows (QKV_S, DO_S:
    "short") and BLOCK_N1 = BLOCK_M2 rows (QKV_L, DO_L: "long"), each with its second-chunk
    twin ("2"). Without TMA, any argument stands in for them."""
    pid = tl.program_id(0)
    n_dkdv = tl.cdiv(N, BLOCK_N1) * BH
    first_dq = 0  # the dQ programs' first program id
    if PART == 0:
        first_dq = n_dkdv
    seed = tl.load(SEED) if DROPOUT else 0
    # (PART is a constexpr: a launch of one kind is compiled without the other's code, and
    # PART = 0 compiles to one branch on the program id)
    if PART == 1 or (PART == 0 and pid < n_dkdv):
        _bwd_dkdv(pid, QKV, DO, LSE, DELTA, DQKV, DQKV, DQKV, DQKV, QKV_S, QKV_S2, DO_S, DO_S2,
                  QKV_L, QKV_L2, DO_L, DO_L2, seed, qk_scale, sm_scale, drop_p, H, N, HEAD_DIM,
                  BLOCK_D, BLOCK_D2, BLOCK_M1, BLOCK_N1, BLOCK_NT1, DROPOUT, False, False, TMA,
                  DIAG)
    else:
        _bwd_dq(pid - first_dq, QKV, O, DO, LSE, DELTA, DQKV, QKV_L, QKV_L2, DO_L, DO_L2, QKV_S,
                QKV_S2, seed, qk_scale, sm_scale, drop_p, H, N, HEAD_DIM, BLOCK_D, BLOCK_D2,
                BLOCK_M2, BLOCK_N2, BLOCK_MT2, DROPOUT, TMA, DIAG, DQ_DELTA)


@triton.jit
def bwd_atomic_kernel(QKV, DO, LSE, DELTA, DQ_ACC, DQKV, SEED, DQ_DESC, DQ_DESC2, Q_DESC,
                      Q_DESC2, DO_DESC, DO_DESC2, KV_DESC, KV_DESC2, qk_scale, sm_scale, drop_p,
                      H, N,
                      HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_D2: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DROPOUT: tl.constexpr,
                      TMA_DQ: tl.constexpr, DIAG: tl.constexpr):
    """The nondeterministic backward after bwd_delta_kernel: a program per BLOCK_N key tile,
    bwd_kernel's dK/dV program that also adds each query tile's share of dQ, dS K, into
    DQ_ACC (fp32, (B * H, N, HEAD_DIM), zeroed) by atomic adds (_bwd_dkdv with ATOMIC_DQ):
    element by element, or with TMA_DQ as bulk tile reductions through the tensor
    descriptors DQ_DESC, DQ_DESC2, and then its tiles come through TMA too: K, V by
    KV_DESC(2) (BLOCK_N-row boxes of qkv), Q and dO by Q_DESC(2) and DO_DESC(2) (BLOCK_M
    rows; see _load_tma). Without TMA_DQ any argument stands in for the descriptors.
    Five matrix products per (query tile, key tile) pair instead of the seven of bwd_kernel,
    whose dQ programs compute S and dP again; but the adds into a dQ row come from every key
    tile in an order that changes from run to run, so dQ is not bitwise reproducible.
    bwd_dq_kernel then scales and stores it."""
    seed = tl.load(SEED) if DROPOUT else 0
    _bwd_dkdv(tl.program_id(0), QKV, DO, LSE, DELTA, DQKV, DQ_ACC, DQ_DESC, DQ_DESC2, Q_DESC,
              Q_DESC2, DO_DESC, DO_DESC2, KV_DESC, KV_DESC2, DO_DESC, DO_DESC2, seed, qk_scale,
              sm_scale, drop_p, H, N, HEAD_DIM, BLOCK_D, BLOCK_D2, BLOCK_M, BLOCK_N, 0, DROPOUT,
              True, TMA_DQ, TMA_DQ, DIAG)


@triton.jit
def _acc_ptrs(DQ_ACC, bh, rows, N, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
              BLOCK_D2: tl.constexpr):
    """Pointers to both column chunks of rows `rows` of head bh in the fp32
    (B * H, N, HEAD_DIM) dQ accumulator."""
    row = DQ_ACC + (bh.to(tl.int64) * N + rows[:, None]) * HEAD_DIM
    ptrs = row + tl.arange(0, BLOCK_D)[None, :]
    ptrs_hi = ptrs
    if BLOCK_D2 > 0:
        ptrs_hi = row + BLOCK_D + tl.arange(0, BLOCK_D2)[None, :]
    return ptrs, ptrs_hi


@triton.jit
def _atomic_add_chunks(ptrs, ptrs_hi, tile, tile_hi, rows, N, HEAD_DIM: tl.constexpr,
                       BLOCK_D: tl.constexpr, BLOCK_D2: tl.constexpr):
    """Atomic fp32 adds of both chunks of a tile into rows `rows` (< N) of the accumulator
    (columns < HEAD_DIM: a padded head dim's extra columns are not there)."""
    cols = tl.arange(0, BLOCK_D)
    if BLOCK_D <= HEAD_DIM:
        tl.atomic_add(ptrs, tile, mask=rows[:, None] < N, sem="relaxed")
    else:
        tl.atomic_add(ptrs, tile, mask=(rows[:, None] < N) & (cols[None, :] < HEAD_DIM),
                      sem="relaxed")
    if BLOCK_D2 > 0:
        tl.atomic_add(ptrs_hi, tile_hi, mask=rows[:, None] < N, sem="relaxed")


@triton.jit
def bwd_dq_kernel(DQ_ACC, DQKV, sm_scale, H, N,
                  HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_D2: tl.constexpr,
                  BLOCK_M: tl.constexpr):
    """After bwd_atomic_kernel: dQ = DQ_ACC * softmax scale, in qkv's dtype, into DQKV."""
    pid_m, bh = _split_pid(tl.program_id(0), N, BLOCK_M)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    ptrs, ptrs_hi = _acc_ptrs(DQ_ACC, bh, rows, N, HEAD_DIM, BLOCK_D, BLOCK_D2)
    cols = tl.arange(0, BLOCK_D)
    if BLOCK_D <= HEAD_DIM:
        dq = tl.load(ptrs, mask=rows[:, None] < N, other=0.0)
    else:
        dq = tl.load(ptrs, mask=(rows[:, None] < N) & (cols[None, :] < HEAD_DIM), other=0.0)
    dq_hi = dq
    if BLOCK_D2 > 0:
        dq_hi = tl.load(ptrs_hi, mask=rows[:, None] < N, other=0.0)
    _store_rows(DQKV, dq * sm_scale, dq_hi * sm_scale, bh, rows, N, H, 3, 0, HEAD_DIM, BLOCK_D,
                BLOCK_D2)


@triton.jit
def _row_terms(w, a, a_hi, acc, acc_hi, BLOCK_D2: tl.constexpr, LATE: tl.constexpr):
    """acc + a's rows weighted by w (one weight per row), in fp32, chunk by chunk: summed
    over the rows into (1, head dim) rows (w^T a), or with LATE added row by row into
    (rows, head dim) accumulators whose rows the caller sums once at the end (_key_sums)."""
    terms = w[:, None] * a.to(tl.float32)
    acc += terms if LATE else tl.sum(terms, 0)[None, :]
    if BLOCK_D2 > 0:
        terms_hi = w[:, None] * a_hi.to(tl.float32)
        acc_hi += terms_hi if LATE else tl.sum(terms_hi, 0)[None, :]
    return acc, acc_hi


@triton.jit
def _key_sums(acc, acc_hi, BLOCK_D2: tl.constexpr):
    """_row_terms' accumulators summed over their rows: the (1, head dim) rows they stand
    for."""
    total = tl.sum(acc, 0)[None, :]
    total_hi = total
    if BLOCK_D2 > 0:
        total_hi = tl.sum(acc_hi, 0)[None, :]
    return total, total_hi


@triton.jit
def _bwd_one_key(dk1, dk1_hi, dv1, dv1_hi, k1, k1_hi, v1, v1_hi, q, q_hi, do, do_hi, lse,
                 delta, qk_scale, seed, bh, rows, key, N, drop_p,
                 BLOCK_D2: tl.constexpr, DROPOUT: tl.constexpr, DIAG: tl.constexpr,
                 LATE_SUMS: tl.constexpr):
    """A query chunk's share of the gradients through a single key, row `key` (< N), in
    vector arithmetic: dK and dV of that key (k1, v1 are (1, head dim) rows; dk1, dv1 too,
    or with LATE_SUMS (ROWS, head dim) accumulators of the rows' terms, which the caller
    sums over the rows once, after its last chunk: _key_sums), and the chunk's column of
    dS, whose dQ term ds k1 the caller adds (_bwd_short_chunk). That is the tail of
    N = 2^k + 1, a class token and a power-of-two grid of patches (65 = 64 + 1): the matrix
    units take at least 16 rows, so as a tail tile of products the one key costs the work
    of 16. P and dS stay in fp32 here (the products round them to the inputs' dtype).
    Padded query rows have q = dO = 0 and LSE = +inf, so p = 0 and they add nothing."""
    s = _rowdot(q, q_hi, k1, k1_hi, BLOCK_D2)  # (ROWS,): q k1^T
    p = tl.math.exp2(s * qk_scale - lse)
    if DIAG:
        p = tl.where(rows == key, 0.0, p)
    dp = _rowdot(do, do_hi, v1, v1_hi, BLOCK_D2)  # dO v1^T
    p_kept = p
    if DROPOUT:
        keep = _keep_one(seed, bh, rows, key, N, drop_p)
        scale = _keep_scale(drop_p, DROPOUT)
        p_kept = tl.where(keep, p * scale, 0.0)
        dp = tl.where(keep, dp * scale, 0.0)
    ds = p * (dp - delta)
    dv1, dv1_hi = _row_terms(p_kept, do, do_hi, dv1, dv1_hi, BLOCK_D2, LATE_SUMS)
    dk1, dk1_hi = _row_terms(ds, q, q_hi, dk1, dk1_hi, BLOCK_D2, LATE_SUMS)
    return dk1, dk1_hi, dv1, dv1_hi, ds


@triton.jit
def _bwd_short_chunk(dk, dk_hi, dv, dv_hi, dk_t, dk_t_hi, dv_t, dv_t_hi,
                     k, k_hi, v, v_hi, k_t, k_t_hi, v_t, v_t_hi,
                     QKV, O, DO, LSE, DQKV, bh, start_m, seed, qk_scale, sm_scale, drop_p, H, N,
                     HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_D2: tl.constexpr,
                     ROWS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr,
                     HAS_TAIL: tl.constexpr, MASK_M: tl.constexpr, DROPOUT: tl.constexpr,
                     DIAG: tl.constexpr, KEY_PER_CHUNK: tl.constexpr, LATE_SUMS: tl.constexpr):
    """One chunk of bwd_short_kernel: ROWS query rows from start_m (MASK_M: the chunk may
    reach past row N - 1). Computes the chunk's delta, writes its finished dQ and returns
    dK, dV (and the tail tile's dK, dV) with its share added, each as its two chunks."""
    rows = start_m + tl.arange(0, ROWS)
    offs_n = tl.arange(0, BLOCK_N)
    offs_t = BLOCK_N + tl.arange(0, BLOCK_T)
    q, q_hi = _load_rows(QKV, bh, rows, N, H, 3, 0, HEAD_DIM, BLOCK_D, BLOCK_D2, MASK_M)
    do, do_hi = _load_rows(DO, bh, rows, N, H, 1, 0, HEAD_DIM, BLOCK_D, BLOCK_D2, MASK_M)
    o, o_hi = _load_rows(O, bh, rows, N, H, 1, 0, HEAD_DIM, BLOCK_D, BLOCK_D2, MASK_M)
    delta = _rowdot(o, o_hi, do, do_hi, BLOCK_D2)
    # Padded query rows: q = dO = 0 and LSE = +inf make their column of P^T zero.
    if MASK_M:
        lse = tl.load(LSE + bh.to(tl.int64) * N + rows, mask=rows < N, other=float("inf"))
    else:
        lse = tl.load(LSE + bh.to(tl.int64) * N + rows)
    ONE_KEY: tl.constexpr = HAS_TAIL and BLOCK_T == 1
    if ONE_KEY and KEY_PER_CHUNK:  # the key read again, its vector work first (bwd_short_kernel)
        key_row = BLOCK_N + tl.arange(0, 1)
        k_t, k_t_hi = _load_rows(QKV, bh, key_row, N, H, 3, 1, HEAD_DIM, BLOCK_D, BLOCK_D2, False)
        v_t, v_t_hi = _load_rows(QKV, bh, key_row, N, H, 3, 2, HEAD_DIM, BLOCK_D, BLOCK_D2, False)
        dk_t, dk_t_hi, dv_t, dv_t_hi, ds1 = _bwd_one_key(
            dk_t, dk_t_hi, dv_t, dv_t_hi, k_t, k_t_hi, v_t, v_t_hi, q, q_hi, do, do_hi, lse,
            delta, qk_scale, seed, bh, rows, BLOCK_N, N, drop_p, BLOCK_D2, DROPOUT, DIAG,
            LATE_SUMS)
    dk, dk_hi, dv, dv_hi, ds_t = _bwd_dkdv_step(dk, dk_hi, dv, dv_hi, k, k_hi, v, v_hi, q, q_hi,
                                                do, do_hi, lse, delta, qk_scale, seed, bh, rows,
                                                0, N, drop_p, BLOCK_D2, DROPOUT, DIAG)
    # Padded keys (k = v = 0) get p = exp2(-lse) != 0 in _bwd_dkdv_step: harmless for
    # their own dK, dV rows, which are never stored, but they must not reach dQ.
    ds_t = tl.where(offs_n[:, None] < N, ds_t, 0.0)
    dq, dq_hi = _zeros(ROWS, BLOCK_D, BLOCK_D2)
    dq, dq_hi = _dot_d(tl.trans(_round(ds_t, k.dtype)), k, k_hi, dq, dq_hi, BLOCK_D2)
    if HAS_TAIL:
        if ONE_KEY:  # one key past the tile: vector arithmetic (_bwd_one_key)
            if not KEY_PER_CHUNK:
                dk_t, dk_t_hi, dv_t, dv_t_hi, ds1 = _bwd_one_key(
                    dk_t, dk_t_hi, dv_t, dv_t_hi, k_t, k_t_hi, v_t, v_t_hi, q, q_hi, do, do_hi,
                    lse, delta, qk_scale, seed, bh, rows, BLOCK_N, N, drop_p, BLOCK_D2, DROPOUT,
                    DIAG, LATE_SUMS)
            dq += ds1[:, None] * k_t.to(tl.float32)  # its dQ term, after dS K's
            if BLOCK_D2 > 0:
                dq_hi += ds1[:, None] * k_t_hi.to(tl.float32)
        else:
            dk_t, dk_t_hi, dv_t, dv_t_hi, ds_tt = _bwd_dkdv_step(
                dk_t, dk_t_hi, dv_t, dv_t_hi, k_t, k_t_hi, v_t, v_t_hi, q, q_hi, do, do_hi, lse,
                delta, qk_scale, seed, bh, rows, BLOCK_N, N, drop_p, BLOCK_D2, DROPOUT, DIAG)
            ds_tt = tl.where(offs_t[:, None] < N, ds_tt, 0.0)
            dq, dq_hi = _dot_d(tl.trans(_round(ds_tt, k.dtype)), k_t, k_t_hi, dq, dq_hi,
                               BLOCK_D2)
    _store_rows(DQKV, dq * sm_scale, dq_hi * sm_scale, bh, rows, N, H, 3, 0, HEAD_DIM, BLOCK_D,
                BLOCK_D2)
    return dk, dk_hi, dv, dv_hi, dk_t, dk_t_hi, dv_t, dv_t_hi


@triton.jit
def bwd_short_kernel(QKV, O, DO, LSE, DQKV, SEED, qk_scale, sm_scale, drop_p, H, N,
                     HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_D2: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_MT: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_T: tl.constexpr, HAS_TAIL: tl.constexpr, DROPOUT: tl.constexpr,
                     DIAG: tl.constexpr, KEY_PER_CHUNK: tl.constexpr):
    """The whole backward of one (batch, head) when all keys fit on chip (a BLOCK_N tile and,
    if HAS_TAIL, a BLOCK_T tail), in one launch and without bwd_delta_kernel: K and V stay
    on chip while the query rows pass in full BLOCK_M chunks and then, unless BLOCK_MT = 0
    (BLOCK_M divides N), one BLOCK_MT-row chunk for the rest (65 rows: 64 + 16, or
    32 + 32 + 16, not 64 + 64); each chunk computes its own delta, adds to dK and dV, and
    writes its finished dQ. BLOCK_T = 1: the tail is one key (N = BLOCK_N + 1), done in
    vector arithmetic rather than as a tile of products (_bwd_one_key). Where at least two
    full chunks pass (BLOCK_M < BLOCK_N), its dK and dV terms add up in (BLOCK_M, head dim)
    accumulators, summed over the rows once after the full chunks (LATE_SUMS), rather than
    summed across the threads in every chunk: compiled for sm_90 on the CPU (triton 3.8),
    a 32-row chunk's loop in 4 warps went from 714 instructions and 20 barriers to 576 and
    12, and on an H100 (triton 3.6) the 32-row and 16-row programs took 6-8% and 22-25%
    less time at the four N = 65, D = 64 shapes (benchmarks/results/gpu_session_65e0e7e/run1/).
    KEY_PER_CHUNK (with BLOCK_T = 1): each chunk reads that key's row again (from cache) and
    does its vector work before the chunk's products, instead of holding the row across the
    loop and working after them; the same arithmetic in the same order, so the same bits,
    with fewer values live at once. In 16-row chunks, 4 warps, that is 216 registers a
    thread instead of 232 (H100, triton 3.6), and under a cap of 168 (3 programs an SM
    instead of 2) 56 bytes of local memory a thread: the fastest backward at those four
    shapes (launch.SHORT_BWD_CAPPED)."""
    bh = tl.program_id(0)
    offs_n = tl.arange(0, BLOCK_N)
    offs_t = BLOCK_N + tl.arange(0, BLOCK_T)
    k, k_hi = _load_rows(QKV, bh, offs_n, N, H, 3, 1, HEAD_DIM, BLOCK_D, BLOCK_D2, True)
    v, v_hi = _load_rows(QKV, bh, offs_n, N, H, 3, 2, HEAD_DIM, BLOCK_D, BLOCK_D2, True)
    dk, dk_hi = _zeros(BLOCK_N, BLOCK_D, BLOCK_D2)
    dv, dv_hi = _zeros(BLOCK_N, BLOCK_D, BLOCK_D2)
    # The tail tiles exist either way (without HAS_TAIL, offs_t >= BLOCK_N >= N masks every
    # load and nothing reads them), so that the loop carries the same variables.
    k_t, k_t_hi = _load_rows(QKV, bh, offs_t, N, H, 3, 1, HEAD_DIM, BLOCK_D, BLOCK_D2, True)
    v_t, v_t_hi = _load_rows(QKV, bh, offs_t, N, H, 3, 2, HEAD_DIM, BLOCK_D, BLOCK_D2, True)
    ONE_KEY: tl.constexpr = HAS_TAIL and BLOCK_T == 1
    # (BLOCK_M, head dim) accumulators of the one key's terms, summed once after the full
    # chunks, where there are at least two of them (N = BLOCK_N + 1)
    LATE_SUMS: tl.constexpr = ONE_KEY and BLOCK_M < BLOCK_N
    if LATE_SUMS:
        dk_t, dk_t_hi = _zeros(BLOCK_M, BLOCK_D, BLOCK_D2)
        dv_t, dv_t_hi = _zeros(BLOCK_M, BLOCK_D, BLOCK_D2)
    else:
        dk_t, dk_t_hi = _zeros(BLOCK_T, BLOCK_D, BLOCK_D2)
        dv_t, dv_t_hi = _zeros(BLOCK_T, BLOCK_D, BLOCK_D2)
    seed = tl.load(SEED) if DROPOUT else 0

    m_full = (N // BLOCK_M) * BLOCK_M
    for start_m in range(0, m_full, BLOCK_M):
        dk, dk_hi, dv, dv_hi, dk_t, dk_t_hi, dv_t, dv_t_hi = _bwd_short_chunk(
            dk, dk_hi, dv, dv_hi, dk_t, dk_t_hi, dv_t, dv_t_hi, k, k_hi, v, v_hi, k_t, k_t_hi,
            v_t, v_t_hi, QKV, O, DO, LSE, DQKV, bh, start_m, seed, qk_scale, sm_scale, drop_p,
            H, N, HEAD_DIM, BLOCK_D, BLOCK_D2, BLOCK_M, BLOCK_N, BLOCK_T, HAS_TAIL, False,
            DROPOUT, DIAG, KEY_PER_CHUNK, LATE_SUMS)
    # the rows past the last full chunk: into the same accumulators if their chunk has as
    # many rows, else after the sums, into the summed rows
    LATE_TAIL: tl.constexpr = LATE_SUMS and BLOCK_MT == BLOCK_M
    if LATE_SUMS and not LATE_TAIL:
        dk_t, dk_t_hi = _key_sums(dk_t, dk_t_hi, BLOCK_D2)
        dv_t, dv_t_hi = _key_sums(dv_t, dv_t_hi, BLOCK_D2)
    if BLOCK_MT > 0:
        dk, dk_hi, dv, dv_hi, dk_t, dk_t_hi, dv_t, dv_t_hi = _bwd_short_chunk(
            dk, dk_hi, dv, dv_hi, dk_t, dk_t_hi, dv_t, dv_t_hi, k, k_hi, v, v_hi, k_t, k_t_hi,
            v_t, v_t_hi, QKV, O, DO, LSE, DQKV, bh, m_full, seed, qk_scale, sm_scale, drop_p,
            H, N, HEAD_DIM, BLOCK_D, BLOCK_D2, BLOCK_MT, BLOCK_N, BLOCK_T, HAS_TAIL, True,
            DROPOUT, DIAG, KEY_PER_CHUNK, LATE_TAIL)
    if LATE_TAIL:
        dk_t, dk_t_hi = _key_sums(dk_t, dk_t_hi, BLOCK_D2)
        dv_t, dv_t_hi = _key_sums(dv_t, dv_t_hi, BLOCK_D2)

    _store_rows(DQKV, dk * sm_scale, dk_hi * sm_scale, bh, offs_n, N, H, 3, 1, HEAD_DIM,
                BLOCK_D, BLOCK_D2)
    _store_rows(DQKV, dv, dv_hi, bh, offs_n, N, H, 3, 2, HEAD_DIM, BLOCK_D, BLOCK_D2)
    if HAS_TAIL:
        _store_rows(DQKV, dk_t * sm_scale, dk_t_hi * sm_scale, bh, offs_t, N, H, 3, 1, HEAD_DIM,
                    BLOCK_D, BLOCK_D2)
        _store_rows(DQKV, dv_t, dv_t_hi, bh, offs_t, N, H, 3, 2, HEAD_DIM, BLOCK_D, BLOCK_D2)
