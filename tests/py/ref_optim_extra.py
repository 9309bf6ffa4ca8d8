#!/usr/bin/env python3
"""Reference trajectories of Adafactor and LAMB, for tests/lua/test_optim_extra_torch.lua.

  /usr/bin/python3 tests/py/ref_optim_extra.py OUT_FILE
  /work/hfvenv/bin/python tests/py/ref_optim_extra.py --check-transformers

Adafactor is transformers.optimization.Adafactor's step written in plain torch ops (transformers
is not installed beside Debian's torch); --check-transformers runs it beside the real one and
prints the largest relative difference. LAMB is You et al. 2020, Algorithm 2 (phi the identity),
with Adam's bias correction and trust ratio 1 when ||p|| or ||r|| is 0 (torch has no LAMB).
Output lines (values %.17g):
  case NAME KIND DTYPE STEPS ; setting KEY V... ; param I NDIM SHAPE... ; init I V...
  grad STEP I V... ; after STEP I V... ; end
Exits 3 when torch is missing.
"""
import math
import sys

try:
    import torch
except ImportError:
    print("ref_optim_extra.py: torch is not importable", file=sys.stderr)
    sys.exit(3)

torch.set_num_threads(1)


def rms(t):
    return t.norm(2) / (t.numel() ** 0.5)


def adafactor_step(p, grad, state, g):
    """transformers' Adafactor.step for one parameter, its operations in its order."""
    factored, first = grad.dim() >= 2, g["beta1"] is not None
    if not state:
        state["step"] = 0
        if first:
            state["exp_avg"] = torch.zeros_like(grad)
        if factored:
            state["row"] = torch.zeros(grad.shape[:-1], dtype=grad.dtype)
            state["col"] = torch.zeros(grad.shape[:-2] + grad.shape[-1:], dtype=grad.dtype)
        else:
            state["v"] = torch.zeros_like(grad)
    state["step"] += 1
    t = state["step"]
    rel = g["lr"]
    if g["relative_step"]:
        rel = min(1e-6 * t if g["warmup_init"] else 1e-2, 1.0 / math.sqrt(t))
    scale = max(g["eps"][1], rms(p)) if g["scale_parameter"] else 1.0
    lr = scale * rel
    beta2t = 1.0 - math.pow(t, g["decay_rate"])
    update = grad**2 + g["eps"][0]
    if factored:
        state["row"].mul_(beta2t).add_(update.mean(dim=-1), alpha=1.0 - beta2t)
        state["col"].mul_(beta2t).add_(update.mean(dim=-2), alpha=1.0 - beta2t)
        r = (state["row"] / state["row"].mean(dim=-1, keepdim=True)).rsqrt_().unsqueeze(-1)
        c = state["col"].unsqueeze(-2).rsqrt()
        update = torch.mul(r, c).mul_(grad)
    else:
        state["v"].mul_(beta2t).add_(update, alpha=1.0 - beta2t)
        update = state["v"].rsqrt().mul_(grad)
    update.div_((rms(update) / g["clip_threshold"]).clamp_(min=1.0))
    update.mul_(lr)
    if first:
        state["exp_avg"].mul_(g["beta1"]).add_(update, alpha=1 - g["beta1"])
        update = state["exp_avg"]
    if g["weight_decay"] != 0:
        p.add_(p, alpha=float(-g["weight_decay"] * lr))
    p.add_(-update)


def lamb_step(p, grad, state, g):
    if not state:
        state["step"], state["m"], state["v"] = 0, torch.zeros_like(p), torch.zeros_like(p)
    state["step"] += 1
    t, (b1, b2) = state["step"], g["betas"]
    m, v = state["m"], state["v"]
    m.mul_(b1).add_(grad * (1 - b1))
    v.mul_(b2).add_(grad * grad * (1 - b2))
    r = m / (1 - b1**t) / ((v / (1 - b2**t)).sqrt() + g["eps"]) + g["weight_decay"] * p
    wn, rn = p.norm(), r.norm()
    trust = wn / rn if wn > 0 and rn > 0 else 1.0
    p.sub_(g["lr"] * trust * r)


