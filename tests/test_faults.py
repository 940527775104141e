"""Faults and bad inputs, each answered clearly and none accepted silently:

- a run SIGKILLed, resumed from its epoch-boundary or mid-epoch checkpoint, reaches the kill
  point in the same state, bit for bit, as the uninterrupted process (naive and sdpa, synthetic
  and real CIFAR-10 images), whatever the number of loader workers;
- a kill while a checkpoint is written leaves the old file or the new one, whole;
- paths recorded inside a checkpoint (best_model_path) are never loaded from outside the run;
- archives that are truncated or damaged unpack nothing;
- bad values, checkpoints and data stop before any work with a message naming the value, the
  reason and the fix.
"""
from __future__ import annotations

import csv
import json
import logging
import os
import re
import signal
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import torch

from test_configs import compose_cfg
from test_train import cifar_slice, evaluate, load_script, run_cli, train  # noqa: F401 (cifar_slice: a fixture)

import vitflash.checkpoint as ckpt_io
import vitflash.ops
from vitflash.pretrained import CheckpointError

REPO = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
prepare = load_script("prepare_data")

# 3 steps per epoch, 2 epochs; every random consumer on: augmentation (pad crop, flip), drop
# path, dropout, mixup/cutmix (numpy's global RNG), warmup then cosine.
STEPS, EPOCHS, KILL_AT = 3, 2, 5  # the kill lands mid-epoch 1, after its 2nd step
RUN = ["trainer=cpu", "test=false", "callbacks.progress_bar=null", "++trainer.num_sanity_val_steps=0", f"trainer.max_epochs={EPOCHS}", "++trainer.limit_val_batches=1",
       "trainer.log_every_n_steps=1", "model.drop_path_rate=0.1", "model.drop_rate=0.1",
       "model.mixup_alpha=0.8", "model.cutmix_alpha=1.0", "model.warmup_epochs=0.5",
       "callbacks.step_checkpoint.every_n_train_steps=1"]
# 16 px images in batches of 8 (17 tokens): each step costs milliseconds, not seconds
DATA = {
    "synthetic": ["data=synthetic", f"data.train_size={8 * STEPS}", "data.test_size=16", "data.batch_size=8",
                  "data.img_size=16"],
    "cifar": ["data.val_size=80", "data.batch_size=8", "data.img_size=16", "data.num_workers=0",
              "data.expected_sizes=null", f"++trainer.limit_train_batches={STEPS}"],
}


def subprocess_env(**extra) -> dict:
    # the same thread count as this process: CPU sums may be split differently across threads
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(TESTS)]), "HYDRA_FULL_ERROR": "0",
            "OMP_NUM_THREADS": str(torch.get_num_threads()), **extra}


def state(path: Path) -> dict[str, torch.Tensor]:
    """Everything a checkpoint holds that decides the rest of the run: weights, AdamW moments,
    random generator states, the loader's position."""
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    opt = ckpt["optimizer_states"][0]["state"]
    rng = ckpt["callbacks"]["RNGState"]
    loader = ckpt[next(k for k in ckpt if k.endswith("DataModule"))]
    loader = loader.get("train_loader", loader)  # the gpu pipeline's DataModule keeps its loader's state
    return {**ckpt["state_dict"], **{f"adam.{i}.{k}": v for i, s in opt.items() for k, v in s.items()},
            "rng.torch": rng["torch"], "rng.numpy": rng["numpy"]["keys"],
            "rng.python": torch.tensor(rng["python"][1]), "global_step": torch.tensor(ckpt["global_step"]),
            **{f"loader.{k}": torch.tensor(v) for k, v in loader.items()}}


def assert_identical(a: Path, b: Path, what: str) -> None:
    sa, sb = state(a), state(b)
    assert sa.keys() == sb.keys()
    differ = [k for k in sa if not torch.equal(sa[k], sb[k])]
    assert not differ, f"{what}: {len(differ)} of {len(sa)} tensors differ, e.g. {differ[:3]}"


@pytest.mark.parametrize("data", ["synthetic", "cifar"])
@pytest.mark.parametrize("attention", ["naive", "sdpa"])
def test_sigkill_then_resume_is_bit_identical(request, tmp_path, data, attention, extra: tuple[str, ...] = ()):
    """A run SIGKILLed mid-epoch 1 leaves a checkpoint per step and last.ckpt (end of epoch 0);
    resumed from the epoch boundary and from mid-epoch, training reaches the kill point in the
    same state, bit for bit, as the uninterrupted process did: weights, AdamW moments, RNGs,
    loader position (from there on the same state gives the same run)."""
    overrides = [*RUN, *DATA[data], f"attention={attention}", *extra]
    if data == "cifar":
        overrides.append(f"paths.data_dir={request.getfixturevalue('cifar_slice')}")
    killed = tmp_path / "killed"
    result = subprocess.run(
        [sys.executable, "scripts/train.py", *overrides, f"hydra.run.dir={killed}",
         "callbacks.step_checkpoint.save_top_k=-1", "callbacks.step_checkpoint.filename='{step}'",
         "+callbacks.kill._target_=killswitch.KillAtStep", f"+callbacks.kill.step={KILL_AT}"],
        cwd=REPO, capture_output=True, text=True, timeout=300, env=subprocess_env())
    assert result.returncode == -signal.SIGKILL, result.stderr[-3000:]
    folder = killed / "checkpoints"
    assert torch.load(folder / "last.ckpt", weights_only=True)["global_step"] == STEPS  # end of epoch 0
    uninterrupted = folder / f"step={KILL_AT}.ckpt"

    for i, start in enumerate(["last.ckpt", f"step={KILL_AT - 1}.ckpt"]):  # an epoch boundary, mid-epoch
        out = tmp_path / f"resumed{i}"
        train(compose_cfg(out, [*overrides, f"ckpt_path='{folder / start}'", "callbacks.step_checkpoint.save_top_k=-1",
                                "callbacks.step_checkpoint.filename='{step}'",
                                "+callbacks.stop._target_=killswitch.StopAtStep", f"+callbacks.stop.step={KILL_AT}"]))
        assert_identical(uninterrupted, out / "out" / "checkpoints" / f"step={KILL_AT}.ckpt", f"resumed from {start}")


