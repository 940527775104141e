"""Every config group composes with the real configs/ and builds its objects; typos fail clearly."""
from __future__ import annotations

import re
from pathlib import Path

import hydra
import lightning as L
import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.errors import MissingConfigException
from hydra.utils import instantiate
from lightning.pytorch.strategies import FSDPStrategy
from omegaconf import OmegaConf
from torch.distributed.fsdp import ShardingStrategy
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

import vitflash.module  # noqa: F401  (registers the ${if_cuda:...} resolver)
from vitflash.cli import check_trainer
from vitflash.model import Block
from vitflash.overrides import unknown_key_error

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONFIGS / group).glob("*.yaml"))


def compose_cfg(tmp_path: Path, overrides: list[str], config_name: str = "train"):
    """configs/<config_name>.yaml as scripts/*.py would see it, with paths under tmp_path."""
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        return compose(config_name, overrides=[
            f"paths.data_dir={tmp_path / 'data'}", f"paths.output_dir={tmp_path / 'out'}", *overrides,
        ])


def build(cfg) -> tuple[L.LightningDataModule, L.LightningModule, L.Trainer]:
    """The objects scripts/train.py builds from cfg (no data is read)."""
    data = instantiate(cfg.data, _convert_="all")
    module = instantiate(cfg.model, _convert_="all")
    callbacks = [instantiate(c, _convert_="all") for c in (cfg.get("callbacks") or {}).values()]
    loggers = [instantiate(c, _convert_="all") for c in (cfg.get("logger") or {}).values()]
    trainer = instantiate(cfg.trainer, callbacks=callbacks, logger=loggers or False, _convert_="all")
    return data, module, trainer


def test_groups_are_all_there():
    for group, expected in {
        "attention": {"auto", "flash", "naive", "sdpa"},
        "data": {"cifar10", "cifar100", "imagenet", "synthetic"},
        "trainer": {"cpu", "gpu", "ddp", "fsdp"},
        "logger": {"csv", "tensorboard"},
    }.items():
        assert expected <= set(options(group)), group
    for group in ("model", "optim", "callbacks", "experiment", "debug"):
        assert options(group), group


def test_defaults_build_and_agree(tmp_path):
    cfg = compose_cfg(tmp_path, [])
    data, module, trainer = build(cfg)
    assert module.model.num_classes == data.num_classes == 10
    assert module.model.config["img_size"] == data.img_size == 32
    assert cfg.model.attention == "auto"
    # no GPU here: the default trainer falls back to fp32 on the CPU
    expected = "bf16-mixed" if torch.cuda.is_available() else "32-true"
    assert trainer.precision == expected
    assert str(trainer.default_root_dir) == str(tmp_path / "out")
    assert trainer.gradient_clip_val == 1.0
    assert {type(c).__name__ for c in trainer.callbacks} >= {"ModelCheckpoint", "ThroughputMonitor", "LearningRateMonitor"}


@pytest.mark.parametrize("group", ["data", "model", "optim", "callbacks", "logger", "debug"])
def test_every_option_builds(tmp_path, group):
    for option in options(group):
        data, module, trainer = build(compose_cfg(tmp_path, [f"{group}={option}"]))
        assert module.model.num_classes == data.num_classes, option


@pytest.mark.parametrize("attention", ["auto", "naive", "sdpa"])
def test_attention_options_reach_the_model(tmp_path, attention):
    _, module, _ = build(compose_cfg(tmp_path, [f"attention={attention}"]))
    assert module.hparams.attention == attention
    assert module.model.attention == ("sdpa" if attention == "auto" and not torch.cuda.is_available() else attention)


