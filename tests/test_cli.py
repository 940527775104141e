"""vitflash/cli.py and the order of checks in train.py: what a run prints and what a failed
start leaves behind. (The CLI runs of test_train.py and test_report.py check the printed
output of real runs, single-process, DDP and a sweep, with `assert_quiet`.)"""
from __future__ import annotations

import logging

import pytest
from lightning.pytorch.utilities.model_summary import summarize

import vitflash.pretrained
from test_configs import build, compose_cfg
from test_train import train
from vitflash.cli import ModelSummary


def test_missing_data_stops_before_the_pretrained_weights(tmp_path, monkeypatch):
    monkeypatch.setattr(vitflash.pretrained, "_create_from_timm",
                        lambda *a, **k: pytest.fail("the weights were fetched before the data was checked"))
    cfg = compose_cfg(tmp_path, ["experiment=imagenette_finetune", "trainer=cpu"])
    with pytest.raises(FileNotFoundError, match="no ImageFolder tree at .*prepare_data.py --archive"):
        train(cfg)


def test_model_summary_without_flops(tmp_path):
    _, module, _ = build(compose_cfg(tmp_path, ["data=synthetic", "trainer=cpu", "attention=sdpa"]))
    summary = summarize(module, max_depth=1)
    lines = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    logger = logging.getLogger(ModelSummary.__mro__[1].__module__)  # Lightning's, which does not propagate
    logger.addHandler(handler)
    try:
        ModelSummary.summarize(summary._get_summary_data(), summary.total_parameters, summary.trainable_parameters,
                               summary.model_size, summary.total_training_modes, total_flops=0)
    finally:
        logger.removeHandler(handler)
    (text,) = lines
    assert "FLOPs" not in text and "Flops" not in text
    assert "VisionTransformer" in text and "Total params" in text and "Mode" in text
