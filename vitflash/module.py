"""The LightningModule: a vitflash ViT with its loss, metrics, optimizer and LR schedule.

    batch (images (B, 3, H, W), labels (B,)) -> [mixup/cutmix] -> model -> logits (B, classes)
    -> cross-entropy (label smoothing, or soft targets under mixup) -> AdamW -> warmup + cosine

Precision (bf16 autocast on GPU), gradient clipping, DDP and checkpoints belong to the
Lightning Trainer; see configs/trainer/.
"""
from __future__ import annotations

import logging
import math
import warnings
from contextlib import nullcontext
from functools import partial
from pathlib import Path
from typing import Callable

import lightning as L
import torch
import torch.nn as nn
from hydra.utils import instantiate
from lightning.pytorch.strategies import DDPStrategy, FSDPStrategy
from omegaconf import OmegaConf
from timm.data import Mixup
from timm.loss import SoftTargetCrossEntropy
from timm.optim import param_groups_layer_decay, param_groups_weight_decay
from timm.scheduler import CosineLRScheduler
from timm.utils import ModelEmaV3
from torch.distributed.fsdp import FullyShardedDataParallel
from torchmetrics import MetricCollection
from torchmetrics.classification import MulticlassAccuracy, MulticlassConfusionMatrix

import vitflash
from vitflash.data import eval_inputs
from vitflash.graph_step import AUTOCAST, WholeStepGraph
from vitflash.model import ATTN_INITS
from vitflash.ops import ATTENTION_IMPLS, check_attention_impl
from vitflash.pretrained import EMA_PREFIX, INPUTS_KEY, checkpoint_weights, load_training_checkpoint

log = logging.getLogger(__name__)

ATTENTION_CHOICES = ("auto", *ATTENTION_IMPLS)
HALF_PRECISIONS = ("bf16-mixed", "16-mixed", "bf16-true", "16-true")
COMPILE_CHOICES = ("auto", "false", "default", "reduce-overhead")



def resolve_attention(name: str, cuda: bool) -> str:
    """The attention path to run: "auto" becomes "flash" when `cuda` else "sdpa".

    Raises ValueError for an unknown name (the paths are checked by
    vitflash.ops.check_attention_impl; "auto" is this module's) and vitflash.SetupError for
    "flash" without CUDA.
    """
    if name == "auto":
        return "flash" if cuda else "sdpa"
    try:
        check_attention_impl(name)
    except ValueError:
        raise ValueError(f"unknown attention {name!r}: choose one of {', '.join(ATTENTION_CHOICES)}") from None
    if name == "flash" and not cuda:
        raise vitflash.SetupError(
            "attention=flash needs a CUDA GPU (vitflash's Triton kernel runs in bf16/fp16 on "
            "the GPU) and none is in use: choose attention=sdpa (PyTorch's fused attention), "
            "attention=naive (matmul, softmax, matmul) or attention=auto (flash on CUDA, else sdpa)"
        )
    return name


def resolve_compile(mode: str | bool | None, cuda: bool, accumulate_grad_batches: int = 1,
                    sharded: bool = False) -> str | None:
    """The `torch.compile` mode to train with, or None for eager.

    "auto" is "reduce-overhead" (CUDA graphs: the ViTs here are launch-bound at CIFAR sizes)
    when `cuda`, else eager; false (YAML's `false` arrives as a bool) and None are eager.
    CUDA graphs cannot accumulate gradients over batches (a replay overwrites the gradients
    the previous batch left in the graph's memory, pytorch/pytorch#169545): with
    accumulate_grad_batches > 1, "auto" is "default" and "reduce-overhead" is refused.
    Under FSDP (`sharded`) "auto" is eager and "reduce-overhead" is refused: FSDP frees each
    block's gathered weights after use and gathers them again into new memory, while a CUDA
    graph replays the addresses it recorded (and compiling around FSDP's hooks is untested here).
    Where the whole step is captured (model.graph_step, on by default on one GPU), setup
    compiles "auto" as "default" inside that graph instead of calling this.
    Raises ValueError for anything else, listing the choices.
    """
    if mode is None or mode is False:
        mode = "false"
    if mode not in COMPILE_CHOICES:
        raise ValueError(f"unknown compile {mode!r}: choose one of {', '.join(COMPILE_CHOICES)}")
    if sharded and mode == "reduce-overhead":
        raise ValueError("compile=reduce-overhead (CUDA graphs) cannot run under trainer=fsdp: FSDP frees each "
                         "block's gathered weights after use and allocates them again at every step, while a CUDA "
                         "graph replays the addresses it recorded. "
                         "Set model.compile=false (or auto, eager under FSDP), or use trainer=ddp")
    if mode == "auto":
        if not cuda or sharded:
            return None
        return "reduce-overhead" if accumulate_grad_batches == 1 else "default"
    if mode == "reduce-overhead" and accumulate_grad_batches > 1:
        raise ValueError(
            f"compile=reduce-overhead (CUDA graphs) cannot accumulate gradients over batches "
            f"(trainer.accumulate_grad_batches={accumulate_grad_batches}): a replay overwrites the "
            "previous batch's gradients. Set model.compile=default (or auto), or accumulate_grad_batches=1"
        )
    return None if mode == "false" else mode