def test_sigkill_then_resume_with_ema_is_bit_identical(request, tmp_path):
    """The same with the EMA of the weights (model.ema_decay), whose warmup makes every update's
    decay depend on the step count: the resumed EMA is the uninterrupted one, bit for bit."""
    test_sigkill_then_resume_is_bit_identical(request, tmp_path, "synthetic", "sdpa",
                                              ("model.ema_decay=0.9", "model.ema_warmup=true"))
    ema = [k for k in state(tmp_path / "killed" / "checkpoints" / f"step={KILL_AT}.ckpt") if k.startswith("ema.module.")]
    assert ema  # compared above with the rest of the checkpoint


@pytest.mark.parametrize("stop_at, every, pipeline", [(1, 1, "cpu"), (STEPS, 1, "cpu"), (STEPS, 2, "cpu"), (1, 1, "gpu")],
                         ids=["mid-epoch", "at an epoch's end", "at an epoch's end between validations",
                              "mid-epoch, the gpu data pipeline"])
def test_time_budget_stop_then_resume_is_bit_identical(tmp_path, stop_at, every, pipeline):
    """trainer.max_time ends fit after step `stop_at` (mid-epoch 0, or its last step), with
    validation and checkpoints every `every` epochs, the data through either pipeline (the gpu
    one runs on CPU tensors here); the command train.py prints to finish the
    run resumes from last.ckpt, and the run ends in the same state, bit for bit, as one without
    the stop. (Lightning's own Timer closed the epoch early at the stop: with validation every
    epoch its checkpoint marked epoch 0 done and the resumed run skipped the rest of it; between
    validations it wrote no checkpoint at all.)"""
    overrides = [o for o in RUN if not o.startswith("callbacks.step_checkpoint")] + [
        *DATA["synthetic"], f"data.pipeline={pipeline}", "attention=sdpa", f"++trainer.check_val_every_n_epoch={every}",
        f"++callbacks.model_checkpoint.every_n_epochs={every}", f"++callbacks.last_checkpoint.every_n_epochs={every}"]
    train(compose_cfg(tmp_path / "whole", overrides))
    stopped = tmp_path / "stopped" / "out" / "checkpoints" / "last.ckpt"
    train(compose_cfg(tmp_path / "stopped", [*overrides, "trainer.max_time=00:01:00:00",
                                             "+callbacks.spend._target_=killswitch.SpendBudgetAtStep",
                                             f"+callbacks.spend.step={stop_at}"]))
    assert torch.load(stopped, map_location="cpu", weights_only=True)["global_step"] == stop_at
    train(compose_cfg(tmp_path / "resumed", [*overrides, "trainer.max_time=null", f"ckpt_path='{stopped}'"]))
    whole = tmp_path / "whole" / "out" / "checkpoints" / "last.ckpt"
    assert torch.load(whole, map_location="cpu", weights_only=True)["global_step"] == EPOCHS * STEPS
    assert_identical(whole, tmp_path / "resumed" / "out" / "checkpoints" / "last.ckpt", f"stopped after step {stop_at}")


def test_time_budget_stop_in_the_last_epoch_says_how_to_finish(tmp_path, caplog):
    """A budget that runs out inside the run's last epoch (where Lightning has already moved
    current_epoch to max_epochs) still ends with the command that finishes the run; one that
    runs out with the last batch does not ask for more."""
    overrides = [o for o in RUN if not o.startswith("callbacks.step_checkpoint")] + [
        *DATA["synthetic"], "attention=sdpa", "trainer.max_time=00:01:00:00",
        "+callbacks.spend._target_=killswitch.SpendBudgetAtStep"]
    for step, hinted in ((EPOCHS * STEPS - 2, True), (EPOCHS * STEPS, False)):
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            train(compose_cfg(tmp_path / str(step), [*overrides, f"+callbacks.spend.step={step}"]))
        hints = [r.getMessage() for r in caplog.records if "To finish it" in r.getMessage()]
        assert bool(hints) == hinted, (step, hints)
        if hinted:
            assert f"after batch {STEPS - 2} of epoch {EPOCHS - 1} (epochs 0 to {EPOCHS - 1}, step {step})" in hints[0]


# --------------------------------------------------------------------------------------
# Bad values: each stops before any data is read, naming the value, the reason and the fix

TINY = ["data=synthetic", "data.train_size=24", "data.test_size=16", "data.batch_size=8", "data.img_size=16",
        "trainer=cpu", "trainer.max_epochs=1", "callbacks.progress_bar=null", "attention=sdpa",
        "++trainer.num_sanity_val_steps=0"]
NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")

