"""Probe: do two training checkpoints hold the same state, bit for bit?

Compares what decides the rest of a run: the weights (with the EMA's), the optimizer's
moments, the global step, and the data loader's position (the DataModule's state). Used to
check on a GPU that a run stopped by its time budget and resumed ends where the same run
without the stop ends (tests/test_faults.py checks the same on the CPU).

    python benchmarks/probes/same_state.py <run A>/checkpoints/last.ckpt <run B>/checkpoints/last.ckpt

Prints one line per part and exits with 1 when any part differs.
"""
from __future__ import annotations

import sys

import torch


def parts(path: str) -> dict[str, dict[str, torch.Tensor]]:
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    optim = {f"{i}.{k}": v for s in ckpt["optimizer_states"] for i, st in s["state"].items() for k, v in st.items()}
    loader = {f"{m}.{k}": torch.tensor(v) for m in ckpt if m.endswith("DataModule")
              for k, v in _flat(ckpt[m]).items()}
    return {"weights": ckpt["state_dict"], "optimizer": optim, "global_step": {"": torch.tensor(ckpt["global_step"])},
            "loader": loader}


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def main(a: str, b: str) -> int:
    pa, pb = parts(a), parts(b)
    same = True
    for name in pa:
        ta, tb = pa[name], pb[name]
        if ta.keys() != tb.keys():
            print(f"{name}: different entries ({len(ta)} and {len(tb)})")
            same = False
            continue
        differ = [k for k in ta if not torch.equal(ta[k], tb[k])]
        same &= not differ
        shown = f", e.g. {differ[:3]}" if differ else ""
        print(f"{name}: {len(ta) - len(differ)} of {len(ta)} tensors identical{shown}")
    print("same state" if same else "states differ")
    return 0 if same else 1


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python benchmarks/probes/same_state.py <a.ckpt> <b.ckpt>")
    sys.exit(main(*sys.argv[1:]))
