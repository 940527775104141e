"""Checkpoints that survive a kill and resume exactly, and paths in them that cannot be hijacked.

- `AtomicCheckpointIO`: Lightning's CheckpointIO plugin (configs/trainer/default.yaml). A
  checkpoint is written to a temporary file in its own folder, flushed and fsync'ed, then
  renamed over the old one with `os.replace`, and the folder is fsync'ed: a kill at any
  moment leaves the old file or the new one, whole. Files are read by
  `vitflash.pretrained.load_file` (weights only), never unpickled in full.
- `RNGState`: a Callback that stores the python, numpy, torch and CUDA generator states in
  every checkpoint and puts them back when training resumes, and drops any path that a
  loaded checkpoint names (ModelCheckpoint's best_model_path, ...) unless it is a local file
  inside this run's checkpoint folder.
- `TimeBudget`: Lightning's Timer (trainer.max_time), which also writes last.ckpt at the
  step where the budget ends, so that a run continued from it resumes that very step.
- `SaveOnTerm`: the same where a SIGTERM stops a one-process run.

Where the data loader stands (epoch, batches done) is the DataModule's state
(`vitflash.data.ResumableSampler`); together with Lightning's own loop, optimizer and
scheduler states, a resumed CPU run ends with the same weights, bit for bit, as an
uninterrupted one.
"""
from __future__ import annotations

import logging
import os
import random
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint, Timer
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.exceptions import SIGTERMException

from vitflash.files import written_whole
from vitflash.pretrained import EMA_PREFIX, CheckpointError, load_file

log = logging.getLogger(__name__)

# The path-valued fields of ModelCheckpoint's state; a checkpoint can name any file in them.
_PATH_FIELDS = ("best_model_path", "kth_best_model_path", "last_model_path")


def _is_remote(path: str | os.PathLike) -> bool:
    return "://" in str(path)


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's torch.save/torch.load plugin, made crash-safe and weights-only for local files."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options=None) -> None:
        if _is_remote(path) or storage_options is not None:
            return super().save_checkpoint(checkpoint, path, storage_options)
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        # In the target's folder, not $TMPDIR: os.replace is atomic only within one filesystem.
        with written_whole(path, suffix=".tmp") as tmp, open(tmp, "wb") as f:
            torch.save(checkpoint, f)
            f.flush()
            os.fsync(f.fileno())
        _fsync_dir(path.parent)  # the rename itself reaches the disk
        for stale in path.parent.glob(f".{path.name}.*.tmp"):  # left by a writer that was killed
            stale.unlink(missing_ok=True)

    def load_checkpoint(self, path, map_location=None, weights_only=None) -> dict[str, Any]:
        if _is_remote(path):
            raise CheckpointError(
                f"checkpoint {path} is not a local file: vitflash resumes only from local "
                "checkpoint files; copy it to this machine and pass its path")
        return load_file(path)  # weights only, whatever the caller asked for

    def remove_checkpoint(self, path) -> None:
        if _is_remote(path) or not str(path).endswith(".ckpt"):
            raise CheckpointError(f"refusing to delete {path}: not a local .ckpt file")
        super().remove_checkpoint(path)


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def run_file(path: str | os.PathLike | None, folders: Iterable[str | os.PathLike]) -> Path | None:
    """`path` as a Path if it is a local file inside one of `folders` (after resolving links
    and `..`), else None."""
    if not path or _is_remote(path):
        return None
    resolved = Path(path).resolve()
    for folder in folders:
        if folder and resolved.is_relative_to(Path(folder).resolve()) and resolved.is_file():
            return resolved
    return None


def check_finite(state_dict: Mapping[str, torch.Tensor], source: str | os.PathLike) -> None:
    """Raise a CheckpointError naming the tensors of `state_dict` that hold NaN or inf."""
    bad = [k for k, v in state_dict.items()
           if isinstance(v, torch.Tensor) and v.is_floating_point() and not torch.isfinite(v).all()]
    if bad:
        more = f" and {len(bad) - 4} more" if len(bad) > 4 else ""
        raise CheckpointError(
            f"checkpoint {source} holds NaN or inf weights ({', '.join(bad[:4])}{more}): the run that "
            "wrote it diverged. Use an earlier checkpoint of that run (the best one, or one saved "
            "before the loss became NaN), and lower the learning rate when training again")