BAD_VALUES = [
    (["data.num_classes=-1"], "data.num_classes=-1 is not a whole number >= 1"),
    (["data.num_classes=0"], "data.num_classes=0 is not a whole number >= 1"),
    (["data.num_classes=abc"], "data.num_classes='abc' is not a whole number"),
    (["data.img_size=0"], "data.img_size=0 is not a whole number >= 1"),
    (["data.batch_size=0"], "data.batch_size=0 is not a whole number >= 1"),
    (["++data.val_size=-5"], "data.val_size=-5 is not a whole number >= 0"),
    (["data.num_workers=-1"], "data.num_workers=-1 is not a whole number >= 0"),
    (["data.aug_repeats=0"], "data.aug_repeats=0 is not a whole number >= 1"),
    (["model.num_classes=-1"], r"num_classes=-1 is not a whole number >= 0 \(0 leaves the head out\)"),
    (["model.img_size=0"], "img_size=0 is not a whole number >= 1"),
    (["model.img_size=-4"], "img_size=-4 is not a whole number >= 1"),
    (["model.img_size=30"], "image size 30 is not divisible by patch size 4"),
    (["model.drop_path_rate=1.5"], r"drop_path_rate=1.5 is not in \[0, 1\)"),
    (["model.model_name=vit_nope"], "unknown model 'vit_nope': choose one of"),
    (["trainer.max_epochs=abc"], "trainer.max_epochs='abc' is not a whole number >= 1 .* trainer.max_epochs=10"),
    (["trainer.max_epochs=0"], "trainer.max_epochs=0 is not a whole number"),
    (["++trainer.limit_train_batches=-1"], "trainer.limit_train_batches=-1 is neither a fraction"),
    (["++trainer.limit_val_batches=abc"], "trainer.limit_val_batches='abc' is neither a fraction"),
    (["trainer.max_time=9min"], "trainer.max_time='9min' is not a time budget .* trainer.max_time=00:00:09:00"),
    (["trainer.max_time=00:09"], "trainer.max_time='00:09' is not a time budget"),
    (["trainer.max_time=00:00:00:00"], "trainer.max_time='00:00:00:00' is not a time budget longer than zero"),
    (["trainer.max_epochs=-1"], r"trainer.max_epochs=-1 \(no epoch limit\) needs trainer.max_steps"),
    (["++trainer.gradient_clip_val=-1.0"], r"trainer.gradient_clip_val=-1.0 is not a number >= 0"),
    (["++trainer.accumulate_grad_batches=0"], "trainer.accumulate_grad_batches=0 is not a whole number >= 1"),
    (["++trainer.check_val_every_n_epoch=0"], "trainer.check_val_every_n_epoch=0 is not a whole number >= 1"),
    (["data.batch_size=7", "model.mixup_alpha=0.8"], "data.batch_size=7 is odd, and mixup/cutmix"),
    pytest.param(["trainer=gpu"], "trainer.accelerator=gpu .* needs a CUDA GPU.* use trainer=cpu", marks=NO_CUDA),
    pytest.param(["trainer=cpu", "attention=flash"], "attention=flash needs a CUDA GPU", marks=NO_CUDA),
    (["data=imagenet"], r"no ImageFolder tree at .*imagenet: .*Put the dataset there in that layout"),
    (["data=cifar10"], r"cifar10 not found under .*prepare_data.py --archive"),
]


@pytest.mark.parametrize("overrides, message", BAD_VALUES, ids=lambda v: " ".join(v) if isinstance(v, list) else "")
def test_bad_value_stops_before_any_work(tmp_path, overrides, message):
    base = TINY[5:] if overrides[0].startswith("data=") else TINY  # another dataset: not synthetic's keys
    cfg = compose_cfg(tmp_path, [*base, *overrides])
    with pytest.raises(Exception) as error:
        train(cfg)
    cause = error.value.__cause__ or error.value  # hydra's instantiate wraps constructor errors
    assert isinstance(cause, (ValueError, TypeError, OSError, RuntimeError)), repr(cause)
    assert re.search(message, str(cause)), str(cause)
    assert not (tmp_path / "out" / "checkpoints").exists()  # nothing trained


def test_config_errors_are_one_short_message(monkeypatch, capsys):
    """A config error is one paragraph on stderr and exit status 1, no traceback;
    HYDRA_FULL_ERROR=1 brings the traceback back (the command line: see the eval test below)."""
    from vitflash.cli import short_errors

    def bad(cfg):
        raise ValueError("trainer.max_epochs='abc' is not a whole number")

    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    with pytest.raises(SystemExit) as exit_:
        short_errors(bad)(None)
    err = capsys.readouterr().err
    assert exit_.value.code == 1 and err.startswith("Error: trainer.max_epochs='abc'") and "Traceback" not in err
    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")
    with pytest.raises(ValueError, match="max_epochs"):
        short_errors(bad)(None)


# --------------------------------------------------------------------------------------
# Checkpoints given to train.py (resume) and eval.py


@pytest.fixture(scope="module")
def tiny_ckpt(tmp_path_factory) -> Path:
    """last.ckpt of a 1-epoch (3-step) run on the TINY config."""
    out = tmp_path_factory.mktemp("tiny")
    train(compose_cfg(out, [*TINY, "test=false"]))
    return out / "out" / "checkpoints" / "last.ckpt"


def crafted(src: Path, dst: Path, edit) -> Path:
    ckpt = torch.load(src, map_location="cpu", weights_only=True)
    edit(ckpt)
    torch.save(ckpt, dst)
    return dst


def poison(value: float):
    def edit(ckpt):
        ckpt["state_dict"]["model.blocks.0.attn.qkv.weight"][0, 0] = value
    return edit


