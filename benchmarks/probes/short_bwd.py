"""Probe: the short backward (kernels.bwd_short_kernel, the whole backward of a head in one
program) timed alone at the CIFAR shapes, over tiles, warps and register caps, this tree's
kernel beside a baseline's (--baseline: the kernels.py of another commit, imported as a
module of its own), with the registers and spills of each binary as the GPU's compiler
allotted them.

    python benchmarks/probes/short_bwd.py --baseline <kernels.py of another commit>

--configs lists BLOCK_M x warps, with an optional register cap per thread (Triton's `maxnreg`
option) and an optional number of software-pipeline stages of the loop over query chunks
(Triton's `num_stages`; 1, what every listed candidate has, if not given): "16x4", "16x4x168",
"16x4x168s2", "32x4s3". A capped configuration runs in the kernel's KEY_PER_CHUNK form, as
launch.short_bwd lists it; --key-per-chunk runs every configuration of this tree's kernel in
that form (a baseline kernel that lacks the parameter runs without it). Each configuration
runs on the same inputs as the tuner's own backward at that shape, and its dqkv is checked
against that backward's (launch._disagreement: rounding alone); the baseline's and this
tree's results are also compared bit for bit. Times are launch._time_ms (CUDA events, a
sleeping kernel ahead of each window: GPU time), `--repeats` times: median (min-max) us. The tuner's whole backward at the shape (its choice, whatever the
family) is timed the same way beside them. Needs a CUDA GPU. Writes <out>/short_bwd_<gpu>.json
and .md after every shape.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import torch

from vitflash.ops import flash as flash_mod
from vitflash.ops import kernels, launch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from bench_attention import command_line, environment, result_stem, spread  # noqa: E402

SHAPES = ["256,3,65,64", "1024,3,65,64", "256,6,65,64", "1024,6,65,64", "512,12,17,64",
          "512,12,65,16"]
CONFIGS = ["16x4", "32x4", "32x8", "16x4x168"]
DEVICE = "cuda"


def load_kernels(path: Path):
    """A kernels.py of another commit as a module of its own (its Triton functions compile
    apart from this tree's)."""
    spec = importlib.util.spec_from_file_location("vitflash_kernels_baseline", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def parse_config(text: str) -> tuple[int, int, int, int]:
    """"16x4" -> (16, 4, 0, 1); "16x4x168" -> (16, 4, 168, 1); "16x4x168s2" -> (16, 4, 168, 2);
    "32x4s3" -> (32, 4, 0, 3): BLOCK_M, warps, register cap, pipeline stages."""
    tiles, _, stages = text.partition("s")
    try:
        parts = [int(x) for x in tiles.split("x")]
        if len(parts) not in (2, 3) or (stages and int(stages) < 1):
            raise ValueError
        return parts[0], parts[1], parts[2] if len(parts) > 2 else 0, int(stages or 1)
    except ValueError:
        raise SystemExit(f"--configs {text!r}: expected BLOCK_MxWARPS[xCAP][sSTAGES], "
                         "e.g. 16x4, 16x4x168, 16x4x168s2") from None


def measure(shape: tuple[int, int, int, int], configs: list[str], modules: dict, repeats: int,
            key_per_chunk: bool = False) -> dict:
    B, H, N, D = shape
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    qkv = torch.randn((B, N, 3, H, D), generator=gen, device=DEVICE, dtype=torch.bfloat16)
    do = torch.randn((B, N, H, D), generator=gen, device=DEVICE, dtype=torch.bfloat16)
    scale = D ** -0.5
    o, lse = flash_mod._forward(qkv, scale)
    ref = flash_mod._backward(do, qkv, o, lse, scale)  # tunes the backward at this shape
    tuned = launch.chosen("bwd", qkv.dtype, N, D, B * H)
    rows = [{"kernel": "tuner's choice", "config": tuned.label() if tuned else "?",
             "us": spread([1e3 * launch._time_ms(lambda: flash_mod._backward(do, qkv, o, lse, scale))
                           for _ in range(repeats)])}]
    one_key = launch.one_key_tail(N)
    results = {}
    for text in configs:
        block_m, warps, cap, stages = parse_config(text)
        cand = launch.short_bwd(N, block_m, warps, one_key=one_key, maxnreg=cap if one_key else 0)
        (plan,) = flash_mod._bwd_launches(cand, B, N, H, D)
        options = dict(num_warps=warps, num_stages=stages, **({"maxnreg": cap} if cap else {}))
        for name, module in modules.items():
            dqkv = torch.empty_like(qkv)
            kernel = module.bwd_short_kernel
            consts = {k: v for k, v in plan.consts.items() if k in kernel.arg_names}
            if key_per_chunk and "KEY_PER_CHUNK" in consts:
                consts["KEY_PER_CHUNK"] = 1

            def run(k=kernel, out=dqkv, consts=consts):
                return k[(B * H,)](qkv, o, do, lse, out, lse, scale * flash_mod.LOG2E, scale, 0.0,
                                   H, N, **consts, **options)

            compiled = run()
            if DEVICE == "cuda":
                torch.cuda.synchronize()
            results[name, text] = dqkv.clone()
            local = getattr(compiled, "n_spills", None)  # Triton counts 4-byte words
            rows.append({"kernel": name, "config": text + (" (one-key tail)" if one_key else "")
                         + (" KEY_PER_CHUNK" if consts.get("KEY_PER_CHUNK") else ""),
                         "registers": getattr(compiled, "n_regs", None),
                         "local_bytes": None if local is None else 4 * local,
                         "disagreement": launch._disagreement((dqkv,), (ref,)),
                         "us": spread([1e3 * launch._time_ms(run) for _ in range(repeats)])})
        if len(modules) == 2:
            a, b = (results[name, text] for name in modules)
            rows[-1]["same_bits_as_baseline"] = bool(torch.equal(a, b))
    return {"shape": list(shape), "rows": rows}


def render(out: dict) -> str:
    env = out["env"]
    lines = [f"# The short backward alone on {env['gpu']}", "",
             f"`{out['command']}`", "",
             f"Commit {env['commit']}; torch {env['torch']}, triton {env['triton']}, CUDA {env['cuda']}; "
             f"{env['date']}. Baseline kernels: {out['baseline'] or 'none'}. GPU time per call, "
             f"median (min-max) of {out['repeats']} windows (launch._time_ms); registers and "
             "bytes of local memory (spills) per thread of the binary as compiled here (Triton's n_spills "
             "times 4); disagreement with the tuner's "
             "backward (launch._disagreement, rounding alone); same bits: this tree's result "
             "against the baseline's at the same configuration.", ""]
    for res in out["results"]:
        lines += [f"## (B, H, N, D) = {tuple(res['shape'])}", "",
                  "| kernel | config | us | registers | local bytes | disagreement | same bits |",
                  "|---|---|---|---|---|---|---|"]
        for r in res["rows"]:
            us = r["us"]
            dis = r.get("disagreement")
            lines.append(f"| {r['kernel']} | {r['config']} | {us['median']:.1f} ({us['min']:.1f}-{us['max']:.1f}) "
                         f"| {r.get('registers', '')} | {r.get('local_bytes', '')} "
                         f"| {'' if dis is None else f'{dis:.3g}'} | {r.get('same_bits_as_baseline', '')} |")
        lines.append("")
    return "\n".join(lines)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", nargs="+", default=SHAPES, help="B,H,N,D each (N <= 160)")
    p.add_argument("--configs", nargs="+", default=CONFIGS, help="BLOCK_M x warps [x register cap] [s stages]")
    p.add_argument("--baseline", type=Path, help="a kernels.py to time beside this tree's")
    p.add_argument("--key-per-chunk", action="store_true",
                   help="this tree's kernel in its KEY_PER_CHUNK form at every configuration")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("short_bwd.py times kernels on a CUDA GPU; none is available here.")
    modules = {"this tree": kernels}
    if args.baseline is not None:
        modules = {"baseline": load_kernels(args.baseline), "this tree": kernels}
    env = environment()
    out = {"env": env, "command": command_line(), "baseline": str(args.baseline or ""),
           "repeats": args.repeats, "results": []}
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / result_stem("short_bwd", env)
    for text in args.shapes:
        shape = tuple(int(x) for x in text.split(","))
        out["results"].append(measure(shape, args.configs, modules, args.repeats, args.key_per_chunk))
        stem.with_suffix(".json").write_text(json.dumps(out, indent=1))
        stem.with_suffix(".md").write_text(render(out))
        print(render({**out, "results": out["results"][-1:]}), flush=True)


if __name__ == "__main__":
    main()
