"""Probe: does Triton's warp specialization (`tl.range(..., warp_specialize=True)`) speed up a
flash-attention forward on Hopper?

A minimal forward over the packed (B, N, 3, H, D) qkv, its Q and K/V tiles loaded through TMA
tensor descriptors, is compiled with and without warp specialization at a few tile configs
(BLOCK_M, BLOCK_N, warps, stages) and timed against cuDNN's attention (SDPA) in the same
process: `triton.testing.do_bench`, 3 repeats, median (min-max) in TFLOP/s (4*B*H*N^2*D), and
the max error against a float32 SDPA. All variants compile first, together, under Triton's
AsyncCompileMode. A variant that does not finish (seen on triton 3.6) stops the probe: run it
under `timeout`.

On a machine without a GPU it runs one tiny case under TRITON_INTERPRET=1 and prints errors only.
This is a one-off measurement kept beside its output
(benchmarks/results/gpu_session_dc8413a/warp_specialize_probe_*.log), not part of the library:

    python benchmarks/probes/warp_specialize.py
"""
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


def main():
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    small = dev == "cpu"
    cases = {(1, 2, 70, 32): [(16, 16, 4, 1)]} if small else {
        (4, 16, 4097, 128): [(128, 128, 8, 3), (128, 64, 8, 3), (64, 64, 4, 3)],
        (8, 12, 4097, 64): [(128, 64, 4, 3), (128, 128, 8, 3)],
        (256, 12, 197, 64): [(128, 64, 4, 3), (64, 64, 4, 3)]}
    dt = torch.float16 if small else torch.bfloat16
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
