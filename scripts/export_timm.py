"""Export a vitflash or Lightning checkpoint as a .safetensors file that timm loads.

    python scripts/export_timm.py outputs/train/runs/<time>/checkpoints/last.ckpt --out vit.safetensors
    python scripts/export_timm.py weights.pth --model vit_small_patch4_32 --out vit.safetensors

Prints the `timm.create_model(...)` call that loads the file and gives the same logits.
"""
from __future__ import annotations

import argparse

from vitflash import list_models
from vitflash.cli import short_errors
from vitflash.pretrained import export_timm


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", help="Lightning .ckpt, or a vitflash/timm state dict file")
    parser.add_argument(
        "--model",
        choices=list_models(),
        help="preset the checkpoint was made from; Lightning checkpoints record it",
    )
    parser.add_argument("--out", required=True, help="the .safetensors file to write")
    args = parser.parse_args(argv)

    kwargs = export_timm(args.checkpoint, args.out, model_name=args.model)
    call = ", ".join(f"{k}={v!r}" for k, v in kwargs.items() if k != "model_name")
    print(f"wrote {args.out}; load it with\n  timm.create_model({kwargs['model_name']!r}, {call})")


if __name__ == "__main__":
    short_errors(main)()  # a path, checkpoint or model the user can fix: one line, exit status 1
