"""A Callback for tests/test_faults.py: SIGKILL the training process at a given step, as a
crash or an out-of-memory kill would (no cleanup, no final checkpoint)."""
import os
import signal

from lightning.pytorch.callbacks import Callback


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
