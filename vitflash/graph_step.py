"""The whole training step as one CUDA graph: forward, loss, backward, clipping and the
optimizer's update, captured once and replayed for every batch (`model.graph_step=true`).

A small ViT at a small batch is bound by the host: even compiled with CUDA graphs
(`model.compile=reduce-overhead`, which captures the forward and the backward), the host
still walks the autograd engine, the optimizer's parameter lists and the clipping for every
step, longer than the GPU takes to run them. Captured whole, a step costs the host one
replay. This follows PyTorch's recipe for whole-network capture: a few eager steps on a side
stream (allocations settled, the flash autotuner's choices made), then a capture with the
gradients unset, so that each replay writes them afresh; the optimizer is capturable and
its learning rates are device tensors, which the LR schedule fills in place.

What stays outside the graph: the data, mixup/cutmix (drawn per batch on the host), the
metrics and the EMA. One device, one batch shape (the gpu data pipeline drops the last
partial batch), no gradient accumulation, bf16-mixed or fp32.
"""
from __future__ import annotations

from contextlib import contextmanager, nullcontext
from functools import partial
from typing import Callable, Iterator

import torch
import torch.nn as nn

from vitflash.ops.launch import recover_from_failed_capture

WARMUP_STEPS = 3  # eager steps before the capture, as PyTorch's recipe does
# the trainer precisions a captured step runs in, and their autocast dtype (fp16's gradient
# scaler reads the gradients' norm on the host, which a graph cannot)
AUTOCAST: dict[str, torch.dtype | None] = {"bf16-mixed": torch.bfloat16, "32-true": None, "32": None}


@contextmanager
def capturing(graph: torch.cuda.CUDAGraph, device: torch.device | None = None) -> Iterator[None]:
    """`torch.cuda.graph(graph)` in thread_local mode (other threads of the process may touch
    the device meanwhile: the gpu data pipeline's loader thread pins memory and waits on copy
    events, DDP's watchdog queries its work), on a side stream that the current stream then
    waits for.

    The wait keeps the first replay's random numbers right. When a capture begins, PyTorch
    resets the graph-side seed and offset of every generator registered with the graph (the
    device's default one always) by kernels on the capture stream, outside the capture. A
    replay sets them to the generator's current seed and offset by kernels on the stream that
    replays it. Nothing orders the two: where the capture's kernels run last, the first replay
    draws its numbers from the seed the generator had at capture and from offset 0. On an H100
    busy with other processes a first batch's augmentation came out different so
    (`benchmarks/results/gpu_session_b18307d/`); with the wait it came out as on an idle GPU, bit
    for bit (`benchmarks/results/gpu_session_d1ef2a5/`). The wait comes after a failed capture
    too, whose caller then runs the work eagerly on the current stream; and after a failed
    capture the device's random generator is taken out of capture mode, where a failed
    capture leaves it (`recover_from_failed_capture`)."""
    side = torch.cuda.Stream(device)
    try:
        with torch.cuda.graph(graph, stream=side, capture_error_mode="thread_local"):
            yield
    except BaseException:
        torch.cuda.current_stream(device).wait_stream(side)
        recover_from_failed_capture(device)
        raise
    torch.cuda.current_stream(device).wait_stream(side)


def make_capturable(optimizer: torch.optim.Optimizer) -> None:
    """Set every param group capturable, with each parameter's step count on the parameter's
    device, as a capturable optimizer keeps it. A state loaded from a checkpoint of a run
    without the graph step (resumed with it) says capturable=False, and a non-fused one holds
    its step counts on the CPU: the optimizer would refuse the capture, or read them on the host."""
    for group in optimizer.param_groups:
        group["capturable"] = True
        for param in group["params"]:
            step = optimizer.state.get(param, {}).get("step")
            if isinstance(step, torch.Tensor) and step.device != param.device:
                optimizer.state[param]["step"] = step.to(param.device)


