"""The Gluon Hopper forward (vitflash/ops/hopper.py) against the tuned Triton forward and cuDNN.

On a Hopper GPU: each configuration's O and LSE at each shape under the FA2 rule (against
float64 naive attention, beside bf16 naive attention's own error), then the forward alone
timed by `triton.testing.do_bench_cudagraph` (replays of a CUDA graph: GPU time), each case
`--repeats` times, median and min-max: the Gluon configurations, vitflash's tuned forward
(`flash_attention_qkvpacked` without grad) and SDPA's cuDNN backend, in the same process.

    python benchmarks/probes/gluon_fwd.py --out <dir> \
        [--shapes 4,16,4097,128 ...] [--configs 128x128x2x8 ...] [--repeats 3]

With --compile (no GPU needed): each configuration compiled for sm_90 by the installed
triton and assembled by its ptxas: registers, spill bytes, shared memory and the count of
the loop's synchronizing instructions (BAR.SYNC, mbarrier waits, wgmma waits).

    python benchmarks/probes/gluon_fwd.py --compile --d 128 --configs 128x128x2x8 128x64x3x8

Configurations are BLOCK_M x BLOCK_N x STAGES x warps (fwd_wgmma_kernel), with a suffix wR
for the warp-specialized fwd_ws_kernel whose two consumer warp groups get R registers each.
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
from registers import assemble  # noqa: E402
from vitflash.ops import hopper, launch  # noqa: E402

SIX = ["256,12,197,64", "256,6,197,64", "64,12,577,64", "32,16,1025,64", "8,12,4097,64",
       "4,16,4097,128"]
DEFAULT_CONFIGS = {64: ["64x128x2x4w240", "64x128x3x4w240", "64x128x4x4w240", "128x128x3x8",
                        "128x64x3x8", "64x128x2x4"],
                   128: ["64x128x2x4w240", "64x128x2x4w240p", "128x128x2x8", "128x64x3x8"]}


def parse_config(text: str) -> tuple[int, int, int, int, int, int]:
    """"MxNxSxW" (fwd_wgmma_kernel) or "MxNxSxWwR" (fwd_ws_kernel, consumers at R registers),
    "MxNxSxWwRp" (fwd_ws_persistent_kernel) -> (BLOCK_M, BLOCK_N, STAGES, warps, R or 0,
    persistent)."""
    persistent = int(text.endswith("p"))
    text, _, regs = text.removesuffix("p").partition("w")
    if persistent and not regs:
        raise ValueError(f"{text}p: the persistent form ('p') is the warp-specialized one's ('wR')")
    m, n, s, w = (int(x) for x in text.split("x"))
    return m, n, s, w, int(regs or 0), persistent


def gluon_launch(text: str, d: int) -> launch.GluonLaunch:
    """The op's launch of configuration `text` at head dim d."""
    bm, bn, stages, warps, regs, persistent = parse_config(text)
    blocks = (("BLOCK_M", bm), ("BLOCK_N", bn)) + ((("CONSUMER_REGS", regs), ) if regs else ())
    blocks += (("PERSISTENT", 1), ) if persistent else ()
    return launch.GluonLaunch(launch.Candidate("gluon_ws" if regs else "gluon", blocks, warps, stages), d)


