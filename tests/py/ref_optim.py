#!/usr/bin/env python3
"""Reference optimizer trajectories from PyTorch, for tests/lua/test_optim_torch.lua.

  /usr/bin/python3 tests/py/ref_optim.py OUT_FILE

Writes, for each case, the initial parameters, every step's gradients and lr, the
total norm torch.nn.utils.clip_grad_norm_ returned (clipping cases) and the parameters
after each step, as text lines (values printed exactly, %.17g):
  case NAME KIND DTYPE STEPS CLIP        (CLIP: max_norm, or 0 for none)
  setting KEY V...                       (the optimizer's settings)
  schedule cosine LR MIN_LR WARMUP TOTAL (when the lr follows the peer's schedule)
  param I GROUP WD NDIM SHAPE... ; init I V...
  lr STEP V ; grad STEP I V... (absent: no gradient) ; norm STEP V ; after STEP I V...
  end
Torch's optimizers run their single-tensor path (foreach=False). Lion is lucidrains'
lion-pytorch update written with torch ops (torch has no Lion). Exits 3 when torch is
missing.
"""
import math
import sys

try:
    import torch
except ImportError:
    print("ref_optim.py: torch is not importable", file=sys.stderr)
    sys.exit(3)

torch.manual_seed(20240)
torch.set_num_threads(1)


def peer_lr(it, lr, min_lr, warmup, total):
    """../shared/peers/torch_charlm.py's lr_at, with its constants as parameters."""
    if it < warmup:
        return lr * (it + 1) / warmup
    r = (it - warmup) / (total - warmup)
    return min_lr + 0.5 * (1 + math.cos(math.pi * r)) * (lr - min_lr)


class Lion(torch.optim.Optimizer):
    """lucidrains/lion-pytorch's update (mul/add form)."""

    def __init__(self, params, lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0):
        super().__init__(params, dict(lr=lr, betas=betas, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad, lr, wd = p.grad, group["lr"], group["weight_decay"]
                beta1, beta2 = group["betas"]
                state = self.state[p]
                if len(state) == 0:
                    state["exp_avg"] = torch.zeros_like(p)
                exp_avg = state["exp_avg"]
                p.data.mul_(1 - lr * wd)
                update = exp_avg.clone().mul_(beta1).add(grad, alpha=1 - beta1).sign_()
                p.add_(update, alpha=-lr)
                exp_avg.mul_(beta2).add_(grad, alpha=1 - beta2)


def values(t):
    return " ".join("%.17g" % v for v in t.detach().reshape(-1).double().tolist())


SHAPES = [((4, 3), 0), ((5,), 1), ((2, 2, 3), 0)]  # (shape, group): group 1 has no weight decay


SCHED = (1e-2, 1e-3, 3, 12)


def run(out, name, kind, dtype, steps, settings, group_wd, sched=False, clip=0.0, grad_scale=None, missing=()):
    params = [torch.randn(s, dtype=torch.float64).to(dtype).requires_grad_() for s, _ in SHAPES]
    groups = [{"params": [p for p, (_, g) in zip(params, SHAPES) if g == gi], "weight_decay": group_wd[gi]}
              for gi in range(2)]
    if kind == "adamw":
        opt = torch.optim.AdamW(groups, foreach=False, **settings)
    elif kind == "sgd":
        opt = torch.optim.SGD(groups, foreach=False, **settings)
    else:
        opt = Lion(groups, **settings)
    dt = {torch.float32: "f32", torch.float64: "f64"}[dtype]
    out.write("case %s %s %s %d %.17g\n" % (name, kind, dt, steps, clip))
    for k, v in settings.items():
        vs = v if isinstance(v, (tuple, list)) else [v]
        out.write("setting %s %s\n" % (k, " ".join(str(x).lower() if isinstance(x, bool) else "%.17g" % x for x in vs)))
    if sched:
        out.write("schedule cosine %.17g %.17g %d %d\n" % SCHED)
    for i, (p, (s, g)) in enumerate(zip(params, SHAPES)):
        out.write("param %d %d %.17g %d %s\n" % (i + 1, g + 1, group_wd[g], len(s), " ".join(map(str, s))))
        out.write("init %d %s\n" % (i + 1, values(p)))
    for it in range(steps):
        lr = peer_lr(it, *SCHED) if sched else settings["lr"]
        for g in opt.param_groups:
            g["lr"] = lr
        out.write("lr %d %.17g\n" % (it, lr))
        scale = grad_scale(it) if grad_scale else 1.0
        for i, p in enumerate(params):
            if (it, i) in missing:
                p.grad = None
                continue
            p.grad = (torch.randn(p.shape, dtype=torch.float64) * scale).to(dtype)
            out.write("grad %d %d %s\n" % (it, i + 1, values(p.grad)))
        if clip > 0:
            norm = torch.nn.utils.clip_grad_norm_(params, clip)
            out.write("norm %d %.17g\n" % (it, norm.item()))
        opt.step()
        for i, p in enumerate(params):
            out.write("after %d %d %s\n" % (it, i + 1, values(p)))
    out.write("end\n")


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: ref_optim.py OUT_FILE")
    with open(sys.argv[1], "w") as out:
        adamw = dict(lr=1e-2, betas=(0.9, 0.99), eps=1e-8)
        for dt, name in [(torch.float32, "adamw_f32"), (torch.float64, "adamw_f64")]:
            run(out, name, "adamw", dt, 12, adamw, (0.1, 0.0), sched=True)
        run(out, "adamw_defaults", "adamw", torch.float32, 6, dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8),
            (0.01, 0.01))
        run(out, "adamw_clip", "adamw", torch.float32, 10, adamw, (0.1, 0.0), sched=True, clip=1.0,
            grad_scale=lambda it: [0.05, 2.0, 0.1, 5.0][it % 4], missing={(2, 1), (5, 2)})
        sgd_cases = [
            ("sgd_plain", torch.float32, dict(lr=0.05, momentum=0.0, dampening=0.0, nesterov=False), (0.0, 0.0)),
            ("sgd_momentum", torch.float32, dict(lr=0.05, momentum=0.9, dampening=0.1, nesterov=False), (0.01, 0.0)),
            ("sgd_nesterov", torch.float32, dict(lr=0.05, momentum=0.9, dampening=0.0, nesterov=True), (1e-3, 0.0)),
            ("sgd_nesterov_f64", torch.float64, dict(lr=0.05, momentum=0.9, dampening=0.0, nesterov=True), (1e-3, 0.0)),
        ]
        for name, dt, settings, wd in sgd_cases:
            run(out, name, "sgd", dt, 8, settings, wd, missing={(3, 0)})
        for dt, name in [(torch.float32, "lion_f32"), (torch.float64, "lion_f64")]:
            run(out, name, "lion", dt, 10, dict(lr=3e-3, betas=(0.9, 0.99)), (0.1, 0.0), sched=True)


if __name__ == "__main__":
    main()