RESUME_FAULTS = {
    "another architecture": (["model.model_name=vit_tiny_patch4_32"], None,
                             "was trained with another model .*model_name: checkpoint 'vit_micro_patch4_32'.*"
                             "model.pretrained="),
    "another class count": (["data.num_classes=5"], None, "num_classes: checkpoint 10, config 5"),
    "NaN weights": ([], poison(float("nan")), "holds NaN or inf weights .*blocks.0.attn.qkv.weight"),
    "no epochs left": (["trainer.max_epochs=1"], None, "has finished 1 epochs and trainer.max_epochs=1: there is nothing"),
    "a folder": ([], "folder", "is a folder, not a file: pass a checkpoint file inside it"),
    "a missing file": ([], "missing", "does not exist: check the path"),
    "a truncated file": ([], "truncated", "it is truncated, corrupt, or not a PyTorch"),
    "weights without hyper-parameters": ([], "weights", "is not a checkpoint of scripts/train.py"),
}


@pytest.mark.parametrize("fault", list(RESUME_FAULTS))
def test_resume_from_a_bad_checkpoint_stops_at_once(tiny_ckpt, tmp_path, fault):
    overrides, edit, message = RESUME_FAULTS[fault]
    path = tmp_path / "bad.ckpt"
    if edit == "folder":
        path = tiny_ckpt.parent
    elif edit == "truncated":
        path.write_bytes(tiny_ckpt.read_bytes()[:4000])
    elif edit == "weights":
        torch.save(torch.load(tiny_ckpt, weights_only=True)["state_dict"], path)
    elif callable(edit):
        crafted(tiny_ckpt, path, edit)
    elif edit is None:
        path = tiny_ckpt
    cfg = compose_cfg(tmp_path, [*TINY, "trainer.max_epochs=2", *overrides, f"ckpt_path={path}"])
    with pytest.raises((ValueError, OSError)) as error:
        train(cfg)
    assert re.search(message, str(error.value)), str(error.value)
    assert not (tmp_path / "out" / "checkpoints").exists()


def test_resume_of_a_run_that_validates_every_other_epoch_knows_it_finished(tmp_path):
    """With validation every n > 1 epochs, Lightning saves the checkpoint at validation's end,
    inside the last epoch, before that epoch counts as processed: the run has still finished
    its epochs, and a resume with the same max_epochs has nothing to train."""
    first = tmp_path / "first"
    first.mkdir()
    train(compose_cfg(first, [*TINY, "trainer.max_epochs=2", "+trainer.check_val_every_n_epoch=2", "test=false"]))
    last = first / "out" / "checkpoints" / "last.ckpt"
    saved = torch.load(last, map_location="cpu", weights_only=True)["loops"]["fit_loop"]
    assert saved["epoch_progress"]["current"]["processed"] == 1  # the case: the 2nd epoch not yet counted
    cfg = compose_cfg(tmp_path, [*TINY, "trainer.max_epochs=2", f"ckpt_path={last}"])
    with pytest.raises(ValueError, match="has finished 2 epochs and trainer.max_epochs=2: there is nothing"):
        train(cfg)
    assert not (tmp_path / "out" / "checkpoints").exists()


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_eval_refuses_non_finite_weights(tiny_ckpt, tmp_path, value):
    bad = crafted(tiny_ckpt, tmp_path / "bad.ckpt", poison(value))
    with pytest.raises(CheckpointError, match="holds NaN or inf weights"):
        evaluate(compose_cfg(tmp_path, [f"ckpt_path={bad}", *TINY[:5], "trainer=cpu"], "eval"))
    if value != value:  # once on the command line: exit status 1 and one message, not "loss: NaN" and 0
        result = run_cli("eval", f"ckpt_path={bad}", *TINY[:5], "trainer=cpu", f"hydra.run.dir={tmp_path}")
        assert result.returncode == 1 and "Error: checkpoint" in result.stderr, result.stderr[-2000:]
        assert "holds NaN or inf weights" in result.stderr and "Traceback" not in result.stderr


def test_eval_scores_a_checkpoint_of_a_graph_step_run_anywhere(tiny_ckpt, tmp_path):
    """model.graph_step captures the training step (on one GPU, by default): a checkpoint of
    such a run evaluates on a machine without CUDA, which could not train it that way."""
    ckpt = crafted(tiny_ckpt, tmp_path / "graph_step.ckpt",
                   lambda c: c["hyper_parameters"].update(graph_step=True))
    metrics = evaluate(compose_cfg(tmp_path, [f"ckpt_path={ckpt}", *TINY[:5], "trainer=cpu"], "eval"))
    plain = evaluate(compose_cfg(tmp_path / "plain", [f"ckpt_path={tiny_ckpt}", *TINY[:5], "trainer=cpu"], "eval"))
    assert metrics["top1"] == plain["top1"] and metrics["loss"] == plain["loss"]


