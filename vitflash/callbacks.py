"""Lightning callbacks that keep the training loop free of per-step host syncs and stalls."""
from __future__ import annotations

import gc
import logging
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import ThroughputMonitor as _ThroughputMonitor
from lightning.pytorch.callbacks import TQDMProgressBar
from lightning.pytorch.utilities import rank_zero_only

log = logging.getLogger(__name__)


class ThroughputMonitor(_ThroughputMonitor):
    """Lightning's ThroughputMonitor, timed on logging steps only.

    Lightning's waits for the GPU (`torch.cuda.synchronize`) after every training batch, so
    the host can never run ahead of the device. This one counts every batch's images (a
    shape: no sync) but takes the time, and so syncs, only on the steps the logger writes
    (trainer.log_every_n_steps) and on the last batch of an epoch (validation time is then
    left out, as Lightning does). With window_size=w, samples_per_sec is the rate over the
    last w - 1 logging intervals. Validation and test are timed as Lightning does.
    """

    @rank_zero_only
    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any,
                           batch: Any, *args: Any) -> None:
        if not (trainer._logger_connector.should_update_logs
                or trainer.fit_loop.epoch_loop.batch_progress.is_last_batch):
            # the running totals Lightning keeps per stage; the clock is read at the next update
            stage = trainer.state.stage
            self._samples[stage] += self.batch_size_fn(batch)
            self._batches[stage] += 1
            return
        super().on_train_batch_end(trainer, pl_module, outputs, batch, *args)


class ProgressBar(TQDMProgressBar):
    """Lightning's TQDM bar, showing the training loss (train/loss_step, train/loss_epoch)
    read only when the bar redraws (every refresh_rate batches and at the epoch's end).

    Lightning turns every value logged with prog_bar=True into a Python number after every
    batch, a host sync per step; so ViTModule logs the loss without prog_bar and this bar
    reads it from the callback metrics instead.
    """

    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict:
        items = super().get_metrics(trainer, pl_module)
        for key in ("train/loss_step", "train/loss_epoch"):
            if (value := trainer.callback_metrics.get(key)) is not None:
                items[key] = float(value)
        return items


class FreezeGarbageCollector(L.Callback):
    """Keeps Python's garbage collector off the objects that live as long as the run.

    A collection of the oldest generation walks every container object the process holds:
    the model, the compiled graphs and their guards, Triton's kernels, Lightning's state,
    half a million objects or more once `torch.compile` has run. On a 2-core CPU one such
    collection after compiling vit_tiny_patch4_32 took about a third of a second
    (scripts/gc_pause.py), a stall of the host in the middle of a training step that the GPU
    waits out. After `after_steps` optimizer steps of this fit (compiling and CUDA-graph
    recording done; a resumed fit counts from where it resumed)
    this collects once and freezes what is left (gc.freeze): later collections skip it (the
    same collection then took microseconds). Objects made later (by the first validation,
    say) are frozen at the end of each validation, without another full collection. Young
    objects are collected as before; what was frozen is still freed by reference counting.
    fit's end unfreezes. after_steps=null: off.
    """

    def __init__(self, after_steps: int | None = 10):
        if after_steps is not None and (isinstance(after_steps, bool) or not isinstance(after_steps, int)
                                        or after_steps < 1):
            raise ValueError(f"callbacks.gc_freeze.after_steps={after_steps!r}: expected a whole number "
                             ">= 1 (optimizer steps before freezing), or null to leave the collector alone")
        self.after_steps = after_steps
        self.frozen = False
        self._start_step = 0

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # a resumed fit compiles and records its graphs again: count its own steps
        self._start_step = trainer.global_step

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        if self.after_steps is None or self.frozen or trainer.global_step - self._start_step < self.after_steps:
            return
        start = gc.get_freeze_count()
        gc.collect()
        gc.freeze()
        self.frozen = True
        log.info("froze %d objects out of the garbage collector's reach after %d steps of this fit, at step %d "
                 "(callbacks.gc_freeze)", gc.get_freeze_count() - start, trainer.global_step - self._start_step,
                 trainer.global_step)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.frozen:
            gc.freeze()

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self.frozen:
            gc.unfreeze()
            self.frozen = False
