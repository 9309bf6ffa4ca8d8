#!/usr/bin/env python3
"""Reference results from PyTorch for the ops along a dim, for tests/lua/test_sort_torch.lua.

  /usr/bin/python3 tests/py/ref_sort.py OUT_FILE

For each case (op, dtype, arguments, odd shapes, a transposed view for the non-contiguous
input) writes the input, the gradient given to the first result, torch's results and the
input's gradient, as text lines (values printed exactly, %.17g):
  case NAME OP DTYPE TRANSPOSE KEY=VALUE...   (TRANSPOSE 1: the op runs on x.transpose(0, 1))
  shape D0 D1 ... ; x V... ; gout V... ; values V... ; indices I... ; grad V...
  end
Inputs of sort and topk are distinct multiples of 1/8 (exact in every float dtype, no ties)
except the cases named *ties*, whose ties and NaN follow the stable order. A case torch 1.13
does not run on the CPU for a dtype is left out and named on stderr. Exits 3 without torch.
"""
import sys

try:
    import torch
except ImportError:
    print("ref_sort.py: torch is not importable", file=sys.stderr)
    sys.exit(3)

TORCH_MAJOR = int(torch.__version__.split(".")[0])
torch.manual_seed(1513)
torch.set_num_threads(1)
DTYPES = {"f32": torch.float32, "f64": torch.float64, "bf16": torch.bfloat16, "f16": torch.float16}


def distinct(shape):
    n = 1
    for s in shape:
        n *= s
    return ((torch.randperm(n, dtype=torch.float64) - n // 2) / 8).reshape(shape)


def ties(shape):
    x = torch.randint(-3, 4, shape).double()
    x.view(-1)[:: 7] = float("nan")
    return x


def normal(shape):
    return torch.randn(shape, dtype=torch.float64)


def positive_with_zeros(shape):
    x = torch.rand(shape, dtype=torch.float64) + 0.5
    x.view(-1)[3 :: 11] = 0.0
    return x


CASES = [
    # name, op, kwargs, base shape (before the transpose), transpose, input maker
    ("topk_last", "topk", dict(k=3, dim=-1, largest=1), (5, 37), 0, distinct),
    ("topk_dim0_small", "topk", dict(k=2, dim=0, largest=0), (7, 3, 5), 0, distinct),
    ("topk_noncontig", "topk", dict(k=4, dim=1, largest=1), (11, 6), 1, distinct),
    ("topk_all", "topk", dict(k=9, dim=-1, largest=1), (9, 3), 1, distinct),
    ("sort_asc", "sort", dict(dim=-1, descending=0), (4, 33), 0, distinct),
    ("sort_desc_noncontig", "sort", dict(dim=0, descending=1), (13, 5), 1, distinct),
    ("sort_ties_nan_asc", "sort", dict(dim=-1, descending=0), (6, 21), 0, ties),
    ("sort_ties_nan_desc", "sort", dict(dim=1, descending=1), (6, 21), 1, ties),
    ("argsort_mid", "argsort", dict(dim=1, descending=0), (3, 17, 2), 0, distinct),
    ("cumsum_last", "cumsum", dict(dim=-1), (5, 29), 0, normal),
    ("cumsum_noncontig", "cumsum", dict(dim=0), (9, 7), 1, normal),
    ("cumprod_zeros", "cumprod", dict(dim=-1), (6, 15), 0, positive_with_zeros),
    ("cumprod_noncontig", "cumprod", dict(dim=1), (5, 4, 3), 1, positive_with_zeros),
    ("tril_main", "tril", dict(diagonal=0), (2, 5, 7), 0, normal),
    ("tril_noncontig", "tril", dict(diagonal=-1), (6, 4), 1, normal),
    ("triu_plus", "triu", dict(diagonal=2), (3, 4, 9), 0, normal),
    ("logsumexp_last", "logsumexp", dict(dim=-1, keepdim=0), (5, 31), 0, normal),
    ("logsumexp_keep_noncontig", "logsumexp", dict(dim=0, keepdim=1), (7, 3, 4), 1, normal),
    ("nan_to_num", "nan_to_num", dict(), (5, 9), 1, lambda s: ties(s) / torch.tensor(0.5) * torch.tensor(
        [float("inf"), 1, -float("inf"), 2, 3, 1, 1, 1, 1])[: s[1]]),
    ("isnan", "isnan", dict(), (4, 9), 0, ties),
]


def run(op, x, kw):
    if op == "topk":
        v, i = torch.topk(x, kw["k"], dim=kw["dim"], largest=bool(kw["largest"]), sorted=True)
        return v, i
    if op == "sort":
        return torch.sort(x, dim=kw["dim"], descending=bool(kw["descending"]), stable=True)
    if op == "argsort":
        return None, torch.sort(x, dim=kw["dim"], descending=bool(kw["descending"]), stable=True)[1]
    if op == "cumsum":
        return torch.cumsum(x, kw["dim"]), None
    if op == "cumprod":
        return torch.cumprod(x, kw["dim"]), None
    if op in ("tril", "triu"):
        return getattr(torch, op)(x, kw["diagonal"]), None
    if op == "logsumexp":
        return torch.logsumexp(x, kw["dim"], keepdim=bool(kw["keepdim"])), None
    if op == "nan_to_num":
        return torch.nan_to_num(x), None
    if op == "isnan":
        return None, torch.isnan(x).long()
    raise ValueError(op)


def line(tag, t):
    return tag + " " + " ".join("%.17g" % v for v in t.reshape(-1).double().tolist())


def main():
    out = []
    for name, op, kw, shape, transpose, make in CASES:
        base = make(shape)
        for dn, dt in DTYPES.items():
            if dt == torch.float16 and TORCH_MAJOR < 2:
                # torch 1.13 has none of these ops for f16 on the CPU; asking raises a C++ exception,
                # which the sanitizer build's preloaded runtime cannot unwind
                print("ref_sort.py: %s f16: torch %s has no CPU kernel" % (name, torch.__version__), file=sys.stderr)
                continue
            xb = base.to(dt)
            x = xb.clone().requires_grad_(op not in ("argsort", "isnan"))
            xv = x.transpose(0, 1) if transpose else x
            try:
                values, indices = run(op, xv, kw)
            except RuntimeError as e:
                print("ref_sort.py: %s %s: %s" % (name, dn, str(e).splitlines()[0]), file=sys.stderr)
                continue
            args = " ".join("%s=%d" % (k, v) for k, v in kw.items())
            out.append("case %s %s %s %d %s" % (name, op, dn, transpose, args))
            out.append("shape " + " ".join(str(s) for s in shape))
            out.append(line("x", xb))
            if values is not None:
                gout = torch.randn(values.shape, dtype=torch.float64).to(dt)
                values.backward(gout)
                out.append(line("gout", gout))
                out.append(line("values", values.detach()))
                out.append(line("grad", x.grad))
            if indices is not None:
                out.append("indices " + " ".join(str(v) for v in indices.reshape(-1).tolist()))
            out.append("end")
    with open(sys.argv[1], "w") as f:
        f.write("\n".join(out) + "\n")


main()