def test_eval_under_ddp_writes_and_prints_once_and_names_the_repeats(tiny_ckpt, tmp_path):
    """eval.py on two processes (gloo): one JSON line and one eval.json, from rank 0, and a
    warning that the sampler's repeated images count in top-1."""
    run = tmp_path / "ddp"
    result = run_cli("eval", f"ckpt_path={tiny_ckpt}", *TINY[:5], "data.test_size=17", "trainer=ddp",
                     "trainer.accelerator=cpu", "trainer.devices=2", f"hydra.run.dir={run}", timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 1 and json.loads(lines[0]) == json.loads((run / "eval.json").read_text())
    assert "2 processes: the sampler repeats up to 1 images" in result.stdout + result.stderr


def test_eval_and_export_name_a_missing_checkpoint_in_one_line(tmp_path):
    """eval.py without ckpt_path, and export_timm.py on a damaged file: exit status 1 and one
    message saying what to pass, no traceback."""
    result = run_cli("eval", f"hydra.run.dir={tmp_path / 'run'}")
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert "Error: eval.py scores a checkpoint: pass ckpt_path=<run dir>/checkpoints/" in result.stderr
    bad = tmp_path / "bad.ckpt"
    bad.write_text("not a checkpoint\n")
    result = run_cli("export_timm", str(bad), "--out", str(tmp_path / "x.safetensors"))
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert f"Error: cannot read checkpoint {bad}: it is truncated, corrupt" in result.stderr
    assert not (tmp_path / "x.safetensors").exists()


class Payload:
    """Unpickled in full, this touches a file: proof that a path was loaded unsafely."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return Path.touch, (self.marker,)


@pytest.mark.parametrize("where", ["an http URL", "a file outside the run"])
def test_paths_inside_a_checkpoint_are_not_followed(tiny_ckpt, tmp_path, caplog, where):
    marker = tmp_path / "payload-ran"
    payload = tmp_path / "elsewhere" / "best.ckpt"
    payload.parent.mkdir()
    torch.save({"state_dict": {}, "x": Payload(marker)}, payload)
    target = "http://127.0.0.1:9/best.ckpt" if where == "an http URL" else str(payload)

    def edit(ckpt):
        for state in ckpt["callbacks"].values():
            if "best_model_path" in state:
                state.update(best_model_path=target, best_k_models={target: torch.tensor(1.0)})
    (tmp_path / "previous-run").mkdir()
    resumed = crafted(tiny_ckpt, tmp_path / "previous-run" / "last.ckpt", edit)
    with caplog.at_level("WARNING"):
        metrics = train(compose_cfg(tmp_path, [*TINY, "trainer.max_epochs=2", f"ckpt_path={resumed}"]))
    assert not marker.exists()
    warned = [r.getMessage() for r in caplog.records if "ignoring the checkpoint paths" in r.getMessage()]
    assert any(repr(target) in m for m in warned), caplog.text
    assert "test/top1" in metrics  # tested this run's own best checkpoint instead
    assert payload.is_file()  # and deleted nothing it named


def test_resume_with_more_epochs_replans_the_schedule(tiny_ckpt, tmp_path, caplog):
    """The 1-epoch run ended its cosine at min_lr; resumed with max_epochs=3 the cosine is
    stretched over 9 steps, so the 4th step runs at the new plan's LR, not at min_lr."""
    with caplog.at_level("INFO"):
        train(compose_cfg(tmp_path, [*TINY, "trainer.max_epochs=3", "test=false", "trainer.log_every_n_steps=1",
                                     f"ckpt_path={tiny_ckpt}"]))
    assert "LR schedule re-planned from 3 to 9 steps" in caplog.text
    assert "ignoring the checkpoint paths" not in caplog.text  # the previous run's own paths: no alarm
    # said once, naming the folder that the best, last and periodic checkpoints share once
    afresh = [r.getMessage() for r in caplog.records if "tracked afresh" in r.getMessage()]
    assert len(afresh) == 1 and afresh[0].count("checkpoints") == 1, afresh
    rows = csv.DictReader((tmp_path / "out" / "csv" / "metrics.csv").open())
    lrs = [float(v) for r in rows for k, v in r.items() if k.startswith("lr-") and v]
    min_lr = compose_cfg(tmp_path, TINY).model.min_lr
    assert lrs and lrs[0] > 10 * min_lr, lrs


@pytest.mark.parametrize("before_step, every, pipeline", [(1, 1, "cpu"), (STEPS - 1, 1, "cpu"), (STEPS - 1, 2, "cpu"),
                                                        (1, 1, "gpu")],
                         ids=["mid-epoch", "on an epoch's last step", "on an epoch's last step between validations",
                              "mid-epoch, the gpu data pipeline"])
def test_sigterm_then_resume_is_bit_identical(tmp_path, before_step, every, pipeline):
    """SIGTERM reaches the process before step `before_step` + 1 runs: Lightning finishes that
    step and ends fit; last.ckpt is written at it, train.py prints the command that finishes
    the run and exits with 143 (128 + SIGTERM), and that command ends in the same state, bit
    for bit, as a run without the signal."""
    overrides = [o for o in RUN if not o.startswith("callbacks.step_checkpoint")] + [
        *DATA["synthetic"], f"data.pipeline={pipeline}", "attention=sdpa", f"++trainer.check_val_every_n_epoch={every}",
        f"++callbacks.model_checkpoint.every_n_epochs={every}", f"++callbacks.last_checkpoint.every_n_epochs={every}"]
    train(compose_cfg(tmp_path / "whole", overrides))
    run = tmp_path / "signalled"
    result = subprocess.run(
        [sys.executable, "scripts/train.py", *overrides, f"hydra.run.dir={run}",
         "+callbacks.term._target_=killswitch.TermAtStep", f"+callbacks.term.step={before_step}"],
        cwd=REPO, capture_output=True, text=True, timeout=300, env=subprocess_env())
    assert result.returncode == 128 + signal.SIGTERM, result.stderr[-3000:]
    last = run / "checkpoints" / "last.ckpt"
    assert torch.load(last, map_location="cpu", weights_only=True)["global_step"] == before_step + 1
    (line,) = [x for x in (result.stdout + result.stderr).splitlines() if "stopped by SIGTERM" in x]
    assert f"at step {before_step + 1}; no test follows. To finish the run: python scripts/train.py " in line
    assert line.endswith(f"ckpt_path={last}") and "killswitch" in line  # the run's own overrides
    train(compose_cfg(tmp_path / "resumed", [*overrides, f"ckpt_path='{last}'"]))
    assert_identical(tmp_path / "whole" / "out" / "checkpoints" / "last.ckpt",
                     tmp_path / "resumed" / "out" / "checkpoints" / "last.ckpt", f"signalled before step {before_step + 1}")


def test_stops_wait_for_the_accumulations_last_batch(tmp_path):
    """With trainer.accumulate_grad_batches=2 the gradients of an accumulation's first batch
    are in no checkpoint: a time budget spent after that batch, and a SIGTERM that reaches
    the process before it, end fit after the accumulation's second batch (optimizer step 1)
    instead; each run resumed from its last.ckpt ends as the run without the stop, bit for
    bit (with the stop after batch 0, 0.003 apart before)."""
    overrides = [o for o in RUN if not o.startswith("callbacks.step_checkpoint")] + [
        *DATA["synthetic"], "attention=sdpa", "++trainer.accumulate_grad_batches=2"]
    train(compose_cfg(tmp_path / "whole", overrides))
    stopped = tmp_path / "stopped" / "out" / "checkpoints" / "last.ckpt"
    train(compose_cfg(tmp_path / "stopped", [*overrides, "trainer.max_time=00:01:00:00",
                                             "+callbacks.spend._target_=killswitch.SpendBudgetAtBatch",
                                             "+callbacks.spend.step=0"]))
    run = tmp_path / "signalled"
    result = subprocess.run(
        [sys.executable, "scripts/train.py", *overrides, f"hydra.run.dir={run}",
         "+callbacks.term._target_=killswitch.TermAtStep", "+callbacks.term.step=0"],
        cwd=REPO, capture_output=True, text=True, timeout=300, env=subprocess_env())
    assert result.returncode == 128 + signal.SIGTERM, result.stderr[-3000:]
    whole = tmp_path / "whole" / "out" / "checkpoints" / "last.ckpt"
    for name, last in (("budget", stopped), ("sigterm", run / "checkpoints" / "last.ckpt")):
        assert torch.load(last, map_location="cpu", weights_only=True)["global_step"] == 1, name
        train(compose_cfg(tmp_path / f"resumed_{name}", [*overrides, "trainer.max_time=null", f"ckpt_path='{last}'"]))
        assert_identical(whole, tmp_path / f"resumed_{name}" / "out" / "checkpoints" / "last.ckpt", name)


def test_time_budget_stop_under_ddp(tmp_path):
    """Two processes (gloo): rank 0's clock decides, both write their part of last.ckpt at the
    stopping step, mid-epoch, and the stop is reported once."""
    run = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "scripts/train.py", "data=synthetic", "data.train_size=256", "data.batch_size=32", "trainer=ddp",
         "trainer.accelerator=cpu", "trainer.devices=2", "trainer.max_epochs=2", "trainer.precision=32-true",
         "attention=sdpa", "test=false", "trainer.max_time=00:01:00:00",
         "+callbacks.spend._target_=killswitch.SpendBudgetAtStep", "+callbacks.spend.step=2", f"hydra.run.dir={run}"],
        cwd=REPO, capture_output=True, text=True, timeout=300, env=subprocess_env())
    assert result.returncode == 0, result.stderr[-3000:]
    output = result.stdout + result.stderr
    assert output.count("trainer.max_time reached after batch 2 of epoch 0 (step 2)") == 1, output[-3000:]
    assert torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)["global_step"] == 2


