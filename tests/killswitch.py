"""Callbacks for tests/test_faults.py: SIGKILL the training process at a given step, as a
crash or an out-of-memory kill would (no cleanup, no final checkpoint); stop it cleanly; or
spend its time budget (trainer.max_time) at a given step."""
import os
import signal

from lightning.pytorch.callbacks import Callback, Timer


class KillAtStep(Callback):
    def __init__(self, step: int):
        self.step = step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        # after the checkpoints of the previous step were written, before this step runs
        if trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGKILL)


class StopAtStep(Callback):
    """Stop training cleanly after `step` optimizer steps (the LR plan still covers max_epochs)."""

    def __init__(self, step: int):
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step >= self.step:
            trainer.should_stop = True


class SpendBudgetAtStep(Callback):
    """Move trainer.max_time's clock past its budget after `step` optimizer steps, as if the
    time had run out there: the Timer, which checks after this callback in the same hook, then
    stops fit at that step, whatever the machine's speed."""

    def __init__(self, step: int):
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.step:
            (timer,) = [c for c in trainer.callbacks if isinstance(c, Timer)]
            timer._offset = timer._duration + 3600.0  # the training time counted before this fit


class SpendBudgetAtBatch(SpendBudgetAtStep):
    """SpendBudgetAtStep after the training batch `batch` (counted from 0 over the whole fit)
    rather than an optimizer step: with gradient accumulation, a batch inside one."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.fit_loop.total_batch_idx == self.step:
            (timer,) = [c for c in trainer.callbacks if isinstance(c, Timer)]
            timer._offset = timer._duration + 3600.0


class TermAtStep(Callback):
    """Send this process SIGTERM before step `step` runs, as a scheduler preempting the job
    would; Lightning finishes the step in progress, then stops fit."""

    def __init__(self, step: int):
        self.step = step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGTERM)
