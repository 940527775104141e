"""Probe: does Triton's warp specialization (`tl.range(..., warp_specialize=True)`) speed up a
flash-attention forward, or the dK/dV loop of its backward, on Hopper?

A minimal forward over the packed (B, N, 3, H, D) qkv, its Q and K/V tiles loaded through TMA
tensor descriptors, is compiled with and without warp specialization at a few tile configs
(BLOCK_M, BLOCK_N, warps, stages) and timed against cuDNN's attention (SDPA) in the same
process: `triton.testing.do_bench`, 3 repeats, median (min-max) in TFLOP/s (4*B*H*N^2*D), and
the max error against a float32 SDPA. All variants compile first, together, under Triton's
AsyncCompileMode. A variant that does not finish (seen on triton 3.6) stops the probe: run it
under `timeout`.

`--op bwd` does the same for a minimal dK/dV program (one K/V tile on chip, the query tiles of
its head streamed past it through TMA, given the forward's LSE and delta = rowsum(dO * O)), the
loop that takes about 60% of the backward at the ViT shapes: each variant's dK and dV against a
float32 reference and against the variant without warp specialization, and its time
(`do_bench`, 3 repeats, median (min-max) in ms). Compiled for sm_90 by triton 3.8 on the CPU
(`python benchmarks/probes/loop_sass.py --op ws_bwd ...`), the 4-warp 64 x 64 tile splits into
partitions, while the 32 x 128 tile's warp-specialization pass fails.

On a machine without a GPU it runs one tiny case under TRITON_INTERPRET=1 and prints errors only.
This is a one-off measurement kept beside its output
(benchmarks/results/gpu_session_dc8413a/warp_specialize_probe_*.log for the forward,
gpu_session_dadf97f/run1/ws_bwd.log for the backward: the 32 x 128 variant with warp
specialization did not finish, compiling or running, on triton 3.6), not part of the library:

    python benchmarks/probes/warp_specialize.py [--op fwd|bwd]
"""
import argparse
import time
from concurrent.futures import ThreadPoolExecutor

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from vitflash.ops import kernels

LOG2E = 1.4426950408889634