def test_attention_flash_without_cuda_names_the_alternatives(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA, where attention=flash is valid")
    cfg = compose_cfg(tmp_path, ["attention=flash"])
    with pytest.raises(Exception, match=r"needs a CUDA GPU.*attention=sdpa.*attention=naive.*attention=auto"):
        instantiate(cfg.model, _convert_="all")


# ids other than the bare option name: the conftest reads a "gpu" keyword as the gpu marker
@pytest.mark.parametrize("option", options("trainer"), ids=lambda o: f"trainer_{o}")
def test_trainer_options(tmp_path, option):
    cfg = compose_cfg(tmp_path, [f"trainer={option}"])
    assert cfg.trainer.gradient_clip_val == 1.0
    if option in ("gpu", "fsdp"):
        assert (cfg.trainer.accelerator, cfg.trainer.precision) == ("gpu", "bf16-mixed")
        if not torch.cuda.is_available():
            return  # Lightning refuses a GPU trainer without a GPU; composed is all we can check
    trainer = build(cfg)[2]
    if option == "ddp":
        assert type(trainer.strategy).__name__ == "DDPStrategy"
    if option == "fsdp":
        assert type(trainer.strategy).__name__ == "FSDPStrategy"


def test_fsdp_strategy_settings(tmp_path):
    """trainer=fsdp's strategy, built alone (the Trainer needs a GPU): every encoder block its
    own FSDP unit, full sharding, FSDP's casts left at fp32 (bf16 comes from autocast)."""
    strategy = instantiate(compose_cfg(tmp_path, ["trainer=fsdp"]).trainer.strategy, _convert_="all")
    assert isinstance(strategy, FSDPStrategy)
    assert strategy.sharding_strategy == ShardingStrategy.FULL_SHARD
    policy = strategy.kwargs["auto_wrap_policy"]
    assert isinstance(policy, ModuleWrapPolicy) and policy._module_classes == {Block}
    precision = strategy.mixed_precision
    assert (precision.param_dtype, precision.reduce_dtype, precision.buffer_dtype) == (torch.float32,) * 3
    assert strategy.kwargs["use_orig_params"]  # Lightning's: the optimizer sees the model's own parameters


def test_fsdp_without_cuda_is_refused_with_the_alternative(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA, where trainer=fsdp runs")
    for extra in ([], ["trainer.accelerator=cpu"]):
        cfg = compose_cfg(tmp_path, ["trainer=fsdp", *extra])
        with pytest.raises(ValueError, match=r"trainer=fsdp .* CUDA GPUs only.*trainer=ddp trainer.accelerator=cpu"):
            check_trainer(cfg.trainer)


@pytest.mark.parametrize("option", options("experiment"))
def test_experiments_build(tmp_path, option):
    # pretrained weights would be fetched from the hub: the recipe is checked without them
    cfg = compose_cfg(tmp_path, [f"experiment={option}", "model.pretrained=null"])
    assert cfg.task_name == option
    data, module, trainer = build(cfg)
    assert module.model.num_classes == data.num_classes
    assert module.model.config["img_size"] == data.img_size


def test_best_cifar_recipe_is_its_measured_command(tmp_path):
    """experiment=cifar10_vit_h12_gap_mimetic_10min composes to the command its README figure
    came from (the shifted-patch recipe with mean pooling, mimetic init and 800 epochs), but for
    its task name and the time limit that run passed and did not reach; its model has no class
    token, so the attention runs at 64 tokens."""
    best = compose_cfg(tmp_path, ["experiment=cifar10_vit_h12_gap_mimetic_10min"])
    run = compose_cfg(tmp_path, ["experiment=cifar10_vit_h12_spt_lsa_10min", "model.global_pool=avg",
                                 "model.attn_init=mimetic", "trainer.max_epochs=800"])
    best, run = (OmegaConf.to_container(c) for c in (best, run))
    assert best.pop("task_name") == "cifar10_vit_h12_gap_mimetic_10min"
    assert run.pop("task_name") == "cifar10_vit_h12_spt_lsa_10min"
    assert best == run
    model = instantiate(compose_cfg(tmp_path, ["experiment=cifar10_vit_h12_gap_mimetic_10min"]).model,
                        _convert_="all").model
    assert model.cls_token is None and model.pos_embed.shape[1] == 64


def test_eval_config_composes(tmp_path):
    cfg = compose_cfg(tmp_path, ["ckpt_path=x.ckpt", "attention=naive", "data=synthetic"], "eval")
    assert (cfg.model.attention, cfg.split, cfg.data.num_classes) == ("naive", "test", 10)
    instantiate(cfg.data, _convert_="all")
    instantiate(cfg.trainer, _convert_="all")


@pytest.mark.parametrize("override,available", [
    ("attention=flsh", "sdpa"),
    ("data=cifar11", "cifar10"),
])
def test_mistyped_group_option_lists_the_choices(tmp_path, override, available):
    with pytest.raises(MissingConfigException, match=rf"Could not find '{override.replace('=', '/')}'") as e:
        compose_cfg(tmp_path, [override])
    assert available in str(e.value.options)


def test_mistyped_value_is_refused_when_building(tmp_path):
    cfg = compose_cfg(tmp_path, ["model.attention=flsh"])
    with pytest.raises(hydra.errors.InstantiationException, match=r"unknown attention 'flsh': choose one of auto, flash, naive, sdpa"):
        instantiate(cfg.model, _convert_="all")
    cfg = compose_cfg(tmp_path, ["model.model_name=vit_pico"])
    with pytest.raises(hydra.errors.InstantiationException, match=r"unknown model .vit_pico.: choose one of .*vit_micro_patch4_32"):
        instantiate(cfg.model, _convert_="all")
    cfg = compose_cfg(tmp_path, ["data.augment.train_crop=pda"])
    with pytest.raises(hydra.errors.InstantiationException, match=r"train_crop='pda': choose 'rrc'"):
        instantiate(cfg.data, _convert_="all")


# --------------------------------------------------------------------------------------
# A mistyped key on the command line (vitflash.overrides): the keys it may have meant


@pytest.mark.parametrize("argv, meant", [
    (["optim.lr=0.1"], "model.optimizer.lr"),  # the optim group's package is model.optimizer
    (["lr=0.1"], "model.optimizer.lr"),
    (["model.optimizer.lrr=0.1"], "model.optimizer.lr"),
    (["trainer.epochs=3"], "trainer.max_epochs"),
    (["data.batch=64"], "data.batch_size"),
    (["model.name=vit_tiny_patch4_32"], "model.model_name"),
    (["experiment=cifar10_quick", "trainer.max_epchs=2", "--cfg", "job"], "trainer.max_epochs"),
])
def test_a_mistyped_key_names_the_key_meant(argv, meant):
    error = unknown_key_error(CONFIGS, "train", argv)
    key = next(a for a in argv if "=" in a and not a.startswith("experiment=")).split("=")[0]
    assert error.startswith(f"{key}=") and f"has no key {key}, so there is nothing to set" in error
    assert f"Did you mean {meant}" in error and "python scripts/train.py --cfg job" in error


def test_a_plus_key_nothing_reads_is_an_error_not_a_silent_default():
    # Hydra's own advice for optim.lr=0.1 is +optim.lr=0.1, which trains with the default lr
    error = unknown_key_error(CONFIGS, "train", ["+optim.lr=0.1"])
    assert "nothing reads optim.lr, because the train config has no optim" in error
    assert "Did you mean model.optimizer.lr" in error
    # an argument the node's class does not take would stop the run only once it is built
    error = unknown_key_error(CONFIGS, "train", ["+model.optimizer.lrr=0.1"])
    assert "torch.optim.AdamW (the node model.optimizer) takes no argument lrr" in error
    assert "Did you mean model.optimizer.lr" in error


def test_a_key_the_class_takes_but_the_yaml_leaves_out_gets_the_plus():
    error = unknown_key_error(CONFIGS, "train", ["trainer.val_check_interval=0.5"])
    assert error == ("trainer.val_check_interval=0.5: the train config does not list trainer.val_check_interval, "
                     "but lightning.pytorch.Trainer takes val_check_interval: add it with a plus, "
                     "+trainer.val_check_interval=0.5 `python scripts/train.py --cfg job` prints every key and its "
                     "value.")


def test_every_mistyped_key_is_named_at_once():
    error = unknown_key_error(CONFIGS, "train", ["optim.lr=0.1", "data.batch_size=8", "trainer.epochs=3",
                                                 "+model.optimizer.lrr=0.1"])
    lines = error.splitlines()
    assert lines[0] == "3 overrides cannot be applied as typed:"
    assert lines[1].startswith("- optim.lr=0.1: ") and "Did you mean model.optimizer.lr?" in lines[1]
    assert lines[2].startswith("- trainer.epochs=3: ") and "Did you mean trainer.max_epochs?" in lines[2]
    assert lines[3].startswith("- +model.optimizer.lrr=0.1: ") and "takes no argument lrr" in lines[3]
    assert lines[4] == "`python scripts/train.py --cfg job` prints every key and its value."
    assert len(lines) == 5  # the valid data.batch_size=8 is not among them


def test_each_job_of_a_sweep_over_groups_is_checked():
    # cifar10_vit_tiny has model.mixup_prob, cifar10_quick does not: the second job would fail
    error = unknown_key_error(CONFIGS, "train", ["-m", "experiment=cifar10_vit_tiny,cifar10_quick",
                                                 "model.mixup_prob=0.5"])
    assert error.startswith("model.mixup_prob=0.5 (in the sweep's job with experiment=cifar10_quick): ")
    assert "vitflash.module.ViTModule takes mixup_prob: add it with a plus, +model.mixup_prob=0.5" in error


@pytest.mark.parametrize("argv", [
    [],
    ["experiment=cifar10_vit_tiny", "model.mixup_prob=0.5", "model.optimizer.lr=3e-3"],
    ["optim=sgd", "model.optimizer.momentum=0.8"],  # a key that the chosen group brings
    ["-m", "model.optimizer.lr=1e-3,2e-3", "attention=flash,naive", "seed=1,2"],
    ["+trainer.val_check_interval=0.5", "+model.optimizer.foreach=true", "+callbacks.extra.x=1"],
    ["trainer.limit_train_batches=10", "trainer.limit_val_batches=0.5", "trainer.limit_test_batches=0"],
    ["trainer.max_time=00:01:00:00", "callbacks.progress_bar=null", "hydra.run.dir=/tmp/x"],
    ["-m", "hydra/launcher=basic", "hydra/job_logging=default", "seed=1,2"],  # Hydra's own groups
    ["-m", "attention=glob(*)", "trainer.epochs=1"],  # a glob over a group's options: left to Hydra whole
    ["-m", "seed=range(0,3)", "model.optimizer.lr=interval(1e-4,1e-3)"],  # a sweeper plugin's syntax
    ["+base_lr=0.1", "model.optimizer.lr=${base_lr}"],  # a top-level key read through an interpolation
    ["attention=flsh", "x=1"],  # a mistyped group: left to Hydra, which lists the options
    ["--help"],
])
def test_keys_the_config_has_pass(argv):
    assert unknown_key_error(CONFIGS, "train", argv) is None


def test_eval_keys_are_checked_against_the_eval_config():
    assert unknown_key_error(CONFIGS, "eval", ["ckpt_path=x.ckpt", "split=val", "data.batch_size=8"]) is None
    assert "Did you mean split?" in unknown_key_error(CONFIGS, "eval", ["ckpt_path=x.ckpt", "splt=val"])


def _documented_commands() -> list[tuple[str, list[str], str]]:
    """(script, overrides, where) of every `python scripts/train.py|eval.py ...` in the docs,
    with comments and brackets left out, -m kept, and placeholders filled ($(...) with a path): a value's (`ckpt_path=<run>/...`)
    with a path, a group choice's (`experiment=<name>`) with the default, and one of their own
    (`<the run's overrides>`) with nothing."""
    def fill(match: re.Match) -> str:
        key = match.group(1)
        return "" if (CONFIGS / key.lstrip("+")).is_dir() else f"{key}=x"

    commands = []
    for doc in ("README.md", "benchmarks/README.md", "benchmarks/TRAINING_RUNS.md", "benchmarks/KERNEL_NOTES.md"):
        text = (CONFIGS.parent / doc).read_text()
        for match in re.finditer(r"python scripts/(train|eval)\.py([^`\n]*)", text):
            line = re.sub(r"\$\([^)]*\)", "x", match.group(2).split("#")[0])  # a shell's $(...)
            line = re.sub(r"([\w.+~]+)=<[^<>]*>", fill, line)
            words = re.sub(r"<[^<>]*>|[\[\]]", " ", line).split()  # [optional overrides] kept
            argv = [w for w in words if "=" in w or w in ("-m", "--multirun")]
            commands.append((match.group(1), argv, f"{doc}: {match.group(0)}"))
    return commands


def test_every_documented_command_uses_keys_the_configs_have():
    commands = _documented_commands()
    assert len(commands) > 50  # the README's commands, and the result files'
    for script, argv, where in commands:
        assert unknown_key_error(CONFIGS, script, argv) is None, where
        # the check composed this command's config: a mistyped key added to it is caught
        mistyped = unknown_key_error(CONFIGS, script, [*argv, "trainer.max_epochz=1"])
        assert mistyped is not None and "Did you mean trainer.max_epochs" in mistyped, where
