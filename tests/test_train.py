"""scripts/train.py and scripts/eval.py end to end on the CPU: every attention path that runs
here, real CIFAR-10 images, resume, evaluation, errors, DDP over gloo (a multirun sweep:
test_report.py)."""
from __future__ import annotations

import csv
import json
import logging
import math
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from PIL import Image

import timm

import vitflash
import vitflash.ops
from vitflash.data import eval_transform_of, imagenet_words
from vitflash.module import load_checkpoint
from vitflash.model import ShiftedPatchEmbed
from vitflash.pretrained import CheckpointError, export_timm
from test_configs import compose_cfg

REPO = Path(__file__).resolve().parents[1]
# the shared data folder beside the repo; VITFLASH_TEST_CIFAR names the archive elsewhere (a GPU machine)
CIFAR_ARCHIVE = Path(os.environ.get("VITFLASH_TEST_CIFAR") or REPO.parent / "shared" / "data" / "cifar10-jpeg.tar.gz")
TRAIN_PER_CLASS, TEST_PER_CLASS, VAL_SIZE, BATCH = 40, 20, 80, 32
STEPS_PER_EPOCH = (10 * TRAIN_PER_CLASS - VAL_SIZE) // BATCH  # the train loader drops the last batch


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(f"vitflash_script_{name}", REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


train = load_script("train").train
evaluate = load_script("eval").evaluate
predict = load_script("predict").predict


def run_cli(script: str, *overrides: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, f"scripts/{script}.py", *overrides], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, "HYDRA_FULL_ERROR": "0"})


def read_metrics(path: Path, column: str) -> list[tuple[int, int, float]]:
    """(epoch, step, value) of every row of a CSVLogger metrics.csv where `column` is set."""
    with path.open() as f:
        return [(int(r["epoch"] or -1), int(r["step"]), float(r[column])) for r in csv.DictReader(f) if r.get(column)]


SMOKE = ["data=synthetic", "logger=csv", "trainer=cpu"]
# Lines Lightning, torch and timm print on every run that a user can do nothing about
NOISE = ("Tip:", "LeafSpec", "Total Flops", "FLOPs", "Cosine annealing scheduler will have no effect",
         "sync_dist", "DistributedSampler", "Warning", "warn")


def assert_quiet(output: str) -> None:
    noisy = [line for line in output.splitlines() if any(n in line for n in NOISE)]
    assert not noisy, noisy


@pytest.mark.parametrize("attention", ["naive", "sdpa"])
def test_fast_dev_run_on_each_cpu_path(tmp_path, monkeypatch, attention):
    calls = defaultdict(int)
    for impl in ("naive", "sdpa"):
        fn = getattr(vitflash.ops, f"{impl}_attention")
        monkeypatch.setattr(vitflash.ops, f"{impl}_attention",
                            lambda *a, _fn=fn, _impl=impl, **k: calls.__setitem__(_impl, calls[_impl] + 1) or _fn(*a, **k))
    metrics = train(compose_cfg(tmp_path, [*SMOKE, "debug=fdr", f"attention={attention}"]))
    assert set(calls) == {attention}  # every block ran the requested path, and only it
    assert torch.isfinite(torch.tensor(metrics["train/loss_epoch"]))
    assert 0.0 <= metrics["test/top1"] <= 1.0


def test_grad_checkpointing_reruns_each_block_in_the_training_step_only(tmp_path, monkeypatch):
    calls = []
    sdpa = vitflash.ops.sdpa_attention
    monkeypatch.setattr(vitflash.ops, "sdpa_attention", lambda *a, **k: calls.append(1) or sdpa(*a, **k))
    counts = {}
    for checkpointed in (False, True):
        calls.clear()
        metrics = train(compose_cfg(tmp_path / str(checkpointed), [
            *SMOKE, "debug=fdr", "attention=sdpa", f"model.grad_checkpointing={str(checkpointed).lower()}"]))
        assert torch.isfinite(torch.tensor(metrics["train/loss_epoch"]))
        counts[checkpointed] = len(calls)
    depth = vitflash.create_model("vit_micro_patch4_32").config["depth"]
    assert counts[True] - counts[False] == depth  # one training step (fast_dev_run): each block once more