def check_graph_step(compile_mode, cuda: bool, precision: str, world_size: int, accumulate_grad_batches: int,
                     optimizer, sharded: bool = False, ddp: bool = False, grad_checkpointing: bool = False) -> None:
    """Raise a ValueError (SetupError without CUDA) where model.graph_step=true cannot run."""
    fix = "or set model.graph_step=false"
    if not cuda:
        raise vitflash.SetupError(f"model.graph_step=true captures the training step as a CUDA graph and needs a "
                                  f"CUDA GPU: run on one (trainer=gpu), {fix}")
    if compile_mode not in ("auto", "false", False, None, "default"):
        raise ValueError(f"model.graph_step=true captures the step in its own CUDA graph, which cannot hold "
                         f"model.compile={compile_mode}'s CUDA graphs: set model.compile=false (eager model) or "
                         f"default (the compiled model inside the captured step), {fix}")
    if precision not in AUTOCAST:
        raise ValueError(f"model.graph_step=true runs in bf16-mixed or fp32, not trainer.precision={precision} (fp16's "
                         f"gradient scaler reads the gradients' norm on the host): set trainer.precision=bf16-mixed, {fix}")
    if sharded:
        raise ValueError(f"model.graph_step=true cannot run under trainer=fsdp (FSDP gathers and frees the weights "
                         f"at every step, while a CUDA graph replays the addresses it recorded): use one GPU, {fix}")
    if world_size > 1:
        raise ValueError(f"model.graph_step=true runs on one device ({world_size} processes here: DDP's gradient "
                         f"all-reduce is not captured): use one GPU, {fix}")
    if ddp:  # a process group of one still runs DDP's reducer hooks around the backward
        raise ValueError(f"model.graph_step=true cannot run under trainer=ddp, even with one device (DDP's gradient "
                         f"hooks are not captured): use trainer=gpu, {fix}")
    if accumulate_grad_batches > 1:
        raise ValueError(f"model.graph_step=true steps the optimizer every batch, not every "
                         f"{accumulate_grad_batches} (trainer.accumulate_grad_batches): set it to 1, {fix}")
    if optimizer not in (torch.optim.AdamW, torch.optim.Adam):
        raise ValueError(f"model.graph_step=true captures a fused, capturable AdamW or Adam step, not "
                         f"{getattr(optimizer, '__name__', optimizer)}: use optim=adamw, {fix}")
    if grad_checkpointing:  # each block's rerun saves and restores the RNG state, which a capture cannot
        raise ValueError(f"model.graph_step=true does not capture model.grad_checkpointing=true (the rerun of "
                         f"each block in the backward resets torch's RNG state): set model.grad_checkpointing="
                         f"false, {fix}")


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_hyperparameters(optimizer, **values) -> None:
    """Raise a ValueError, naming the config key and a value to pass, for a learning rate that
    is not a positive number, or a weight decay, warmup, cool-down, LR floor, layer decay,
    label smoothing or mixup setting outside its range: what the optimizer, the scheduler or
    timm's Mixup would refuse only once the data is set up, or take silently. (The model's
    sizes and dropout rates are checked by vitflash.create_model.)
    `optimizer`: the model.optimizer factory (a partial); `values`: ViTModule's arguments of
    those names."""
    keywords = getattr(optimizer, "keywords", None) or {}
    lr = keywords.get("lr")
    if lr is not None and not (_number(lr) and lr > 0):
        raise ValueError(f"model.optimizer.lr={lr!r} is not a positive number: pass e.g. model.optimizer.lr=1e-3")
    decay = keywords.get("weight_decay")
    if decay is not None and not (_number(decay) and decay >= 0):
        raise ValueError(f"model.optimizer.weight_decay={decay!r} is not a number >= 0: pass e.g. "
                         "model.optimizer.weight_decay=0.05, or 0 for none")
    at_least_0 = (lambda v: v >= 0, "a number >= 0")
    chance = (lambda v: 0 <= v <= 1, "a number in [0, 1]")
    ranges = {  # key: (test, what it must be, what to pass)
        "warmup_epochs": (*at_least_0, "e.g. 5, or 0 for none"),
        "cooldown_epochs": (*at_least_0, "e.g. 10 (the last epochs, held at min_lr), or 0 for none"),
        "warmup_lr": (*at_least_0, "e.g. 1e-6 (the LR the warmup starts from)"),
        "min_lr": (*at_least_0, "e.g. 1e-5 (where the cosine ends)"),
        "layer_decay": (lambda v: 0 < v <= 1, "null or a number in (0, 1]", "e.g. 0.75, or null to turn it off"),
        "label_smoothing": (lambda v: 0 <= v < 1, "a number in [0, 1)", "e.g. 0.1, or 0 for none"),
        "mixup_alpha": (*at_least_0, "e.g. 0.8, or 0 for no mixup"),
        "cutmix_alpha": (*at_least_0, "e.g. 1.0, or 0 for no cutmix"),
        "mixup_prob": (*chance, "the chance that a batch is mixed, e.g. 1.0"),
        "mixup_switch_prob": (*chance, "the chance of cutmix rather than mixup, e.g. 0.5"),
    }
    for key, value in values.items():
        test, must, hint = ranges[key]
        if not (value is None and key == "layer_decay") and not (_number(value) and test(value)):
            raise ValueError(f"model.{key}={value!r} is not {must}: pass {hint}")


def check_grad_checkpointing(enabled: bool, sharded: bool = False) -> None:
    """Raise a ValueError for activation checkpointing under FSDP (`sharded`): each block's rerun
    would sit outside the block's FSDP unit, a combination not tested here (Lightning's
    FSDPStrategy has activation checkpointing of its own, activation_checkpointing_policy)."""
    if enabled and sharded:
        raise ValueError("model.grad_checkpointing=true is not supported under trainer=fsdp: set "
                         "model.grad_checkpointing=false, or use it with trainer=gpu or trainer=ddp")


def check_ema(decay: float | None, warmup: bool = False, sharded: bool = False) -> None:
    """Raise a ValueError unless `decay` is None (no EMA) or a number in (0, 1) and `warmup` a
    bool; and for an EMA under FSDP (`sharded`), where each process holds a shard of the
    weights while timm's ModelEmaV3 averages a whole copy of the model."""
    if decay is None:
        return
    if isinstance(decay, bool) or not isinstance(decay, (int, float)) or not 0 < decay < 1:
        raise ValueError(
            f"model.ema_decay={decay!r} is not a number in (0, 1): the EMA keeps decay x itself + "
            "(1 - decay) x the weights at every optimizer step. Pass e.g. model.ema_decay=0.9998 "
            "(an average over about 1 / (1 - decay) = 5000 steps), or model.ema_decay=null to turn it off")
    if not isinstance(warmup, bool):
        raise ValueError(f"model.ema_warmup={warmup!r} is not true or false: pass model.ema_warmup=true "
                         "(ramp the decay up over the first steps) or false")
    if sharded:
        raise ValueError(
            f"model.ema_decay={decay} cannot run under trainer=fsdp: each process holds a shard of the "
            "weights, while the EMA (timm's ModelEmaV3) keeps and updates a whole copy of the model. "
            "Set model.ema_decay=null, or train with trainer=ddp")


