# the flash op with dropout on the GPU (compiled kernels, the tuner's choice) against float64
# attention with the kernels' own mask, beside bf16 attention with the same mask: max |error| of o
import torch
DEV = "cuda" if torch.cuda.is_available() else "cpu"  # the CPU: under TRITON_INTERPRET=1
from vitflash.ops import flash as F
for B, N, H, D in ((2, 65, 3, 64), (2, 65, 6, 64), (2, 197, 6, 64)):
    torch.manual_seed(0)
    p, qkv = 0.3, torch.randn(B, N, 3, H, D, device=DEV, dtype=torch.bfloat16)
    seed = torch.tensor([7], device=DEV)
    o, _ = F._forward(qkv, D ** -0.5, p, seed)
    m = F.dropout_keep_mask(seed, B, H, N, p)
    def ref(x):
        q, k, v = (t.transpose(1, 2) for t in x.unbind(2))
        a = torch.softmax((q @ k.transpose(-1, -2)) * D ** -0.5, -1) * m.to(x.dtype) / (1 - p)
        return (a @ v).transpose(1, 2)
    exact = ref(qkv.double())
    print((B, N, H, D), "keep rate %.4f" % m.float().mean().item(), "flash err %.3g" % (o.double() - exact).abs().max().item(),
          "bf16 naive err %.3g" % (ref(qkv.float()).bfloat16().double() - exact).abs().max().item(), flush=True)