@triton.jit
def fwd_tma(O, LSE, QD, KD, qk_scale, H, N, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
            BLOCK_N: tl.constexpr, WS: tl.constexpr):
    pid_m, bh = kernels._split_pid(tl.program_id(0), N, BLOCK_M)
    b = bh // H
    h = bh % H
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    q = QD.load([b, pid_m * BLOCK_M, h * HEAD_DIM]).reshape(BLOCK_M, HEAD_DIM)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    offs_n = tl.arange(0, BLOCK_N)
    for start_n in tl.range(0, N, BLOCK_N, warp_specialize=WS):
        cols = start_n + offs_n
        k = KD.load([b, start_n, (H + h) * HEAD_DIM]).reshape(BLOCK_N, HEAD_DIM)
        s = tl.dot(q, tl.trans(k))
        s = tl.where(cols[None, :] < N, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
        p = tl.math.exp2(s * qk_scale - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = KD.load([b, start_n, (2 * H + h) * HEAD_DIM]).reshape(BLOCK_N, HEAD_DIM)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        m_i = m_new
    acc = acc / l_i[:, None]
    rows = bh.to(tl.int64) * N + offs_m
    tl.store(O + rows[:, None] * HEAD_DIM + tl.arange(0, HEAD_DIM)[None, :],
             acc.to(O.dtype.element_ty), mask=offs_m[:, None] < N)
    tl.store(LSE + rows, m_i + tl.math.log2(l_i), mask=offs_m < N)


@triton.jit
def bwd_dkdv_tma(DK, DV, LSE, DELTA, QD, DOD, KD, qk_scale, sm_scale, H, N, HEAD_DIM: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, WS: tl.constexpr):
    """dK and dV of one BLOCK_N key tile of one head: the query tiles of the head streamed past
    it (Q from qkv, dO through their descriptors), the scores recomputed from the base-2 LSE."""
    pid_n, bh = kernels._split_pid(tl.program_id(0), N, BLOCK_N)
    b = bh // H
    h = bh % H
    k = KD.load([b, pid_n * BLOCK_N, (H + h) * HEAD_DIM]).reshape(BLOCK_N, HEAD_DIM)
    v = KD.load([b, pid_n * BLOCK_N, (2 * H + h) * HEAD_DIM]).reshape(BLOCK_N, HEAD_DIM)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    offs_m = tl.arange(0, BLOCK_M)
    for start_m in tl.range(0, N, BLOCK_M, warp_specialize=WS):
        rows = start_m + offs_m
        q = QD.load([b, start_m, h * HEAD_DIM]).reshape(BLOCK_M, HEAD_DIM)
        do = DOD.load([b, start_m, h * HEAD_DIM]).reshape(BLOCK_M, HEAD_DIM)
        lse = tl.load(LSE + bh * N + rows, mask=rows < N, other=0.0)
        delta = tl.load(DELTA + bh * N + rows, mask=rows < N, other=0.0)
        pt = tl.math.exp2(tl.dot(k, tl.trans(q)) * qk_scale - lse[None, :])
        pt = tl.where(rows[None, :] < N, pt, 0.0)
        dv = tl.dot(pt.to(do.dtype), do, dv)
        dst = pt * (tl.dot(v, tl.trans(do)) - delta[None, :])
        dk = tl.dot(dst.to(q.dtype), q, dk)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    out = (bh.to(tl.int64) * N + offs_n)[:, None] * HEAD_DIM + tl.arange(0, HEAD_DIM)[None, :]
    tl.store(DK + out, (dk * sm_scale).to(DK.dtype.element_ty), mask=offs_n[:, None] < N)
    tl.store(DV + out, dv.to(DV.dtype.element_ty), mask=offs_n[:, None] < N)


def bwd_inputs(qkv, do):
    """The backward's float32 reference from qkv (B, N, 3, H, D) and do (B, N, H, D): the
    forward's base-2 LSE and delta (B, H, N), and dK, dV (B, H, N, D)."""
    D = qkv.shape[-1]
    q, k, v = (qkv[:, :, i].transpose(1, 2).float() for i in range(3))
    g = do.transpose(1, 2).float()
    s = q @ k.transpose(-1, -2) * D ** -0.5
    p = s.softmax(-1)
    delta = (g * (p @ v)).sum(-1)
    ds = p * (g @ v.transpose(-1, -2) - delta[..., None])
    lse = torch.logsumexp(s, -1) * LOG2E
    return lse, delta, (ds.transpose(-1, -2) @ q * D ** -0.5, p.transpose(-1, -2) @ g)


def _bwd_args(qkv, do, block_m, block_n):
    """The dK/dV kernel's outputs (B, H, N, D) and its Q, dO and K/V descriptors."""
    B, N, _, H, D = qkv.shape
    flat, g = qkv.view(B, N, 3 * H * D), do.view(B, N, H * D)
    qd = TensorDescriptor(flat, list(flat.shape), list(flat.stride()), [1, block_m, D])
    dod = TensorDescriptor(g, list(g.shape), list(g.stride()), [1, block_m, D])
    kd = TensorDescriptor(flat, list(flat.shape), list(flat.stride()), [1, block_n, D])
    dk, dv = (torch.empty(B, H, N, D, device=qkv.device, dtype=qkv.dtype) for _ in range(2))
    return dk, dv, qd, dod, kd


def run_bwd(qkv, do, lse, delta, block_m, block_n, warps, stages, ws):
    """A launcher of one dK/dV variant, and the dK and dV it writes."""
    B, N, _, H, D = qkv.shape
    dk, dv, qd, dod, kd = _bwd_args(qkv, do, block_m, block_n)
    grid = (triton.cdiv(N, block_n) * B * H,)

    def launch():
        bwd_dkdv_tma[grid](dk, dv, lse, delta, qd, dod, kd, D ** -0.5 * LOG2E, D ** -0.5, H, N, D,
                           block_m, block_n, ws, num_warps=warps, num_stages=stages)
    return launch, (dk, dv)


def _args(qkv, block_m, block_n):
    """The kernel's tensors: the output, the LSE and the Q and K/V descriptors over qkv."""
    B, N, _, H, D = qkv.shape
    v = qkv.view(B, N, 3 * H * D)
    qd = TensorDescriptor(v, list(v.shape), list(v.stride()), [1, block_m, D])
    kd = TensorDescriptor(v, list(v.shape), list(v.stride()), [1, block_n, D])
    o = torch.empty(B, H, N, D, device=qkv.device, dtype=qkv.dtype)
    lse = torch.empty(B, H, N, device=qkv.device, dtype=torch.float32)
    return o, lse, qd, kd


def run(qkv, block_m, block_n, warps, stages, ws):
    """A launcher of one variant on qkv, and the output it writes."""
    B, N, _, H, D = qkv.shape
    o, lse, qd, kd = _args(qkv, block_m, block_n)
    grid = (triton.cdiv(N, block_m) * B * H,)

    def launch():
        fwd_tma[grid](o, lse, qd, kd, D ** -0.5 * LOG2E, H, N, D, block_m, block_n, ws,
                      num_warps=warps, num_stages=stages)
    return launch, o


def _tflops(flops, fn):
    ms = sorted(triton.testing.do_bench(fn) for _ in range(3))
    return f"{flops / ms[1] / 1e9:.0f} TFLOP/s ({flops / ms[2] / 1e9:.0f}-{flops / ms[0] / 1e9:.0f})"


# (B, H, N, D) -> the variants (BLOCK_M, BLOCK_N, warps, stages) each op times on a GPU; without
# one, a tiny case in the interpreter
CASES = {
    "fwd": {(4, 16, 4097, 128): [(128, 128, 8, 3), (128, 64, 8, 3), (64, 64, 4, 3)],
            (8, 12, 4097, 64): [(128, 64, 4, 3), (128, 128, 8, 3)],
            (256, 12, 197, 64): [(128, 64, 4, 3), (64, 64, 4, 3)]},
    "bwd": {(8, 12, 4097, 64): [(32, 128, 4, 3), (64, 64, 4, 3), (64, 128, 8, 3)],
            (4, 16, 4097, 128): [(64, 64, 4, 2), (64, 64, 4, 3)],
            (256, 12, 197, 64): [(32, 128, 4, 3), (64, 64, 4, 3)]},
}
SMALL_CASES = {(1, 2, 70, 32): [(16, 16, 4, 1)]}


def main_bwd(dev: str, small: bool, cases: dict, dt: torch.dtype) -> None:
    """--op bwd: each dK/dV variant against the float32 reference and against its variant
    without warp specialization, and its time."""
    for (B, H, N, D), cfgs in cases.items():
        torch.manual_seed(0)
        qkv = torch.randn(B, N, 3, H, D, device=dev, dtype=dt)
        do = torch.randn(B, N, H, D, device=dev, dtype=dt)
        lse, delta, ref = bwd_inputs(qkv, do)
        for c in cfgs:
            plain = None
            for ws in (False, True):
                try:
                    fn, out = run_bwd(qkv, do, lse, delta, *c, ws)
                    fn()
                    err = max((o.float() - r).abs().max().item() for o, r in zip(out, ref))
                    line = f"{(B, H, N, D)} {c} ws={ws} err {err:.4f}"
                    if plain is not None:
                        line += f", max diff from ws=False {max((o - p).abs().max().item() for o, p in zip(out, plain)):.4f}"
                    plain = plain or out
                    if not small:
                        ms = sorted(triton.testing.do_bench(fn) for _ in range(3))
                        line += f", {ms[1]:.3f} ms ({ms[0]:.3f}-{ms[2]:.3f})"
                    print(line, flush=True)
                except Exception as e:  # a variant that fails to compile or run: say so, go on
                    print((B, H, N, D), c, ws, "FAILED", type(e).__name__, str(e).strip()[:300], flush=True)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--op", choices=("fwd", "bwd"), default="fwd")
    args = p.parse_args(argv)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    small = dev == "cpu"
    cases = SMALL_CASES if small else CASES[args.op]
    dt = torch.float16 if small else torch.bfloat16
    if args.op == "bwd":
        main_bwd(dev, small, cases, dt)
        return
    inputs = {s: torch.randn(s[0], s[2], 3, s[1], s[3], device=dev, dtype=dt) for s in cases}
    if not small:  # compile every variant at once, then time
        t0 = time.time()
        with ThreadPoolExecutor(8) as pool, triton.AsyncCompileMode(pool, ignore_errors=True):
            for shape, cfgs in cases.items():
                qkv = inputs[shape]
                B, N, _, H, D = qkv.shape
                for m, n, w, st in cfgs:
                    for ws in (False, True):
                        fwd_tma.warmup(*_args(qkv, m, n), 0.1, H, N, D, m, n, ws, grid=(1,),
                                       num_warps=w, num_stages=st)
        print(f"compiled all in {time.time() - t0:.1f}s", flush=True)
    for (B, H, N, D), cfgs in cases.items():
        qkv = inputs[(B, H, N, D)]
        q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
        ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float())
        flops = 4 * B * H * N * N * D
        if not small:
            from torch.nn.attention import SDPBackend, sdpa_kernel
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                cudnn = _tflops(flops, lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v))
            print(f"{(B, H, N, D)} cudnn fwd {cudnn}", flush=True)
        for c in cfgs:
            for ws in (False, True):
                try:
                    fn, o = run(qkv, *c, ws)
                    fn()
                    if dev == "cuda":
                        torch.cuda.synchronize()
                    err = (o.float() - ref).abs().max().item()
                    if small:
                        print(c, ws, "err", err, flush=True)
                        continue
                    print(f"{(B, H, N, D)} {c} ws={ws} {_tflops(flops, fn)} err {err:.4f}", flush=True)
                except Exception as e:  # a variant that fails to compile or run: say so, go on
                    print((B, H, N, D), c, ws, "FAILED", type(e).__name__, str(e)[:300], flush=True)


if __name__ == "__main__":
    main()
