"""Evaluate a checkpoint: top-1/top-5, loss and peak GPU memory on a split of a dataset.

    python scripts/eval.py ckpt_path=<run>/checkpoints/last.ckpt               # CIFAR-10 test
    python scripts/eval.py ckpt_path=... data=imagenette attention=naive split=val
    python scripts/eval.py ckpt_path=... eval_flip=true   # each image and its mirror image
    python scripts/eval.py ckpt_path=... eval_shift=2     # and each image moved 2 px four ways

The result is printed as one JSON line and written to <eval run folder>/eval.json; beside it,
per_class.csv (each class's images and top-1) and confusion.csv (true class x predicted class).
"""
from __future__ import annotations

import csv
import json
import logging
from pathlib import Path

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from vitflash.checkpoint import check_finite
from vitflash.cli import check_trainer, host_peak_rss_gib, run_session, short_errors
from vitflash.data import imagenet_words
from vitflash.files import written_whole
from vitflash.module import check_eval_shift, load_checkpoint
from vitflash.overrides import checked_keys

log = logging.getLogger(__name__)
SPLITS = ("test", "val")


def evaluate(cfg: DictConfig) -> dict:
    """Evaluate cfg.ckpt_path on split cfg.split of cfg.data with attention cfg.model.attention."""
    if OmegaConf.is_missing(cfg, "ckpt_path"):
        raise ValueError("eval.py scores a checkpoint: pass ckpt_path=<run dir>/checkpoints/<file>.ckpt "
                         "(last.ckpt, or the best one, named by its val top-1)")
    if cfg.split not in SPLITS:
        raise ValueError(f"split={cfg.split!r}: choose one of {', '.join(SPLITS)}")
    check_trainer(cfg.trainer)
    if cfg.eval_flip is not None and not isinstance(cfg.eval_flip, bool):  # (1 == True: `in` would let 1 by)
        raise ValueError(f"eval_flip={cfg.eval_flip!r}: give true (score each image and its mirror image), "
                         "false, or null (as the checkpoint's run validated)")
    torch.set_float32_matmul_precision(cfg.matmul_precision)
    if cfg.eval_shift is not None:
        check_eval_shift(cfg.eval_shift, key="eval_shift")  # the model's image size is checked as it loads
    module = load_checkpoint(cfg.ckpt_path, attention=cfg.model.attention, eval_flip=cfg.eval_flip,
                             eval_shift=cfg.eval_shift)
    check_finite(module.state_dict(), cfg.ckpt_path)  # else the scores would be NaN, exit status 0
    datamodule = instantiate(cfg.data, _convert_="all")
    if module.hparams.num_classes != datamodule.num_classes:
        raise ValueError(
            f"the checkpoint classifies {module.hparams.num_classes} classes but data has "
            f"{datamodule.num_classes}: pass the data= options the model was trained with"
        )
    confusion = module.track_confusion()
    trainer = instantiate(cfg.trainer, logger=False, _convert_="all")
    on_cuda = trainer.strategy.root_device.type == "cuda"
    if on_cuda:
        torch.cuda.init()  # the memory statistics refuse a device before CUDA is initialized
        torch.cuda.reset_peak_memory_stats(trainer.strategy.root_device)
    run = trainer.test if cfg.split == "test" else trainer.validate
    (metrics,) = run(module, datamodule=datamodule, verbose=False)
    prefix = "test/" if cfg.split == "test" else "val/"
    result = {
        "checkpoint": str(cfg.ckpt_path),
        "model": module.hparams.model_name,
        "split": cfg.split,
        "attention": module.model.attention,
        "eval_flip": module.eval_flip,
        "eval_shift": module.eval_shift,
        "precision": str(trainer.precision),
        "top1": metrics[prefix + "top1"],
        "top5": metrics[prefix + "top5"],
        "loss": metrics[prefix + "loss"],
        "peak_mem_gib": torch.cuda.max_memory_allocated(trainer.strategy.root_device) / 2**30 if on_cuda else None,
        "host_peak_rss_gib": host_peak_rss_gib(),  # the process's peak RSS, on CPU and GPU alike
    }
    counts = confusion.compute().cpu()  # (true, predicted) image counts, summed over the processes
    per_class = per_class_top1(counts, datamodule.classes)
    scored = [(name, top1) for name, _, top1 in per_class if top1 is not None]  # (a class with images)
    result["lowest_classes"] = [[name, top1] for name, top1 in sorted(scored, key=lambda r: r[1])[:3]]
    if trainer.world_size > 1:
        log.warning("%d processes: the sampler repeats up to %d images so that each process scores as many, "
                    "and the repeats count in top-1; trainer.devices=1 scores every image once",
                    trainer.world_size, trainer.world_size - 1)
    if not trainer.is_global_zero:
        return result  # (the metrics are the same on every process: one writes and prints them)
    if HydraConfig.initialized():
        folder = Path(HydraConfig.get().runtime.output_dir)
        write_per_class(folder, per_class, counts)
        with written_whole(folder / "eval.json") as tmp:
            Path(tmp).write_text(json.dumps(result, indent=2) + "\n")
        log.info("wrote eval.json, per_class.csv and confusion.csv into %s", folder)
    print(json.dumps(result))
    return result


def per_class_top1(counts: torch.Tensor, classes: list[str] | None) -> list[tuple[str, int, float | None]]:
    """(class name, images, top-1) of each class, in label order, from a confusion matrix of
    counts (rows: true class, columns: predicted); top-1 None for a class with no images.
    Without names (synthetic data) a class is named by its index."""
    names = classes if classes is not None else [str(i) for i in range(len(counts))]
    rows = []
    for name, row, hits in zip(names, counts.tolist(), counts.diagonal().tolist()):
        images = int(sum(row))
        rows.append((str(name), images, hits / images if images else None))
    return rows


def write_per_class(folder: Path, per_class: list[tuple[str, int, float | None]], counts: torch.Tensor) -> None:
    """per_class.csv (index, class, images, top1, and ImageNet's words for a class folder
    named by its WordNet ID) and confusion.csv (a row per true class, a column per predicted
    class, image counts) into `folder`."""
    words = imagenet_words(name for name, *_ in per_class)
    with written_whole(folder / "per_class.csv") as tmp, open(tmp, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["index", "class", "images", "top1", "description"])
        writer.writerows([i, name, images, "" if top1 is None else f"{top1:.6f}", words.get(name, "")]
                         for i, (name, images, top1) in enumerate(per_class))
    names = [name for name, *_ in per_class]
    with written_whole(folder / "confusion.csv") as tmp, open(tmp, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["true \\ predicted", *names])
        writer.writerows([name, *row] for name, row in zip(names, counts.long().tolist()))


@checked_keys(Path(__file__).resolve().parents[1] / "configs", "eval")  # a mistyped key: the keys it may mean
@hydra.main(version_base="1.3", config_path="../configs", config_name="eval")
@short_errors
def main(cfg: DictConfig) -> None:
    with run_session():  # quiet output; no run folder left by a run that fails at the start
        evaluate(cfg)


if __name__ == "__main__":
    main()