def compile_sm90(d: int, cfg: tuple[int, int, int, int, int, int]):
    """fwd_wgmma_kernel (fwd_ws_kernel, fwd_ws_persistent_kernel) compiled for sm_90 (bf16)
    by the installed triton, no GPU needed."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    bm, bn, stages, warps, regs, persistent = cfg

    def desc(rows: int) -> str:
        return f"tensordesc<bf16[1,{rows},{d}],{hopper._layout(rows, d, torch.bfloat16)!r}>"

    # the kernels' parameters in order: runtime ones (TILES: the persistent form's), then constexprs
    sig = dict(q_desc=desc(bm), kv_desc=desc(bn), o_desc=desc(bm), LSE="*fp32", qk_scale="fp32",
               H="i32", N="i32", **(dict(TILES="i32") if persistent else {}),
               **dict.fromkeys(("HEAD_DIM", "BLOCK_M", "BLOCK_N", "STAGES"), "constexpr"),
               **(dict(CONSUMER_REGS="constexpr") if regs else {}), num_warps="constexpr")
    consts = dict(HEAD_DIM=d, BLOCK_M=bm, BLOCK_N=bn, STAGES=stages, num_warps=warps)
    options = dict(num_warps=warps)
    fn = hopper.fwd_wgmma_kernel
    if regs:
        fn = hopper.fwd_ws_persistent_kernel if persistent else hopper.fwd_ws_kernel
        consts["CONSUMER_REGS"] = regs
        options["maxnreg"] = hopper.ws_maxnreg(regs)
    src = GluonASTSource(fn=fn, signature=sig, constexprs=consts)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)


# the columns of a compile table: what ptxas and the SASS say of one kernel compiled for sm_90
COMPILE_COLUMNS = ("registers", "spill bytes", "shared KiB", "HGMMA", "wgmma waits", "BAR.SYNC",
                   "mbarrier waits")


def sass_cells(compiled) -> list[str]:
    """COMPILE_COLUMNS of a kernel compiled for sm_90: registers and spill stores from ptxas's
    report, shared memory from triton's metadata, and the SASS's wgmma products, their waits,
    CTA barriers and mbarrier phase checks."""
    report, sass = assemble(compiled)
    ops = Counter(re.findall(r"^\s+/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)",
                             sass, flags=re.M))
    count = lambda prefix: str(sum(v for k, v in ops.items() if k.startswith(prefix)))  # noqa: E731
    return [re.search(r"Used (\d+) registers", report).group(1),
            re.search(r"(\d+) bytes spill stores", report).group(1),
            f"{compiled.metadata.shared / 1024:.0f}", count("HGMMA"), count("WARPGROUP.DEPBAR"),
            count("BAR.SYNC"), count("SYNCS.PHASECHK")]


def compile_header(d: int, *extra: str) -> list[str]:
    columns = ("config", *COMPILE_COLUMNS, *extra)
    return [f"triton {triton.__version__}, sm_90, D = {d}, bf16", "",
            "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]


def write_out(out: Path | None, stem: str, table: list[str], results: list) -> None:
    """The table as <out>/<stem>.md and the results as <out>/<stem>.json (nothing without out)."""
    if out:
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{stem}.md").write_text("\n".join(table) + "\n")
        (out / f"{stem}.json").write_text(json.dumps(results, indent=1) + "\n")


def compile_rows(d: int, configs: list[str]) -> list[str]:
    rows = compile_header(d, "setmaxnreg")
    for text in configs:
        compiled = compile_sm90(d, parse_config(text))
        # the warp-specialized form's register moves between partitions ("-": none)
        moves = re.findall(r"setmaxnreg\.(inc|dec)\.sync\.aligned\.u32\s+(\d+);", compiled.asm["ptx"])
        moves = ", ".join(sorted({f"{kind} {n}" for kind, n in moves}, key=lambda m: (m[:3], int(m[4:])))) or "-"
        rows.append("| " + " | ".join([text, *sass_cells(compiled), moves]) + " |")
    return rows


def reference(qkv: torch.Tensor, scale: float, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Naive attention's O and base-2 LSE in `dtype` arithmetic, one batch at a time."""
    outs, lses = [], []
    for x in qkv.unbind(0):
        q, k, v = (t.transpose(0, 1).to(dtype) for t in x.unbind(1))  # (H, N, D)
        s = (q @ k.transpose(-1, -2)) * scale
        lses.append(torch.logsumexp(s.double(), -1) / math.log(2))
        outs.append((s.softmax(-1) @ v).transpose(0, 1))
    return torch.stack(outs), torch.stack(lses)


def check(shape, configs: list[str]) -> dict:
    """Every configuration's O (FA2 rule) and LSE (within twice the tuned forward's error)."""
    from vitflash.ops import flash
    B, H, N, D = shape
    gen = torch.Generator(device="cuda").manual_seed(0)
    qkv = torch.randn(B, N, 3, H, D, device="cuda", generator=gen).to(torch.bfloat16)
    scale = D ** -0.5
    o64, lse64 = reference(qkv, scale, torch.float64)
    o16, _ = reference(qkv, scale, torch.bfloat16)
    naive_err = (o16.double() - o64).abs().max().item()
    _, lse_flash = flash._forward(qkv, scale)
    flash_lse_err = (lse_flash.double() - lse64).abs().max().item()
    out = {}
    for text in configs:
        run = gluon_launch(text, D)
        o = torch.full((B, N, H, D), float("nan"), device="cuda", dtype=qkv.dtype)
        lse = torch.full((B, H, N), float("nan"), device="cuda")
        try:
            run(qkv, o, lse, None, scale * 1.4426950408889634, 0.0, H, N)
            torch.cuda.synchronize()
        except Exception as err:  # a configuration that does not compile or fit: named
            out[text] = {"error": str(err).splitlines()[0][:200]}
            continue
        err = (o.double() - o64).abs().max().item()
        lse_err = (lse.double() - lse64).abs().max().item()
        ok = (math.isfinite(err) and err <= 2 * naive_err + 1e-5
              and math.isfinite(lse_err) and lse_err <= 2 * flash_lse_err + 1e-5)
        out[text] = {"o_err": err, "naive_err": naive_err, "lse_err": lse_err,
                     "flash_lse_err": flash_lse_err, "ok": ok}
    return out


def timed(fn, repeats: int) -> list[float]:
    fn()
    torch.cuda.synchronize()
    return [triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median")
            for _ in range(repeats)]


