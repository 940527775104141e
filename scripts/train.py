"""Train a ViT: Hydra composes configs/train.yaml, Lightning fits, then tests the best checkpoint.

    python scripts/train.py experiment=cifar10_quick             # the CPU-sized recipe
    python scripts/train.py attention=flash trainer=gpu          # vitflash's kernel
    python scripts/train.py -m attention=flash,sdpa,naive        # a sweep, one folder per job
    python scripts/train.py ckpt_path=<run>/checkpoints/last.ckpt  # resume

Every run writes config, checkpoints and metrics into its own folder (configs/hydra/).
A resumed run continues exactly where the checkpoint stopped (vitflash/checkpoint.py); bad
values and checkpoints that cannot resume this config stop before any data is read.
"""
from __future__ import annotations

import logging
import shlex
import signal
import time
import warnings
from pathlib import Path

import hydra
import lightning as L
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from lightning.pytorch.callbacks import Timer
from lightning.pytorch.utilities.exceptions import SIGTERMException
from omegaconf import DictConfig, OmegaConf

from vitflash.checkpoint import RNGState, SaveOnTerm, TimeBudget, check_resume, run_file
from vitflash.cli import check_trainer, duration_seconds, is_fsdp, run_session, short_errors
from vitflash.module import check_ema
from vitflash.overrides import checked_keys
from vitflash.pretrained import load_training_checkpoint

log = logging.getLogger(__name__)
# Lightning asks the DataLoader for its position; vitflash's DataModules keep it themselves
# (vitflash.data.ResumableSampler), so its "dataloader is not resumable" warning does not apply.
warnings.filterwarnings("ignore", message="You're resuming from a checkpoint that ended before the epoch ended")
# A resume writes into a new folder: RNGState drops the old run's checkpoint paths (and says so),
# so ModelCheckpoint's "dirpath has changed ... only best_model_path will be reloaded" is untrue.
warnings.filterwarnings("ignore", message="The dirpath has changed from")
# A run that a time budget stopped is finished with trainer.max_time=null (the command it
# prints): the budget's state in the checkpoint is meant to be left unused then.
warnings.filterwarnings("ignore", message=r"Be aware that when using `ckpt_path`, callbacks used to create the "
                        r"checkpoint need to be provided during `Trainer` instantiation. Please add the following "
                        r"callbacks: \['Timer'\]")


def build(cfg: DictConfig, extra_callbacks: list[L.Callback] = (), ckpt: dict | None = None
          ) -> tuple[L.LightningDataModule, L.LightningModule, L.Trainer]:
    """The DataModule, ViTModule and Trainer (with the configured callbacks, vitflash's RNG
    state callback, then `extra_callbacks`, and loggers) that `cfg` describes; a callback or
    logger set to null is left out. `ckpt`, the checkpoint to resume from, is checked
    against the config before the Trainer is built."""
    datamodule = instantiate(cfg.data, _convert_="all")
    datamodule.check_data()  # a missing dataset stops the run before pretrained weights are fetched
    module = instantiate(cfg.model, _convert_="all")
    if ckpt is not None:
        check_resume(ckpt, module, cfg.ckpt_path, cfg.trainer.get("max_epochs"))
    # an entry set to null (callbacks.progress_bar=null) is switched off
    callbacks = [instantiate(c, _convert_="all") for c in (cfg.get("callbacks") or {}).values() if c is not None]
    callbacks.append(RNGState())  # not a config choice: exact resume depends on it
    callbacks.append(SaveOnTerm())
    if (budget := cfg.trainer.get("max_time")) is not None:
        # Lightning's own Timer would end fit without a checkpoint to resume the stopped epoch from
        # (and reads a mapping such as {hours: 1} only as a plain dict)
        callbacks.append(TimeBudget(duration=OmegaConf.to_container(budget) if isinstance(budget, DictConfig)
                                    else budget, interval="step"))
    loggers = [instantiate(c, _convert_="all") for c in (cfg.get("logger") or {}).values() if c is not None]
    trainer: L.Trainer = instantiate(cfg.trainer, callbacks=[*callbacks, *extra_callbacks], logger=loggers or False,
                                     max_time=None, _convert_="all")
    return datamodule, module, trainer


