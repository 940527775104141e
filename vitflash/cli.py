"""What scripts/train.py and scripts/eval.py share: checks of the composed config that run
before any data is read, and errors printed as one short message.

A config or data error prints `Error: <what, why, the fix>` and exits with status 1; its
traceback stays behind `HYDRA_FULL_ERROR=1`, as Hydra does for its own errors.
"""
from __future__ import annotations

import functools
import os
import sys
from typing import Callable

import torch
from hydra.errors import InstantiationException
from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException

# What a user's config or data can cause; anything else is a bug and keeps its traceback.
USER_ERRORS = (ValueError, TypeError, OSError, RuntimeError, OmegaConfBaseException)


def short_errors(main: Callable) -> Callable:
    """Wrap a Hydra task function: user errors become one message on stderr and exit status 1."""

    @functools.wraps(main)
    def wrapper(cfg: DictConfig):
        try:
            return main(cfg)
        except (InstantiationException, *USER_ERRORS) as e:
            if os.environ.get("HYDRA_FULL_ERROR") == "1":
                raise
            # instantiate wraps the constructor's error; its message is the one to show
            cause = e.__cause__ if isinstance(e, InstantiationException) and e.__cause__ else e
            if not isinstance(cause, USER_ERRORS):
                raise
            print(f"Error: {cause}\n(set HYDRA_FULL_ERROR=1 for the traceback)", file=sys.stderr)
            sys.exit(1)

    return wrapper


def _whole(value, least: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def check_trainer(trainer: DictConfig) -> None:
    """Raise a ValueError for trainer settings Lightning would only trip over after the data
    is set up: non-numeric epochs or batch limits, a GPU accelerator without CUDA."""
    epochs = trainer.get("max_epochs")
    if epochs is not None and not (_whole(epochs, 1) or epochs == -1):
        raise ValueError(f"trainer.max_epochs={epochs!r} is not a whole number >= 1 (or -1 for no limit): "
                         "pass e.g. trainer.max_epochs=10")
    for key in ("limit_train_batches", "limit_val_batches", "limit_test_batches"):
        value = trainer.get(key)
        if value is None:
            continue
        fraction = isinstance(value, float) and 0.0 <= value <= 1.0
        if not (fraction or _whole(value, 0)):
            raise ValueError(f"trainer.{key}={value!r} is neither a fraction in [0, 1] nor a whole number "
                             f"of batches: pass e.g. trainer.{key}=1.0 (all) or trainer.{key}=100")
    accelerator = str(trainer.get("accelerator", "auto"))
    if accelerator in ("gpu", "cuda") and not torch.cuda.is_available():
        raise ValueError(
            f"trainer.accelerator={accelerator} (trainer=gpu) needs a CUDA GPU, and PyTorch sees none "
            f"(torch.cuda.is_available() is False; torch {torch.__version__}): on this machine use "
            "trainer=cpu, or trainer=default (the GPU when there is one, else the CPU)")