def time_shape(shape, configs: list[str], ok: dict, repeats: int) -> dict:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import torch.nn.functional as F
    from vitflash.ops import flash_attention_qkvpacked
    B, H, N, D = shape
    qkv = torch.randn(B, N, 3, H, D, device="cuda", dtype=torch.bfloat16)
    o = torch.empty(B, N, H, D, device="cuda", dtype=qkv.dtype)
    lse = torch.empty(B, H, N, device="cuda")
    qs = D ** -0.5 * 1.4426950408889634
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=qkv.dtype) for _ in range(3))
    cases = {}
    for text in configs:
        if ok.get(text, {}).get("ok"):
            run = gluon_launch(text, D)
            cases[f"gluon {text}"] = lambda run=run: run(qkv, o, lse, None, qs, 0.0, H, N)

    def flash_fwd():
        with torch.no_grad():
            flash_attention_qkvpacked(qkv)

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            F.scaled_dot_product_attention(q, k, v)

    cases["flash (tuned)"] = flash_fwd
    cases["sdpa_cudnn"] = cudnn
    flops = 4 * B * H * N * N * D
    out = {}
    for name, fn in cases.items():
        ms = timed(fn, repeats)
        t = [flops / m * 1e-9 for m in ms]
        out[name] = {"ms": statistics.median(ms), "tflops": statistics.median(t),
                     "tflops_min": min(t), "tflops_max": max(t)}
    return out


def probe_parser(doc: str, shapes: list[str], d: int) -> argparse.ArgumentParser:
    """The Gluon probes' common options (each adds its configuration lists)."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--shapes", nargs="+", default=shapes, help="B,H,N,D")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--compile", action="store_true", help="compile for sm_90 only (no GPU)")
    p.add_argument("--d", type=int, default=d, help="--compile: the head dim")
    return p


def require_gluon() -> None:
    if not hopper.available():
        sys.exit(f"Gluon does not import in triton {triton.__version__}: {hopper._IMPORT_ERROR}")


def hopper_env() -> str:
    """The GPU and versions, for a table's header; exits without a Hopper GPU."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        sys.exit("needs a Hopper GPU (compute capability 9.x); --compile needs none")
    return (f"{torch.cuda.get_device_name()}; torch {torch.__version__}, triton "
            f"{triton.__version__}, cuDNN {torch.backends.cudnn.version()}")


def main(argv=None) -> None:
    p = probe_parser(__doc__, SIX, 64)
    p.add_argument("--configs", nargs="+", default=None,
                   help="BLOCK_M x BLOCK_N x STAGES x warps (default: per head dim)")
    args = p.parse_args(argv)
    require_gluon()
    if args.compile:
        print("\n".join(compile_rows(args.d, args.configs or DEFAULT_CONFIGS[args.d])))
        return
    env = hopper_env()
    rows, results = [], []
    for text in args.shapes:
        shape = tuple(int(x) for x in text.split(","))
        configs = args.configs or DEFAULT_CONFIGS[shape[3]]
        ok = check(shape, configs)
        times = time_shape(shape, configs, ok, args.repeats)
        results.append({"shape": shape, "check": ok, "times": times})
        print(json.dumps(results[-1]), flush=True)
        gl = {k: v for k, v in times.items() if k.startswith("gluon")}
        best = max(gl, key=lambda k: gl[k]["tflops"]) if gl else None
        cud, fl = times["sdpa_cudnn"]["tflops"], times["flash (tuned)"]["tflops"]
        cell = lambda r: f"{r['tflops']:.0f} ({r['tflops_min']:.0f}-{r['tflops_max']:.0f})"  # noqa: E731
        fails = [c for c, r in ok.items() if not r.get("ok")]
        rows.append(f"| {shape} | {cell(times[best]) if best else 'n/a'} | {best or '-'} | "
                    f"{cell(times['flash (tuned)'])} | {cell(times['sdpa_cudnn'])} | "
                    f"{times[best]['tflops'] / cud:.2f}x | {times[best]['tflops'] / fl:.2f}x | "
                    f"{', '.join(fails) or 'none'} |" if best else f"| {shape} | all failed: {ok} |")
    table = ["# Gluon Hopper forward against the tuned forward and cuDNN", "",
             f"Command: `python {' '.join(sys.argv)}`", "", env + "; bf16, forward only, "
             "do_bench_cudagraph median of each repeat; TFLOP/s median (min-max) of "
             f"{args.repeats}.", "",
             "| (B, H, N, D) | best Gluon TFLOP/s | its config | tuned flash | cuDNN | "
             "Gluon / cuDNN | Gluon / flash | configs outside the rule |",
             "|---|---|---|---|---|---|---|---|", *rows]
    print("\n".join(table))
    write_out(args.out, "gluon_fwd", table, results)


if __name__ == "__main__":
    main()