def test_resume_from_a_validation_checkpoint_logs_each_epoch_once(tmp_path):
    """last.ckpt written after validation (as with validation every n epochs), before the
    epoch's end: Lightning runs that end again when it resumes. The train metrics are logged
    once per epoch trained, none for the replayed end (it logged train/top1 = 0 before)."""
    last = ["++callbacks.last_checkpoint.save_on_train_epoch_end=false", "test=false"]
    train(compose_cfg(tmp_path / "first", [*TINY, *last]))
    train(compose_cfg(tmp_path / "resumed", [*TINY, *last, "trainer.max_epochs=3",
                                             f"ckpt_path={tmp_path / 'first' / 'out' / 'checkpoints' / 'last.ckpt'}"]))
    rows = list(csv.DictReader((tmp_path / "resumed" / "out" / "csv" / "metrics.csv").open()))
    assert [r["epoch"] for r in rows if r.get("train/top1")] == ["1", "2"]
    assert [r["epoch"] for r in rows if r.get("train/loss_epoch")] == ["1", "2"]


# --------------------------------------------------------------------------------------
# Writing checkpoints: a kill at any moment leaves the old file or the new one, whole

SAVER = """
import sys, torch
from vitflash.checkpoint import AtomicCheckpointIO
io, path = AtomicCheckpointIO(), sys.argv[1]
for i in range(1000):
    print("saving", i, flush=True)
    io.save_checkpoint({"i": i, "w": torch.full((4_000_000,), float(i))}, path)
"""


def test_kill_during_checkpoint_write_leaves_a_whole_file(tmp_path):
    path = tmp_path / "last.ckpt"
    # $TMPDIR on no filesystem at all: the temporary file must live beside the checkpoint
    child = subprocess.Popen([sys.executable, "-c", SAVER, str(path)], stdout=subprocess.PIPE, text=True,
                             env=subprocess_env(TMPDIR=str(tmp_path / "no-such-dir")))
    try:
        for line in child.stdout:
            if line.strip() == "saving 3":
                break
        child.send_signal(signal.SIGKILL)  # while the 4th checkpoint (16 MB) is being written
    finally:
        child.wait(timeout=60)
    assert child.returncode == -signal.SIGKILL
    ckpt = ckpt_io.AtomicCheckpointIO().load_checkpoint(path)
    assert ckpt["i"] >= 2 and torch.equal(ckpt["w"], torch.full((4_000_000,), float(ckpt["i"])))


