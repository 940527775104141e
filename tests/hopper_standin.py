"""Imported by the compile-only test scripts (run in subprocesses): Triton's active driver
answers as an sm_90 GPU on this CPU, so Gluon kernels and launches compile for Hopper (a
kernel's warmup, the tuner's compile-only pass) while nothing is ever launched."""
import torch
from triton.backends.compiler import GPUTarget
from triton.runtime import driver


class Hopper:
    def get_current_device(self): return 0
    def get_current_stream(self, device=None): return 0
    def get_current_target(self): return GPUTarget("cuda", 90, 32)
    def get_active_torch_device(self): return torch.device("cpu")


driver.set_active(Hopper())