def test_max_time_stops_training_and_still_tests(tmp_path, caplog):
    """A wall-clock budget (trainer.max_time) ends fit early, and the best checkpoint so far
    is tested as after max_epochs; the log says where it stopped and how to finish the run."""
    cfg = compose_cfg(tmp_path, [*SMOKE, "trainer.max_epochs=1000", "trainer.max_time=00:00:00:04"])
    start = time.monotonic()
    with caplog.at_level(logging.INFO):
        metrics = train(cfg)
    wall = time.monotonic() - start
    assert "starts from random weights (model.pretrained=null: trained from scratch)" in caplog.text
    epochs = [e for e, _, _ in read_metrics(tmp_path / "out" / "csv" / "metrics.csv", "val/top1")]
    assert 1 <= len(epochs) < 1000
    assert 0.0 <= metrics["test/top1"] <= 1.0
    (hint,) = [r.getMessage() for r in caplog.records if "trainer.max_time stopped training" in r.getMessage()]
    assert re.search(r"stopped training after batch \d+ of epoch \d+ \(epochs 0 to 999, step \d+\); the test below", hint)
    assert hint.endswith(
        f"python scripts/train.py <the run's overrides> trainer.max_time=null "
        f"ckpt_path={tmp_path / 'out' / 'checkpoints' / 'last.ckpt'}")
    # the budget is the whole run's: the checkpoint carries the training time spent so far,
    # and a resume counts on from it (README: raise max_time to continue)
    ckpt = torch.load(tmp_path / "out" / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    (timer,) = [v for k, v in ckpt["callbacks"].items() if k.startswith("Timer")]
    # (bounded by the whole call's wall time, not by budget + a margin: on a loaded machine one
    # step and the validation after it can run seconds past the budget before the check)
    assert 0 < timer["time_elapsed"]["train"] <= wall


def test_max_time_stop_prints_the_command_that_finishes_the_run(tmp_path):
    """On the command line the hint repeats the run's own overrides, the time limit lifted and
    the last checkpoint named; where the run folder went (hydra.*) is left out, as a resume
    writes a new one."""
    run = tmp_path / "run"
    result = run_cli("train", *SMOKE, "trainer.max_epochs=1000", "trainer.max_time=00:00:00:03",
                     "model.optimizer.lr=2e-3", f"hydra.run.dir={run}")
    assert result.returncode == 0, result.stderr[-3000:]
    (line,) = [x for x in (result.stdout + result.stderr).splitlines() if "trainer.max_time stopped training" in x]
    assert line.split("To finish it: ", 1)[1] == (
        "python scripts/train.py data=synthetic logger=csv trainer=cpu trainer.max_epochs=1000 "
        f"model.optimizer.lr=2e-3 trainer.max_time=null ckpt_path={run / 'checkpoints' / 'last.ckpt'}")
    assert (run / "checkpoints" / "last.ckpt").is_file()


def test_max_time_as_a_mapping_and_a_spent_budget(tmp_path):
    """trainer.max_time also takes timedelta's keywords ({minutes: 1}); resuming a run whose
    budget is spent with the same budget stops at once, saying how to finish it."""
    run = tmp_path / "budget"
    train(compose_cfg(run, [*SMOKE, "debug=default", "trainer.max_epochs=1000", "trainer.max_time={seconds: 3}"]))
    last = run / "out" / "checkpoints" / "last.ckpt"
    assert torch.load(last, map_location="cpu", weights_only=True)["callbacks"]["Timer"]["time_elapsed"]["train"] >= 3
    with pytest.raises(ValueError, match=r"has already trained for \d+ s, all of trainer.max_time=.*"
                                         r"pass trainer.max_time=null to finish it"):
        train(compose_cfg(tmp_path / "again", [*SMOKE, "debug=default", "trainer.max_epochs=1000",
                                               "trainer.max_time=00:00:00:03", f"ckpt_path='{last}'"]))


def test_fit_ends_with_last_ckpt_between_its_saves(tmp_path):
    """With last.ckpt every 2 epochs and 3 epochs, the third is still saved where fit ends."""
    run = tmp_path / "run"
    train(compose_cfg(run, [*SMOKE, "debug=default", "trainer.max_epochs=3",
                            "++callbacks.last_checkpoint.every_n_epochs=2"]))
    saved = torch.load(run / "out" / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert saved["global_step"] == 3 * 4  # debug=default: 4 batches an epoch
    assert saved["loops"]["fit_loop"]["epoch_progress"]["current"]["completed"] == 3


def test_flash_without_cuda_stops_at_start(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA, where attention=flash runs")
    result = run_cli("train", *SMOKE, "debug=fdr", "attention=flash", f"hydra.run.dir={tmp_path / 'run'}")
    assert result.returncode != 0
    assert not (tmp_path / "run").exists()  # a run that fails at the start leaves no folder
    assert "attention=flash needs a CUDA GPU" in result.stderr
    assert all(f"attention={alt}" in result.stderr for alt in ("sdpa", "naive", "auto"))


def test_error_after_the_loggers_start_leaves_no_folder(tmp_path):
    """A config error found once the trainer is set up (a cool-down longer than the run, in
    configure_optimizers) leaves the logger's empty folder behind it, and no result: no
    run folder either."""
    run = tmp_path / "run"
    result = run_cli("train", *SMOKE, "debug=default", "model.cooldown_epochs=20", f"hydra.run.dir={run}")
    assert result.returncode == 1 and "model.cooldown_epochs=20 leaves the cosine no steps" in result.stderr
    assert not run.exists(), sorted(p.relative_to(run) for p in run.rglob("*"))


def test_a_failing_job_of_a_sweep_leaves_the_others_running(tmp_path):
    """In a sweep (-m) a job's config error is reported with its overrides, the later jobs still
    run, and the sweep exits with status 1."""
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA, where attention=flash runs")
    sweep = tmp_path / "sweep"
    result = run_cli("train", "-m", "attention=flash,naive", *SMOKE, "debug=default", f"hydra.sweep.dir={sweep}")
    assert result.returncode == 1
    assert "Error in the job with overrides attention=flash" in result.stderr
    assert "attention=flash needs a CUDA GPU" in result.stderr
    assert (sweep / "1" / "csv" / "metrics.csv").is_file() and not (sweep / "0").exists()


def test_fsdp_asks_for_test_false_before_any_work(tmp_path):
    # Lightning does not shard the model again for a test after fit under FSDP
    with pytest.raises(ValueError, match=r"trainer=fsdp cannot test .*add test=false.*scripts/eval.py ckpt_path="):
        train(compose_cfg(tmp_path, ["data=synthetic", "trainer=fsdp"]))
    assert not (tmp_path / "out").exists()  # nothing was built or written


def test_mistyped_option_on_the_command_line():
    result = run_cli("train", "attention=flsh")
    assert result.returncode != 0
    assert "Could not find 'attention/flsh'" in result.stderr
    assert "Available options in 'attention'" in result.stderr and "sdpa" in result.stderr


def test_mistyped_key_on_the_command_line_stops_before_any_run_folder(tmp_path):
    result = run_cli("train", "optim.lr=0.1", *SMOKE, f"hydra.run.dir={tmp_path / 'run'}")
    assert result.returncode == 1
    assert result.stderr.startswith("Error: optim.lr=0.1: the train config has no key optim.lr")
    assert "Did you mean model.optimizer.lr?" in result.stderr and "+optim" not in result.stderr
    assert not (tmp_path / "run").exists()


def test_missing_dataset_folder(tmp_path):
    cfg = compose_cfg(tmp_path, ["data=cifar10", "trainer=cpu", "debug=fdr"])
    with pytest.raises(FileNotFoundError, match=r"cifar10 not found under .*python scripts/prepare_data.py --archive"):
        train(cfg)


# --------------------------------------------------------------------------------------
# Real images: a slice of the shared CIFAR-10 archive


@pytest.fixture(scope="module")
def cifar_slice(tmp_path_factory) -> Path:
    """A data root holding cifar10/{train,test}/<class>/*.jpg: the first 40 train and 20 test
    images of every class of the shared archive."""
    if not CIFAR_ARCHIVE.is_file():
        pytest.skip(f"{CIFAR_ARCHIVE} is absent: the real-data tests need the shared data folder beside the repo "
                    "(or VITFLASH_TEST_CIFAR=<path of cifar10-jpeg.tar.gz>)")
    root = tmp_path_factory.mktemp("cifar_slice")
    wanted = {"train": TRAIN_PER_CLASS, "test": TEST_PER_CLASS}
    taken = defaultdict(int)
    with tarfile.open(CIFAR_ARCHIVE) as tar:
        for member in tar:
            parts = member.name.split("/")  # cifar10/<split>/<class>/<file>.jpg
            if member.isfile() and len(parts) == 4 and taken[parts[1], parts[2]] < wanted[parts[1]]:
                taken[parts[1], parts[2]] += 1
                tar.extract(member, root, filter="data")
    assert sorted(taken.values()) == [TEST_PER_CLASS] * 10 + [TRAIN_PER_CLASS] * 10
    return root


def cifar_overrides(data_root: Path) -> list[str]:
    return ["experiment=cifar10_quick", "trainer=cpu", f"paths.data_dir={data_root}", f"data.val_size={VAL_SIZE}",
            f"data.batch_size={BATCH}", "data.num_workers=0", "data.expected_sizes=null", "trainer.limit_train_batches=1.0",
            "trainer.log_every_n_steps=1", "model.warmup_epochs=0"]


@pytest.fixture(scope="module")
def cifar_run(cifar_slice, tmp_path_factory):
    """Three epochs of vit_micro_patch4_32 on the slice; returns (metrics, run folder)."""
    run = tmp_path_factory.mktemp("cifar_run")
    metrics = train(compose_cfg(run, [*cifar_overrides(cifar_slice), "trainer.max_epochs=3"]))
    return metrics, run / "out"


def test_real_images_lower_the_loss(cifar_run):
    metrics, out = cifar_run
    log = out / "csv" / "metrics.csv"
    per_epoch = {epoch: loss for epoch, _, loss in read_metrics(log, "train/loss_epoch")}
    assert list(per_epoch) == [0, 1, 2]
    assert per_epoch[2] < per_epoch[0] - 0.1, per_epoch
    assert len(read_metrics(log, "train/loss_step")) == 3 * STEPS_PER_EPOCH
    assert any(v > 0 for *_, v in read_metrics(log, "train/device/samples_per_sec"))  # ThroughputMonitor
    # train accuracy: logged once per epoch
    top1 = read_metrics(log, "train/top1")
    assert [epoch for epoch, *_ in top1] == [0, 1, 2] and all(0 <= v <= 1 for *_, v in top1)
    assert len({v for *_, v in top1}) > 1
    assert {"val/top1", "val/top5", "test/top1", "test/top5"} <= set(metrics)
    assert metrics["test/top5"] >= metrics["test/top1"]


def test_checkpoints_are_plain_and_name_the_model(cifar_run):
    _, out = cifar_run
    ckpts = sorted(p.name for p in (out / "checkpoints").glob("*.ckpt"))
    assert "last.ckpt" in ckpts and len(ckpts) == 2  # last and best
    ckpt = torch.load(out / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert ckpt["global_step"] == 3 * STEPS_PER_EPOCH
    assert ckpt["hyper_parameters"]["model_name"] == "vit_micro_patch4_32"


def test_resume_continues_the_step_count(cifar_run, cifar_slice, tmp_path):
    _, out = cifar_run
    train(compose_cfg(tmp_path, [*cifar_overrides(cifar_slice), "trainer.max_epochs=4", "test=false",
                                 f"ckpt_path={out / 'checkpoints' / 'last.ckpt'}"]))
    resumed = torch.load(tmp_path / "out" / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert (resumed["epoch"], resumed["global_step"]) == (3, 4 * STEPS_PER_EPOCH)
    steps = [step for _, step, _ in read_metrics(tmp_path / "out" / "csv" / "metrics.csv", "train/loss_step")]
    assert len(steps) == STEPS_PER_EPOCH and min(steps) >= 3 * STEPS_PER_EPOCH - 1  # only the new epoch


def test_eval_reproduces_the_test_score(cifar_run, cifar_slice, tmp_path):
    metrics, out = cifar_run
    best = next(p for p in (out / "checkpoints").glob("*.ckpt") if p.name != "last.ckpt")
    common = [f"ckpt_path={best}", f"paths.data_dir={cifar_slice}", f"data.val_size={VAL_SIZE}", "data.num_workers=0",
              "data.expected_sizes=null", "trainer=cpu"]
    result = evaluate(compose_cfg(tmp_path, [*common, "attention=naive"], "eval"))
    assert result["attention"] == "naive" and result["peak_mem_gib"] is None  # no GPU
    assert 0.1 < result["host_peak_rss_gib"] < 64  # this process, with torch loaded
    # train.py tested this checkpoint with sdpa; naive may flip at most a near-tie
    assert abs(result["top1"] - metrics["test/top1"]) <= 1 / (10 * TEST_PER_CLASS)
    val = evaluate(compose_cfg(tmp_path, [*common, "split=val"], "eval"))
    assert val["split"] == "val" and 0.0 <= val["top1"] <= val["top5"] <= 1.0
    assert result["eval_flip"] is False  # the run validated without it
    flipped = evaluate(compose_cfg(tmp_path, [*common, "attention=naive", "eval_flip=true"], "eval"))
    assert flipped["eval_flip"] is True and 0.0 <= flipped["top1"] <= flipped["top5"] <= 1.0
    assert flipped["loss"] != pytest.approx(result["loss"], rel=1e-4)  # other logits were scored
    with pytest.raises(ValueError, match=r"eval_flip='yes': give true"):
        evaluate(compose_cfg(tmp_path, [*common, "eval_flip=yes"], "eval"))
    with pytest.raises(ValueError, match=r"^eval_flip=1: give true"):  # 1 == True, but not a bool
        evaluate(compose_cfg(tmp_path, [*common, "eval_flip=1"], "eval"))
    moved = evaluate(compose_cfg(tmp_path, [*common, "attention=naive", "eval_shift=1"], "eval"))
    assert moved["eval_shift"] == 1 and moved["eval_flip"] is False and result["eval_shift"] == 0
    assert moved["loss"] != pytest.approx(result["loss"], rel=1e-4)  # five views scored, not one
    with pytest.raises(ValueError, match=r"eval_shift=-2: give a whole number of pixels"):
        evaluate(compose_cfg(tmp_path, [*common, "eval_shift=-2"], "eval"))


def test_eval_writes_each_classes_top1_and_the_confusion_matrix(cifar_run, cifar_slice, tmp_path):
    _, out = cifar_run
    best = next(p for p in (out / "checkpoints").glob("*.ckpt") if p.name != "last.ckpt")
    result = run_cli("eval", f"ckpt_path={best}", f"paths.data_dir={cifar_slice}", f"data.val_size={VAL_SIZE}",
                     "data.num_workers=0",
                     "data.expected_sizes=null", "trainer=cpu", "attention=sdpa", f"hydra.run.dir={tmp_path}")
    assert result.returncode == 0, result.stderr
    scores = json.loads((tmp_path / "eval.json").read_text())
    with (tmp_path / "per_class.csv").open() as f:
        rows = list(csv.DictReader(f))
    classes = sorted(p.name for p in (cifar_slice / "cifar10" / "test").iterdir())
    assert [r["class"] for r in rows] == classes and [int(r["images"]) for r in rows] == [TEST_PER_CLASS] * 10
    # the classes' top-1, weighted by their images, is the split's
    assert sum(float(r["top1"]) * int(r["images"]) for r in rows) / (10 * TEST_PER_CLASS) == pytest.approx(scores["top1"])
    lowest = sorted(rows, key=lambda r: float(r["top1"]))[:3]
    assert [[r["class"], pytest.approx(float(r["top1"]))] for r in lowest] == scores["lowest_classes"]
    with (tmp_path / "confusion.csv").open() as f:
        matrix = list(csv.reader(f))
    assert matrix[0][1:] == classes and [row[0] for row in matrix[1:]] == classes
    counts = [[int(v) for v in row[1:]] for row in matrix[1:]]
    assert all(sum(row) == TEST_PER_CLASS for row in counts)
    assert [counts[i][i] / TEST_PER_CLASS for i in range(10)] == [pytest.approx(float(r["top1"])) for r in rows]


def test_per_class_top1_of_a_confusion_matrix():
    counts = torch.tensor([[3, 1, 0], [0, 0, 0], [2, 0, 2]])  # rows: true class; class 1 has no images
    assert load_script("eval").per_class_top1(counts, ["a", "b", "c"]) == [("a", 4, 0.75), ("b", 0, None),
                                                                          ("c", 4, 0.5)]
    assert [name for name, *_ in load_script("eval").per_class_top1(counts, None)] == ["0", "1", "2"]


def test_predict_classifies_image_files_as_the_test_scored_them(cifar_run, cifar_slice, tmp_path):
    metrics, out = cifar_run
    best = next(p for p in (out / "checkpoints").glob("*.ckpt") if p.name != "last.ckpt")
    test_dir = cifar_slice / "cifar10" / "test"
    rows = predict(best, [str(test_dir)], top=5, attention="sdpa")
    assert len(rows) == 10 * TEST_PER_CLASS
    classes = sorted(p.name for p in test_dir.iterdir())
    for row in rows:
        probs = [p for *_, p in row["top"]]
        assert len(probs) == 5 and probs == sorted(probs, reverse=True) and sum(probs) <= 1 + 1e-5
        assert all(classes[index] == name for name, index, _ in row["top"])  # the folder names, in label order
    # the files, read by PIL and the checkpoint's saved eval transform, score what the test scored
    # on the decoded arrays (the batches differ: at most a near-tie may flip)
    truth = [Path(row["image"]).parent.name for row in rows]
    top1 = sum(row["top"][0][0] == t for row, t in zip(rows, truth)) / len(rows)
    top5 = sum(t in [name for name, *_ in row["top"]] for row, t in zip(rows, truth)) / len(rows)
    assert abs(top1 - metrics["test/top1"]) <= 1 / (10 * TEST_PER_CLASS)
    assert abs(top5 - metrics["test/top5"]) <= 1 / (10 * TEST_PER_CLASS)

    # a checkpoint written before the inputs were saved: the transform from its run folder's config
    run = tmp_path / "old_run"
    (run / "checkpoints").mkdir(parents=True)
    ckpt = torch.load(best, map_location="cpu", weights_only=True)
    ckpt.pop("vitflash_inputs")
    torch.save(ckpt, run / "checkpoints" / "old.ckpt")
    with pytest.raises(ValueError, match=r"does not record its eval transform .* keep the checkpoint in its run"):
        predict(run / "checkpoints" / "old.ckpt", [str(test_dir)], attention="sdpa")
    (run / ".hydra").mkdir()
    OmegaConf.save(compose_cfg(tmp_path, cifar_overrides(cifar_slice)), run / ".hydra" / "config.yaml")
    old = predict(run / "checkpoints" / "old.ckpt", [str(test_dir)], top=1, attention="sdpa")
    assert [r["top"][0][1] for r in old] == [r["top"][0][1] for r in rows]
    assert [r["top"][0][0] for r in old] == [str(r["top"][0][1]) for r in rows]  # no names: the indices

    # the command line: a table on stdout and a CSV file; bad inputs stop with the file named
    image = sorted((test_dir / "cat").iterdir())[0]
    result = run_cli("predict", str(best), str(image), "--top", "2", "--out", str(tmp_path / "p.csv"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0].startswith(f"{image}  ") and len(result.stdout.split()) == 1 + 4 + 2
    with (tmp_path / "p.csv").open() as f:
        written = list(csv.DictReader(f))
    assert [r["rank"] for r in written] == ["1", "2"] and written[0]["image"] == str(image)
    assert written[0]["class"] == classes[int(written[0]["index"])]
    # a file PIL cannot read costs its own prediction only; with nothing readable the run stops
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    shutil.copy(image, mixed / "a.jpg")
    (mixed / "b.jpg").write_bytes(b"not a jpeg")
    (mixed / "c.png").write_bytes(b"\x89PNG\r\n\x1a\n truncated")
    result = run_cli("predict", str(best), str(mixed), "--top", "1", "--out", str(tmp_path / "m.csv"))
    assert result.returncode == 0, result.stderr
    assert [line.split()[0] for line in result.stdout.splitlines()[:1]] == [str(mixed / "a.jpg")]
    assert f"skipped 2 of 3 files that PIL cannot read as images:\n  {mixed / 'b.jpg'}: " in result.stderr
    assert f"\n  {mixed / 'c.png'}: " in result.stderr
    with (tmp_path / "m.csv").open() as f:
        assert [r["image"] for r in csv.DictReader(f)] == [str(mixed / "a.jpg")]
    alone, beside = (predict(best, [str(path)], top=1, attention="sdpa", device="cpu")[0]["top"][0]
                     for path in (image, mixed))  # fp32 on the CPU: bf16 on a GPU differs with the batch's size
    in_workers = predict(best, [str(mixed)], top=1, attention="sdpa", device="cpu", batch_size=1, num_workers=2)
    assert [bool(row["top"]) for row in in_workers] == [True, False, False]  # the reasons come back from workers
    assert in_workers[1]["unreadable"] and in_workers[0]["top"][0][:2] == beside[:2]
    assert alone[:2] == beside[:2] and alone[2] == pytest.approx(beside[2], abs=1e-5)  # a blank beside changes nothing
    result = run_cli("predict", str(best), str(mixed / "b.jpg"))
    assert result.returncode == 1 and f"no file could be read as an image by PIL: {mixed / 'b.jpg'} (" in result.stderr
    result = run_cli("predict", str(best), str(tmp_path / "missing"))
    assert result.returncode == 1 and "missing does not exist: pass image files or folders" in result.stderr


def test_predict_names_imagenet_class_folders_by_their_words():
    described = imagenet_words(["n01440764", "n03888257", "cat", "n99999999"])  # Imagenette's two, and others
    assert described == {"n01440764": "tench, Tinca tinca", "n03888257": "parachute, chute"}


@pytest.mark.gpu
def test_predict_on_a_gpu_with_flash_agrees_with_the_cpu(cifar_run, cifar_slice):
    _, out = cifar_run
    files = [str(cifar_slice / "cifar10" / "test" / name) for name in ("cat", "ship")]
    cpu = predict(out / "checkpoints" / "last.ckpt", files, top=3, attention="sdpa", device="cpu")
    gpu = predict(out / "checkpoints" / "last.ckpt", files, top=3, attention="auto")  # flash, bf16 autocast
    assert [r["image"] for r in gpu] == [r["image"] for r in cpu]
    # bf16 moves the probabilities by about 1e-2; the top class may flip only on a near-tie
    for g, c in zip(gpu, cpu):
        assert abs(g["top"][0][2] - c["top"][0][2]) < 0.05
        assert g["top"][0][1] == c["top"][0][1] or abs(c["top"][0][2] - c["top"][1][2]) < 0.05


def test_attention_maps_of_a_checkpoint(cifar_run, cifar_slice, tmp_path):
    _, out = cifar_run
    image = sorted((cifar_slice / "cifar10" / "test" / "cat").iterdir())[0]
    result = run_cli("attention_maps", str(out / "checkpoints" / "last.ckpt"), str(image), "--out",
                     str(tmp_path / "maps.png"))
    assert result.returncode == 0, result.stderr
    maps = np.load(tmp_path / "maps.npz")
    heads = load_checkpoint(out / "checkpoints" / "last.ckpt").model.blocks[-1].attn.num_heads
    assert maps["rollout"].shape == (8, 8) and maps["heads"].shape == (heads, 8, 8)  # 32 px in 4 px patches
    assert maps["probs"].shape == (heads, 65, 65)
    np.testing.assert_allclose(maps["probs"].sum(-1), 1, rtol=1e-5)
    np.testing.assert_allclose(maps["heads"].sum((1, 2)), 1, rtol=1e-5)  # the class token's row over the patches
    assert maps["rollout"].sum() == pytest.approx(1, rel=1e-5)
    assert (tmp_path / "maps.png").stat().st_size > 10_000
    result = run_cli("attention_maps", str(out / "checkpoints" / "last.ckpt"), str(image), "--block", "9",
                     "--out", str(tmp_path / "x.png"))
    assert result.returncode == 1 and "--block 9: the model has 4 blocks (0 to 3, or -1 for the last)" in result.stderr


def test_rollout_of_attention_that_stays_home_is_the_identity():
    rollout = load_script("attention_maps").rollout
    n = 5
    assert torch.equal(rollout([torch.eye(n).expand(3, n, n)] * 4), torch.eye(n))
    uniform = rollout([torch.full((2, n, n), 1 / n)])  # half the residual, half the mean
    torch.testing.assert_close(uniform, 0.5 * torch.eye(n) + 0.5 / n)
    # over the patches: the class token's row (prefix 1), or the patches' mean row (global_pool=avg)
    patch_maps = load_script("attention_maps").patch_maps
    weights = torch.softmax(torch.randn(3, 5, 5), -1)
    cls = patch_maps(weights, prefix=1, grid=(2, 2))
    torch.testing.assert_close(cls, (weights[:, 0, 1:] / weights[:, 0, 1:].sum(-1, keepdim=True)).view(3, 2, 2))
    avg = patch_maps(weights[:, 1:, 1:], prefix=0, grid=(2, 2))
    assert avg.shape == (3, 2, 2)
    torch.testing.assert_close(avg.sum((1, 2)), torch.ones(3))


def test_finetune_from_an_exported_checkpoint(cifar_run, cifar_slice, tmp_path, caplog):
    """The fine-tuning path end to end: a trained run, exported to timm's format, loaded by
    timm itself, then fine-tuned by train.py at another image size (position embedding
    resampled, fresh head) with layer-wise LR decay (experiment=cifar10_finetune, on the
    small model that runs here)."""
    _, out = cifar_run
    weights = tmp_path / "vit.safetensors"
    kwargs = export_timm(out / "checkpoints" / "last.ckpt", weights)
    ours = load_checkpoint(out / "checkpoints" / "last.ckpt", attention="sdpa").model.eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():  # timm's own create_model reads the file and gives our logits
        torch.testing.assert_close(timm.create_model(**kwargs).eval()(x), ours(x), atol=1e-4, rtol=1e-4)
    # and timm's data config prepares an image as vitflash's evaluation does (CIFAR's mean and std,
    # not the timm architecture's defaults)
    data_cfg = timm.data.resolve_data_config({}, model=timm.create_model(**kwargs))
    assert data_cfg["mean"] == pytest.approx((0.4914, 0.4822, 0.4465)) and data_cfg["input_size"] == (3, 32, 32)
    image = Image.open(sorted((cifar_slice / "cifar10" / "test" / "cat").iterdir())[0]).convert("RGB")
    inputs = torch.load(out / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)["vitflash_inputs"]
    torch.testing.assert_close(timm.data.create_transform(**data_cfg)(image), eval_transform_of(inputs)(image))

    quick = [o for o in cifar_overrides(cifar_slice) if not o.startswith(("experiment=", "trainer.limit_train"))]
    cfg = compose_cfg(tmp_path, ["experiment=cifar10_finetune", *quick, "model.model_name=vit_micro_patch4_32",
                                 f"model.pretrained={weights}", "data.img_size=64", "trainer.max_epochs=1",
                                 "data.batch_size=32"])
    assert cfg.model.layer_decay == 0.9 and cfg.data.augment.train_crop == "rrc"
    _, module, _ = load_script("train").build(cfg)
    start = module.model.state_dict()
    for name, value in ours.state_dict().items():
        if name == "pos_embed":  # 8 x 8 patches resampled to 16 x 16 for 64 px
            assert start[name].shape == (1, 1 + 16 * 16, value.shape[-1])
        elif not name.startswith("head."):  # the trained weights, as exported
            torch.testing.assert_close(start[name], value, msg=name)
    with caplog.at_level(logging.INFO):
        metrics = train(cfg)
    assert torch.isfinite(torch.tensor(metrics["train/loss_epoch"])) and 0.0 <= metrics["test/top1"] <= 1.0
    assert f"vit_micro_patch4_32 starts from the weights of {weights} (model.pretrained)" in caplog.text
    # layer decay: one LR per depth (LearningRateMonitor logs each parameter group's)
    rows = list(csv.DictReader((tmp_path / "out" / "csv" / "metrics.csv").open()))
    lrs = {k: float(r[k]) for r in rows for k in r if k.startswith("lr-AdamW") and r[k]}
    assert len(set(lrs.values())) >= 4, lrs


def test_shifted_patches_and_locality_attention_train_evaluate_and_stay_out_of_timm(tmp_path):
    """model.shifted_patches=true with model.locality_attention=true (Lee et al.'s two changes)
    end to end: a run trains, eval.py scores its checkpoint as the run's test did, and the
    timm routes (export, loading as pretrained weights) refuse it with a message that names
    the option."""
    tiny = ["data=synthetic", "data.train_size=24", "data.test_size=16", "data.batch_size=8", "trainer=cpu",
            "callbacks.progress_bar=null", "attention=sdpa", "++trainer.num_sanity_val_steps=0"]
    metrics = train(compose_cfg(tmp_path, [*tiny, "trainer.max_epochs=1", "model.shifted_patches=true",
                                           "model.locality_attention=true"]))
    last = tmp_path / "out" / "checkpoints" / "last.ckpt"
    module = load_checkpoint(last)
    assert isinstance(module.model.patch_embed, ShiftedPatchEmbed)
    assert module.hparams.shifted_patches is True and module.hparams.locality_attention is True
    # the learned scales trained away from their start, and the checkpoint kept them
    scales = [blk.attn.log_scale.item() for blk in module.model.blocks]
    assert all(s != pytest.approx(-0.5 * math.log(module.model.blocks[0].attn.head_dim), abs=1e-7) for s in scales)
    result = evaluate(compose_cfg(tmp_path, [f"ckpt_path={last}", *tiny[:4], "trainer=cpu"], "eval"))
    assert result["loss"] == pytest.approx(metrics["test/loss"], rel=1e-5)
    with pytest.raises(CheckpointError, match="shifted patches.*does not load as timm weights nor export"):
        export_timm(last, tmp_path / "vit.safetensors")
    with pytest.raises(CheckpointError, match="model.shifted_patches=true"):
        vitflash.create_model("vit_micro_patch4_32", pretrained=last, shifted_patches=True)
    assert not (tmp_path / "vit.safetensors").exists()


def test_corrupt_checkpoint(cifar_run, tmp_path):
    _, out = cifar_run
    truncated = tmp_path / "truncated.ckpt"
    truncated.write_bytes((out / "checkpoints" / "last.ckpt").read_bytes()[:5000])
    garbage = tmp_path / "garbage.ckpt"
    garbage.write_bytes(os.urandom(4096))
    for bad in (truncated, garbage):
        with pytest.raises(ValueError, match=rf"cannot read checkpoint {bad}: it is truncated, corrupt, or not a PyTorch"):
            evaluate(compose_cfg(tmp_path, [f"ckpt_path={bad}", "data=synthetic"], "eval"))
    with pytest.raises(ValueError, match="truncated, corrupt"):
        train(compose_cfg(tmp_path, [*SMOKE, "debug=fdr", f"ckpt_path={garbage}"]))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        evaluate(compose_cfg(tmp_path, [f"ckpt_path={tmp_path / 'nope.ckpt'}", "data=synthetic"], "eval"))


# --------------------------------------------------------------------------------------
# Processes: DDP over gloo


def test_ddp_two_processes_on_cpu(tmp_path):
    result = run_cli("train", "data=synthetic", "data.train_size=256", "data.batch_size=32", "trainer=ddp",
                     "trainer.accelerator=cpu", "trainer.devices=2", "trainer.max_epochs=1", "trainer.precision=32-true",
                     "model.attention=sdpa", f"hydra.run.dir={tmp_path}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "distributed_backend=gloo" in result.stderr + result.stdout
    assert "Starting with 2 processes" in result.stderr + result.stdout
    # nothing a user cannot act on, and each line once, not once per process
    assert_quiet(result.stderr + result.stdout)
    assert (result.stderr + result.stdout).count("best checkpoint") == 1
    ckpt = torch.load(tmp_path / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert ckpt["global_step"] == 256 // (32 * 2)  # each process saw half of the images


def logged_metrics(run: Path) -> dict[tuple[str, int], float]:
    """{(column, step): value} of the loss and accuracy columns (train/val/test, step and
    epoch) of a run's metrics.csv: what a run learned, not how fast or in how much memory."""
    with (run / "csv" / "metrics.csv").open() as f:
        rows = list(csv.DictReader(f))
    columns = [c for c in rows[0] if re.fullmatch(r"(train|val|test)/(loss|top1|top5)(_step|_epoch)?", c)]
    return {(c, int(r["step"])): float(r[c]) for r in rows for c in columns if r[c]}


@pytest.mark.gpu
def test_ddp_on_one_gpu_matches_the_single_device_trainer(tmp_path):
    """trainer=ddp with one device wraps the model in DDP and starts a process group of one: the
    loop must learn exactly what trainer=gpu learns (same data order, augmentation, updates)."""
    common = ["data=synthetic", "data.train_size=256", "data.batch_size=32", "trainer.max_epochs=2",
              "trainer.log_every_n_steps=1", "model.compile=false", "model.graph_step=false", "logger=csv",
              "trainer.deterministic=warn"]  # deterministic cuDNN and cuBLAS where they have it
    metrics, output = {}, {}
    for name, trainer in {"gpu": ["trainer=gpu"], "ddp": ["trainer=ddp", "trainer.devices=1"]}.items():
        result = run_cli("train", *common, *trainer, f"hydra.run.dir={tmp_path / name}")
        assert result.returncode == 0, result.stderr[-3000:]
        metrics[name], output[name] = logged_metrics(tmp_path / name), result.stderr + result.stdout
    assert "distributed_backend=nccl" in output["ddp"] and "Starting with 1 processes" in output["ddp"]
    assert "distributed_backend" not in output["gpu"]
    # both replayed their augmentation as a CUDA graph (a capture that fell back ran eagerly)
    assert all("could not be captured" not in out for out in output.values())
    columns = {c for c, _ in metrics["gpu"]}
    assert {"train/loss_step", "train/loss_epoch", "val/top1", "test/top1"} <= columns
    assert len([k for k in metrics["gpu"] if k[0] == "train/loss_step"]) == 2 * 256 // 32
    assert metrics["ddp"].keys() == metrics["gpu"].keys()
    for key, value in metrics["gpu"].items():
        assert metrics["ddp"][key] == pytest.approx(value, rel=1e-4, abs=1e-5), key