ADAFACTOR = dict(lr=None, eps=(1e-30, 1e-3), clip_threshold=1.0, decay_rate=-0.8, beta1=None, weight_decay=0.0,
                 scale_parameter=True, relative_step=True, warmup_init=False)
LAMB = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0)
SHAPES = [(7,), (5, 6), (3, 4, 5), (1, 9)]
CASES = [
    ("adafactor_default", "adafactor", {}),
    ("adafactor_fixed_lr", "adafactor", dict(lr=1e-2, relative_step=False, scale_parameter=False, beta1=0.9,
                                              weight_decay=0.1, clip_threshold=0.5)),
    ("adafactor_warmup", "adafactor", dict(warmup_init=True, decay_rate=-0.5, eps=(1e-20, 1e-2))),
    ("lamb_default", "lamb", {}),
    ("lamb_decay", "lamb", dict(lr=2e-2, betas=(0.8, 0.99), eps=1e-8, weight_decay=0.1)),
]
STEPS = 10


def fmt(t):
    return " ".join("%.17g" % x for x in t.reshape(-1).tolist())


def run_case(out, name, kind, over, dtype):
    g = dict(ADAFACTOR if kind == "adafactor" else LAMB)
    g.update(over)
    gen = torch.Generator().manual_seed(1234)
    params = [torch.randn(s, generator=gen, dtype=torch.float64).to(dtype) for s in SHAPES]
    params.append(torch.zeros(4, 3, dtype=dtype))  # a zero parameter: rms 0, ||p|| 0
    out.write("case %s %s %s %d\n" % (name, kind, "f64" if dtype == torch.float64 else "f32", STEPS))
    for k, v in sorted(over.items()):
        out.write("setting %s %s\n" % (k, " ".join("%.17g" % x for x in v) if isinstance(v, tuple) else
                                       ("true" if v is True else "false" if v is False else "%.17g" % v)))
    for i, p in enumerate(params):
        out.write("param %d %d %s\n" % (i + 1, p.dim(), " ".join(str(d) for d in p.shape)))
        out.write("init %d %s\n" % (i + 1, fmt(p)))
    states = [{} for _ in params]
    for s in range(STEPS):
        for i, p in enumerate(params):
            grad = torch.randn(p.shape, generator=gen, dtype=torch.float64).to(dtype) * (0.1 * (i + 1))
            if i == 2 and s == 3:
                grad.zero_()  # an all-zero gradient: r 0 (LAMB's trust 1)
            out.write("grad %d %d %s\n" % (s, i + 1, fmt(grad)))
            (adafactor_step if kind == "adafactor" else lamb_step)(p, grad, states[i], g)
            out.write("after %d %d %s\n" % (s, i + 1, fmt(p)))
    out.write("end\n")


def check_transformers():
    """This file's Adafactor against transformers' own, every case, f32 and f64."""
    from transformers.optimization import Adafactor
    worst = 0.0
    for name, kind, over in CASES:
        if kind != "adafactor":
            continue
        for dtype in (torch.float32, torch.float64):
            g = dict(ADAFACTOR)
            g.update(over)
            gen = torch.Generator().manual_seed(99)
            ours = [torch.randn(s, generator=gen, dtype=dtype) for s in SHAPES]
            theirs = [torch.nn.Parameter(p.clone()) for p in ours]
            opt = Adafactor(theirs, **over)
            states = [{} for _ in ours]
            for _ in range(STEPS):
                for p, q, st in zip(ours, theirs, states):
                    grad = torch.randn(p.shape, generator=gen, dtype=dtype)
                    q.grad = grad.clone()
                    adafactor_step(p, grad, st, g)
                opt.step()
                for p, q in zip(ours, theirs):
                    d = ((p - q.detach()).abs().max() / q.detach().abs().max()).item()
                    worst = max(worst, d)
            print("%s %s: max relative difference so far %.3g" % (name, dtype, worst))
    print("transformers Adafactor vs this reference: max relative difference %.3g" % worst)


def main():
    if sys.argv[1:] == ["--check-transformers"]:
        check_transformers()
        return
    with open(sys.argv[1], "w") as out:
        for name, kind, over in CASES:
            for dtype in (torch.float64, torch.float32):
                run_case(out, name, kind, over, dtype)


if __name__ == "__main__":
    main()
