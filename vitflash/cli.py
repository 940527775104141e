"""What a run of scripts/train.py or scripts/eval.py prints, and what it leaves on disk.

    @hydra.main(...)
    @short_errors
    def main(cfg):
        with run_session():
            train(cfg)

`short_errors` prints a config or data error as one message, `Error: <what, why, the fix>`,
and exits with status 1; its traceback stays behind `HYDRA_FULL_ERROR=1`, as Hydra does for
its own errors. `check_trainer` checks the composed Trainer config before any data is read.
`run_session` hides the messages a user cannot act on (each filter below says why it is
safe), prints vitflash's own log lines from rank zero only under DDP, and removes the run
folder Hydra made when the run fails before it has written any result. `ModelSummary` is
Lightning's model summary without the FLOPs column it cannot fill for this model;
`host_peak_rss_gib` is the host memory figure eval.py prints.
"""
from __future__ import annotations

import contextlib
import functools
import logging
import os
import resource
import shutil
import sys
import warnings
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Callable

import torch
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from hydra.errors import InstantiationException
from lightning.pytorch.callbacks import ModelSummary as _LightningModelSummary
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException

from vitflash import SetupError


# Messages Lightning and torch print on every run that say nothing about the user's run.
_IGNORED_WARNINGS = (
    # Lightning 2.6 calls a torch pytree API that newer torch deprecates: Lightning's to fix.
    r".*isinstance\(treespec, LeafSpec\)",
    # The top-1/top-5 metrics are torchmetrics, which sync across processes once per epoch
    # before they are logged; the losses are logged with sync_dist.
    r".*sync_dist=True.*when logging on epoch level in distributed setting",
    # Under DDP, DistributedSampler pads the test set to a multiple of the process count:
    # at most (processes - 1) repeated images (none on CIFAR's 10,000 with 2, 4 or 8 GPUs).
    # eval.py with trainer.devices=1 scores every image exactly once.
    r".*Using `DistributedSampler` with the dataloaders. During `trainer.test\(\)`",
)
# Lightning's advertisements for its cloud services (info lines, not warnings).
_IGNORED_INFO = ("💡 Tip:",)
# Files Hydra writes into a run folder before the run starts; a folder holding nothing else
# has no result in it.
_HYDRA_BOOKKEEPING = {".hydra", "train.log", "eval.log"}


