"""vitflash's FlashAttention: the public ops, their autograd, and the torch.library ops
that torch.compile sees. The Triton kernels are in `kernels.py` (algorithm and layout are
described there); choosing and launching them is `launch.py`.

Dtypes: float16 and bfloat16, with float32 accumulation. float32 inputs are refused, as
FlashAttention refuses them: the tiles and configurations are sized for 16-bit operands on
the matrix units, and fp32 tiles would halve what fits on chip. Run the model under bf16
autocast, or use the `sdpa` / `naive` paths for fp32.

The kernels read one contiguous (B, N, 3, H, D) qkv tensor, the output of a ViT's fused qkv
projection, and write one dqkv of that layout: `flash_attention_qkvpacked` takes it as it
is; `flash_attention` stacks separate q, k, v into it (one copy).

Attention dropout (`dropout_p`): the kernels drop weights by a mask that a per-call seed (one
int64 drawn on the device, saved for the backward) and the head determine, and regenerate it
in the backward (kernels.py); `dropout_keep_mask` shows it for a seed.

Configurations are autotuned on the first call at each (N, D, dtype, B*H bucket) and the
choice is kept on disk (see launch.py): a few seconds once per GPU and shape, not per run.
On CPU the kernels run under Triton's interpreter (TRITON_INTERPRET=1, set before Triton
is first imported), which is how CI tests them.
"""
from __future__ import annotations

import math

import torch
from triton.tools.tensor_descriptor import TensorDescriptor

from vitflash.ops import kernels
from vitflash.ops import launch as _launch
from vitflash.ops.launch import Candidate, Launch, _pow2, choose, split_d, tail_tile

from vitflash.ops.reference import check_dropout_p, check_mask_diagonal, check_packed, check_softmax_scale

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16)
MAX_HEAD_DIM = 256
LOG2E = 1.4426950408889634
DELTA_BLOCK = 64