def _rng_states() -> dict[str, Any]:
    # Like Lightning's _collect_rng_states, but numpy's keys as a tensor: the checkpoint must stay
    # readable with torch.load(weights_only=True), which refuses numpy arrays.
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    states = {
        "python": random.getstate(),
        "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "gauss": float(gauss)},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def _set_rng_states(states: Mapping[str, Any]) -> None:
    version, internal, gauss_next = states["python"]
    random.setstate((version, tuple(internal), gauss_next))
    n = states["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    torch.set_rng_state(states["torch"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


class RNGState(Callback):
    """Random generator states in every checkpoint, restored when training resumes; and no
    path from a loaded checkpoint that points outside this run's checkpoint folder.

    The states are put back in `on_train_start`, after Lightning's sanity check and the
    loader set-up, so that nothing between the restore and the first resumed step draws
    from them (the data pipeline seeds its own generators per sample; see
    `vitflash.data.SeededSamples`).
    """

    def __init__(self) -> None:
        self._loaded: dict[str, Any] | None = None

    def state_dict(self) -> dict[str, Any]:
        return _rng_states()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._loaded = state_dict

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._loaded is not None:
            _set_rng_states(self._loaded)
            self._loaded = None

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        # Runs before each callback's load_state_dict: ModelCheckpoint would otherwise take
        # best_model_path (any string, even an http:// URL) from the file and later load or
        # delete what it names.
        # several ModelCheckpoint callbacks (best, last, periodic) usually share one folder
        folders = list(dict.fromkeys(
            cb.dirpath for cb in trainer.checkpoint_callbacks if isinstance(cb, ModelCheckpoint)))
        afresh = False
        # where the resumed file lies: the previous run's own paths point there
        source = [Path(trainer.ckpt_path).parent] if trainer.ckpt_path and not _is_remote(trainer.ckpt_path) else []
        for key, state in (checkpoint.get("callbacks") or {}).items():
            if not isinstance(state, dict) or "best_model_path" not in state:
                continue
            named = [state.get(f) for f in _PATH_FIELDS] + list(state.get("best_k_models") or {})
            outside = [p for p in named if p and run_file(p, folders) is None]
            if not outside:
                continue
            foreign = [p for p in outside if _is_remote(p) or not Path(p).resolve().is_relative_to(
                source[0].resolve() if source else Path("/nonexistent"))]
            if foreign:
                log.warning(
                    "ignoring the checkpoint paths %s recorded in %s: they lie outside this run's checkpoint "
                    "folder (%s) and the resumed checkpoint's; only files inside this run's folder are loaded",
                    ", ".join(map(repr, foreign)), key, ", ".join(map(str, folders)) or "none")
            else:
                afresh = True
            state.update(best_model_path="", kth_best_model_path="", last_model_path="",
                         best_k_models={}, best_model_score=None, kth_value=None)
        if afresh:
            log.info("resumed into a new folder: the best checkpoint is tracked afresh in %s",
                     ", ".join(map(str, folders)))


def save_last_now(trainer: L.Trainer) -> list[str]:
    """Write `last.ckpt` at this step through each ModelCheckpoint named "last" that has not
    saved at it yet (on every process: a collective save under DDP), and return the paths.
    The callback records the step as saved, so its own saves later in the step are skipped."""
    written = []
    for callback in trainer.checkpoint_callbacks:
        if (isinstance(callback, ModelCheckpoint) and callback.filename == "last" and callback.dirpath
                and callback._last_global_step_saved != trainer.global_step):
            path = os.path.join(callback.dirpath, "last.ckpt")
            callback.best_model_path = path  # part of the callback's state, as its own saves do
            callback._save_checkpoint(trainer, path)
            written.append(path)
    return written


def mid_accumulation(trainer: L.Trainer) -> bool:
    """Whether the training batch just run is not the last of its gradient accumulation
    (trainer.accumulate_grad_batches > 1), as Lightning counts it: its gradients wait in
    `.grad` for the optimizer step, and a checkpoint written now would not hold them, so a
    run resumed from it would step on part of the accumulation."""
    if trainer.accumulate_grad_batches <= 1:
        return False
    progress = trainer.fit_loop.epoch_loop.batch_progress
    return (progress.current.ready % trainer.accumulate_grad_batches != 0
            and progress.current.ready != trainer.num_training_batches and not progress.is_last_batch)


class TimeBudget(Timer):
    """trainer.max_time: Lightning's Timer, checked after every training step, that also
    writes `last.ckpt` at the step where the budget ends.

    Lightning ends fit there by closing the epoch early: it validates the part of the epoch
    done and runs the epoch's end, and a checkpoint written then marks that epoch as finished,
    so a run resumed from it skipped the rest of the epoch (with validation every epoch); with
    validation every n epochs no checkpoint was written at all, and a resume went back to the
    last validation. Here the ModelCheckpoint callbacks named "last" write their file at the
    stopping step itself, mid-epoch, as `callbacks.step_checkpoint` would, and Lightning's
    saves later in that step are skipped for them (they already saved at this step). A run
    continued from `last.ckpt` then carries on from the next batch: with the same weights,
    bit for bit, as a run without the stop (tests/test_faults.py).

    With gradient accumulation the stop waits for the accumulation's last batch, where the
    optimizer has stepped and nothing is left in `.grad` that a checkpoint would miss.

    The state (the training time spent so far) is stored under Lightning's Timer key, so the
    budget stays the whole run's across a resume, with checkpoints of either.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("verbose", False)  # the stop is logged once, with its checkpoint (below)
        super().__init__(*args, **kwargs)
        self.stopped: tuple[int, int, int] | None = None  # (epoch, batch in it, global step) where the budget ended

    @property
    def state_key(self) -> str:
        return "Timer"

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any, **kwargs: Any) -> None:
        stopping = trainer.should_stop
        super().on_train_batch_end(trainer, *args, **kwargs)  # decided on rank 0 and broadcast: every rank saves
        if trainer.should_stop and not stopping and mid_accumulation(trainer):
            trainer.should_stop = False  # the Timer says so again after the next batch
            return
        if trainer.should_stop and not stopping:
            batch = trainer.fit_loop.epoch_loop.batch_progress.current.ready
            self.stopped = (trainer.current_epoch, batch, trainer.global_step)  # for the message after fit
            for path in save_last_now(trainer):
                if trainer.is_global_zero:
                    log.info("trainer.max_time reached after batch %d of epoch %d (step %d): wrote %s, to "
                             "resume from the next batch", batch, trainer.current_epoch, trainer.global_step, path)


class SaveOnTerm(Callback):
    """SIGTERM (a scheduler preempting the job, `kill <pid>`) in a one-process run: Lightning
    ends fit after the training step in progress by raising SIGTERMException; this writes
    `last.ckpt` at that step first, as `TimeBudget` does at the end of a budget, so that the
    run resumes from the next batch with the same state, bit for bit, as without the signal
    (tests/test_faults.py). A signal that lands during validation leaves the last checkpoint
    as it was. With gradient accumulation fit ends at the accumulation's last batch instead
    (see TimeBudget). Under DDP nothing is added to Lightning's own handling (seen with
    Lightning 2.6 over gloo: with every process signalled, the processes wait on each other and
    do not end).

    It also writes `last.ckpt` where fit ends, if no save there has: with
    `callbacks.last_checkpoint.every_n_epochs=10` and 25 epochs, the last five would otherwise
    be in no checkpoint."""

    def __init__(self) -> None:
        self.deferred = False  # a SIGTERM held back until the accumulation's last batch

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any, **kwargs: Any) -> None:
        # Lightning raises SIGTERMException after this hook where received_sigterm is set
        connector = getattr(trainer, "_signal_connector", None)
        if connector is None or trainer.world_size > 1:
            return
        if connector.received_sigterm and mid_accumulation(trainer):
            connector.received_sigterm, self.deferred = False, True
        elif self.deferred and not mid_accumulation(trainer):
            connector.received_sigterm, self.deferred = True, False

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.fast_dev_run:  # (which saves no checkpoint)
            save_last_now(trainer)

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        if not isinstance(exception, SIGTERMException) or trainer.state.fn != TrainerFn.FITTING \
                or trainer.sanity_checking or trainer.validating or trainer.world_size > 1:
            return
        for path in save_last_now(trainer):
            if trainer.is_global_zero:
                log.info("SIGTERM: wrote %s at step %d, to resume from the next batch", path, trainer.global_step)


def finished_epochs(ckpt: Mapping[str, Any]) -> int | None:
    """How many epochs the run saved in `ckpt` has finished, as Lightning counts them when it
    resumes; None when the checkpoint does not say. A checkpoint written at validation's end
    (where ModelCheckpoint saves when validation runs every n > 1 epochs) lies inside the
    epoch's last step: its last batch has run, but the epoch is not yet counted as processed."""
    fit = ckpt.get("loops", {}).get("fit_loop", {})
    epochs = fit.get("epoch_progress", {}).get("current", {})
    done = epochs.get("processed")
    if not isinstance(done, int):
        return None
    started = epochs.get("started", done)
    if isinstance(started, int) and started > done and fit.get("epoch_loop.batch_progress", {}).get("is_last_batch"):
        done += 1
    return done


def check_resume(ckpt: Mapping[str, Any], module: L.LightningModule, path: str | os.PathLike,
                 max_epochs: int | None) -> None:
    """Raise a ValueError/CheckpointError before any work when checkpoint `ckpt` (read from
    `path`) cannot resume training `module`: another architecture or class count, NaN/inf
    weights, or no epochs left under `max_epochs`."""
    hp, mine = ckpt.get("hyper_parameters", {}), module.hparams
    keys = ("model_name", "num_classes", "img_size")
    differ = [f"{k}: checkpoint {hp.get(k)!r}, config {mine.get(k)!r}" for k in keys if hp.get(k) != mine.get(k)]
    # the EMA's shapes are the network's; ViTModule adds or drops it when model.ema_decay changed
    expected = {k: tuple(v.shape) for k, v in module.state_dict().items() if not k.startswith(EMA_PREFIX)}
    got = {k: tuple(v.shape) for k, v in ckpt["state_dict"].items()}
    shapes = [f"{k} {got.get(k)} vs {s}" for k, s in expected.items() if got.get(k) != s]
    if differ or shapes:
        more = f" and {len(shapes) - 3} more" if len(shapes) > 3 else ""
        raise CheckpointError(
            f"ckpt_path={path} was trained with another model than this config builds "
            f"({'; '.join(differ) or 'same settings'}; {len(shapes)} weight shapes differ: "
            f"{', '.join(shapes[:3])}{more}). To resume it, repeat the settings it was trained with "
            f"(model.model_name={hp.get('model_name')} data.num_classes={hp.get('num_classes')} "
            f"data.img_size={hp.get('img_size')}); to start a new run from its weights, pass "
            f"model.pretrained={path} instead of ckpt_path")
    check_finite(ckpt["state_dict"], path)
    done = finished_epochs(ckpt)
    if done is not None and max_epochs is not None and max_epochs >= 0 and done >= max_epochs:
        raise ValueError(
            f"ckpt_path={path} has finished {done} epochs and trainer.max_epochs={max_epochs}: "
            f"there is nothing left to train. Pass a larger trainer.max_epochs (the LR schedule is "
            f"re-planned to the new length), or score the checkpoint with scripts/eval.py")
