"""How long one full garbage collection stalls the host once a model is compiled, and how long
after gc.freeze() (what callbacks.gc_freeze does after its warm-up steps).

    python scripts/gc_pause.py                                  # vit_tiny_patch4_32, compiled
    python scripts/gc_pause.py --model vit_micro_patch4_32 --no-compile

Builds the model (attention=sdpa: the collector's work does not depend on the path), runs a
few training steps (forward, loss, backward, AdamW) on random images, compiled with
torch.compile unless --no-compile, then times `--repeats` full collections (gc.collect()),
freezes, runs two more steps and times `--repeats` full collections again. Prints a JSON
line: objects tracked, and the median and range of the collections' milliseconds before and
after the freeze.
"""
from __future__ import annotations

import argparse
import gc
import json
import statistics
import time

import torch

from vitflash.model import build_model


def full_collections_ms(repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        gc.collect()
        times.append(1e3 * (time.perf_counter() - start))
    return times


def summary(times: list[float]) -> dict:
    return {"median_ms": statistics.median(times), "min_ms": min(times), "max_ms": max(times)}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="vit_tiny_patch4_32")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=3, help="training steps before the first timing")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-compile", dest="compile", action="store_false")
    args = parser.parse_args(argv)

    model = build_model(args.model, attention="sdpa")
    size = model.patch_embed.img_size
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    run = torch.compile(model) if args.compile else model

    def train(steps: int) -> None:
        for _ in range(steps):
            x = torch.randn(args.batch, 3, *size)
            run(x).logsumexp(-1).mean().backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    train(args.steps)
    gc.collect()  # what the steps left for collection is not the steady state
    tracked = len(gc.get_objects())
    before = full_collections_ms(args.repeats)
    gc.freeze()
    try:
        train(2)
        after = full_collections_ms(args.repeats)
    finally:
        gc.unfreeze()
    result = {"model": args.model, "compile": args.compile, "torch": torch.__version__,
              "objects_tracked": tracked, "before_freeze": summary(before), "after_freeze": summary(after)}
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
