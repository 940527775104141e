"""vitflash's own Lightning callbacks, in a real Trainer on the CPU."""
from __future__ import annotations

import gc

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from vitflash.callbacks import FreezeGarbageCollector


class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 2)

    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).square().mean()

    def validation_step(self, batch, batch_idx):
        self.log("val/loss", self.layer(batch[0]).square().mean())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class FreezeProbe(L.Callback):
    """The collector's frozen-object count after each training batch and each validation."""

    def __init__(self):
        self.after_batch, self.after_val = [], []

    def on_train_batch_end(self, trainer, *args):
        self.after_batch.append((trainer.global_step, gc.get_freeze_count()))

    def on_validation_end(self, trainer, pl_module):
        self.after_val.append(gc.get_freeze_count())


def fit(freezer: FreezeGarbageCollector, steps: int = 8, ckpt_path=None, save_to=None) -> FreezeProbe:
    probe = FreezeProbe()
    data = DataLoader(TensorDataset(torch.randn(16, 4)), batch_size=2)
    trainer = L.Trainer(accelerator="cpu", max_steps=steps, val_check_interval=5, limit_val_batches=1,
                        num_sanity_val_steps=0, callbacks=[freezer, probe], logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Tiny(), train_dataloaders=data, val_dataloaders=data, ckpt_path=ckpt_path)
    if save_to:
        trainer.save_checkpoint(save_to)
    return probe


def test_freezes_after_warmup_and_thaws_at_the_end():
    assert gc.get_freeze_count() == 0
    probe = fit(FreezeGarbageCollector(after_steps=3))
    counts = dict(probe.after_batch)
    assert all(counts[s] == 0 for s in (1, 2))  # compiling, recording: not yet
    assert all(counts[s] > 0 for s in range(3, 9))  # frozen from the third step on
    # the validation at step 5 froze what had been made since
    (after_val,) = probe.after_val
    assert after_val > counts[5]
    assert gc.get_freeze_count() == 0  # fit's end gives the objects back to the collector


def test_a_resumed_fit_counts_its_own_steps(tmp_path):
    """Resumed at step 4, the process compiles and records again: it freezes after 3 steps of
    its own (step 7), not after its first (the global step is past after_steps already)."""
    fit(FreezeGarbageCollector(after_steps=None), steps=4, save_to=tmp_path / "step4.ckpt")
    probe = fit(FreezeGarbageCollector(after_steps=3), steps=10, ckpt_path=tmp_path / "step4.ckpt")
    counts = dict(probe.after_batch)
    assert sorted(counts) == list(range(5, 11))
    assert all(counts[s] == 0 for s in (5, 6)) and all(counts[s] > 0 for s in range(7, 11))


def test_null_leaves_the_collector_alone():
    probe = fit(FreezeGarbageCollector(after_steps=None))
    assert {count for _, count in probe.after_batch} == {0}


@pytest.mark.parametrize("value", [0, -1, True, 2.5, "10"])
def test_bad_after_steps_is_refused(value):
    with pytest.raises(ValueError, match=r"callbacks.gc_freeze.after_steps=.*whole number >= 1.*or null"):
        FreezeGarbageCollector(after_steps=value)
