#!/usr/bin/env python3
"""Reference values and gradients of PyTorch's activation modules, for
tests/lua/test_nn_activation_torch.lua.

  /usr/bin/python3 tests/py/ref_activation.py OUT_FILE

For each module (GELU exact and tanh, SiLU, ReLU, Tanh, Sigmoid, Identity), every float dtype,
x contiguous or not (T = 1: x is base.transpose(-1, -2)), writes the inputs and torch's results
as text lines (values exact, %.17g):
  case NAME DTYPE T
  tensor KEY DTYPE NDIM SHAPE... VALUES...   (KEY: base, gout, y, dx)
y is module(x), dx the gradient of sum(y * gout). Inputs are N(0, 3^2) with exact zeros and
+-8 mixed in (ReLU's kink, the saturated tails). 16-bit cases run torch in f32 on the 16-bit
values and round y and dx to the dtype once, as torch 2's CPU kernels compute them (in float):
torch 1.13 has none of these kernels in f16, and its bf16 tanh-GELU rounds intermediates to bf16
(dx at x = 3 is 1.0234, the exact 1.0116). Exits 3 when torch is missing.
"""
import sys

try:
    import torch
    from torch import nn
except ImportError:
    print("ref_activation.py: torch is not importable", file=sys.stderr)
    sys.exit(3)

torch.manual_seed(15)
torch.set_num_threads(1)
DTYPES = {"f32": torch.float32, "f64": torch.float64, "bf16": torch.bfloat16, "f16": torch.float16}
MODULES = {
    "gelu": lambda: nn.GELU(),
    "gelu_tanh": lambda: nn.GELU(approximate="tanh"),
    "silu": nn.SiLU,
    "relu": nn.ReLU,
    "tanh": nn.Tanh,
    "sigmoid": nn.Sigmoid,
    "identity": nn.Identity,
}


def emit(f, key, t):
    t = t.detach().contiguous().to(torch.float64)
    shape = list(t.shape)
    vals = t.reshape(-1).tolist()
    f.write("tensor %s f64 %d %s %s\n" % (key, len(shape), " ".join(map(str, shape)),
                                         " ".join("%.17g" % v for v in vals)))


def main():
    with open(sys.argv[1], "w") as f:
        for name, make in MODULES.items():
            for dt, dtype in DTYPES.items():
                for transpose in (False, True):
                    shape = [3, 7, 5] if not transpose else [3, 5, 7]
                    base = torch.randn(shape, dtype=torch.float64) * 3
                    flat = base.view(-1)
                    flat[::11] = 0
                    flat[3], flat[4] = 8, -8
                    base = base.to(dtype)
                    run = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
                    x = (base.transpose(-1, -2) if transpose else base).to(run).detach().requires_grad_()
                    gout = torch.randn(x.shape, dtype=torch.float64).to(dtype)
                    y = make()(x)
                    (dx,) = torch.autograd.grad((y * gout.to(run)).sum(), [x])
                    y, dx = y.to(dtype), dx.to(dtype)
                    f.write("case %s %s %d\n" % (name, dt, 1 if transpose else 0))
                    emit(f, "base", base)
                    emit(f, "gout", gout)
                    emit(f, "y", y)
                    emit(f, "dx", dx)
                    f.write("end\n")


if __name__ == "__main__":
    main()
