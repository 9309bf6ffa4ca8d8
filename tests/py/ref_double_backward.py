#!/usr/bin/env python3
"""PyTorch's gradients of gradients, for tests/lua/test_double_backward_torch.lua.

  /usr/bin/python3 tests/py/ref_double_backward.py OUT_FILE

Every case is f64 on the CPU. Its inputs are random (odd shapes; INTS are index tensors), DIFF the
ones that require grad. y = f(inputs) and L = sum(w y^3) with a random w; then, with
create_graph, the first gradients G_i = dL/d DIFF_i and from them
  mode vjp:     P = sum_i sum(G_i * v_i)   (a Hessian-vector product: H_i = dP/d DIFF_i = (d2L) v)
  mode penalty: P = sum(G_1 * G_1)         (a gradient penalty ||dL/dx||^2, x = DIFF_1)
and the second gradients H_i = dP/d DIFF_i (zeros where P does not depend on DIFF_i). Written as
text lines (values exact, %.17g):
  case NAME MODE
  diff NAME...
  tensor KEY DTYPE NDIM SHAPE... VALUES...   (KEY: in:NAME, w, v:NAME, G:NAME, H:NAME)
  end
The same f for each NAME is in the Lua test. Exits 3 when torch is missing.
"""
import math
import sys

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    print("ref_double_backward.py: torch is not importable", file=sys.stderr)
    sys.exit(3)

torch.manual_seed(1507)
torch.set_num_threads(1)
f64 = torch.float64


def emit(f, key, t):
    t = t.detach().contiguous()
    dt = {torch.int64: "i64", torch.bool: "bool"}.get(t.dtype, "f64")
    vals = t.reshape(-1).tolist()
    shape = list(t.shape)
    f.write("tensor %s %s %d %s %s\n" % (key, dt, len(shape), " ".join(map(str, shape)),
                                         " ".join(("%.17g" % v) if dt == "f64" else str(int(v)) for v in vals)))


def randn(*shape):
    return torch.randn(tuple(shape), dtype=f64)


def positive(*shape):
    return torch.rand(*shape, dtype=f64) + 0.5


def away_from_zero(*shape):  # |x| >= 0.5
    x = randn(*shape)
    return torch.where(x < 0, x - 0.5, x + 0.5)


def gelu_tanh(x):
    return F.gelu(x, approximate="tanh")


def rms_norm(x, w, eps):
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w