def test_failed_write_keeps_the_old_checkpoint(tmp_path):
    io, path = ckpt_io.AtomicCheckpointIO(), tmp_path / "last.ckpt"
    io.save_checkpoint({"i": 1}, path)
    with pytest.raises(Exception):
        io.save_checkpoint({"i": 2, "unpicklable": lambda: None}, path)
    assert io.load_checkpoint(path) == {"i": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]  # no temporary file left
    assert oct(path.stat().st_mode & 0o777) == oct(0o666 & ~_umask())


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_checkpoint_io_refuses_remote_and_foreign_paths(tmp_path):
    io = ckpt_io.AtomicCheckpointIO()
    with pytest.raises(CheckpointError, match="not a local file: vitflash resumes only from local"):
        io.load_checkpoint("http://127.0.0.1:9/last.ckpt")
    precious = tmp_path / "notes.txt"
    precious.write_text("keep")
    with pytest.raises(CheckpointError, match="refusing to delete"):
        io.remove_checkpoint(precious)
    assert precious.read_text() == "keep"


# --------------------------------------------------------------------------------------
# Unpacking archives: nothing lands in the root unless the whole archive reads back intact


def jpeg_tree(root: Path, classes: int, per_class: dict[str, int], name: str = "cifar10") -> Path:
    """root/<name>/<split>/<class>/<i>.jpg: 32x32 JPEGs, `per_class[split]` per class."""
    from PIL import Image

    for split, n in per_class.items():
        for c in range(classes):
            folder = root / name / split / f"class{c}"
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(n):
                Image.new("RGB", (32, 32), (25 * c, 7 * i, 100)).save(folder / f"{i}.jpg")
    return root


@pytest.fixture(scope="module")
def archive(tmp_path_factory) -> Path:
    """A tar.gz of a small JPEG tree (3 classes x 4 train / 2 test images), the same bytes in
    every run (no times, owners or gzip timestamp in it): the damaged copies below then hit the
    same bytes each time."""
    import gzip

    def plain(member: tarfile.TarInfo) -> tarfile.TarInfo:
        member.mtime, member.uid, member.gid, member.uname, member.gname = 0, 0, 0, "", ""
        return member

    folder = tmp_path_factory.mktemp("archive")
    tree = jpeg_tree(folder / "src", 3, {"train": 4, "test": 2})
    path = folder / "tiny.tar.gz"
    with gzip.GzipFile(path, "wb", mtime=0) as gz, tarfile.open(fileobj=gz, mode="w") as tar:
        tar.add(tree / "cifar10", arcname="cifar10", filter=plain)
    return path


