#!/usr/bin/env python3
"""Reference values and gradients of PyTorch's indexing ops, for tests/lua/test_index_torch.lua.

  /usr/bin/python3 tests/py/ref_index.py OUT_FILE

For each case (op, dtype, dim, odd shapes, x non-contiguous when T = 1: x is base.transpose(-1, -2)),
writes the inputs and torch's results as text lines (values exact, %.17g):
  case NAME OP DTYPE DIM T                   (OP scatter_reduce:REDUCE:INCLUDE_SELF for scatter_reduce)
  tensor KEY DTYPE NDIM SHAPE... VALUES...   (KEY: base, index, src, mask, gout, y, dx, dsrc)
  end
y is op(x, ...), dx and dsrc the gradients of sum(y * gout). torch 1.13 runs every case in
every dtype on the CPU (one it refused would fail the script). Exits 3 when torch is missing.
"""
import sys

try:
    import torch
except ImportError:
    print("ref_index.py: torch is not importable", file=sys.stderr)
    sys.exit(3)

torch.manual_seed(15)
torch.set_num_threads(1)
DTYPES = {"f32": torch.float32, "f64": torch.float64, "bf16": torch.bfloat16, "f16": torch.float16}


def emit(f, key, t):
    t = t.detach().contiguous()
    dt = {torch.int64: "i64", torch.int32: "i32", torch.bool: "bool"}.get(t.dtype, "f64")
    vals = t.reshape(-1).tolist()
    vals = [int(v) if dt != "f64" else float(v) for v in vals]
    shape = list(t.shape)
    f.write("tensor %s %s %d %s %s\n" % (key, dt, len(shape), " ".join(map(str, shape)),
                                         " ".join(("%.17g" % v) if dt == "f64" else str(v) for v in vals)))


def case(f, name, op, dt, dim, transpose, xshape, make):
    """make(x, dtype) -> (y, index, src or None, mask or None)."""
    dtype = DTYPES[dt]
    bshape = list(xshape)
    if transpose:
        bshape[-1], bshape[-2] = bshape[-2], bshape[-1]
    base = torch.randn(bshape, dtype=torch.float64).to(dtype)
    x = (base.transpose(-1, -2) if transpose else base).clone().requires_grad_()
    xin = base.transpose(-1, -2) if transpose else base
    xin = xin.detach().requires_grad_()
    # torch 1.13 runs every case in every dtype: a case it refuses fails the script, never drops out
    y, index, src, mask = make(xin, dtype)
    gout = torch.randn(y.shape, dtype=torch.float64).to(dtype)
    ins = [xin] + ([src] if src is not None and src.requires_grad else [])
    grads = torch.autograd.grad((y * gout).sum(), ins)
    del x
    f.write("case %s %s %s %d %d\n" % (name, op, dt, dim, 1 if transpose else 0))
    emit(f, "base", base)
    if index is not None:
        emit(f, "index", index)
    if src is not None:
        emit(f, "src", src)
    if mask is not None:
        emit(f, "mask", mask)
    emit(f, "gout", gout)
    emit(f, "y", y)
    emit(f, "dx", grads[0])
    if len(grads) > 1:
        emit(f, "dsrc", grads[1])
    f.write("end\n")


def main():
    out = open(sys.argv[1], "w")
    for dt in DTYPES:
        for tr in (0, 1):
            # gather: index (3, 5, 2) into x (3, 5, 7) along -1, duplicates included
            case(out, "gather_last", "gather", dt, -1, tr, (3, 5, 7),
                 lambda x, d: (x.gather(-1, idx := torch.randint(0, 7, (3, 5, 2))), idx, None, None))
            case(out, "gather_0", "gather", dt, 0, tr, (4, 3, 5),
                 lambda x, d: (x.gather(0, idx := torch.randint(0, 4, (6, 2, 5))), idx, None, None))
            case(out, "scatter_add_1", "scatter_add", dt, 1, tr, (3, 6, 5),
                 lambda x, d: (x.scatter_add(1, idx := torch.randint(0, 6, (3, 9, 5)),
                                             s := torch.randn(3, 9, 5, dtype=torch.float64).to(d).requires_grad_()),
                               idx, s, None))
            case(out, "scatter_0", "scatter", dt, 0, tr, (5, 3, 4),
                 lambda x, d: (x.scatter(0, idx := torch.randperm(5)[:3].reshape(3, 1, 1).expand(3, 3, 4).contiguous(),
                                         s := torch.randn(3, 3, 4, dtype=torch.float64).to(d).requires_grad_()),
                               idx, s, None))
            case(out, "index_select_1", "index_select", dt, 1, tr, (3, 7, 5),
                 lambda x, d: (x.index_select(1, idx := torch.tensor([6, 0, 2, 2, 5])), idx, None, None))
            case(out, "index_select_0", "index_select", dt, 0, tr, (9, 3, 2),
                 lambda x, d: (x.index_select(0, idx := torch.randint(0, 9, (11,))), idx, None, None))
            case(out, "index_add_0", "index_add", dt, 0, tr, (5, 3, 4),
                 lambda x, d: (x.index_add(0, idx := torch.tensor([4, 0, 4, 1, 4, 2, 0]),
                                           s := torch.randn(7, 3, 4, dtype=torch.float64).to(d).requires_grad_()),
                               idx, s, None))
            case(out, "index_add_2", "index_add", dt, 2, tr, (3, 5, 6),
                 lambda x, d: (x.index_add(2, idx := torch.tensor([5, 5, 1]),
                                           s := torch.randn(3, 5, 3, dtype=torch.float64).to(d).requires_grad_()),
                               idx, s, None))
            case(out, "index_copy_1", "index_copy", dt, 1, tr, (3, 6, 4),
                 lambda x, d: (x.index_copy(1, idx := torch.tensor([5, 1, 3]),
                                            s := torch.randn(3, 3, 4, dtype=torch.float64).to(d).requires_grad_()),
                               idx, s, None))
            for red in ("sum", "mean", "amax", "amin"):
                for inc in (True, False):
                    case(out, "scatter_reduce_%s_%d" % (red, inc), "scatter_reduce:%s:%d" % (red, inc), dt, 1, tr,
                         (3, 5, 4),
                         lambda x, d, red=red, inc=inc: (
                             x.scatter_reduce(1, idx := torch.randint(0, 5, (3, 4, 4)),
                                              s := torch.randn(3, 4, 4, dtype=torch.float64).to(d).requires_grad_(),
                                              red, include_self=inc), idx, s, None))
            case(out, "masked_fill", "masked_fill", dt, 0, tr, (4, 3, 5),
                 lambda x, d: (x.masked_fill(m := torch.rand(3, 5) < 0.4, -2.5), None, None, m))
    out.close()


main()
