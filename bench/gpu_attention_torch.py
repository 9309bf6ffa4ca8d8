#!/usr/bin/env python3
"""Peer of bench/gpu_attention.lua: torch.nn.functional.scaled_dot_product_attention on cuda:0.

Same problem as the Lua bench: q, k, v (B, H, T, D) (PyTorch's layout), causal unless --no-causal,
forward and backward timed with CUDA events around each call, median of --iters after warm-up.
Prints one line the Lua bench parses:
  torch_fwd_ms=<ms> torch_bwd_ms=<ms> fwd_tflops=<x> bwd_tflops=<x> backend=<name>
FLOPs as the Lua bench: forward 4 B H T^2 D (halved when causal), backward 2.5x.
Exits 77 when PyTorch or a GPU is missing.
"""
import argparse
import statistics
import sys

p = argparse.ArgumentParser()
p.add_argument("--B", type=int, default=8)
p.add_argument("--H", type=int, default=12)
p.add_argument("--T", type=int, default=1024)
p.add_argument("--D", type=int, default=64)
p.add_argument("--dtype", default="bf16", choices=["bf16", "f16", "f32"])
p.add_argument("--iters", type=int, default=20)
p.add_argument("--no-causal", action="store_true")
a = p.parse_args()

try:
    import torch
    import torch.nn.functional as F
except ImportError as e:
    print(f"gpu_attention_torch: skipped: no PyTorch ({e})")
    sys.exit(77)
if not torch.cuda.is_available():
    print("gpu_attention_torch: skipped: no CUDA device")
    sys.exit(77)

dtype = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[a.dtype]
causal = not a.no_causal
torch.manual_seed(0)
shape = (a.B, a.H, a.T, a.D)
q, k, v = (torch.randn(shape, device="cuda", dtype=dtype, requires_grad=True) for _ in range(3))
dout = torch.randn(shape, device="cuda", dtype=dtype)


def forward():
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def time_ms(f):
    for _ in range(3):
        f()
    torch.cuda.synchronize()
    times = []
    for _ in range(a.iters):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        f()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1))
    return statistics.median(times)


with torch.no_grad():
    fwd_ms = time_ms(forward)

# backward alone: one forward kept, its graph retained, backward timed
out = forward()


def backward():
    q.grad = k.grad = v.grad = None
    out.backward(dout, retain_graph=True)


bwd_ms = time_ms(backward)

backend = "unknown"
try:
    from torch.backends.cuda import flash_sdp_enabled

    backend = "flash" if flash_sdp_enabled() else "other"
except ImportError:
    pass
fwd_flops = 4 * a.B * a.H * a.T * a.T * a.D * (0.5 if causal else 1)
bwd_flops = 2.5 * fwd_flops
print(f"torch_fwd_ms={fwd_ms:.4f} torch_bwd_ms={bwd_ms:.4f} fwd_tflops={fwd_flops / fwd_ms / 1e9:.1f} "
      f"bwd_tflops={bwd_flops / bwd_ms / 1e9:.1f} backend={backend} torch={torch.__version__}")