def check_head_and_init(global_pool: str | None, attn_init: str, pretrained: str | None) -> dict:
    """Check model.global_pool and model.attn_init before anything is built; returns the
    pooling keywords for create_model (none where the preset or the weights decide)."""
    if global_pool not in (None, "token", "avg"):
        raise ValueError(f"model.global_pool={global_pool!r}: choose token (the class token), avg (the mean of "
                         "the patch tokens) or null (the preset's, or the pretrained weights')")
    if attn_init not in ATTN_INITS:
        raise ValueError(f"model.attn_init={attn_init!r}: choose one of {', '.join(ATTN_INITS)}")
    if attn_init != "default" and pretrained is not None:
        raise ValueError(f"model.attn_init={attn_init} draws the weights of a model trained from scratch, but "
                         f"model.pretrained={pretrained!r} loads them: set model.attn_init=default to fine-tune, "
                         "or model.pretrained=null to train from scratch")
    if global_pool is None:
        return {}
    if pretrained is not None:
        raise ValueError(f"model.global_pool={global_pool} builds a model from scratch, but model.pretrained="
                         f"{pretrained!r} brings its own pooling (class token or mean, and its norms): set "
                         "model.global_pool=null to fine-tune, or model.pretrained=null to train from scratch")
    return {"global_pool": global_pool, "class_token": global_pool == "token"}


