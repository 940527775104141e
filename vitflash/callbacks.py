"""Lightning callbacks that keep the training loop free of per-step host syncs."""
from __future__ import annotations

from typing import Any

import lightning as L
from lightning.pytorch.callbacks import ThroughputMonitor as _ThroughputMonitor
from lightning.pytorch.callbacks import TQDMProgressBar
from lightning.pytorch.utilities import rank_zero_only


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
