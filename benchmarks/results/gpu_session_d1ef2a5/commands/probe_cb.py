import lightning as L
import torch


class Probe(L.Callback):
    """Prints what the first training steps start from: the batch, the labels, the weights."""

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if batch_idx < 2:
            x, y = batch
            w = sum(p.double().sum().item() for p in pl_module.parameters())
            print(f"PROBE batch {batch_idx} x {x.double().sum().item():.6f} {x.double().abs().sum().item():.6f} "
                  f"y {y.sum().item()} w {w:.9f}", flush=True)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if batch_idx < 2:
            x, _ = batch
            with torch.no_grad(), torch.autocast("cuda", torch.bfloat16):
                logits = pl_module(x)
            print(f"PROBE after {batch_idx} logits {logits.double().sum().item():.6f}", flush=True)