class ViTModule(L.LightningModule):
    """Image classification with a vitflash VisionTransformer, stored as `self.model`.

    Args:
        model_name: a preset of `vitflash.create_model` (e.g. "vit_micro_patch4_32").
        num_classes, img_size: passed to create_model (img_size None keeps the preset's).
        pretrained: weights for create_model (None: random init).
        attention: "auto", "flash", "naive" or "sdpa".
        drop_path_rate, drop_rate, attn_drop_rate: stochastic depth, head dropout and
            attention-weight dropout of the model.
        shifted_patches: tokenize with shifted patches (`vitflash.model.ShiftedPatchEmbed`,
            Lee et al.) instead of the strided convolution; such checkpoints evaluate and
            resume here but do not export to timm.
        locality_attention: locality self-attention (`vitflash.model.Attention`, Lee et al.):
            no token attends to itself, each layer learns its softmax scale; likewise no
            timm export.
        global_pool: what the head reads, for a model trained from scratch. None: the
            preset's (the class token), or the pretrained weights'. "token": the class token.
            "avg": the mean of the patch tokens, then a LayerNorm (timm's fc_norm), and no
            class token at all (64 tokens for a 32 px image in 4 px patches, not 65), as in
            Beyer et al.'s plain ViT baseline. Pretrained weights bring their own pooling.
        attn_init: "default" (timm's truncated normal) or "mimetic": attention weights drawn
            so that the query-key product starts near the identity and the value-projection
            product near minus the identity (`vitflash.model.mimetic_init_`). From scratch
            only: pretrained weights would replace it.
        optimizer: a partial optimizer taking the parameter groups, e.g.
            `partial(torch.optim.AdamW, lr=1e-3, weight_decay=0.05)`; its weight_decay goes to
            every parameter except norms, biases, position embedding and class token.
        warmup_epochs: linear warmup from warmup_lr, then cosine decay to min_lr, per step.
        cooldown_epochs: the last epochs of the run held at min_lr, the cosine ending before
            them (timm's train.py --cooldown-epochs: its 300 + 10 epochs are
            trainer.max_epochs=310 with cooldown_epochs=10).
        layer_decay: layer-wise LR decay for fine-tuning (e.g. 0.75): block i of L gets
            lr * layer_decay ** (L - i); None turns it off.
        label_smoothing: of the cross-entropy (and of mixup's soft targets).
        mixup_alpha, cutmix_alpha, mixup_prob, mixup_switch_prob: timm's Mixup; both alphas
            0 turn mixing off.
        mixup_off_epoch: the epoch (counted from 0) from which the images are no longer mixed,
            as timm's train.py --mixup-off-epoch: the last epochs train on whole images, with
            the same smoothed targets. None: mix to the end.
        compile: "auto", "false", "default" or "reduce-overhead": `torch.compile` of the model
            for training, applied in place at setup (state_dict keys do not change, so
            checkpoints load either way); see `resolve_compile`. Validation and test run the
            same weights eagerly.
        ema_decay: None (off), or the decay of an exponential moving average of the weights
            (timm's ModelEmaV3, as timm's train.py --model-ema), e.g. 0.9998: `self.ema`,
            updated after every optimizer step. Validation and test evaluate it, so the best
            checkpoint is chosen on its accuracy, and `read_checkpoint` returns its weights.
        ema_warmup: ModelEmaV3's use_warmup: the decay at optimizer step n is
            min(ema_decay, 1 - n ** (-2/3)) (0.999 at step 31,600); without it, 0 at step 1
            (a copy) and ema_decay after.
        graph_step: run the whole training step (forward, loss, backward, clipping, AdamW) as
            one CUDA graph replayed per batch (`vitflash.graph_step`): for small models at small
            batches, where the host's work per step outlasts the GPU's. One CUDA device,
            bf16-mixed or fp32, AdamW/Adam, no gradient accumulation. The model runs eager
            (compile false) or compiled without CUDA graphs of its own (compile default or
            auto: inductor's fused kernels inside the captured step). "auto" (the default): on
            where the trainer allows it (the conditions above, checked at fit), else off,
            with a log line that says why.
        eval_flip: test-time augmentation by horizontal flip: validation and test score the
            mean of the logits of each image and of its mirror image (two forwards per batch).
            Training is unchanged; eval.py can turn it on or off for any checkpoint.
        grad_checkpointing: activation checkpointing in training
            (`VisionTransformer.set_grad_checkpointing`): each block runs its forward again in the
            backward instead of keeping its activations, for models or batches whose activations
            crowd the GPU. Not with graph_step (auto turns it off) nor trainer=fsdp.
        eval_shift: test-time augmentation by translation, in pixels. With s > 0 validation and
            test also score each image moved s pixels left, right, up and down, its border
            filled by reflection as the padded crop of training fills it: five views (ten with
            eval_flip, each view and its mirror image), the mean of their logits. 0 (the
            default): off. Training is unchanged; eval.py can set it for any checkpoint.
    """

    def __init__(
        self,
        model_name: str,
        num_classes: int,
        img_size: int | None = None,
        pretrained: str | None = None,
        attention: str = "auto",
        drop_path_rate: float = 0.0,
        drop_rate: float = 0.0,
        attn_drop_rate: float = 0.0,
        shifted_patches: bool = False,
        locality_attention: bool = False,
        global_pool: str | None = None,
        attn_init: str = "default",
        optimizer: Callable[..., torch.optim.Optimizer] = partial(torch.optim.AdamW, lr=1e-3, weight_decay=0.05),
        warmup_epochs: float = 0.0,
        cooldown_epochs: float = 0.0,
        warmup_lr: float = 1e-6,
        min_lr: float = 1e-5,
        layer_decay: float | None = None,
        label_smoothing: float = 0.0,
        mixup_alpha: float = 0.0,
        cutmix_alpha: float = 0.0,
        mixup_prob: float = 1.0,
        mixup_switch_prob: float = 0.5,
        mixup_off_epoch: int | None = None,
        compile: str | bool | None = "auto",
        ema_decay: float | None = None,
        ema_warmup: bool = False,
        graph_step: bool | str = "auto",
        grad_checkpointing: bool = False,
        eval_flip: bool = False,
        eval_shift: int = 0,
    ):
        super().__init__()
        check_eval_shift(eval_shift)  # the type here, before weights are fetched; the image size once built
        resolve_compile(compile, cuda=False)  # a bad value stops here, before the model is built
        check_ema(ema_decay, ema_warmup)
        check_hyperparameters(optimizer, warmup_epochs=warmup_epochs, cooldown_epochs=cooldown_epochs,
                              warmup_lr=warmup_lr, min_lr=min_lr,
                              layer_decay=layer_decay, label_smoothing=label_smoothing,
                              mixup_alpha=mixup_alpha, cutmix_alpha=cutmix_alpha, mixup_prob=mixup_prob,
                              mixup_switch_prob=mixup_switch_prob)
        head = check_head_and_init(global_pool, attn_init, pretrained)
        # plain values only, so `torch.load(weights_only=True)` reads the checkpoints
        self.save_hyperparameters(ignore=["optimizer"])
        self.optimizer_factory = optimizer
        impl = resolve_attention(attention, cuda=torch.cuda.is_available())
        self.model = vitflash.create_model(
            model_name, attention=impl, num_classes=num_classes, img_size=img_size,
            pretrained=pretrained, drop_path_rate=drop_path_rate, drop_rate=drop_rate,
            attn_drop_rate=attn_drop_rate, shifted_patches=shifted_patches,
            locality_attention=locality_attention, attn_init=attn_init, **head,
        )
        check_eval_shift(eval_shift, min(self.model.patch_embed.img_size))
        self.eval_shift = eval_shift
        try:
            self.model.set_grad_checkpointing(grad_checkpointing)
        except ValueError:
            raise ValueError(f"model.grad_checkpointing={grad_checkpointing!r} is not true or false") from None
        # The EMA: a copy of the network, made before setup compiles self.model in place, so it
        # stays eager; no gradients, and not in the optimizer's groups (configure_optimizers
        # groups self.model's parameters) nor clipped. Its state_dict keys are EMA_PREFIX's.
        self.ema: ModelEmaV3 | None = None
        if ema_decay is not None:
            # exclude_buffers: the weights are walked as parameters() rather than state_dict(),
            # about 30% less host time per update (0.6 vs 0.85 ms for vit_tiny_h12 on one CPU
            # core, the lerp itself left out); the same average, as vitflash's ViTs have no
            # buffers (it would copy them)
            self.ema = ModelEmaV3(self.model, decay=ema_decay, use_warmup=ema_warmup,
                                  exclude_buffers=True)
            self.ema.requires_grad_(False)
            # in the network's mode, not the eval mode ModelEmaV3 leaves it in: Lightning warns of
            # modules in eval mode when fit starts, and puts all of them in eval mode to validate
            self.ema.train(self.model.training)
        if mixup_off_epoch is not None and (isinstance(mixup_off_epoch, bool) or not isinstance(mixup_off_epoch, int)
                                            or mixup_off_epoch < 0):
            raise ValueError(f"model.mixup_off_epoch={mixup_off_epoch!r}: give a whole number of epochs >= 0 "
                             "(the epoch, counted from 0, from which images are no longer mixed), or null to mix "
                             "to the end")
        if not isinstance(eval_flip, bool):
            raise ValueError(f"model.eval_flip={eval_flip!r} is not true or false")
        self.eval_flip = eval_flip
        if not isinstance(graph_step, bool) and graph_step != "auto":
            raise ValueError(f"model.graph_step={graph_step!r} is not true, false or auto")
        if graph_step is True:  # the rest is checked at setup, on the trainer
            if not torch.cuda.is_available():
                check_graph_step(compile, cuda=False, precision="", world_size=1, accumulate_grad_batches=1,
                                 optimizer=torch.optim.AdamW)
            check_graph_step(compile, cuda=True, precision="bf16-mixed", world_size=1, accumulate_grad_batches=1,
                             optimizer=torch.optim.AdamW, grad_checkpointing=grad_checkpointing)
        self.mixup = None
        if mixup_alpha > 0 or cutmix_alpha > 0:
            self.mixup = Mixup(
                mixup_alpha=mixup_alpha, cutmix_alpha=cutmix_alpha, prob=mixup_prob,
                switch_prob=mixup_switch_prob, label_smoothing=label_smoothing, num_classes=num_classes,
            )
        self.train_loss = SoftTargetCrossEntropy() if self.mixup else nn.CrossEntropyLoss(label_smoothing=label_smoothing)
        self.eval_loss = nn.CrossEntropyLoss()
        # validate_args=False: the checks run torch.unique on the labels, a host sync every step
        metrics = MetricCollection({
            "top1": MulticlassAccuracy(num_classes, top_k=1, average="micro", validate_args=False),
            "top5": MulticlassAccuracy(num_classes, top_k=min(5, num_classes), average="micro",
                                       validate_args=False),
        })
        # training: top-1 only. The metrics update every batch, and each MulticlassAccuracy
        # costs the host a few hundred microseconds per update; a top-5 against the unmixed
        # labels of mixed images says little (val and test keep both)
        self.train_metrics = MetricCollection({"top1": metrics["top1"].clone()}, prefix="train/")
        self.val_metrics = metrics.clone(prefix="val/")
        self.test_metrics = metrics.clone(prefix="test/")
        self.flops_per_batch = None  # read by Lightning's ThroughputMonitor (not measured)
        self.compile_mode: str | None = None  # set at setup, when the device is known
        self.inputs: dict | None = None  # a loaded checkpoint's INPUTS_KEY (load_checkpoint)
        self.confusion: MulticlassConfusionMatrix | None = None  # scripts/eval.py's (`track_confusion`)
        # the training loss of the epoch so far: sum of loss x batch size (on the device), images
        self._loss_sum: torch.Tensor | None = None
        self._loss_count = 0
        self._clip_params: list[nn.Parameter] | None = None  # what configure_gradient_clipping clips
        self._ema_tensors: tuple[list, list, list] | None = None  # what _update_ema averages: listed once per fit
        self._whole_step: WholeStepGraph | None = None  # model.graph_step: made at the first training step
        self.graph_step = False  # whether this fit runs the captured whole step: settled at setup

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, 3, H, W) images -> (B, num_classes) logits."""
        return self.model(x)

    def setup(self, stage: str) -> None:
        # The device and precision are known now: settle "auto" and check "flash" against them.
        on_cuda = self.trainer.strategy.root_device.type == "cuda"
        half = str(self.trainer.precision) in HALF_PRECISIONS
        if self.hparams.attention == "auto":
            impl = resolve_attention("auto", cuda=on_cuda and half)
            if stage == "fit" or impl != self.model.attention:
                log.info("attention=auto -> %s (%s)", impl,
                         "CUDA in bf16/fp16" if impl == "flash" else "not on CUDA in bf16/fp16")
            self.model.set_attention(impl)
        elif self.model.attention == "flash":
            resolve_attention("flash", cuda=on_cuda)
            if not half:
                raise ValueError(
                    f"attention=flash runs in bf16/fp16 but trainer.precision={self.trainer.precision}: "
                    "set trainer.precision=bf16-mixed (as trainer=gpu does) or choose attention=sdpa"
                )
        check_grad_checkpointing(self.model.grad_checkpointing, sharded=isinstance(self.trainer.strategy, FSDPStrategy))
        if self.ema is not None:
            check_ema(self.hparams.ema_decay, sharded=isinstance(self.trainer.strategy, FSDPStrategy))
            if str(self.trainer.precision) in ("bf16-true", "16-true"):
                # the copy would be cast to bf16/fp16 with the module: fp16 rounds the updates
                # away, and ModelEmaV3's stochastic rounding of bf16 draws from a CPU generator
                raise ValueError(
                    f"model.ema_decay with trainer.precision={self.trainer.precision}: the EMA would be "
                    "held in half precision. Use trainer.precision=bf16-mixed (fp32 weights, as trainer=gpu), "
                    "or model.ema_decay=null")
            self.ema.module.set_attention(self.model.attention)
            if stage == "fit":
                chosen = getattr(getattr(self.trainer, "checkpoint_callback", None), "monitor", None)
                log.info("model.ema_decay=%g: validation and test evaluate the EMA of the weights%s",
                         self.hparams.ema_decay, "; the best checkpoint is chosen on it" if chosen else "")
        if stage == "fit":
            self.graph_step = self._settle_graph_step(on_cuda)
        if stage == "fit" and self.graph_step:
            # the model compiled without CUDA graphs of its own, or eager: the kernels inductor
            # makes (fused elementwise ops, the flash op) are launched inside the step's graph
            mode = "default" if self.hparams.compile in ("default", "auto") else None
            log.info("model.graph_step=%s: the whole training step runs as one CUDA graph, the model %s",
                     "true" if self.hparams.graph_step is True else "auto -> true", "compiled" if mode else "eager")
            # the step hands Lightning no loss on purpose: its backward and optimizer step are in the graph
            warnings.filterwarnings("ignore", message=r"`training_step` returned `None`")
        else:
            mode = resolve_compile(self.hparams.compile, cuda=on_cuda,
                                   accumulate_grad_batches=self.trainer.accumulate_grad_batches,
                                   sharded=isinstance(self.trainer.strategy, FSDPStrategy))
        if stage == "fit" and mode and self.compile_mode is None:
            # in place (nn.Module.compile): the module tree and state_dict keys stay as they are
            self.model.compile(mode=mode)
            self.compile_mode = mode
            log.info("compile=%s -> torch.compile(mode=%r) for training", self.hparams.compile, mode)

    # No host sync in a step: no .item(), metrics are updated on the device (`update`, not the
    # forward that also computes a per-batch value), and the logged tensors become numbers
    # only when the logger reads them (every trainer.log_every_n_steps). The loss is logged
    # without prog_bar=True, which would make Lightning convert it after every batch;
    # vitflash.callbacks.ProgressBar shows it when it redraws.
    # Little host work per step either: a launch-bound step (CUDA graphs) leaves the host a few
    # milliseconds, and a self.log call was the largest Python cost of the step outside the
    # model (scripts/bench_loop.py --profile). So the step's loss is handed to self.log only on
    # the steps the logger writes (train/loss_step), and the epoch's mean (train/loss_epoch) is
    # a sum kept on the device, logged in on_train_epoch_end: the values Lightning's
    # on_step/on_epoch logging gave.
    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        if self.compile_mode == "reduce-overhead":
            # a new CUDA-graph iteration: the previous step's graph outputs (its logits, and the
            # gradients Lightning clears only after this forward) may now be overwritten
            torch.compiler.cudagraph_mark_step_begin()
        x, y = batch
        target = y
        if self.mixup is not None:
            x, target = self.mixup(x, y)  # target: (B, num_classes) soft labels
        if self.graph_step:
            # forward, backward and the update, replayed: nothing is left for Lightning to do
            # (returning None skips its backward; optimizer_step below skips its step)
            logits, loss = self._graph_step().step(x, target)
        else:
            logits = self(x)
            loss = self.train_loss(logits, target)
        # against the unmixed labels (a rough guide under mixup); read now, before the next
        # replay of a CUDA graph could overwrite the logits
        self.train_metrics.update(logits, y)
        if self._loss_sum is None:
            self._loss_sum = torch.zeros((), device=loss.device)
        self._loss_sum.add_(loss.detach(), alpha=len(x))  # weighted by the batch size, as Lightning's mean
        self._loss_count += len(x)
        if self._logs_this_step():
            self.log("train/loss_step", loss.clone())  # a copy: the next replay overwrites the graph's output
        return None if self.graph_step else loss

    def _settle_graph_step(self, on_cuda: bool) -> bool:
        """model.graph_step for this fit: true where the trainer allows it (else the error that
        says what to change); auto: the same check, off where it fails."""
        choice = self.hparams.graph_step
        if not choice:
            return False
        try:
            check_graph_step(self.hparams.compile, cuda=on_cuda, precision=str(self.trainer.precision),
                             world_size=self.trainer.world_size,
                             sharded=isinstance(self.trainer.strategy, FSDPStrategy),
                             ddp=isinstance(self.trainer.strategy, DDPStrategy),
                             accumulate_grad_batches=self.trainer.accumulate_grad_batches,
                             optimizer=getattr(self.optimizer_factory, "func", self.optimizer_factory),
                             grad_checkpointing=self.model.grad_checkpointing)
        except (ValueError, vitflash.SetupError) as err:
            if choice is True:
                raise
            log.info("model.graph_step=auto -> false: %s", str(err).split(": ")[0])
            return False
        return True

    def _graph_step(self) -> WholeStepGraph:
        if self._whole_step is None:
            trainer = self.trainer
            clip = None
            if (trainer.gradient_clip_val or 0) > 0:  # as Lightning: a value <= 0 clips nothing
                clip = (float(trainer.gradient_clip_val), trainer.gradient_clip_algorithm or "norm")
            self._whole_step = WholeStepGraph(self.model, self.train_loss, self.optimizers(use_pl_optimizer=False),
                                              clip, str(trainer.precision))
        return self._whole_step

    def _logs_this_step(self) -> bool:
        """Whether the logger writes this training step (as Lightning decides for on_step values)."""
        trainer = self._trainer
        if trainer is None:  # a step called by hand: self.log says it is not attached
            return True
        return trainer._logger_connector.should_update_logs or bool(trainer.fast_dev_run)

    def _eval_step(self, batch, metrics: MetricCollection, stage: str) -> None:
        x, y = batch
        # Eager even when training is compiled: a compiled eval would add graphs for
        # inference mode and for the last, partial batch (and under CUDA graphs a second
        # memory pool) to save little, since eval is a forward over a small part of the images.
        with torch.compiler.set_stance("force_eager") if self.compile_mode else nullcontext():
            logits = self.eval_logits(x)
        self.log(f"{stage}/loss", self.eval_loss(logits, y), prog_bar=True, sync_dist=True)
        metrics.update(logits, y)
        self.log_dict(metrics, prog_bar=True)
        if self.confusion is not None:
            self.confusion.update(logits, y)

    def track_confusion(self) -> MulticlassConfusionMatrix:
        """From now on, val and test steps also count (true class, predicted class) pairs, over
        every process, in the returned metric (not saved with the weights, never reset here):
        what scripts/eval.py reports per class."""
        self.confusion = MulticlassConfusionMatrix(self.hparams.num_classes, validate_args=False).to(self.device)
        return self.confusion

    def eval_logits(self, x: torch.Tensor) -> torch.Tensor:
        """The logits that val and test score: the EMA's where there is one, and with
        eval_shift and eval_flip the mean of the logits of each view of each image (`eval_views`)."""
        net = self.model if self.ema is None else self.ema.module
        views = eval_views(x, self.eval_shift, self.eval_flip)
        logits = net(views[0])
        for view in views[1:]:  # one view at a time: the eval batch's memory stays as it is
            logits = logits + net(view)
        return logits / len(views)  # one view: divided by 1, the same logits bit for bit

    def predict_step(self, batch, batch_idx: int) -> torch.Tensor:
        """(images, anything) -> (B, num_classes) class probabilities of `eval_logits`, in fp32."""
        with torch.compiler.set_stance("force_eager") if self.compile_mode else nullcontext():
            return self.eval_logits(batch[0]).float().softmax(-1)

    def validation_step(self, batch, batch_idx: int) -> None:
        self._eval_step(batch, self.val_metrics, "val")

    def test_step(self, batch, batch_idx: int) -> None:
        self._eval_step(batch, self.test_metrics, "test")

    def _log_peak_memory(self, stage: str) -> None:
        if self.device.type == "cuda":
            self.log(f"{stage}/peak_mem_gib", torch.cuda.max_memory_allocated(self.device) / 2**30, sync_dist=True)

    def on_train_epoch_start(self) -> None:
        self._loss_sum, self._loss_count = None, 0  # nothing carried over from an epoch left unfinished
        if self.mixup is not None:
            # from the epoch alone, so a resumed run mixes exactly as an uninterrupted one
            off = self.hparams.get("mixup_off_epoch")
            self.mixup.mixup_enabled = off is None or self.current_epoch < off

    def on_train_epoch_end(self) -> None:
        if not self._loss_count:
            # no training step in this process since the epoch began: Lightning runs the end of
            # an epoch again when it resumes from a checkpoint written at that end (after its
            # validation); there is nothing to report, and computing the empty metric would log
            # a train/top1 of 0
            self.train_metrics.reset()
            return
        # computed (and synchronized across DDP processes) once per epoch: logging the metric
        # objects in every step costs the host about a millisecond per step in Lightning's
        # bookkeeping, a share of a launch-bound step
        self.log_dict(self.train_metrics.compute())
        self.train_metrics.reset()
        self.log("train/loss_epoch", self._loss_sum / self._loss_count, sync_dist=True)  # mean over all processes
        self._log_peak_memory("train")

    def on_test_epoch_end(self) -> None:
        self._log_peak_memory("test")

    def configure_optimizers(self):
        hp = self.hparams
        # timm's helpers: no decay on 1-D parameters (norms, biases) and the model's
        # no_weight_decay() names; layer decay groups by the model's group_matcher()
        weight_decay = getattr(self.optimizer_factory, "keywords", {}).get("weight_decay", 0.0)
        no_decay = self.model.no_weight_decay()
        # Under FSDP this runs after wrapping, when every parameter is a flat 1-D slice of its
        # shard (or empty), which timm would take for a norm or a bias: group them while FSDP
        # shows them whole (the same Parameter objects, as Lightning sets use_orig_params).
        sharded = isinstance(self.trainer.model, FullyShardedDataParallel)
        with FullyShardedDataParallel.summon_full_params(self.trainer.model, writeback=False) if sharded else nullcontext():
            if hp.layer_decay:
                groups = param_groups_layer_decay(self.model, weight_decay=weight_decay,
                                                  no_weight_decay_list=no_decay, layer_decay=hp.layer_decay)
            else:
                groups = param_groups_weight_decay(self.model, weight_decay=weight_decay, no_weight_decay_list=no_decay)
        self._clip_params = self._ema_tensors = None  # listed again at this fit's first clipping and EMA update
        factory = self.optimizer_factory
        # The whole update in a few multi-tensor kernels, fewer launches than foreach's. Not
        # under fp16's gradient scaler: a fused step unscales inside, after clipping would
        # have seen scaled gradients (see configure_gradient_clipping).
        if (self.device.type == "cuda" and getattr(factory, "func", None) in (torch.optim.AdamW, torch.optim.Adam)
                and "fused" not in factory.keywords and "foreach" not in factory.keywords
                and str(self.trainer.precision) not in ("16-mixed", "16")):
            factory = partial(factory, fused=True)
        if self.graph_step:
            factory = partial(self.optimizer_factory, fused=True, capturable=True)  # its step inside the graph
        optimizer = factory(groups)
        self._whole_step = None  # a new optimizer: captured again at the next fit's first steps

        total = int(self.trainer.estimated_stepping_batches)  # max_steps where it ends fit first
        # optimizer steps an epoch, which size the warmup and cool-down whatever ends fit
        batches = self.trainer.num_training_batches
        if not math.isfinite(batches):  # Lightning had max_steps for the total and read no data
            self.trainer.fit_loop.setup_data()  # what estimated_stepping_batches does otherwise
            batches = self.trainer.num_training_batches
        # (a loader without a length: the run counts as one epoch)
        per_epoch = batches / self.trainer.accumulate_grad_batches if math.isfinite(batches) else total
        # A warmup longer than a short (debug) run is cut to half of it, leaving the cosine
        # at least two steps (a one-step cosine is flat, and timm warns about it). The
        # cool-down's steps come off the cosine's end: past t_initial timm holds lr_min.
        warmup = min(round(hp.warmup_epochs * per_epoch), total // 2)
        cooldown = round(hp.get("cooldown_epochs", 0.0) * per_epoch)
        if cooldown and total - warmup - cooldown < 2:
            raise ValueError(f"model.cooldown_epochs={hp.cooldown_epochs} leaves the cosine no steps in "
                             f"{total} steps ({total / per_epoch:g} epochs) with {hp.warmup_epochs} of warmup: "
                             "lower it, or raise trainer.max_epochs")
        scheduler = CosineLRScheduler(
            optimizer, t_initial=max(total - warmup - cooldown, 2), lr_min=hp.min_lr, warmup_t=warmup,
            warmup_lr_init=hp.warmup_lr, warmup_prefix=True, t_in_epochs=False,
        )
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None,
                                    gradient_clip_algorithm=None) -> None:
        """Lightning's clipping refuses fused optimizers under mixed precision, for fear of
        clipping scaled gradients. Without a gradient scaler (bf16, fp32; a fused optimizer
        is never chosen under fp16) the gradients are the true ones: clip them directly.
        Under FSDP each process holds a shard of the gradients, so the norm is FSDP's own
        (an all-reduce of the shards' norms), which Lightning's FSDP precision does not call."""
        if self.graph_step:
            return  # clipped inside the captured step
        if gradient_clip_val is not None and gradient_clip_val <= 0:
            gradient_clip_val = None  # as Lightning: no clipping (torch's would flip the gradients' sign)
        if (gradient_clip_val and gradient_clip_algorithm in (None, "norm")
                and isinstance(self.trainer.model, FullyShardedDataParallel)):
            self.trainer.model.clip_grad_norm_(gradient_clip_val)
            return
        if not gradient_clip_val or not optimizer.defaults.get("fused"):
            return super().configure_gradient_clipping(optimizer, gradient_clip_val,
                                                       gradient_clip_algorithm)
        # listed once: self.parameters() walks the module tree (metrics included), ~0.5 ms of
        # a CPU core per step for vit_tiny; in the module's order, the order of the total norm's
        # sum, so the clipped gradients are the same bits
        if self._clip_params is None:
            self._clip_params = [p for p in self.parameters() if p.requires_grad]  # not the EMA's
        params = self._clip_params
        if gradient_clip_algorithm in (None, "norm"):
            torch.nn.utils.clip_grad_norm_(params, gradient_clip_val)
        else:
            torch.nn.utils.clip_grad_value_(params, gradient_clip_val)

    def optimizer_step(self, epoch: int, batch_idx: int, optimizer, optimizer_closure=None) -> None:
        if self.graph_step:
            optimizer_closure()  # training_step: the update, replayed as part of the step's graph
        else:
            super().optimizer_step(epoch, batch_idx, optimizer, optimizer_closure)
        if self.ema is not None:
            # Once per optimizer step: Lightning calls this hook only at the last batch of an
            # accumulation. The step of ModelEmaV3's decay counts this one, as timm's train.py
            # counts num_updates (decay 0 at step 1: the EMA starts as a copy of the trained
            # weights); Lightning's global_step (restored on resume) counts it only once this
            # hook returns.
            self._update_ema(self.global_step + 1)

    @torch.no_grad()
    def _update_ema(self, step: int) -> None:
        """ModelEmaV3.update(self.model, step): one torch._foreach_lerp_ over the weights on
        their device, with a Python float weight (no host sync), and the buffers copied. The
        tensor lists are made once per fit, not walked from both module trees at every step as
        ModelEmaV3 does: that walk took about 0.5 ms of host time per step for
        vit_tiny_h12_patch4_32 on one CPU core, where the whole captured step of the best CIFAR
        recipe takes the host about 6.4 ms (scripts/bench_loop.py on an H200). The tensors stay the same objects through a fit (compiled
        in place; checkpoints load into them). The EMA's dtype is the weights' (bf16 weights
        with an EMA are refused at setup), so ModelEmaV3's stochastic rounding has no part here."""
        if self._ema_tensors is None:
            ema, net = self.ema.module, self.model
            self._ema_tensors = (list(ema.parameters()), list(net.parameters()), list(zip(ema.buffers(), net.buffers())))
        ema_params, params, buffers = self._ema_tensors
        torch._foreach_lerp_(ema_params, params, 1.0 - self.ema.get_decay(step))
        for ema_buffer, buffer in buffers:
            ema_buffer.copy_(buffer)

    def lr_scheduler_step(self, scheduler: CosineLRScheduler, metric=None) -> None:
        # timm schedulers are driven by the number of optimizer updates, which also resumes right
        scheduler.step_update(num_updates=self.global_step)
        if self._whole_step is not None:
            self._whole_step.sync_lrs()  # the schedule writes floats; the graph reads its tensors

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        # the data's eval transform and class names, so that the checkpoint alone can classify images
        datamodule = getattr(self._trainer, "datamodule", None)
        if hasattr(datamodule, "inputs"):
            checkpoint[INPUTS_KEY] = datamodule.inputs()

    # On resume the schedule is re-planned from the current config: timm's scheduler is a pure
    # function of (plan, step), so the plan that configure_optimizers just made is kept and the
    # checkpoint's (t_initial, warmup_t, ... of the old max_epochs) is not loaded over it.
    # Same config: the same LRs, bit for bit; a larger trainer.max_epochs: the cosine is
    # stretched to the new length from the step reached (the LR rises again), instead of the
    # extra epochs running at min_lr.
    def on_load_checkpoint(self, checkpoint: dict) -> None:
        self._match_ema(checkpoint["state_dict"])
        states = checkpoint.get("lr_schedulers") or []
        self._resumed_plan = [s.get("t_initial", 0) + s.get("warmup_t", 0) for s in states]
        checkpoint["lr_schedulers"] = [{} for _ in states]  # timm's load_state_dict({}) keeps the new plan

    def _match_ema(self, state_dict: dict) -> None:
        """Resuming with the EMA turned on or off since the checkpoint: a new EMA starts from
        the checkpoint's weights (as timm's train.py does); an unwanted one is dropped."""
        has_ema = any(k.startswith(EMA_PREFIX) for k in state_dict)
        if self.ema is not None and not has_ema:
            log.info("the checkpoint has no EMA of the weights: the EMA starts from its weights")
            state_dict.update({EMA_PREFIX + k[len("model."):]: v.clone() for k, v in list(state_dict.items())
                               if k.startswith("model.")})
        elif self.ema is None and has_ema:
            log.info("model.ema_decay=null: the checkpoint's EMA of the weights is dropped")
            for k in [k for k in state_dict if k.startswith(EMA_PREFIX)]:
                del state_dict[k]

    def on_train_start(self) -> None:
        planned = getattr(self, "_resumed_plan", None)
        if not planned:
            return
        for config, old in zip(self.trainer.lr_scheduler_configs, planned):
            new = config.scheduler.t_initial + config.scheduler.warmup_t
            if new != old:
                log.info("LR schedule re-planned from %d to %d steps (trainer.max_epochs changed)", old, new)
            config.scheduler.step_update(num_updates=self.global_step)  # this step's LR under the plan
        self._resumed_plan = None


def check_eval_shift(shift, size: int | None = None, key: str = "model.eval_shift") -> None:
    """model.eval_shift (named `key` in messages): whole pixels >= 0, and (given the images'
    `size`) less than it, as reflection can fill no wider border."""
    if isinstance(shift, bool) or not isinstance(shift, int) or shift < 0:
        raise ValueError(f"{key}={shift!r}: give a whole number of pixels >= 0 to also score each "
                         "image moved that far left, right, up and down (0: off)")
    if size is not None and shift >= size:
        raise ValueError(f"{key}={shift} does not fit the model's {size}px images: reflection fills a "
                         f"border narrower than the image; give at most {size - 1} (a few pixels, e.g. 2 at 32px)")


def eval_views(x: torch.Tensor, shift: int = 0, flip: bool = False) -> list[torch.Tensor]:
    """The views of the images x (B, C, H, W) that eval_logits averages: x itself; with
    `shift`, x moved `shift` pixels left, right, up and down, the border filled by reflection;
    with `flip`, the mirror image of each of those."""
    views = [x]
    if shift:
        padded = nn.functional.pad(x, (shift,) * 4, mode="reflect")
        H, W = x.shape[-2:]
        views += [padded[..., shift + dy:shift + dy + H, shift + dx:shift + dx + W]
                  for dy, dx in ((0, shift), (0, -shift), (shift, 0), (-shift, 0))]
    if flip:
        views += [v.flip(-1) for v in views]
    return views


def load_checkpoint(path: str | Path, attention: str | None = None,
                    eval_flip: bool | None = None, eval_shift: int | None = None) -> ViTModule:
    """A ViTModule with the weights of checkpoint `path`; `attention` overrides the path it
    was trained with, `eval_flip` and `eval_shift` (if not None) its test-time augmentation. Pretrained weights are not fetched again (the checkpoint has them).
    A run with model.ema_decay gives its EMA weights (those it validated), as `module.model`,
    and the module keeps no second copy."""
    checkpoint = load_training_checkpoint(path)
    state_dict, hparams = checkpoint_weights(checkpoint, path)
    if hparams.get("ema_decay") is not None:
        log.info("%s: the EMA of the weights (model.ema_decay=%g)", path, hparams["ema_decay"])
    # graph_step captures the training step only (and needs CUDA): off for a model that is scored
    hparams = {**hparams, "pretrained": None, "ema_decay": None, "graph_step": False}
    if attention is not None:
        hparams["attention"] = attention
    if eval_flip is not None:
        hparams["eval_flip"] = eval_flip
    if eval_shift is not None:
        hparams["eval_shift"] = eval_shift
    module = ViTModule(**hparams)
    module.model.load_state_dict(state_dict)  # the network's weights: the module's other state is not saved
    module.inputs = checkpoint.get(INPUTS_KEY)  # what scripts/predict.py feeds it (None: an older checkpoint)
    return module


def checkpoint_inputs(module: ViTModule, ckpt: str | Path) -> dict:
    """The eval transform's settings and class names saved with the checkpoint; for a checkpoint
    written before they were saved, the transform from its run folder's config (.hydra/), without
    class names."""
    if module.inputs is not None:
        return module.inputs
    config = Path(ckpt).resolve().parent.parent / ".hydra" / "config.yaml"
    if not config.is_file():
        raise ValueError(
            f"{ckpt} does not record its eval transform (checkpoints of older vitflash versions do not), and "
            f"no run config is beside it at {config}: keep the checkpoint in its run folder's checkpoints/, "
            f"where scripts/train.py wrote it")
    data = OmegaConf.load(config).data
    log.warning("%s predates saved inputs: the eval transform is read from %s; classes are shown by index",
                ckpt, config)
    return eval_inputs(instantiate(data.get("augment") or {"_target_": "vitflash.data.Augment"}), data.img_size)