class _DropLines(logging.Filter):
    """Drops Lightning's tips, and on DDP ranks other than zero every record below ERROR
    (each process would print the same line again)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if str(record.msg).startswith(_IGNORED_INFO):
            return False
        return rank_zero_only.rank == 0 or record.levelno >= logging.ERROR


def quiet() -> None:
    """Install the warning and log filters (idempotent)."""
    for pattern in _IGNORED_WARNINGS:
        warnings.filterwarnings("ignore", message=pattern)
    drop = _DropLines()
    # Lightning logs through its own handler (it does not propagate); everything else
    # (vitflash, __main__, timm) reaches the root handlers Hydra installs.
    for logger in (logging.getLogger(), logging.getLogger("lightning.pytorch")):
        for handler in logger.handlers:
            if not any(isinstance(f, _DropLines) for f in handler.filters):
                handler.addFilter(drop)
    # Lightning's tips go through its rank-zero logger.
    logger = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    if not any(isinstance(f, _DropLines) for f in logger.filters):
        logger.addFilter(drop)


def remove_empty_run_folder() -> bool:
    """Delete this Hydra job's output folder if it holds only Hydra's bookkeeping (the run
    failed before writing checkpoints or metrics). Returns whether it was deleted."""
    if not HydraConfig.initialized() or rank_zero_only.rank != 0:
        return False
    folder = Path(HydraConfig.get().runtime.output_dir)
    # (a logger's folder made before the error, with nothing in it, holds no result either)
    if not folder.is_dir() or any(p.name not in _HYDRA_BOOKKEEPING and _holds_files(p) for p in folder.iterdir()):
        return False
    shutil.rmtree(folder, ignore_errors=True)
    return True


def _holds_files(path: Path) -> bool:
    return path.is_file() or any(p.is_file() for p in path.rglob("*"))


@contextlib.contextmanager
def run_session() -> Iterator[None]:
    """Quiet output for the block; on an exception, no empty run folder is left behind; at
    its end, the process leaves the DDP process group (`leave_process_group`)."""
    quiet()
    try:
        yield
    except BaseException:
        remove_empty_run_folder()
        raise
    leave_process_group()


def leave_process_group() -> None:
    """After a DDP run, when every rank is done: meet at a barrier, then tear the process
    group down. Left to interpreter finalization, a gloo group now and then aborted the
    process after its work was done (SIGABRT, "terminate called without an active
    exception"); the barrier keeps one rank from tearing it down under another."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


def host_peak_rss_gib() -> float:
    """Peak resident memory of this process so far, in GiB: the whole process (Python,
    model, data in memory), the host-side figure eval.py reports next to GPU memory."""
    kib_or_bytes = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kib_or_bytes / (2**30 if sys.platform == "darwin" else 2**20)  # bytes on macOS, KiB on Linux


class ModelSummary(_LightningModelSummary):
    """Lightning's model summary without FLOPs: Lightning counts them only by running an
    `example_input_array` under torch's FlopCounterMode, which cannot see the Triton kernel
    (flash would show fewer FLOPs than naive for the same model), so the column would read
    0 or mislead. Parameters, sizes and modes are Lightning's."""

    @staticmethod
    def summarize(summary_data, *args, **kwargs) -> None:
        summary_data = [column for column in summary_data if column[0] != "FLOPs"]
        with _without_total_flops():
            _LightningModelSummary.summarize(summary_data, *args, **kwargs)


class _DropTotalFlops(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str):
            record.msg = "\n".join(line for line in record.msg.split("\n") if not line.endswith("Total Flops"))
        return True


@contextlib.contextmanager
def _without_total_flops() -> Iterator[None]:
    logger = logging.getLogger(_LightningModelSummary.__module__)
    drop = _DropTotalFlops()
    logger.addFilter(drop)
    try:
        yield
    finally:
        logger.removeFilter(drop)


# What a user's config or data can cause; anything else is a bug and keeps its traceback.
USER_ERRORS = (ValueError, TypeError, OSError, SetupError, OmegaConfBaseException)


def short_errors(main: Callable) -> Callable:
    """Wrap a Hydra task function (or a script's argparse main): user errors become one message
    on stderr and exit status 1."""

    @functools.wraps(main)
    def wrapper(*args, **kwargs):
        try:
            return main(*args, **kwargs)
        except (InstantiationException, *USER_ERRORS) as e:
            if os.environ.get("HYDRA_FULL_ERROR") == "1":
                raise
            # instantiate wraps the constructor's error; its message is the one to show
            cause = e.__cause__ if isinstance(e, InstantiationException) and e.__cause__ else e
            if not isinstance(cause, USER_ERRORS):
                raise
            if _in_multirun():
                # one job of a sweep: Hydra runs the others, then says which failed and exits 1
                # (sys.exit would end the sweep here, its later jobs never run)
                job = " ".join(HydraConfig.get().overrides.task)
                print(f"Error in the job with overrides {job}: {cause}", file=sys.stderr)
                raise JobError(str(cause)) from None
            print(f"Error: {cause}\n(set HYDRA_FULL_ERROR=1 for the traceback)", file=sys.stderr)
            sys.exit(1)

    return wrapper


class JobError(RuntimeError):
    """A user error in one job of a Hydra sweep (-m), raised for Hydra to report."""


def _in_multirun() -> bool:
    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def _whole(value, least: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def is_fsdp(strategy) -> bool:
    """Whether a trainer.strategy config value (a name such as "fsdp", or a node with a
    `_target_`) is Lightning's FSDPStrategy."""
    if isinstance(strategy, str):
        return strategy.startswith("fsdp")
    target = strategy.get("_target_", "") if isinstance(strategy, (dict, DictConfig)) else ""
    return target.rsplit(".", 1)[-1] == "FSDPStrategy"


def duration_seconds(value) -> float | None:
    """trainer.max_time in seconds, as Lightning's Timer reads it ("DD:HH:MM:SS", or a mapping
    of timedelta's keywords such as {hours: 1}); None where it is not one, or not above zero."""
    try:
        if isinstance(value, str):
            parts = value.strip().split(":")
            if len(parts) != 4 or not all(p.isdigit() for p in parts):
                return None
            seconds = timedelta(**dict(zip(("days", "hours", "minutes", "seconds"), map(int, parts)))).total_seconds()
        elif isinstance(value, (dict, DictConfig)):
            seconds = timedelta(**{str(k): v for k, v in dict(value).items()}).total_seconds()
        else:
            return None
    except (TypeError, ValueError, OverflowError):
        return None
    return seconds if seconds > 0 else None


def check_trainer(trainer: DictConfig) -> None:
    """Raise a ValueError for trainer settings Lightning would only trip over after the data
    is set up: non-numeric epochs, steps or batch limits, a time budget that is not one, a
    negative clipping threshold, a GPU accelerator or FSDP without CUDA."""
    epochs = trainer.get("max_epochs")
    if epochs is not None and not (_whole(epochs, 1) or epochs == -1):
        raise ValueError(f"trainer.max_epochs={epochs!r} is not a whole number >= 1 (or -1 for no limit): "
                         "pass e.g. trainer.max_epochs=10")
    steps = trainer.get("max_steps")
    if epochs == -1 and not _whole(steps, 1):
        raise ValueError(f"trainer.max_epochs=-1 (no epoch limit) needs trainer.max_steps, the number of optimizer "
                         f"steps the learning-rate schedule runs over (got {steps!r}): pass e.g. "
                         "+trainer.max_steps=20000, or a number of epochs")
    for key in ("accumulate_grad_batches", "check_val_every_n_epoch"):
        value = trainer.get(key)
        if value is not None and not _whole(value, 1):
            raise ValueError(f"trainer.{key}={value!r} is not a whole number >= 1: pass e.g. trainer.{key}=2, "
                             f"or leave it out")
    clip = trainer.get("gradient_clip_val")
    if clip is not None and not (isinstance(clip, (int, float)) and not isinstance(clip, bool) and clip >= 0):
        # torch's clip_grad_norm_ would scale the gradients by a negative factor (gradient
        # ascent) where Lightning, which clips on the other paths, ignores the value
        raise ValueError(f"trainer.gradient_clip_val={clip!r} is not a number >= 0: pass e.g. "
                         "trainer.gradient_clip_val=1.0, or null (or 0) for no clipping")
    for key in ("limit_train_batches", "limit_val_batches", "limit_test_batches"):
        value = trainer.get(key)
        if value is None:
            continue
        fraction = isinstance(value, float) and 0.0 <= value <= 1.0
        if not (fraction or _whole(value, 0)):
            raise ValueError(f"trainer.{key}={value!r} is neither a fraction in [0, 1] nor a whole number "
                             f"of batches: pass e.g. trainer.{key}=1.0 (all) or trainer.{key}=100")
    budget = trainer.get("max_time")
    if budget is not None and duration_seconds(budget) is None:
        raise ValueError(f"trainer.max_time={budget!r} is not a time budget longer than zero: write "
                         "days:hours:minutes:seconds, e.g. trainer.max_time=00:00:09:00 for nine minutes, "
                         "or trainer.max_time=null for none")
    accelerator = str(trainer.get("accelerator", "auto"))
    if is_fsdp(trainer.get("strategy")) and not (accelerator in ("gpu", "cuda", "auto") and torch.cuda.is_available()):
        # Lightning refuses FSDPStrategy on any accelerator but CUDA, and passes torch's FSDP no
        # device on the CPU, which torch refuses too: said here before any data is read
        raise ValueError(
            f"trainer=fsdp (Lightning's FSDPStrategy) runs on CUDA GPUs only, and here "
            f"trainer.accelerator={accelerator} with torch.cuda.is_available()={torch.cuda.is_available()}: "
            "on a machine without GPUs use trainer=ddp trainer.accelerator=cpu trainer.devices=2 (DDP over gloo)")
    if accelerator in ("gpu", "cuda") and not torch.cuda.is_available():
        raise ValueError(
            f"trainer.accelerator={accelerator} (trainer=gpu) needs a CUDA GPU, and PyTorch sees none "
            f"(torch.cuda.is_available() is False; torch {torch.__version__}): on this machine use "
            "trainer=cpu, or trainer=default (the GPU when there is one, else the CPU)")