def train(cfg: DictConfig) -> dict[str, float]:
    """Fit and test as `cfg` (a composed configs/train.yaml) says; returns the last logged
    metrics (train/*, val/*, and test/* of the best checkpoint)."""
    if cfg.get("test") and is_fsdp(cfg.trainer.get("strategy")):
        # Lightning does not shard the model again for a trainer.test after fit: the weights
        # FSDP left sharded would be used as they are (Lightning-AI/pytorch-lightning#19015)
        raise ValueError("trainer=fsdp cannot test the model in the process that trained it (Lightning does not "
                         "shard it again after fit): add test=false, then score the best checkpoint with "
                         "`python scripts/eval.py ckpt_path=<run>/checkpoints/<best>.ckpt`")
    # ViTModule.setup refuses an EMA under FSDP too, but only once the data is set up
    check_ema(cfg.model.get("ema_decay"), sharded=is_fsdp(cfg.trainer.get("strategy")))
    check_trainer(cfg.trainer)
    check_mixup_batch(cfg)
    if cfg.get("seed") is not None:
        L.seed_everything(cfg.seed, workers=True)
    torch.set_float32_matmul_precision(cfg.matmul_precision)
    # a missing, corrupt or foreign file stops the run before any work
    ckpt = load_training_checkpoint(cfg.ckpt_path) if cfg.get("ckpt_path") else None
    if ckpt is not None:
        check_budget_left(ckpt, cfg.trainer.get("max_time"), cfg.ckpt_path)
    datamodule, module, trainer = build(cfg, ckpt=ckpt)
    if ckpt is None:  # (a resume starts from the checkpoint's weights, whatever model.pretrained says)
        weights = cfg.model.get("pretrained")
        log.info("%s starts from %s", cfg.model.model_name, f"the weights of {weights} (model.pretrained)"
                 if weights else "random weights (model.pretrained=null: trained from scratch)")
    del ckpt  # Lightning reads the file again, through configs/trainer's AtomicCheckpointIO
    start = time.perf_counter()
    try:
        trainer.fit(module, datamodule=datamodule, ckpt_path=cfg.get("ckpt_path"))
    except SIGTERMException:
        # Lightning ended fit after the step in progress; SaveOnTerm wrote last.ckpt there
        if trainer.is_global_zero:
            log.warning("stopped by SIGTERM at step %d; no test follows. To finish the run: %s",
                        trainer.global_step, finish_command(trainer))
        raise SystemExit(128 + signal.SIGTERM) from None  # as a shell reports a process that SIGTERM ended
    log_fit_time(trainer, time.perf_counter() - start)
    if hint := resume_hint(trainer, tested=bool(cfg.get("test"))):
        log.warning(hint)
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}

    if cfg.get("test"):
        best = load_best(trainer, module)
        trainer.test(module, datamodule=datamodule)
        metrics.update({k: float(v) for k, v in trainer.callback_metrics.items()})
        if best:
            which = "best" if trainer.checkpoint_callback.monitor else "last (model_checkpoint.monitor=null)"
            log.info("%s checkpoint %s: test/top1 %.4f", which, best, metrics.get("test/top1", float("nan")))
    return metrics


def check_mixup_batch(cfg: DictConfig) -> None:
    """Raise a ValueError for an odd batch under mixup or cutmix, which timm's Mixup pairs
    with itself flipped (its assertion would come at the first training step)."""
    mixing = (cfg.model.get("mixup_alpha") or 0) > 0 or (cfg.model.get("cutmix_alpha") or 0) > 0
    batch = cfg.data.get("batch_size")
    if mixing and isinstance(batch, int) and batch % 2:
        raise ValueError(f"data.batch_size={batch} is odd, and mixup/cutmix (model.mixup_alpha, model.cutmix_alpha) "
                         "pairs each batch's images: pass an even batch size, or model.mixup_alpha=0 "
                         "model.cutmix_alpha=0")


def check_budget_left(ckpt: dict, budget, path: str) -> None:
    """Raise a ValueError where the checkpoint's run has spent all of trainer.max_time
    already: the budget is the whole run's across resumes (TimeBudget), so fit would stop
    at once, having done nothing."""
    if budget is None:
        return
    spent = (((ckpt.get("callbacks") or {}).get("Timer") or {}).get("time_elapsed") or {}).get("train", 0.0)
    if spent >= duration_seconds(budget):
        raise ValueError(f"the run in {path} has already trained for {spent:.0f} s, all of "
                         f"trainer.max_time={budget} (a budget counts the whole run across resumes): pass "
                         "trainer.max_time=null to finish it, or a longer budget")