def rope(x, theta):  # x (B, T, H, D), positions 0..T-1, "rotate half"
    T, D = x.shape[1], x.shape[3]
    inv = theta ** (-torch.arange(0, D, 2, dtype=f64) / D)
    ang = torch.arange(T, dtype=f64)[:, None] * inv[None, :]
    cos = torch.cat([ang.cos(), ang.cos()], -1)[None, :, None, :]
    sin = torch.cat([ang.sin(), ang.sin()], -1)[None, :, None, :]
    x1, x2 = x[..., : D // 2], x[..., D // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


def attention(q, k, v):  # (B, T, D), causal, composed
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    T = s.shape[-1]
    mask = torch.ones(T, T, dtype=torch.bool).triu(1)
    return torch.softmax(s.masked_fill(mask, float("-inf")), -1) @ v


def sdpa(q, k, v, causal=False, window=0, seg=None, scale=None):  # q (B, T, H, D), k, v (B, S, Hkv, D)
    T, H, D, S, Hkv = q.shape[1], q.shape[2], q.shape[3], k.shape[1], k.shape[2]
    k, v = k.repeat_interleave(H // Hkv, 2), v.repeat_interleave(H // Hkv, 2)  # query head h reads kv head h // (H / Hkv)
    s = torch.einsum("bthd,bshd->bhts", q, k) * (scale if scale is not None else 1 / math.sqrt(D))
    t = (torch.arange(T) + S - T)[:, None]
    p = torch.arange(S)[None, :]
    hidden = torch.zeros(T, S, dtype=torch.bool)[None, None]
    if causal:
        hidden = hidden | (p > t)[None, None]
        if window > 0:
            hidden = hidden | (t - p >= window)[None, None]
    if seg is not None:
        hidden = hidden | (seg[:, None, :, None] != seg[:, None, None, :])
    return torch.einsum("bhts,bshd->bthd", torch.softmax(s.masked_fill(hidden, float("-inf")), -1), v)


def mlp(x, w1, b1, w2, b2):
    return F.linear(torch.tanh(F.linear(x, w1, b1)), w2, b2)


# name -> (mode, inputs: list of (name, tensor, differentiable), f(**inputs) -> y)
CASES = []


def case(name, mode, inputs, f):
    CASES.append((name, mode, inputs, f))


def unary(name, f, make=randn):
    case(name, "vjp", [("a", make(3, 5), True)], lambda a: f(a))


case("add", "vjp", [("a", randn(3, 4), True), ("b", randn(4), True)], lambda a, b: a + b)
case("sub", "vjp", [("a", randn(2, 3), True), ("b", randn(2, 1), True)], lambda a, b: a - b)
case("mul", "vjp", [("a", randn(3, 4), True), ("b", randn(3, 1), True)], lambda a, b: a * b)
case("div", "vjp", [("a", randn(3, 4), True), ("b", away_from_zero(4), True)], lambda a, b: a / b)
case("neg", "vjp", [("a", randn(2, 3), True)], lambda a: -a)
case("pow", "vjp", [("a", positive(2, 3), True), ("b", randn(2, 3), True)], lambda a, b: a ** b)
case("pow_scalar", "vjp", [("a", randn(2, 3), True)], lambda a: a ** 3)
case("rpow", "vjp", [("a", randn(2, 3), True)], lambda a: 2.0 ** a)
case("rdiv", "vjp", [("a", away_from_zero(2, 3), True)], lambda a: 1.5 / a)
case("scalars", "vjp", [("a", randn(2, 3), True)], lambda a: (a * 2.5 + 1) - 0.5)
case("maximum", "vjp", [("a", randn(3, 4), True), ("b", randn(3, 4), True)], lambda a, b: torch.maximum(a, b))
unary("exp", torch.exp)
unary("log", torch.log, positive)
unary("sqrt", torch.sqrt, positive)
unary("rsqrt", torch.rsqrt, positive)
unary("tanh", torch.tanh)
unary("sigmoid", torch.sigmoid)
unary("relu", torch.relu)
unary("gelu", gelu_tanh)
unary("silu", F.silu)
unary("abs", torch.abs)
unary("sin", torch.sin)
unary("cos", torch.cos)
unary("square", torch.square)
unary("reciprocal", torch.reciprocal, away_from_zero)
unary("erf", torch.erf)
unary("gelu_erf", F.gelu)
unary("clamp", lambda a: a.clamp(-0.5, 0.5))
case("sum_dim", "vjp", [("a", randn(3, 4, 5), True)], lambda a: a.sum(1))
case("mean_keepdim", "vjp", [("a", randn(3, 4, 5), True)], lambda a: a.mean((0, 2), keepdim=True))
case("var", "vjp", [("a", randn(3, 5), True)], lambda a: a.var(-1))
case("std", "vjp", [("a", randn(3, 5), True)], lambda a: a.std(0))
case("amax", "vjp", [("a", randn(3, 5), True)], lambda a: a.amax(1))
case("prod", "vjp", [("a", randn(3, 4), True)], lambda a: a.prod(1))
case("matmul", "vjp", [("a", randn(2, 3, 4), True), ("b", randn(4, 5), True)], lambda a, b: a @ b)
case("bmm", "vjp", [("a", randn(2, 3, 4), True), ("b", randn(2, 4, 5), True)], lambda a, b: a @ b)
case("linear", "vjp", [("x", randn(2, 3, 4), True), ("w", randn(5, 4), True), ("b", randn(5), True)],
     lambda x, w, b: F.linear(x, w, b))
case("reshape", "vjp", [("a", randn(3, 4), True)], lambda a: a.reshape(2, 6))
case("transpose", "vjp", [("a", randn(3, 4, 2), True)], lambda a: a.transpose(0, 2))
case("permute", "vjp", [("a", randn(2, 3, 4), True)], lambda a: a.permute(2, 0, 1))
case("narrow", "vjp", [("a", randn(5, 4), True)], lambda a: a.narrow(0, 1, 3))
case("select", "vjp", [("a", randn(3, 4), True)], lambda a: a.select(1, 2))
case("expand", "vjp", [("a", randn(3, 1), True)], lambda a: a.expand(3, 4))
case("slice_step", "vjp", [("a", randn(7, 3), True)], lambda a: a[1:6:2])
case("index", "vjp", [("a", randn(4, 5), True)], lambda a: a[1:3, 2])
case("cat", "vjp", [("a", randn(2, 3), True), ("b", randn(2, 2), True)], lambda a, b: torch.cat([a, b], 1))
case("stack", "vjp", [("a", randn(2, 3), True), ("b", randn(2, 3), True)], lambda a, b: torch.stack([a, b], 0))
case("softmax", "vjp", [("a", randn(3, 5), True)], lambda a: torch.softmax(a, -1))
case("softmax_dim0", "vjp", [("a", randn(3, 5), True)], lambda a: torch.softmax(a, 0))
case("log_softmax", "vjp", [("a", randn(3, 5), True)], lambda a: torch.log_softmax(a, -1))
case("cross_entropy", "vjp", [("logits", randn(6, 5), True), ("t", torch.tensor([1, 4, -100, 0, 3, 4]), False)],
     lambda logits, t: F.cross_entropy(logits, t, ignore_index=-100))
case("cross_entropy_none", "vjp", [("logits", randn(2, 3, 5), True), ("t", torch.randint(0, 5, (2, 3)), False)],
     lambda logits, t: F.cross_entropy(logits.reshape(6, 5), t.reshape(6), reduction="none").reshape(2, 3))
case("embedding", "vjp", [("ids", torch.tensor([[1, 5, 1], [0, 3, 5]]), False), ("w", randn(6, 4), True)],
     lambda ids, w: F.embedding(ids, w))
case("gather", "vjp", [("x", randn(3, 5), True), ("i", torch.tensor([[0, 4], [2, 2], [1, 3]]), False)],
     lambda x, i: x.gather(1, i))
case("index_select", "vjp", [("x", randn(5, 3), True), ("i", torch.tensor([4, 0, 4, 2]), False)],
     lambda x, i: x.index_select(0, i))
case("scatter_add", "vjp", [("x", randn(3, 5), True), ("i", torch.tensor([[0, 4], [2, 2], [1, 3]]), False),
                            ("src", randn(3, 2), True)],
     lambda x, i, src: x.scatter_add(1, i, src))
case("index_add", "vjp", [("x", randn(5, 3), True), ("i", torch.tensor([1, 3, 1]), False), ("src", randn(3, 3), True)],
     lambda x, i, src: x.index_add(0, i, src))
case("where", "vjp", [("c", randn(3, 4) > 0, False), ("a", randn(3, 4), True), ("b", randn(4), True)],
     lambda c, a, b: torch.where(c, a, b))
case("masked_fill", "vjp", [("x", randn(3, 4), True), ("m", randn(1, 4) > 0, False)],
     lambda x, m: x.masked_fill(m, 0.25))
case("layer_norm", "vjp", [("x", randn(2, 3, 6), True), ("w", randn(6), True), ("b", randn(6), True)],
     lambda x, w, b: F.layer_norm(x, (6,), w, b, 1e-5))
case("rms_norm", "vjp", [("x", randn(4, 6), True), ("w", randn(6), True)], lambda x, w: rms_norm(x, w, 1e-6))
case("cumsum", "vjp", [("a", randn(3, 5), True)], lambda a: a.cumsum(1))
case("cumprod", "vjp", [("a", torch.tensor([[0.5, -1.2, 0.0, 2.0, 0.9], [0.3, 0.7, -0.4, 1.1, -1.3],
                                             [0.0, 1.5, 0.0, -0.6, 0.8]], dtype=f64), True)], lambda a: a.cumprod(1))
case("tril", "vjp", [("a", randn(4, 4), True)], lambda a: a.tril(1))
case("sort", "vjp", [("a", randn(3, 5), True)], lambda a: a.sort(1)[0])
case("topk", "vjp", [("a", randn(3, 5), True)], lambda a: a.topk(2, 1)[0])
case("rope", "vjp", [("x", randn(2, 3, 2, 4), True)], lambda x: rope(x, 10000.0))
case("add_layer_norm", "vjp", [("x", randn(2, 3, 5), True), ("r", randn(2, 3, 5), True), ("w", randn(5), True),
                               ("b", randn(5), True)],
     lambda x, r, w, b: F.layer_norm(x + r, (5,), w, b, 1e-5) + (x + r) * 0.5)
case("add_rms_norm", "vjp", [("x", randn(2, 3, 5), True), ("r", randn(2, 3, 5), True), ("w", randn(5), True)],
     lambda x, r, w: rms_norm(x + r, w, 1e-6) + (x + r) * 0.5)
case("sdpa_causal_gqa_window", "vjp", [("q", randn(1, 3, 4, 2), True), ("k", randn(1, 5, 2, 2), True),
                                       ("v", randn(1, 5, 2, 2), True)],
     lambda q, k, v: sdpa(q, k, v, causal=True, window=3))
case("sdpa_segments", "penalty", [("q", randn(2, 4, 2, 3), True), ("k", randn(2, 4, 2, 3), True),
                                  ("v", randn(2, 4, 2, 3), True), ("seg", torch.tensor([[0, 0, 1, 1], [2, 2, 2, 3]]), False)],
     lambda q, k, v, seg: sdpa(q, k, v, causal=True, seg=seg, scale=0.4))
case("noncontiguous", "vjp", [("a", randn(4, 3), True), ("b", randn(3, 4), True)],
     lambda a, b: torch.tanh(a.t()) * b.exp())
# compositions: gradient penalties and Hessian-vector products
mlp_in = [("x", randn(4, 3), True), ("w1", randn(5, 3), True), ("b1", randn(5), True), ("w2", randn(2, 5), True),
          ("b2", randn(2), True)]
case("mlp_penalty", "penalty", mlp_in, mlp)
case("mlp_hvp", "vjp", mlp_in, mlp)
case("attention_penalty", "penalty", [("q", randn(2, 4, 3), True), ("k", randn(2, 4, 3), True),
                                      ("v", randn(2, 4, 3), True)], attention)
case("attention_hvp", "vjp", [("q", randn(2, 4, 3), True), ("k", randn(2, 4, 3), True), ("v", randn(2, 4, 3), True)],
     attention)
case("block_penalty", "penalty",
     [("x", randn(2, 3, 4), True), ("g", randn(4), True), ("bn", randn(4), True), ("w1", randn(6, 4), True),
      ("w2", randn(5, 6), True), ("t", torch.randint(0, 5, (2, 3)), False)],
     lambda x, g, bn, w1, w2, t: F.cross_entropy(
         F.linear(gelu_tanh(F.linear(F.layer_norm(x, (4,), g, bn, 1e-5), w1)), w2).reshape(6, 5), t.reshape(6)))
case("swiglu_hvp", "vjp",
     [("x", randn(3, 4), True), ("g", randn(4), True), ("w1", randn(6, 4), True), ("w3", randn(6, 4), True),
      ("w2", randn(4, 6), True)],
     lambda x, g, w1, w3, w2: F.linear(F.silu(F.linear(rms_norm(x, g, 1e-6), w1)) * F.linear(rms_norm(x, g, 1e-6), w3),
                                       w2))
case("embedding_penalty", "penalty",
     [("w", randn(6, 4), True), ("ids", torch.tensor([[1, 5, 1], [0, 3, 5]]), False), ("wo", randn(3, 4), True)],
     lambda w, ids, wo: torch.log_softmax(F.linear(F.embedding(ids, w), wo), -1))


def run(f, name, mode, inputs, fn):
    f.write("case %s %s\n" % (name, mode))
    diff = [n for n, _, d in inputs if d]
    f.write("diff %s\n" % " ".join(diff))
    args = {}
    for n, t, d in inputs:
        emit(f, "in:" + n, t)
        args[n] = t.clone().requires_grad_() if d else t
    y = fn(**args)
    w = randn(*y.shape)
    emit(f, "w", w)
    L = (w * y * y * y).sum()
    xs = [args[n] for n in diff]
    G = torch.autograd.grad(L, xs, create_graph=True)
    if mode == "vjp":
        vs = [randn(*g.shape) for g in G]
        for n, v in zip(diff, vs):
            emit(f, "v:" + n, v)
        P = sum((g * v).sum() for g, v in zip(G, vs))
    else:
        P = (G[0] * G[0]).sum()
    H = torch.autograd.grad(P, xs, allow_unused=True)
    for n, g in zip(diff, G):
        emit(f, "G:" + n, g)
    for n, h, x in zip(diff, H, xs):
        emit(f, "H:" + n, h if h is not None else torch.zeros_like(x))
    f.write("end\n")


def main():
    with open(sys.argv[1], "w") as f:
        for name, mode, inputs, fn in CASES:
            run(f, name, mode, inputs, fn)


if __name__ == "__main__":
    main()
