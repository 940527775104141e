"""Train a ViT: Hydra composes configs/train.yaml, Lightning fits, then tests the best checkpoint.

    python scripts/train.py experiment=cifar10_quick             # the CPU-sized recipe
    python scripts/train.py attention=flash trainer=gpu          # vitflash's kernel
    python scripts/train.py -m attention=flash,sdpa,naive        # a sweep, one folder per job
    python scripts/train.py ckpt_path=<run>/checkpoints/last.ckpt  # resume

Every run writes config, checkpoints and metrics into its own folder (configs/hydra/).
"""
from __future__ import annotations

import logging

import hydra
import lightning as L
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig

from vitflash.cli import run_session
from vitflash.module import read_checkpoint

log = logging.getLogger(__name__)


def build(cfg: DictConfig, extra_callbacks: list[L.Callback] = ()) -> tuple[L.LightningDataModule, L.LightningModule, L.Trainer]:
    """The DataModule, ViTModule and Trainer (with the configured callbacks, then
    `extra_callbacks`, and loggers) that `cfg` describes; a callback or logger set to null
    is left out."""
    datamodule = instantiate(cfg.data, _convert_="all")
    datamodule.check_data()  # a missing dataset stops the run before pretrained weights are fetched
    module = instantiate(cfg.model, _convert_="all")
    callbacks = [instantiate(c, _convert_="all") for c in (cfg.get("callbacks") or {}).values() if c is not None]
    loggers = [instantiate(c, _convert_="all") for c in (cfg.get("logger") or {}).values() if c is not None]
    trainer: L.Trainer = instantiate(cfg.trainer, callbacks=[*callbacks, *extra_callbacks], logger=loggers or False,
                                     _convert_="all")
    return datamodule, module, trainer


def train(cfg: DictConfig) -> dict[str, float]:
    """Fit and test as `cfg` (a composed configs/train.yaml) says; returns the last logged
    metrics (train/*, val/*, and test/* of the best checkpoint)."""
    if cfg.get("seed") is not None:
        L.seed_everything(cfg.seed, workers=True)
    torch.set_float32_matmul_precision(cfg.matmul_precision)
    if cfg.get("ckpt_path"):
        read_checkpoint(cfg.ckpt_path, training=True)  # a missing or corrupt file stops the run before any work

    datamodule, module, trainer = build(cfg)
    trainer.fit(module, datamodule=datamodule, ckpt_path=cfg.get("ckpt_path"))
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}

    if cfg.get("test"):
        best = trainer.checkpoint_callback.best_model_path if trainer.checkpoint_callback else ""
        if not best:
            log.warning("no best checkpoint was saved (e.g. fast_dev_run): testing the weights in memory")
        trainer.test(module, datamodule=datamodule, ckpt_path=best or None)
        metrics.update({k: float(v) for k, v in trainer.callback_metrics.items()})
        if best:
            log.info("best checkpoint %s: test/top1 %.4f", best, metrics.get("test/top1", float("nan")))
    return metrics


@hydra.main(version_base="1.3", config_path="../configs", config_name="train")
def main(cfg: DictConfig) -> float | None:
    with run_session():  # quiet output; no run folder left by a run that fails at the start
        metrics = train(cfg)
    return metrics.get("val/top1")  # the objective of a sweeper plugin


if __name__ == "__main__":
    main()