def log_fit_time(trainer: L.Trainer, seconds: float) -> None:
    """Say how long fit took by the wall clock, and log it as fit/wall_s at the last step.
    The training clock of the metrics (train/time, Lightning's ThroughputMonitor) counts the
    training steps alone; this one also counts the data set-up, the first steps' compilation,
    validation and checkpoints: what a user waits for. scripts/report.py adds it up over a
    run's pieces (fit_wall_s)."""
    log.info("fit took %.1f s by the wall clock (set-up, compilation, validation and checkpoints included), "
             "epoch %d, step %d", seconds, trainer.current_epoch, trainer.global_step)
    if trainer.is_global_zero:
        for logger in trainer.loggers:
            logger.log_metrics({"fit/wall_s": seconds}, step=trainer.global_step)
            logger.save()


def finish_command(trainer: L.Trainer, lift_budget: bool = False) -> str:
    """The command that continues this run from its last.ckpt: the run's own overrides (where
    the run folder went, hydra.*, left out: a resume writes a new one), `trainer.max_time=null`
    in place of the run's budget if `lift_budget`, and the checkpoint."""
    lasts = [Path(c.dirpath) / "last.ckpt" for c in trainer.checkpoint_callbacks
             if getattr(c, "filename", None) == "last" and c.dirpath]
    last = next((p for p in lasts if p.is_file()), None)
    dropped = ("ckpt_path", "trainer.max_time") if lift_budget else ("ckpt_path",)
    if HydraConfig.initialized():
        kept = [o for o in HydraConfig.get().overrides.task if o.split("=", 1)[0].lstrip("+~") not in dropped]
        overrides = " ".join(shlex.quote(o) for o in kept)
    else:
        overrides = "<the run's overrides>"
    where = shlex.quote(f"ckpt_path={last}") if last else "ckpt_path=<run>/checkpoints/last.ckpt"
    return " ".join(p for p in ("python scripts/train.py", overrides, "trainer.max_time=null" if lift_budget else "",
                                where) if p)


def resume_hint(trainer: L.Trainer, tested: bool = True) -> str | None:
    """Where trainer.max_time ended fit before trainer.max_epochs: how far it got and the
    command that finishes the run from its last checkpoint; None otherwise."""
    timer = next((c for c in trainer.callbacks if isinstance(c, Timer)), None)
    if timer is None or trainer.max_epochs is None or trainer.max_epochs < 1:
        return None
    stopped = getattr(timer, "stopped", None)  # TimeBudget's (epoch, batch, step); epochs count from 0
    if stopped is not None:  # (a stop in the last epoch leaves current_epoch at max_epochs)
        if stopped[0] >= trainer.max_epochs - 1 and stopped[1] >= trainer.num_training_batches:
            return None  # the budget ran out with the run's last batch
    elif trainer.current_epoch >= trainer.max_epochs:
        return None
    if (timer.time_remaining("train") or 0) > 0:
        return None  # stopped by something else (e.g. max_steps)
    command = finish_command(trainer, lift_budget=True)
    where_stopped = (f"after batch {stopped[1]} of epoch {stopped[0]} (epochs 0 to {trainer.max_epochs - 1}, step "
                     f"{stopped[2]})" if stopped else f"at step {trainer.global_step} of {trainer.max_epochs} epochs")
    then = "the test below scores the run as it stands" if tested else "test=false: no test follows"
    return f"trainer.max_time stopped training {where_stopped}; {then}. To finish it: {command}"


def load_best(trainer: L.Trainer, module: L.LightningModule) -> Path | None:
    """Load the best checkpoint's weights into `module` and return its path; None (testing the
    weights in memory) when there is none. The path is ModelCheckpoint's best_model_path, which
    a resumed checkpoint can set to anything: only a file inside this run's checkpoint folder is
    loaded, and weights only."""
    callback = trainer.checkpoint_callback
    named = callback.best_model_path if callback else ""
    best = run_file(named, [callback.dirpath] if callback else [])
    if named and best is None:
        raise ValueError(
            f"refusing to load the best checkpoint {named!r}: it is not a file inside this run's "
            f"checkpoint folder {callback.dirpath}. The run's checkpoints are saved; score one with "
            "`python scripts/eval.py ckpt_path=<run>/checkpoints/<file>.ckpt`")
    if best is None:
        log.warning("no best checkpoint was saved (e.g. fast_dev_run): testing the weights in memory")
        return None
    module.load_state_dict(load_training_checkpoint(best)["state_dict"])
    return best


@checked_keys(Path(__file__).resolve().parents[1] / "configs", "train")  # a mistyped key: the keys it may mean
@hydra.main(version_base="1.3", config_path="../configs", config_name="train")
@short_errors
def main(cfg: DictConfig) -> float | None:
    with run_session():  # quiet output; no run folder left by a run that fails at the start
        metrics = train(cfg)
    return metrics.get("val/top1")  # the objective of a sweeper plugin


if __name__ == "__main__":
    main()