def damaged(archive: Path, folder: Path, how: str) -> Path:
    data = bytearray(archive.read_bytes())
    if how == "truncated":
        data = data[: len(data) // 2]
    elif how == "flipped CRC byte":
        data[-8] ^= 0xFF  # gzip's trailer: CRC32 of the uncompressed tar
    elif how == "flipped byte mid-stream":
        data[len(data) // 2] ^= 0x01
    elif how == "not a tar":
        data = bytearray(os.urandom(2048))
    path = folder / "damaged" / archive.name
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(bytes(data))
    return path


@pytest.mark.parametrize("how", ["truncated", "flipped CRC byte", "flipped byte mid-stream", "not a tar"])
def test_damaged_archive_unpacks_nothing(archive, tmp_path, capsys, how):
    root = tmp_path / "data"
    prepare.main(["--archive", str(archive), "--root", str(root)])  # a good copy first
    before = sorted(p.relative_to(root) for p in root.rglob("*"))
    with pytest.raises(SystemExit, match="truncated, damaged or not a tar archive. Nothing was unpacked"):
        prepare.main(["--archive", str(damaged(archive, tmp_path, how)), "--root", str(root)])
    assert sorted(p.relative_to(root) for p in root.rglob("*")) == before  # the good tree is intact
    fresh = tmp_path / "fresh"
    with pytest.raises(SystemExit):
        prepare.main(["--archive", str(damaged(archive, tmp_path, how)), "--root", str(fresh)])
    assert not any(fresh.iterdir())  # no partial tree to train on


def test_a_refused_member_of_a_damaged_archive_is_reported_as_the_damage(tmp_path):
    """A damaged stream can decode into a member that the extraction filter refuses (a byte
    flipped mid-stream once turned a JPEG's header into a special file's), before gzip's CRC
    at the end shows the damage. The user must hear that the copy is damaged, not that the
    archive holds something unsafe; an intact archive with that member is refused as unsafe."""
    def with_fifo(path: Path) -> bytes:
        with tarfile.open(path, "w:gz") as tar:
            info = tarfile.TarInfo("cifar10/train/class0/0.jpg")
            info.type = tarfile.FIFOTYPE
            tar.addfile(info)
        return path.read_bytes()

    intact = tmp_path / "fifo.tar.gz"
    data = bytearray(with_fifo(intact))
    with pytest.raises(SystemExit, match="refusing to unpack .*special file. Nothing was unpacked"):
        prepare.main(["--archive", str(intact), "--root", str(tmp_path / "data")])
    data[-8] ^= 0xFF  # gzip's trailer: CRC32 of the uncompressed tar
    bad = tmp_path / "bad" / "fifo.tar.gz"
    bad.parent.mkdir()
    bad.write_bytes(bytes(data))
    with pytest.raises(SystemExit, match="truncated, damaged or not a tar archive. Nothing was unpacked"):
        prepare.main(["--archive", str(bad), "--root", str(tmp_path / "data")])
    assert not any((tmp_path / "data").iterdir())


def test_archive_checked_against_sha256sums(archive, tmp_path):
    import hashlib

    bad = damaged(archive, tmp_path, "flipped byte mid-stream")
    (bad.parent / "SHA256SUMS").write_text(f"{hashlib.sha256(archive.read_bytes()).hexdigest()}  {archive.name}\n")
    with pytest.raises(SystemExit, match="does not match its checksum in .*SHA256SUMS: the copy is damaged"):
        prepare.main(["--archive", str(bad), "--root", str(tmp_path / "data")])
    assert not (tmp_path / "data").exists()


def test_archive_faults_named_clearly(archive, tmp_path, capsys):
    # a --root that is a file
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(SystemExit):
        prepare.main(["--archive", str(archive), "--root", str(afile)])
    assert "--root" in capsys.readouterr().err and afile.read_text() == "x"
    # a missing archive, a folder given as the archive
    with pytest.raises(SystemExit, match="does not exist"):
        prepare.main(["--archive", str(tmp_path / "nope.tar.gz"), "--root", str(tmp_path / "data")])
    with pytest.raises(SystemExit, match="is a folder: pass the .tar.gz file itself"):
        prepare.main(["--archive", str(tmp_path), "--root", str(tmp_path / "data")])
    # a member that would land outside the root
    evil = tmp_path / "evil.tar.gz"
    with tarfile.open(evil, "w:gz") as tar:
        tar.add(archive, arcname="cifar10/ok.bin")
        tar.add(archive, arcname="../escaped.bin")
    with pytest.raises(SystemExit, match="refusing to unpack .*Nothing was unpacked"):
        prepare.main(["--archive", str(evil), "--root", str(tmp_path / "data")])
    assert not (tmp_path / "escaped.bin").exists() and not (tmp_path / "data" / "cifar10").exists()
    # a temporary folder left by a killed unpack is removed, and the archive unpacks
    stale = tmp_path / "data" / f".unpacking-{archive.name}-killed"
    (stale / "cifar10").mkdir(parents=True)
    prepare.main(["--archive", str(archive), "--root", str(tmp_path / "data")])
    assert not stale.exists() and len(list((tmp_path / "data" / "cifar10" / "train").rglob("*.jpg"))) == 12


# --------------------------------------------------------------------------------------
# Data that does not match the config: the error points at the data


def cifar_module(root: Path, **kwargs):
    from vitflash.data import CIFARDataModule

    return CIFARDataModule(root=str(root), num_classes=10, img_size=32, batch_size=4, num_workers=0, **kwargs)


def test_incomplete_dataset_points_at_the_data(tmp_path):
    few_classes = jpeg_tree(tmp_path / "a", 6, {"train": 2, "test": 1})  # a half-unpacked tree
    with pytest.raises(ValueError, match="has 6 classes but data.num_classes=10: the data there is incomplete.*"
                                         "Unpack it again with scripts/prepare_data.py"):
        cifar_module(few_classes).setup("fit")
    few_images = jpeg_tree(tmp_path / "b", 10, {"train": 2, "test": 1})
    with pytest.raises(ValueError, match="has 20 training and 10 test images but 50000 and 10000 are expected"):
        cifar_module(few_images, expected_sizes=[50000, 10000]).setup("fit")
    empty_jpeg = jpeg_tree(tmp_path / "c", 10, {"train": 2, "test": 1})
    (empty_jpeg / "cifar10" / "train" / "class3" / "1.jpg").write_bytes(b"")
    with pytest.raises(ValueError, match="cannot decode .*train/class3/1.jpg .*damaged or half-unpacked"):
        cifar_module(empty_jpeg).setup("fit")


@pytest.mark.parametrize("scale, error", [("abc", TypeError), (float("nan"), ValueError), (-1.0, ValueError)])
def test_bad_softmax_scale_named_on_every_path(scale, error):
    q = torch.randn(1, 4, 2, 8)
    for fn, x in ((vitflash.ops.naive_attention, q), (vitflash.ops.sdpa_attention, q),
                  (vitflash.ops.flash_attention, q.half())):
        with pytest.raises(error, match=rf"softmax_scale={re.escape(repr(scale))} is not a"):
            fn(x, x, x, scale)


def test_loader_resumes_mid_epoch_with_workers():
    """The training batches of an epoch, images included, do not depend on the number of loader
    workers, and a loader restored to a mid-epoch position yields exactly the rest of the epoch."""
    from vitflash.data import Augment, SyntheticDataModule

    def loader(workers: int, state: dict | None = None):
        dm = SyntheticDataModule(train_size=24, test_size=8, num_classes=4, img_size=16, batch_size=4,
                                 num_workers=workers, augment=Augment(train_crop="pad"))
        dm.setup("fit")
        if state:
            dm.load_state_dict(state)
        dl = dm.train_dataloader()
        dl.sampler.set_epoch(state["epoch"] if state else 1)
        return list(dl)

    whole = loader(0)
    assert [torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(whole, loader(2))] == [True] * 6
    seed = 0  # the DataModule's shuffle_seed (data.shuffle_seed), which orders both pipelines
    rest = loader(2, {"seed": seed, "epoch": 1, "start": 2 * 4})
    assert len(rest) == 4 and all(torch.equal(a[0], b[0]) for a, b in zip(whole[2:], rest))
    assert not torch.equal(whole[0][0], loader(0, {"seed": seed, "epoch": 2, "start": 0})[0][0])
