# after an eager forward+backward of the op (tuning included), is the call's output still alive, and what holds it?
import gc, os, sys, weakref, types
os.environ["VITFLASH_GLUON"] = sys.argv[1]
import torch
from vitflash.ops import flash_attention_qkvpacked, launch
def chain(obj, depth=0, seen=None):
    seen = seen if seen is not None else set()
    if depth > 4: return
    for r in gc.get_referrers(obj):
        if id(r) in seen or r is seen or isinstance(r, types.FrameType) and r.f_code.co_name in ("chain", "<module>"): continue
        if r is globals(): continue
        seen.add(id(r))
        desc = type(r).__name__
        if isinstance(r, types.FrameType): desc += f" {r.f_code.co_filename}:{r.f_code.co_name}:{r.f_lineno}"
        elif isinstance(r, types.FunctionType): desc += f" {r.__qualname__}"
        elif isinstance(r, dict): desc += f" keys={list(r)[:6]}"
        print("  " * (depth + 1) + desc, flush=True)
        chain(r, depth + 1, seen)
for shape in [(8, 16, 2049, 128), (4, 16, 4097, 128)]:
    B, H, N, D = shape
    leaf = torch.randn(B, N, 3, H, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    do = torch.randn(B, N, H, D, device="cuda", dtype=torch.bfloat16)
    for call in range(2):
        o = flash_attention_qkvpacked(leaf)
        r = weakref.ref(o)
        torch.autograd.grad(o, leaf, do)
        del o
        print(shape, "gluon", sys.argv[1], "call", call, "output alive after del:", r() is not None, flush=True)
        if r() is not None:
            chain(r())
            gc.collect()
            print("  after gc.collect:", r() is not None)
    print(shape, "plans", [(k[0], [type(p).__name__ for p in v]) for k, v in __import__("vitflash.ops.flash", fromlist=["x"])._plans.items() if k[4] == N])