class WholeStepGraph:
    """Runs `step(x, target) -> (logits, loss)`: the update of `model` by `optimizer` on one batch,
    eagerly for the first WARMUP_STEPS calls, then from a CUDA graph captured at the next.

    Args:
        model: the network, on the GPU, in train mode.
        loss_fn: (logits, target) -> scalar loss.
        optimizer: built with capturable=True (e.g. a fused AdamW); its learning rates become
            device tensors here (see `sync_lrs`).
        clip: (value, "norm" or "value") of the gradient clipping, or None.
        precision: the trainer's, one of AUTOCAST's keys.
    """

    def __init__(self, model: nn.Module, loss_fn: Callable, optimizer: torch.optim.Optimizer,
                 clip: tuple[float, str] | None, precision: str):
        self.model, self.loss_fn, self.optimizer, self.clip = model, loss_fn, optimizer, clip
        autocast_dtype = AUTOCAST[precision]
        # autocast without its cast cache: casts cached during the capture would be freed when
        # the context exits (PyTorch's advice for autocast under graph capture)
        self.autocast = (partial(torch.autocast, "cuda", dtype=autocast_dtype, cache_enabled=False)
                         if autocast_dtype is not None else nullcontext)
        self.params = [p for p in model.parameters() if p.requires_grad]
        make_capturable(optimizer)
        self.lrs: list[torch.Tensor] = []
        self.graph: torch.cuda.CUDAGraph | None = None
        self.static: tuple[torch.Tensor, torch.Tensor] | None = None
        self.outputs: tuple[torch.Tensor, torch.Tensor] | None = None
        self.eager_steps = 0

    def sync_lrs(self) -> None:
        """Each param group's learning rate as a device tensor, holding the value the LR
        schedule last wrote (a float): the graph reads the tensors it was captured with."""
        groups = self.optimizer.param_groups
        if not self.lrs:
            device = self.params[0].device
            self.lrs = [torch.tensor(float(g["lr"]), dtype=torch.float32, device=device) for g in groups]
        for group, lr in zip(groups, self.lrs):
            if group["lr"] is not lr:
                lr.fill_(float(group["lr"]))
                group["lr"] = lr

    def _body(self, x: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with self.autocast():
            logits = self.model(x)
            loss = self.loss_fn(logits, target)
        loss.backward()
        if self.clip is not None:
            value, algorithm = self.clip
            if algorithm == "value":
                torch.nn.utils.clip_grad_value_(self.params, value, foreach=True)
            else:  # no error_if_nonfinite: that check reads the norm on the host
                torch.nn.utils.clip_grad_norm_(self.params, value, foreach=True)
        self.optimizer.step()
        return logits.detach(), loss.detach()

    def step(self, x: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.sync_lrs()
        if self.graph is None and self.eager_steps < WARMUP_STEPS:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                self.optimizer.zero_grad(set_to_none=True)
                out = self._body(x, target)
            torch.cuda.current_stream().wait_stream(side)
            self.eager_steps += 1
            return out
        if self.graph is None:
            self.static = (x.clone(), target.clone())
            self.optimizer.zero_grad(set_to_none=True)  # the graph allocates and writes the gradients
            self.graph = torch.cuda.CUDAGraph()
            try:
                with capturing(self.graph):
                    self.outputs = self._body(*self.static)
            except RuntimeError as err:  # e.g. an op that waits on the device, or a compiled model's guard
                raise RuntimeError(
                    f"model.graph_step=true could not capture the training step as a CUDA graph: {err}. With the "
                    "model compiled (model.compile=default or auto), try model.compile=false (the model eager inside "
                    "the graph); else set model.graph_step=false") from err
        static_x, static_target = self.static
        if x.shape != static_x.shape or target.shape != static_target.shape:
            raise ValueError(
                f"model.graph_step=true replays one captured step, for batches of {tuple(static_x.shape)}, and got "
                f"{tuple(x.shape)}: drop the last partial batch (the gpu data pipeline does) or set model.graph_step=false")
        static_x.copy_(x)
        static_target.copy_(target)
        self.graph.replay()
        return self.outputs
