"""scripts/report.py on a real sweep made on the CPU: a train.py -m job per attention path,
one of them continued by resume in a new folder; what it writes is read back and checked
against the runs' own metrics.csv."""
from __future__ import annotations

import csv
import json
import re
import shlex
import shutil
import statistics
import sys
from pathlib import Path

import pytest

from test_train import assert_quiet, load_script, read_metrics, run_cli

report = load_script("report")
# 1 epoch of 4 batches; the default trainer (CPU here), whose precision is ${if_cuda:...}
SWEEP = ["data=synthetic", "logger=csv", "debug=default"]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> tuple[Path, Path]:
    """(sweep folder with jobs 0: sdpa and 1: naive, the folder of job 1 resumed for a 2nd epoch)."""
    root = tmp_path_factory.mktemp("sweep")
    result = run_cli("train", "-m", "attention=sdpa,naive", *SWEEP, f"hydra.sweep.dir={root / 'sweep'}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert_quiet(result.stderr + result.stdout)
    # the resume repeats the job's overrides and points ckpt_path into its folder
    result = run_cli("train", "attention=naive", *SWEEP, "trainer.max_epochs=2",
                     f"ckpt_path={root / 'sweep' / '1' / 'checkpoints' / 'last.ckpt'}", f"hydra.run.dir={root / 'resumed'}")
    assert result.returncode == 0, result.stderr[-3000:]
    return root / "sweep", root / "resumed"


def _last(run: Path, column: str) -> float:
    return read_metrics(run / "csv" / "metrics.csv", column)[-1][2]


def _expected_img_per_s(*pieces: Path) -> float:
    """What the report should give: the median of the throughput monitor's windows over all
    pieces; where no window filled (too few logging steps), samples over time between the
    first and last logged step of each piece."""
    windows = [v for p in pieces for *_, v in read_metrics(p / "csv" / "metrics.csv", "train/device/samples_per_sec")]
    if windows:
        return statistics.median(windows)
    sums = [_img_per_s(p) for p in pieces]
    return sum(s for s, _ in sums) / sum(t for _, t in sums)


def _img_per_s(run: Path) -> tuple[float, float]:
    """(samples, seconds) between the first and last logged training step of a run."""
    samples = read_metrics(run / "csv" / "metrics.csv", "train/samples")
    times = read_metrics(run / "csv" / "metrics.csv", "train/time")
    return samples[-1][2] - samples[0][2], times[-1][2] - times[0][2]


def _set_ckpt_path(run: Path, ckpt: Path) -> None:
    """Make `run` a resume of the checkpoint `ckpt`, as train.py ckpt_path=<ckpt> records it."""
    config = run / ".hydra" / "config.yaml"
    config.write_text(re.sub(r"(?m)^ckpt_path: .*$", f"ckpt_path: {ckpt}", config.read_text()))


def test_sweep_jobs_have_their_overrides(sweep):
    jobs, _ = sweep
    for job, attention in ((0, "sdpa"), (1, "naive")):
        assert f"attention={attention}" in (jobs / str(job) / ".hydra" / "overrides.yaml").read_text()
        assert read_metrics(jobs / str(job) / "csv" / "metrics.csv", "test/top1")


def test_report_joins_the_resumed_run_and_reads_back(sweep, tmp_path):
    jobs, resumed = sweep
    out = tmp_path / "report"
    summaries = report.main([str(jobs), str(resumed), "--out", str(out), "--plot", "--targets", "0"])

    written = {p.name for p in out.iterdir()}
    assert written == {"report.md", "summary.json", "curves.csv", "curves.png", "speed_memory.png",
                       "time_to_accuracy.png"}
    for png in ("curves.png", "speed_memory.png", "time_to_accuracy.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and (out / png).stat().st_size > 10_000
    rows = json.loads((out / "summary.json").read_text())
    assert rows == json.loads(json.dumps(summaries))
    by_attention = {r["attention"]: r for r in rows}
    assert sorted(by_attention) == ["naive", "sdpa"]  # job 1 and its resume are one run

    sdpa, naive = by_attention["sdpa"], by_attention["naive"]
    assert [Path(p).resolve() for p in naive["pieces"]] == [(jobs / "1").resolve(), resumed.resolve()]
    assert [Path(p).resolve() for p in sdpa["pieces"]] == [(jobs / "0").resolve()]
    assert (sdpa["epochs"], naive["epochs"]) == (1, 2)  # the test row (logged at epoch=1) is not an epoch
    assert sdpa["dataset"] == naive["dataset"] == "synthetic"
    assert sdpa["test_top1"] == _last(jobs / "0", "test/top1")
    assert naive["test_top1"] == _last(resumed, "test/top1")  # the last piece's test
    assert sdpa["best_val_top1"] == max(v for *_, v in read_metrics(jobs / "0" / "csv" / "metrics.csv", "val/top1"))

    # training time continues across the pieces; img/s as _expected_img_per_s says
    assert sdpa["train_wall_s"] == pytest.approx(_last(jobs / "0", "train/time"))
    assert naive["train_wall_s"] == pytest.approx(_last(jobs / "1", "train/time") + _last(resumed, "train/time"))
    assert sdpa["img_per_s"] == pytest.approx(_expected_img_per_s(jobs / "0"))
    assert naive["img_per_s"] == pytest.approx(_expected_img_per_s(jobs / "1", resumed))
    assert sdpa["peak_gib"] is None  # no GPU here
    # fit's wall clock (train.py's fit/wall_s), added up over the pieces: more than the training clock
    assert sdpa["fit_wall_s"] == pytest.approx(_last(jobs / "0", "fit/wall_s"))
    assert naive["fit_wall_s"] == pytest.approx(_last(jobs / "1", "fit/wall_s") + _last(resumed, "fit/wall_s"))
    assert naive["fit_wall_s"] > naive["train_wall_s"] > 0
    # every run reaches top-1 >= 0 at its first validation, after its first epoch
    assert naive["time_to_top1"] == {"0": pytest.approx(_last(jobs / "1", "train/time"))}

    table = (out / "report.md").read_text()
    assert f"{100 * sdpa['test_top1']:.2f}%" in table and f"{100 * naive['test_top1']:.2f}%" in table
    assert "| fit wall (s) |" in table and f"| {naive['fit_wall_s']:,.1f} |" in table
    # the synthetic data has no held-out split: validation scored the test images, and the table says so
    assert sdpa["val_split"] == naive["val_split"] == "test"
    assert f"| {100 * sdpa['best_val_top1']:.2f}% * |" in table and "validated on the test split" in table
    curves = (out / "curves.csv").read_text().splitlines()
    assert len(curves) == 1 + 1 + 2  # header, one epoch of job 0, two of job 1 + resume


def test_pieces_copied_elsewhere_are_still_joined(sweep, tmp_path):
    """Runs brought back from the machine that made them: the resumed piece's ckpt_path names
    a folder that is not here, and its copy sits under another parent; the folder's name
    (unique among the runs) ties the pieces together."""
    jobs, resumed = sweep
    copies = tmp_path / "results"
    for src, name in ((jobs / "0", "0"), (jobs / "1", "1"), (resumed, "resumed")):
        shutil.copytree(src, copies / name)
    rows = report.main([str(copies / "0"), str(copies / "1"), str(copies / "resumed"), "--out", str(tmp_path / "out")])
    naive = next(r for r in rows if r["attention"] == "naive")
    assert [Path(p).resolve() for p in naive["pieces"]] == [(copies / "1").resolve(), (copies / "resumed").resolve()]
    assert len(rows) == 2  # the copy of job 1 is a piece, not a run of its own


def test_pieces_whose_checkpoints_lived_outside_the_run_folders_are_joined(sweep, tmp_path):
    """Checkpoints written to a folder of their own (callbacks.*.dirpath set elsewhere): the
    resumed piece's ckpt_path names neither run folder, and the earlier piece is the one
    whose configured checkpoint folder held it."""
    jobs, resumed = sweep
    copies = tmp_path / "results"
    for src, name in ((jobs / "0", "a"), (jobs / "1", "b"), (resumed, "c")):
        shutil.copytree(src, copies / name)
    elsewhere = tmp_path / "gone" / "ckpt_b"  # no such folder here, and its name matches no run
    for name, text in (("b", f"dirpath: {elsewhere}"), ("c", f"dirpath: {tmp_path / 'gone' / 'ckpt_c'}")):
        config = copies / name / ".hydra" / "config.yaml"
        config.write_text(re.sub(r"(?m)^(\s+)dirpath: .*$", lambda m: m.group(1) + text, config.read_text()))
    config = copies / "c" / ".hydra" / "config.yaml"
    config.write_text(re.sub(r"(?m)^ckpt_path: .*$", f"ckpt_path: {elsewhere / 'last.ckpt'}", config.read_text()))
    assert report.resumed_from(copies / "c", [copies / "a", copies / "b", copies / "c"]) == copies / "b"
    rows = report.main([str(copies / n) for n in "abc"] + ["--out", str(tmp_path / "out")])
    naive = next(r for r in rows if r["attention"] == "naive")
    assert [Path(p).name for p in naive["pieces"]] == ["b", "c"]
    assert len(rows) == 2


def test_a_piece_that_only_tested_keeps_the_earlier_pieces(sweep, tmp_path):
    """A last piece with no training rows (it resumed a finished run and only scored the test
    split) adds its test score and keeps the training curves and times of the pieces before it."""
    jobs, resumed = sweep
    copies = tmp_path / "results"
    for src, name in ((jobs / "1", "1"), (resumed, "resumed"), (resumed, "tested")):
        shutil.copytree(src, copies / name)
    config = copies / "tested" / ".hydra" / "config.yaml"
    config.write_text(re.sub(r"(?m)^ckpt_path: .*$", f"ckpt_path: {copies / 'resumed' / 'checkpoints' / 'last.ckpt'}",
                             config.read_text()))
    metrics = copies / "tested" / "csv" / "metrics.csv"
    with metrics.open() as f:
        rows = list(csv.DictReader(f))
    tested = [r for r in rows if any(v for k, v in r.items() if k.startswith("test/"))]
    assert tested and len(tested) < len(rows)
    with metrics.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(tested)
    whole = report.main([str(copies / "1"), str(copies / "resumed"), "--out", str(tmp_path / "a")])[0]
    joined = report.main([str(copies / "1"), str(copies / "resumed"), str(copies / "tested"),
                          "--out", str(tmp_path / "b")])[0]
    assert [Path(p).name for p in joined["pieces"]] == ["1", "resumed", "tested"]
    for key in ("epochs", "best_val_top1", "train_wall_s", "img_per_s"):
        assert joined[key] == whole[key] and whole[key] is not None, key
    assert joined["test_top1"] == float(tested[-1]["test/top1"])


def test_a_piece_that_ran_past_the_checkpoint_the_next_resumed_is_cut_there(sweep, tmp_path):
    """A piece that went on training after the checkpoint the next piece resumed from (killed
    between two checkpoints, say) logged steps that the next piece trains again. The report keeps
    the earlier piece's rows only up to the next piece's first training step: those epochs count
    once, and the clock continues from where the checkpoint was taken, not from the kill."""
    jobs, resumed = sweep
    copies = tmp_path / "results"
    shutil.copytree(jobs / "1", copies / "1")
    shutil.copytree(resumed, copies / "resumed")
    _set_ckpt_path(copies / "resumed", copies / "1" / "checkpoints" / "last.ckpt")  # the folder that went on
    runs = [str(copies / "1"), str(copies / "resumed")]
    whole = report.main([*runs, "--out", str(tmp_path / "a")])[0]
    # piece 1 goes on: the training and validation rows of piece 2's epoch, on a clock 100 s later
    def read(path):
        with path.open() as f:
            return list(csv.DictReader(f))
    first, second = read(copies / "1" / "csv" / "metrics.csv"), read(resumed / "csv" / "metrics.csv")
    went_on = [{**r, "train/time": str(float(r["train/time"]) + 100.0)} if r.get("train/time") else r
               for r in second if not any(v for k, v in r.items() if k.startswith("test/"))]
    assert any(r.get("train/time") for r in went_on) and any(r.get("val/top1") for r in went_on)
    fields = list(dict.fromkeys([*first[0], *second[0]]))
    with (copies / "1" / "csv" / "metrics.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows([*first, *went_on])
    joined = report.main([*runs, "--out", str(tmp_path / "b")])[0]
    for key in ("epochs", "best_val_top1", "test_top1", "train_wall_s", "time_to_top1"):
        assert joined[key] == whole[key] and whole[key] is not None, key
    assert (tmp_path / "b" / "curves.csv").read_text() == (tmp_path / "a" / "curves.csv").read_text()
    # the same rows, not cut, would have run the clock on by the 100 s
    assert max(float(r["train/time"]) for r in went_on if r.get("train/time")) > whole["train_wall_s"]


def test_a_held_out_val_split_gets_no_mark():
    row = {"run": "r", "dataset": "cifar10", "model": "m", "attention": "flash", "epochs": 3, "best_val_top1": 0.5,
           "test_top1": 0.4, "test_top5": 0.9, "img_per_s": 100.0, "peak_gib": None, "train_wall_s": 10.0,
           "fit_wall_s": None, "time_to_top1": {}, "overrides": "", "val_split": "held out"}
    table = report.markdown([row])
    assert "| 50.00% |" in table and "*" not in table and "validated on the test split" not in table
    assert "| 50.00% * |" in report.markdown([{**row, "val_split": "test"}])


def test_report_names_a_folder_without_runs(tmp_path):
    result = run_cli("report", str(tmp_path))
    assert result.returncode != 0
    assert "holds no training run" in result.stderr and "csv/metrics.csv" in result.stderr


def test_runs_are_found_below_a_task_folder_and_the_log_folder(sweep, tmp_path):
    """`report.py outputs/<task>` or `report.py outputs` finds every run below: the task's
    runs/<time>/ and multiruns/<time>/<job>/ (jobs in numeric order), down to five levels."""
    jobs, _ = sweep
    task = tmp_path / "outputs" / "train"
    shutil.copytree(jobs / "0", task / "runs" / "2026-01-01_00-00-00")
    for job in ("10", "2", "0"):
        shutil.copytree(jobs / "1", task / "multiruns" / "2026-01-02_00-00-00" / job)
    (task / "runs" / "2026-01-01_00-00-01" / "csv").mkdir(parents=True)  # a run that failed early: no metrics
    expected = [task / "multiruns" / "2026-01-02_00-00-00" / job for job in ("0", "2", "10")]
    expected.append(task / "runs" / "2026-01-01_00-00-00")
    assert report.find_runs([tmp_path / "outputs"]) == [p.resolve() for p in expected]
    assert report.find_runs([task]) == [p.resolve() for p in expected]
    assert report.find_runs([task / "multiruns" / "2026-01-02_00-00-00"]) == [p.resolve() for p in expected[:3]]
    runs = report.chains(report.find_runs([task]))
    assert report.run_names(runs) == ["0", "2", "10", "2026-01-01_00-00-00"]
    shutil.copytree(jobs / "0", task / "multiruns" / "2026-01-03_00-00-00" / "0")  # a second sweep's job 0
    runs = report.chains(report.find_runs([task]))
    assert report.run_names(runs) == ["2026-01-02_00-00-00/0", "2026-01-02_00-00-00/2", "2026-01-02_00-00-00/10",
                                      "2026-01-03_00-00-00/0", "runs/2026-01-01_00-00-00"]
    deep = tmp_path / "deep" / "a" / "b" / "c" / "d" / "e" / "f"  # six levels below
    shutil.copytree(jobs / "0", deep)
    with pytest.raises(report.ReportError, match="holds no training run: .*up to five levels below"):
        report.find_runs([tmp_path / "deep"])


def test_overrides_column_keeps_the_recipe_not_the_places():
    kept = ["attention=flash", "trainer.max_epochs=40", "+trainer.limit_train_batches=2", "data.batch_size=64"]
    places = ["hydra.run.dir=/x/run", "paths.data_dir=/d", "ckpt_path=/x/last.ckpt",
              "callbacks.model_checkpoint.dirpath=/x/ck", "+callbacks.last_checkpoint.dirpath=/x/ck"]
    assert [o for o in kept + places if not report._where(o)] == kept


def test_runs_differing_only_in_seed_are_gathered():
    def run(name, attention, seed, test, extra=""):
        return {"run": name, "dataset": "cifar10", "model": "m", "attention": attention, "seed": seed,
                "overrides": f"experiment=x attention={attention} seed={seed} {extra}".strip(),
                "test_top1": test, "best_val_top1": (test or 0.6) + 0.01, "img_per_s": 100.0 * seed}
    summaries = [run("0", "flash", 1, 0.60, extra="task_name=a hydra.job.name=a"),
                 run("1", "flash", 2, 0.64, extra="task_name=b"), run("2", "flash", 3, None),
                 run("3", "naive", 1, 0.70), run("4", "naive", 2, 0.66),
                 run("5", "naive", 3, 0.9, extra="trainer.max_epochs=5"),  # another recipe: its own group of one
                 run("6", "sdpa", 1, 0.5)]
    groups = report.seed_groups(summaries)
    assert [(g["attention"], g["runs"]) for g in groups] == [("flash", ["0", "1", "2"]), ("naive", ["3", "4"])]
    flash, naive = groups
    assert flash["test_top1"]["n"] == 2 and flash["test_top1"]["mean"] == pytest.approx(0.62)
    assert flash["test_top1"]["sd"] == pytest.approx(statistics.stdev([0.60, 0.64]))
    assert flash["best_val_top1"]["n"] == 3 and flash["img_per_s"] == 200.0
    assert (naive["test_top1"]["min"], naive["test_top1"]["max"]) == (0.66, 0.70)
    table = report.markdown_groups(groups)
    assert "| cifar10 | m | flash | 1, 2, 3 | 62.00 ± 2.83% (60.00-64.00, 2 runs) |" in table
    assert table.count("\n") == 4 and report.markdown_groups(report.seed_groups(summaries[:1])) == ""
    curves = [{"run": r, "epoch": e, "val_top1": v} for r, e, v in
              [("0", 0, 0.2), ("1", 0, 0.3), ("2", 0, 0.4), ("0", 1, 0.5), ("1", 1, 0.6),
               ("3", 0, 0.1), ("4", 0, 0.2), ("3", 1, 0.3), ("4", 1, 0.5), ("6", 0, 0.9)]]
    means = report.markdown_groups_at_epochs(groups, curves, [0, 1]).splitlines()
    assert means[0] == "| epoch | flash: 0, 1, 2 | naive: 3, 4 |"
    assert means[2:] == ["| 0 | 30.00% | 15.00% |", "| 1 | n/a | 40.00% |"]  # run 2 has no epoch 1
    assert report.markdown_groups_at_epochs([], curves, [0]) == ""


def test_names_label_the_joined_runs_in_order(sweep, tmp_path):
    """--names replaces the folder names, one per run once the resumed pieces are joined, in
    the report's order; a count that does not match or a repeated name stops with the runs listed."""
    jobs, resumed = sweep
    out = tmp_path / "report"
    found = [s["run"] for s in report.main([str(jobs), str(resumed)])]
    assert len(found) == 2  # job 1 and its resumed folder are one run
    summaries = report.main([str(jobs), str(resumed), "--out", str(out), "--names", "sdpa-1ep", "naive-2ep"])
    assert [s["run"] for s in summaries] == ["sdpa-1ep", "naive-2ep"]
    assert [s["attention"] for s in summaries] == ["sdpa", "naive"]
    assert len(summaries[1]["pieces"]) == 2
    assert [r["run"] for r in json.loads((out / "summary.json").read_text())] == ["sdpa-1ep", "naive-2ep"]
    with open(out / "curves.csv", newline="") as f:
        assert {r["run"] for r in csv.DictReader(f)} == {"sdpa-1ep", "naive-2ep"}
    assert "| naive-2ep | " in (out / "report.md").read_text()
    for names, message in ((["one"], "gives 1 name(s) for 2 run(s)"), (["a", "a"], "repeats a")):
        with pytest.raises(SystemExit) as exit_:
            report.main([str(jobs), str(resumed), "--names", *names])
        assert message in str(exit_.value)
    assert ", ".join(found) in str(pytest.raises(SystemExit, report.main, [str(jobs), str(resumed), "--names", "x"]).value)


def test_val_top1_at_equal_epochs(sweep, tmp_path, capsys):
    """--at-epochs tabulates each run's val top-1 at those epochs and its spread across the
    runs: read back from the runs' own metrics.csv; an epoch that a run did not reach is n/a."""
    jobs, resumed = sweep
    out = tmp_path / "report"
    report.main([str(jobs), str(resumed), "--out", str(out), "--at-epochs", "0", "1"])
    sdpa = [v for epoch, _, v in read_metrics(jobs / "0" / "csv" / "metrics.csv", "val/top1") if epoch == 0]
    naive = {epoch: v for epoch, _, v in read_metrics(jobs / "1" / "csv" / "metrics.csv", "val/top1")}
    naive.update({epoch: v for epoch, _, v in read_metrics(resumed / "csv" / "metrics.csv", "val/top1")})
    table = (out / "report.md").read_text()
    assert "Val top-1 at equal epochs:" in table
    spread = f"{100 * abs(sdpa[0] - naive[0]):.2f}"
    assert f"| 0 | {100 * sdpa[0]:.2f}% | {100 * naive[0]:.2f}% | {spread} |" in table
    assert f"| 1 | n/a | {100 * naive[1]:.2f}% | n/a |" in table  # sdpa's job ran one epoch
    assert f"| 0 | {100 * sdpa[0]:.2f}% |" in capsys.readouterr().out


def test_speed_against_the_naive_run_of_the_same_model_and_seed():
    """The "img/s / naive" column: each run's img/s over that of the one naive run of its
    dataset, model and seed; n/a where none, or more than one, matches."""
    def row(name, attention, img_per_s, seed=42, model="m"):
        return {"run": name, "dataset": "cifar10", "model": model, "attention": attention, "seed": seed,
                "epochs": 3, "best_val_top1": 0.5, "test_top1": 0.4, "test_top5": 0.9, "img_per_s": img_per_s,
                "peak_gib": None, "train_wall_s": 10.0, "fit_wall_s": 12.0, "time_to_top1": {}, "overrides": "",
                "val_split": "held out"}
    flash, sdpa, naive = row("f", "flash", 300.0), row("s", "sdpa", 150.0), row("n", "naive", 120.0)
    other_seed, other_model = row("f1", "flash", 90.0, seed=1), row("fm", "flash", 50.0, model="m2")
    runs = [flash, sdpa, naive, other_seed, other_model]
    assert report.speed_vs_naive(flash, runs) == pytest.approx(2.5)
    assert report.speed_vs_naive(naive, runs) == pytest.approx(1.0)
    assert report.speed_vs_naive(other_seed, runs) is None and report.speed_vs_naive(other_model, runs) is None
    assert report.speed_vs_naive(flash, runs + [row("n2", "naive", 100.0)]) is None  # which naive? ambiguous
    lines = report.markdown(runs).splitlines()
    at = lines[0].split(" | ").index("img/s / naive")
    assert [line.split(" | ")[at] for line in lines[2:7]] == ["2.50x", "1.25x", "1.00x", "n/a", "n/a"]


def test_a_new_sweep_resumed_from_an_earlier_one_is_joined_to_the_earlier_jobs(sweep, tmp_path, capsys):
    """Jobs 0 and 1 of a new sweep that resumed jobs 1 and 0 of an earlier one (not listed):
    each checkpoint's own folder is the earlier piece, not the new sibling that bears its
    name. Folders not here are matched by name; where those matches lead round in a loop,
    each folder is a run of its own, with a warning, rather than none reported."""
    jobs, resumed = sweep
    new = tmp_path / "new"
    for job, earlier in (("0", "1"), ("1", "0")):
        shutil.copytree(resumed, new / job)
        _set_ckpt_path(new / job, jobs / earlier / "checkpoints" / "last.ckpt")
    rows = report.main([str(new)])
    assert [[Path(p).resolve() for p in r["pieces"]] for r in rows] == [
        [(jobs / "1").resolve(), (new / "0").resolve()], [(jobs / "0").resolve(), (new / "1").resolve()]]
    assert [r["run"] for r in rows] == ["0", "1"]  # the folders listed
    capsys.readouterr()
    for job, earlier in (("0", "1"), ("1", "0")):
        _set_ckpt_path(new / job, tmp_path / "gone" / earlier / "checkpoints" / "last.ckpt")
    rows = report.main([str(new)])
    assert [[Path(p).name for p in r["pieces"]] for r in rows] == [["0"], ["1"]]
    assert "lead round in a loop" in capsys.readouterr().err


def test_runs_resumed_from_one_checkpoint_are_told_apart(sweep, tmp_path):
    """Two resumes of one checkpoint share their first folder: each run is named by its last
    folder, and their curves stay apart; a folder listed twice (`report.py sweep sweep/0`) is
    one run."""
    jobs, resumed = sweep
    runs = tmp_path / "runs"
    shutil.copytree(jobs / "1", runs / "a")
    for name in ("b", "b2"):
        shutil.copytree(resumed, runs / name)
        _set_ckpt_path(runs / name, runs / "a" / "checkpoints" / "last.ckpt")
    out = tmp_path / "report"
    rows = report.main([str(runs), str(runs / "b"), "--out", str(out), "--at-epochs", "0", "1"])
    assert [r["run"] for r in rows] == ["b", "b2"]
    assert [[Path(p).name for p in r["pieces"]] for r in rows] == [["a", "b"], ["a", "b2"]]
    with open(out / "curves.csv", newline="") as f:
        assert [(r["run"], r["epoch"]) for r in csv.DictReader(f)] == [("b", "0"), ("b", "1"), ("b2", "0"), ("b2", "1")]
    assert "| epoch | b (naive) | b2 (naive) | spread (pt) |" in (out / "report.md").read_text()
    assert len(report.main([str(jobs), str(jobs / "0")])) == 2


def test_overrides_in_another_order_are_one_recipe():
    def run(name, seed, overrides):
        return {"run": name, "dataset": "cifar10", "model": "m", "attention": "flash", "seed": seed,
                "overrides": overrides.format(seed=seed), "test_top1": 0.6, "best_val_top1": 0.6, "img_per_s": 1.0}
    groups = report.seed_groups([run("0", 1, "seed={seed} trainer.max_epochs=5 data.batch_size=64"),
                                 run("1", 2, "data.batch_size=64 seed={seed} trainer.max_epochs=5")])
    assert [g["runs"] for g in groups] == [["0", "1"]]
    assert groups[0]["recipe"] == "data.batch_size=64 trainer.max_epochs=5"


def test_plot_without_matplotlib_stops_before_writing(sweep, tmp_path, monkeypatch):
    jobs, _ = sweep
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as where it is not installed
    with pytest.raises(SystemExit) as exit_:
        report.main([str(jobs), "--out", str(tmp_path / "report"), "--plot"])
    assert str(exit_.value) == 'report.py: --plot needs matplotlib: pip install -e ".[report]"'
    assert not (tmp_path / "report").exists()


def test_a_run_whose_loss_is_not_finite_is_marked(sweep, tmp_path):
    """A run that diverged (a NaN loss at its end) is marked in the table, with the mark's legend."""
    jobs, _ = sweep
    shutil.copytree(jobs / "0", tmp_path / "nan")
    metrics = tmp_path / "nan" / "csv" / "metrics.csv"
    with metrics.open() as f:
        rows = list(csv.DictReader(f))
    last = max(i for i, r in enumerate(rows) if r["val/loss"])
    rows[last]["val/loss"] = "nan"
    with metrics.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    out = tmp_path / "report"
    summaries = report.main([str(tmp_path / "nan"), str(jobs / "1"), "--out", str(out)])
    assert [s["diverged"] for s in summaries] == [True, False]
    table = (out / "report.md").read_text()
    assert "| nan † | synthetic |" in table and "| 1 | synthetic |" in table
    assert "† diverged: its last train, val or test loss is not finite" in table
    assert "†" not in report.markdown(summaries[1:])


def test_a_killed_job_is_named_and_a_missing_path_is_said_missing(sweep, tmp_path, capsys):
    """A sweep job with its config (.hydra) but no metrics (killed before it logged) is left
    out with a warning that names it; a path that is not there is said not to exist."""
    jobs, _ = sweep
    shutil.copytree(jobs, tmp_path / "sweep")
    shutil.rmtree(tmp_path / "sweep" / "1" / "csv")
    rows = report.main([str(tmp_path / "sweep")])
    assert [r["run"] for r in rows] == ["0"]
    err = capsys.readouterr().err
    assert f"{tmp_path / 'sweep' / '1'} has a run config (.hydra) but no csv/metrics.csv" in err
    with pytest.raises(SystemExit) as exit_:
        report.main([str(tmp_path / "nowhere")])
    assert str(exit_.value) == f"report.py: {tmp_path / 'nowhere'} does not exist: give run folders of " \
                               "scripts/train.py or folders above them"


def test_the_command_in_the_report_is_quoted_and_targets_are_fractions(sweep, tmp_path, capsys):
    jobs, _ = sweep
    out = tmp_path / "my report"
    report.main([str(jobs), "--out", str(out)])
    command = re.search(r"`(.*)`", (out / "report.md").read_text()).group(1)
    assert shlex.split(command) == ["python", "scripts/report.py", str(jobs), "--out", str(out)]
    for targets in (["90"], ["0.9", "-0.1"]):
        with pytest.raises(SystemExit):
            report.main([str(jobs), "--targets", *targets])
        assert f"--targets {targets[-1]}: val top-1 levels are fractions from 0 to 1 (0.9 for 90%)" \
            in capsys.readouterr().err
