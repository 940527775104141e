"""scripts/gc_pause.py on the CPU: a full collection walks fewer objects once they are frozen."""
from __future__ import annotations

import gc

from test_train import load_script


def test_freezing_shortens_a_full_collection(capsys):
    result = load_script("gc_pause").main(["--model", "vit_micro_patch4_32", "--no-compile", "--steps", "1"])
    assert result["objects_tracked"] > 10_000  # torch, timm, the model: the heap a collection walks
    assert result["after_freeze"]["median_ms"] < result["before_freeze"]["median_ms"] / 10
    assert gc.get_freeze_count() == 0  # the script thaws what it froze
    assert '"before_freeze"' in capsys.readouterr().out