def _cdiv(a: int, b: int) -> int:  # plain Python: triton.cdiv is a jit function, slow on the host
    return -(-a // b)


# ----------------------------------------------------------------------------------------
# Host launchers (no autograd here)
# ----------------------------------------------------------------------------------------
# A plan per (op, dtype, device, B, N, H, D): the Launches of the chosen candidate. After the
# first call at a shape, a call is a dict lookup, the output allocations and the launches.
_plans: dict[tuple, list[Launch]] = {}


def _fwd_launches(c: Candidate, B: int, N: int, H: int, D: int, dropout: bool = False,
                  diag: bool = False) -> list[Launch]:
    if c.family in _launch.GLUON_FAMILIES:
        if not (dropout or diag):
            return [_launch.GluonLaunch(c, D)]
        # the Gluon forwards have neither; dropout is in the tuning key (never listed with
        # it), the diagonal mask is not: a call with it takes the untuned Triton forward
        c = _launch.heuristic("fwd", N, D)
    short = c.family in _launch.SHORT_FWD_FAMILIES
    kernel = kernels.fwd_short_kernel if short else kernels.fwd_kernel
    meta = {**c.meta, "DROPOUT": dropout, "TMA": c.family in ("general_tma", "short_tma"), "DIAG": diag}
    if (B * H) % meta.get("HEADS", 1):  # tuned at another B * H of the same bucket
        meta.update(HEADS=1, STAGES=1)
    if not short:  # the tail tile: the keys past the last full BLOCK_N (loaded before the
        # loop in a tail-ahead twin, launch.tail_ahead_twins)
        meta["BLOCK_T"] = tail_tile(N, meta["BLOCK_N"])
        meta.setdefault("TAIL_AHEAD", 0)
    else:  # the query rows past the last full BLOCK_M
        meta["BLOCK_MT"] = tail_tile(N, meta["BLOCK_M"])
    block_d1, block_d2 = split_d(D)  # (64, 16) at D = 80: two column chunks, no padding
    consts = {"HEAD_DIM": D, "BLOCK_D": block_d1, "BLOCK_D2": block_d2, **meta}
    grid = _cdiv(N, meta["BLOCK_M"]) * (B * H // meta.get("HEADS", 1))
    return [Launch(kernel, grid, consts, c.num_warps, c.num_stages, n_tensors=4, maxnreg=c.maxnreg)]


def _bwd_launches(c: Candidate, B: int, N: int, H: int, D: int, dropout: bool = False,
                  diag: bool = False) -> list[Launch]:
    if c.family == _launch.GLUON_BWD_FAMILY and (dropout or diag):
        # as in _fwd_launches: dropout is never listed with it, the diagonal mask takes the
        # untuned Triton backward
        c = _launch.heuristic("bwd", N, D)
    block_d1, block_d2 = split_d(D)
    head = {"HEAD_DIM": D, "BLOCK_D": block_d1, "BLOCK_D2": block_d2}
    flags = {"DROPOUT": dropout, "DIAG": diag}
    if c.family == "short":  # one program per (batch, head), delta computed inside
        tail = {"BLOCK_MT": tail_tile(N, c.meta["BLOCK_M"])}  # the rows past the last BLOCK_M
        form = {"KEY_PER_CHUNK": 0, **c.meta}  # listed only in the capped twins' blocks
        return [Launch(kernels.bwd_short_kernel, B * H, {**head, **form, **tail, **flags},
                       c.num_warps, c.num_stages, n_tensors=6, maxnreg=c.maxnreg)]
    if c.family == _launch.GLUON_BWD_FAMILY:  # dQ's programs, computing delta, then dK/dV's
        return [_launch.GluonBwdLaunch(c, D, dkdv=False), _launch.GluonBwdLaunch(c, D, dkdv=True)]
    m = c.meta
    delta = Launch(kernels.bwd_delta_kernel, _cdiv(N, DELTA_BLOCK) * B * H,
                   {**head, "BLOCK_M": DELTA_BLOCK}, 4, 1, n_tensors=3)
    if c.family in _launch.ATOMIC_FAMILIES:  # dK, dV and dQ's adds, then dQ scaled and stored
        return [delta,
                Launch(kernels.bwd_atomic_kernel, _cdiv(N, m["BLOCK_N"]) * B * H,
                       {**head, **m, **flags, "TMA_DQ": c.family == "atomic_tma"},
                       c.num_warps, c.num_stages, n_tensors=7, maxnreg=c.maxnreg),
                Launch(kernels.bwd_dq_kernel, _cdiv(N, DELTA_BLOCK) * B * H,
                       {**head, "BLOCK_M": DELTA_BLOCK}, 4, 1, n_tensors=2)]
    consts = {**head, **m, **flags, "TMA": c.family == "general_tma"}
    if not consts.pop("SPLIT", 0):  # PART 0: both kinds of program in one launch, after delta's
        return [delta, Launch(kernels.bwd_kernel, _cdiv(N, m["BLOCK_N1"]) * B * H
                              + _cdiv(N, m["BLOCK_M2"]) * B * H,
                              _bwd_tails({**consts, "PART": 0, "DQ_DELTA": False}, N),
                              c.num_warps, c.num_stages, n_tensors=7, maxnreg=c.maxnreg)]
    # a split candidate: dQ's launch, which computes delta as well (DQ_DELTA), then dK/dV's,
    # each with its own tiles, warps and stages (the dQ launch's: WARPS2 and STAGES2, else the
    # candidate's). A launch's unused pair of tiles mirrors its own (what PART 0 requires of
    # them), so that one part's kernel is the same binary whatever the other part is.
    warps2, stages2 = consts.pop("WARPS2", c.num_warps), consts.pop("STAGES2", c.num_stages)
    m1, n1, m2, n2 = (consts[k] for k in ("BLOCK_M1", "BLOCK_N1", "BLOCK_M2", "BLOCK_N2"))
    return [Launch(kernels.bwd_kernel, _cdiv(N, m2) * B * H,
                   _bwd_tails({**consts, "BLOCK_M1": n2, "BLOCK_N1": m2, "PART": 2, "DQ_DELTA": True}, N),
                   warps2, stages2, n_tensors=7, maxnreg=c.maxnreg),
            Launch(kernels.bwd_kernel, _cdiv(N, n1) * B * H,
                   _bwd_tails({**consts, "BLOCK_M2": n1, "BLOCK_N2": m1, "PART": 1, "DQ_DELTA": False}, N),
                   c.num_warps, c.num_stages, n_tensors=7, maxnreg=c.maxnreg)]


def _bwd_tails(consts: dict, N: int) -> dict:
    """consts with bwd_kernel's tail programs set: the dK/dV program of the keys past the last
    full BLOCK_N1 tile takes BLOCK_NT1 keys, the dQ program of the rows past the last full
    BLOCK_M2 tile BLOCK_MT2 rows, each `tail_tile(N, tile)` where that is smaller than the
    tile, else 0 (the last program's tile is a full one, masked). At N = 197: 5 keys past
    3 x 64 -> a 16-key program; 69 past 128 -> none. The loops inside the programs keep full
    tiles: a tail step after the pipelined loop cost more than the masked full step on an
    H200 (benchmarks/results/gpu_session_edf20d8/).

    None (0, 0) at head dims held in a 16-column second chunk (48, 80, 144) or wider than 128
    columns: compiled for sm_90 there, the tail programs' code took the whole kernel to 255
    registers a thread with up to 1.4 KB of spills (at D = 80 with TMA loads: 174 registers
    and none without them), or cost it programs per SM
    (benchmarks/results/registers_sm90_bwd_tails.md), and on the H200 the backward at
    (32, 16, 577, 80) went from 0.61 ms to 0.79 ms (benchmarks/results/gpu_session_b7a82e1/)."""
    if consts["BLOCK_D2"] == 16 or consts["BLOCK_D"] + consts["BLOCK_D2"] > 128:
        consts.update(BLOCK_NT1=0, BLOCK_MT2=0)
        return consts
    return bwd_tail_tiles(consts, N)


def bwd_tail_tiles(consts: dict, N: int) -> dict:
    """consts with the tail programs' tiles that _bwd_tails sets where it uses them (at any
    head dim: what benchmarks/probes/registers.py --tails-anyway compiles)."""
    for tile, tail in (("BLOCK_N1", "BLOCK_NT1"), ("BLOCK_M2", "BLOCK_MT2")):
        t = tail_tile(N, consts[tile])
        consts[tail] = t if t < consts[tile] else 0
    return consts


def _bwd_descriptors(launch: Launch, qkv: torch.Tensor, do: torch.Tensor,
                     made: dict | None = None) -> tuple:
    """The descriptor arguments of a bwd_kernel launch: with TMA, qkv's and dO's in boxes of
    its two tile heights, BLOCK_M1 = BLOCK_N2 rows ("short": the Q and dO tiles of the dK/dV
    programs, the K and V tiles of the dQ ones) and BLOCK_N1 = BLOCK_M2 rows ("long"), a
    second-chunk twin beside each (kernels.bwd_kernel); else None in their eight places.
    made: the descriptors of this call's earlier launches by (tensor, height), reused: a split
    twin's second launch has the same heights as its first and builds none."""
    c = launch.consts
    if not c["TMA"]:
        return (None,) * 8
    made = {} if made is None else made
    out = []
    for name, t in (("qkv", qkv), ("do", do)):
        for rows in (c["BLOCK_M1"], c["BLOCK_N1"]):
            if (name, rows) not in made:
                made[name, rows] = _tma_descriptors(t, rows, c)
            out += made[name, rows]
    return tuple(out)


def _tma_descriptors(t: torch.Tensor, rows: int, consts: dict) -> tuple:
    """TMA descriptors of t (B, N, ...), contiguous, viewed as (B, N, the rest), in boxes of
    (1, rows, BLOCK_D) and, for a split head dim, (1, rows, BLOCK_D2) (unsplit: None, never
    read): what kernels._load_tma reads tiles of `rows` rows through, and what
    bwd_atomic_kernel adds dQ tiles through (t: its fp32 (B * H, N, D) accumulator). The
    batch is a dimension of its own so that rows past N are outside the bounds (zeros when
    read, dropped when added), not the next batch's first rows."""
    flat = t.view(t.shape[0], t.shape[1], -1)
    shape, strides = list(flat.shape), list(flat.stride())
    first = TensorDescriptor(flat, shape, strides, [1, rows, consts["BLOCK_D"]])
    if not consts["BLOCK_D2"]:
        return first, None
    return first, TensorDescriptor(flat, shape, strides, [1, rows, consts["BLOCK_D2"]])


def _probe(like: torch.Tensor) -> torch.Tensor:
    """Fixed, well-conditioned inputs of `like`'s shape, dtype and device (standard normal
    values from a seeded generator): what the tuner checks each candidate's result on
    (launch.choose). The real inputs of a first call may be anything, a trained model's
    peaked attention among them, where correct kernels can differ by more than rounding."""
    gen = torch.Generator(device=like.device).manual_seed(0)
    return torch.randn(like.shape, generator=gen, device=like.device, dtype=like.dtype)


def _plan(op: str, t: torch.Tensor, B: int, N: int, H: int, D: int, dropout: bool, diag: bool,
          run, verify) -> list[Launch]:
    """The plan for this shape: cached, or chosen now (`run(launches)` runs a candidate's
    launches on the real arguments, for timing; `verify(launches)` runs them on _probe
    inputs of the same shape and returns their results, which must agree with the heuristic
    candidate's: launch.choose). With dropout or the diagonal mask the kernels are traced
    with its code; dropout is also part of the tuning key (its mask work moves the best
    candidate), the diagonal mask is not (launch._key)."""
    key = (op, t.dtype, t.device, B, N, H, D, dropout, diag)
    plan = _plans.get(key)
    if plan is None:
        make = _fwd_launches if op == "fwd" else _bwd_launches  # bwd or bwd_atomic
        made: dict[Candidate, list[Launch]] = {}

        def launches(c: Candidate) -> list[Launch]:
            # one plan per candidate while tuning: after its first call each of its Launches
            # calls the compiled kernel directly, so the tuner's thousands of calls (about a
            # hundred per candidate in its windows, up to 500 per graph block) skip Triton's
            # argument binding
            if c not in made:
                made[c] = make(c, B, N, H, D, dropout, diag)
            return made[c]

        cand = choose(op, t.dtype, N, D, B * H, t.device, lambda c: run(launches(c)),
                      lambda c: verify(launches(c)), dropout=dropout)
        plan = launches(cand)
        if not (t.is_cuda and torch.cuda.is_current_stream_capturing()):
            _plans[key] = plan  # a plan made during capture is untuned: not kept
    return plan


def _packed_input(t: torch.Tensor) -> torch.Tensor:
    """t itself where it is contiguous and starts on a 16-byte boundary, else a copy that
    does: the TMA descriptors of the Hopper kernels need that alignment (a contiguous view
    that starts part-way into an element row may lack it), and a fresh allocation has it.
    Here in the launchers, which see real tensors also under torch.compile (a traced wrapper
    sees fake ones, whose addresses are not known)."""
    if t.is_contiguous() and t.data_ptr() % 16 == 0:
        return t
    return t.clone(memory_format=torch.contiguous_format)


def _forward(qkv: torch.Tensor, softmax_scale: float, dropout_p: float = 0.0,
             seed: torch.Tensor | None = None,
             mask_diagonal: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """qkv (B, N, 3, H, D) contiguous -> o (B, N, H, D) contiguous, lse (B, H, N) fp32 in
    base-2 units. dropout_p > 0: the probabilities are dropped by the mask that `seed` (a
    one-element int64 tensor on qkv's device) keys; the LSE is that of the whole row.
    mask_diagonal: no query attends to its own key (N >= 2)."""
    B, N, _, H, D = qkv.shape
    qkv = _packed_input(qkv)
    o = torch.empty((B, N, H, D), dtype=qkv.dtype, device=qkv.device)
    lse = torch.empty((B, H, N), dtype=torch.float32, device=qkv.device)
    dropout = dropout_p > 0
    # without dropout the kernels never read SEED: any aligned pointer stands in for it
    tensors = (qkv, o, lse, seed if dropout else lse)
    scalars = (softmax_scale * LOG2E, dropout_p, H, N)
    plan = _plans.get(("fwd", qkv.dtype, qkv.device, B, N, H, D, dropout, mask_diagonal))
    if plan is None:  # (the tuner's runners are built only here, off the per-call path)
        def run(p: list[Launch], args: tuple = tensors) -> None:
            p[0](*args, *_fwd_descriptors(p[0], args[0]), *scalars)

        def verify(p: list[Launch]) -> tuple[torch.Tensor]:
            args = (_probe(qkv), torch.empty_like(o), torch.empty_like(lse), tensors[3])
            run(p, args)
            return (args[1],)

        plan = _plan("fwd", qkv, B, N, H, D, dropout, mask_diagonal, run, verify)
    (launch,) = plan
    launch(*tensors, *_fwd_descriptors(launch, qkv), *scalars)
    return o, lse


def _fwd_descriptors(launch: Launch, qkv: torch.Tensor) -> tuple:
    """The descriptor arguments of a forward launch. The general kernel: with TMA, qkv's in
    boxes of BLOCK_M rows (Q) and BLOCK_N rows (K, V), else None in their four places. The
    short one: with TMA, qkv's in boxes of each height that its tiles have (BLOCK_M, BLOCK_MT,
    BLOCK_N, BLOCK_T, BLOCK_T2), in the places of the heights 16 ... 256, None elsewhere; all
    None without TMA. Second-chunk twins are None for an unsplit head dim (_tma_descriptors):
    the launch encodes every descriptor passed, at a cost in host time. A Gluon forward
    makes its own: none."""
    if isinstance(launch, _launch.GluonLaunch):
        return ()
    c = launch.consts
    if launch.kernel is not kernels.fwd_short_kernel:
        if not c["TMA"]:
            return (None,) * 4
        return _tma_descriptors(qkv, c["BLOCK_M"], c) + _tma_descriptors(qkv, c["BLOCK_N"], c)
    if not c["TMA"]:
        return (None,) * 10
    heights = {c["BLOCK_M"], c["BLOCK_MT"], c["BLOCK_N"], c["BLOCK_T"] * c["HAS_TAIL"], c["BLOCK_T2"]}
    return tuple(d for rows in _launch.BOX_HEIGHTS
                 for d in (_tma_descriptors(qkv, rows, c) if rows in heights else (None, None)))


def _backward(do: torch.Tensor, qkv: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
              softmax_scale: float, dropout_p: float = 0.0, seed: torch.Tensor | None = None,
              deterministic: bool = True, mask_diagonal: bool = False) -> torch.Tensor:
    """dqkv (B, N, 3, H, D), contiguous, from do (B, N, H, D) and the forward's qkv, o, lse
    (and its dropout_p, seed and mask_diagonal: the backward regenerates the forward's masks).
    deterministic=False lets the tuner also choose the backward that adds into dQ
    atomically (op "bwd_atomic"): less work at long sequences, results that vary in the
    last bits from run to run."""
    B, N, _, H, D = qkv.shape
    qkv, do = _packed_input(qkv), _packed_input(do)
    dqkv = torch.empty_like(qkv)
    qk_scale = softmax_scale * LOG2E
    dropout = dropout_p > 0
    seed = seed if dropout else lse
    dq_acc = None  # the atomic backward's fp32 dQ, one per call (and per tuning, not per candidate)

    def run(plan: list[Launch], args: tuple = (qkv, o, do, lse, dqkv)) -> None:
        nonlocal dq_acc
        qkv_, o_, do_, lse_, dqkv_ = args
        # one launch: the short backward; a split candidate's dQ launch (delta computed there)
        # and its dK/dV launch; the Gluon dQ kernel computing delta, then the dK/dV one; else
        # delta first, then bwd_kernel once, or bwd_atomic_kernel into an fp32 dQ and
        # bwd_dq_kernel (_bwd_launches)
        if len(plan) == 1:
            plan[0](qkv_, o_, do_, lse_, dqkv_, seed, qk_scale, softmax_scale, dropout_p, H, N)
            return
        delta = torch.empty_like(lse_)
        parts = plan
        if plan[0].kernel is kernels.bwd_delta_kernel:
            plan[0](o_, do_, delta, H, N)
            parts = plan[1:]
        if isinstance(parts[0], _launch.GluonBwdLaunch):
            for part in parts:
                part(qkv_, o_, do_, lse_, delta, dqkv_, qk_scale, softmax_scale, H, N)
            return
        if parts[0].kernel is kernels.bwd_kernel:
            made = {}  # TMA descriptors by (tensor, box height), shared by a split's launches
            for part in parts:  # one launch, or a split candidate's two (own tiles each)
                part(qkv_, o_, do_, lse_, delta, dqkv_, seed, *_bwd_descriptors(part, qkv_, do_, made),
                     qk_scale, softmax_scale, dropout_p, B * H, H, N)
            return
        if dq_acc is None:
            dq_acc = torch.empty((B * H, N, D), dtype=torch.float32, device=qkv.device)
        dq_acc.zero_()
        c = plan[1].consts
        if c["TMA_DQ"]:  # dQ's bulk adds, and the tiles' loads (see kernels.bwd_atomic_kernel)
            descs = tuple(d for t, rows in ((dq_acc, c["BLOCK_M"]), (qkv_, c["BLOCK_M"]),
                                            (do_, c["BLOCK_M"]), (qkv_, c["BLOCK_N"]))
                          for d in _tma_descriptors(t, rows, c))
        else:
            descs = (None,) * 8
        plan[1](qkv_, do_, lse_, delta, dq_acc, dqkv_, seed, *descs, qk_scale, softmax_scale,
                dropout_p, H, N)
        plan[2](dq_acc, dqkv_, softmax_scale, H, N)

    op = "bwd" if deterministic else "bwd_atomic"
    plan = _plans.get((op, qkv.dtype, qkv.device, B, N, H, D, dropout, mask_diagonal))
    if plan is None:  # (the tuner's check is built only here, off the per-call path)
        def verify(p: list[Launch]) -> tuple[torch.Tensor]:
            # probe inputs, and their forward as this call's forward ran (planned by now)
            x, g = _probe(qkv), _probe(do)
            o_x, lse_x = _forward(x, softmax_scale, dropout_p, seed if dropout else None,
                                  mask_diagonal)
            args = (x, o_x, g, lse_x, torch.empty_like(qkv))
            run(p, args)
            return (args[4],)

        plan = _plan(op, qkv, B, N, H, D, dropout, mask_diagonal, run, verify)
    run(plan)
    return dqkv


def new_seed(device: torch.device) -> torch.Tensor:
    """A dropout seed: one int64 drawn on `device` from torch's generator, so that
    torch.manual_seed fixes the masks and a CUDA graph draws a new one at each replay."""
    return torch.randint(0, 2**31 - 1, (1,), dtype=torch.int64, device=device)


def dropout_keep_mask(seed: torch.Tensor, B: int, H: int, N: int, dropout_p: float) -> torch.Tensor:
    """The (B, H, N, N) bool mask of the probabilities that the kernels keep for `seed`
    (True: kept, then scaled by 1 / (1 - dropout_p)). For tests and inspection: the kernels
    regenerate it and never store it."""
    mask = torch.empty((B * H, N, N), dtype=torch.uint8, device=seed.device)
    kernels.dropout_mask_kernel[(N, B * H)](seed, mask, dropout_p, N, BLOCK=min(128, max(16, _pow2(N))))
    return mask.view(B, H, N, N).bool()


# ----------------------------------------------------------------------------------------
# torch.library ops for torch.compile, and autograd
# ----------------------------------------------------------------------------------------
# Defined with the plain Library API, not torch.library.custom_op: a call through the
# dispatcher then reaches the Python function directly, without custom_op's wrappers (its
# autograd and backend layers), which cost the host several times as much a call
# (benchmarks/probes/op_dispatch.py times both). This matters in default-mode torch.compile,
# whose graphs call these ops at every step; autograd comes from _FlashAttention around
# them, so the ops need no autograd kernel of their own.
_lib = torch.library.Library("vitflash", "DEF")
_lib.define("flash_attn_forward(Tensor qkv, float softmax_scale, float dropout_p, Tensor? seed, "
            "bool mask_diagonal=False) -> (Tensor, Tensor)", tags=(torch.Tag.pt2_compliant_tag,))
_lib.define("flash_attn_backward(Tensor do, Tensor qkv, Tensor o, Tensor lse, float softmax_scale, "
            "float dropout_p, Tensor? seed, bool deterministic, bool mask_diagonal=False) -> Tensor",
            tags=(torch.Tag.pt2_compliant_tag,))
for _key in ("CUDA", "CPU"):  # CPU: the interpreter
    _lib.impl("flash_attn_forward", _forward, _key)
    _lib.impl("flash_attn_backward", _backward, _key)
_forward_op = torch.ops.vitflash.flash_attn_forward.default
_backward_op = torch.ops.vitflash.flash_attn_backward.default


@torch.library.register_fake("vitflash::flash_attn_forward")
def _(qkv, softmax_scale, dropout_p, seed, mask_diagonal=False):
    B, N, _, H, D = qkv.shape
    return qkv.new_empty((B, N, H, D)), qkv.new_empty((B, H, N), dtype=torch.float32)


@torch.library.register_fake("vitflash::flash_attn_backward")
def _(do, qkv, o, lse, softmax_scale, dropout_p, seed, deterministic, mask_diagonal=False):
    return torch.empty_like(qkv, memory_format=torch.contiguous_format)


class _FlashAttention(torch.autograd.Function):
    """o = attention(qkv); the backward returns one dqkv. While torch.compile traces, the
    custom ops stand in for the launchers (one opaque node each); in eager mode the launchers
    run directly, since the op dispatcher's host time would rival a small attention's GPU
    time."""

    @staticmethod
    def forward(ctx, qkv, softmax_scale, dropout_p, deterministic, mask_diagonal):
        compiling = torch.compiler.is_compiling()
        seed = new_seed(qkv.device) if dropout_p > 0 else None
        o, lse = (_forward_op if compiling else _forward)(qkv, softmax_scale, dropout_p, seed,
                                                         mask_diagonal)
        ctx.save_for_backward(qkv, o, lse, seed)
        ctx.softmax_scale, ctx.dropout_p, ctx.deterministic = softmax_scale, dropout_p, deterministic
        ctx.mask_diagonal = mask_diagonal
        return o

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, do):
        """dqkv. The kernels' gradient has no gradient of its own: differentiating it again
        (a gradient penalty through attention, create_graph=True) raises rather than leaving
        attention's share out; the 'naive' and 'sdpa' paths differentiate twice."""
        compiling = torch.compiler.is_compiling()
        qkv, o, lse, seed = ctx.saved_tensors
        dqkv = (_backward_op if compiling else _backward)(do, qkv, o, lse, ctx.softmax_scale,
                                                          ctx.dropout_p, seed, ctx.deterministic,
                                                          ctx.mask_diagonal)
        return dqkv, None, None, None, None


# ----------------------------------------------------------------------------------------
# Public API
# ----------------------------------------------------------------------------------------
def check_head_dim(d: int) -> None:
    """Raise a ValueError unless the kernel supports head dim `d` (multiple of 8, <= 256)."""
    if d % 8 != 0 or not 8 <= d <= MAX_HEAD_DIM:
        raise ValueError(
            f"head dim {d} is not supported by flash attention: it needs a multiple of 8 no "
            f"larger than {MAX_HEAD_DIM} (e.g. 32, 64, 80, 96, 128); change embed_dim or "
            "num_heads, or use the 'sdpa' or 'naive' attention path")


def _check_tensor(name: str, t, ref: torch.Tensor | None = None) -> None:
    """Type, dtype and device of one input (against q's, when given)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in SUPPORTED_DTYPES:
        raise TypeError(
            f"flash attention supports torch.float16 and torch.bfloat16, but {name} is "
            f"{t.dtype}: cast the inputs (e.g. run under torch.autocast('cuda', "
            f"dtype=torch.bfloat16)) or use the 'sdpa' or 'naive' attention path")
    if ref is None:
        if t.device.type == "cpu" and not _launch.INTERPRET:
            raise ValueError(
                "flash attention got CPU tensors: it is a Triton GPU kernel and needs CUDA "
                "tensors. On a machine without a GPU use the 'sdpa' or 'naive' attention "
                "path (or set TRITON_INTERPRET=1 before importing triton to run the kernel "
                "slowly in Triton's interpreter, as the tests do)")
        if t.device.type not in ("cpu", "cuda"):
            raise ValueError(f"flash attention needs CUDA tensors, got {t.device}")
        return
    if t.dtype != ref.dtype:
        raise TypeError(f"{name} is {t.dtype} but q is {ref.dtype}: give q, k, v one dtype")
    if t.device != ref.device:
        raise ValueError(f"{name} is on {t.device} but q is on {ref.device}: "
                         "put q, k, v on one device")
    if t.shape != ref.shape:
        raise ValueError(f"{name} has shape {tuple(t.shape)}, expected {tuple(ref.shape)} "
                         "(B, N, H, D) like q")


def _check_sizes(B: int, N: int, H: int, D: int, shape: tuple) -> None:
    check_head_dim(D)
    if min(B, N, H) < 1:
        raise ValueError(f"empty input of shape {shape}: B, N and H must be >= 1")


def _check_deterministic(deterministic) -> bool:
    if deterministic is True:  # the default, first: this runs on every call
        return True
    if deterministic is not False:
        raise TypeError(f"deterministic must be True or False, got {deterministic!r}")
    if torch.are_deterministic_algorithms_enabled():
        raise RuntimeError(
            "flash attention was asked for its nondeterministic backward (deterministic=False), "
            "but torch.use_deterministic_algorithms(True) is set: pass deterministic=True (the "
            "default), or turn deterministic algorithms off")
    return deterministic


def _scale(softmax_scale: float | None, d: int) -> float:
    softmax_scale = check_softmax_scale(softmax_scale)
    return float(softmax_scale) if softmax_scale is not None else 1.0 / math.sqrt(d)


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    softmax_scale: float | None = None, dropout_p: float = 0.0,
                    deterministic: bool = True, mask_diagonal: bool = False) -> torch.Tensor:
    """Exact attention softmax(q k^T * scale) v without materializing the scores.

    Args:
        q, k, v: (B, N, H, D), float16 or bfloat16, on one CUDA device, any strides. They
            are stacked into the packed layout the kernels read (one copy); a fused qkv
            projection should call `flash_attention_qkvpacked` instead. D a multiple of 8,
            at most 256; any N >= 1.
        softmax_scale: defaults to 1/sqrt(D).
        dropout_p: attention dropout, the probability of dropping each attention weight
            (the kept ones are scaled by 1 / (1 - p)), in [0, 1). The mask is drawn from
            torch's generator on the device and regenerated in the backward, never stored.
            Pass 0 at evaluation.
        deterministic: True (the default): the backward gives bitwise the same gradients on
            every run. False lets it also use a kernel that adds into dQ with atomic adds,
            whose order varies between runs, so the gradients vary in their last bits; it
            does less work at long sequences, and the autotuner keeps it only where it times
            faster than the deterministic kernels (on an H200 it never did: see the README).
            Refused while `torch.use_deterministic_algorithms(True)` is set.
        mask_diagonal: no query attends to its own key (the diagonal masking of locality
            self-attention, Lee et al.): each row's softmax runs over the other N - 1 keys.
            Needs N >= 2.
    Returns:
        o: (B, N, H, D), contiguous, so `o.reshape(B, N, H * D)` is free.
    Differentiable in q, k, v, once: differentiating the gradient again raises.
    """
    _check_tensor("q", q)
    if q.dim() != 4:
        raise ValueError(f"q must be 4-d (B, N, H, D), got shape {tuple(q.shape)}")
    _check_tensor("k", k, q)
    _check_tensor("v", v, q)
    _check_sizes(*q.shape, tuple(q.shape))
    scale = _scale(softmax_scale, q.shape[-1])
    return _FlashAttention.apply(torch.stack((q, k, v), dim=2), scale, check_dropout_p(dropout_p),
                                 _check_deterministic(deterministic),
                                 check_mask_diagonal(mask_diagonal, q.shape[1]))


def flash_attention_qkvpacked(qkv: torch.Tensor, softmax_scale: float | None = None,
                              dropout_p: float = 0.0, deterministic: bool = True,
                              mask_diagonal: bool = False) -> torch.Tensor:
    """flash_attention on a packed qkv tensor, the output of a fused projection.

    Args:
        qkv: (B, N, 3, H, D), e.g. `linear(x).view(B, N, 3, H, D)`; same dtype, device and
            head-dim rules as `flash_attention`. Read in place when contiguous and 16-byte
            aligned, as a projection's output is (else copied by the kernels' launchers).
        softmax_scale, dropout_p, deterministic, mask_diagonal: as `flash_attention`.
    Returns:
        o: (B, N, H, D), contiguous.
    The backward writes a single dqkv (B, N, 3, H, D) tensor: no cat/stack copies.
    """
    _check_tensor("qkv", qkv)
    check_packed(qkv)
    B, N, _, H, D = qkv.shape
    _check_sizes(B, N, H, D, tuple(qkv.shape))
    scale = _scale(softmax_scale, D)
    return _FlashAttention.apply(qkv if qkv.is_contiguous() else qkv.contiguous(), scale,
                                 check_dropout_p(dropout_p), _check_deterministic(deterministic),
                                 check_mask_diagonal(mask_diagonal, N))
