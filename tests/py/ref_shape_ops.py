#!/usr/bin/env python3
"""Reference values and gradients of PyTorch's einsum, split, chunk, unbind, cat, stack, clamp (number and
tensor bounds, clamp_min, clamp_max, clip), repeat_interleave, bincount and histc, for
tests/lua/test_shape_ops_torch.lua.

  /usr/bin/python3 tests/py/ref_shape_ops.py OUT_FILE

For each case (op, dtype, odd shapes, inputs transposed for non-contiguous ones) writes the inputs and
torch's results as text lines (values exact, %.17g):
  case NAME OP DTYPE ARGS...       (ARGS: the op's other arguments: numbers, nil, lists [2,5,1], or
                                   einsum's equation; bincount's is minlength)
  tensor KEY DTYPE T NDIM SHAPE... VALUES...
  end
KEY: x1, x2, ... the inputs (T = 1: the op takes x.transpose(-1, -2) of the tensor written), then per
result k: yk, goutk; then dk, the gradient of sum_k sum(yk * goutk) for input k (float inputs only);
for einsum, s_y1 and s_dk: the same computed from |x| and |gout| in f64, the scale of their rounding errors.
torch 1.13 runs every case on the CPU (one it refused would fail the script), in every dtype but for
what it has no f16 kernel for: einsum's and clamp's f16 results are torch's f32 ones on the same f16
inputs, rounded to f16 (F16_VIA_F32), and so are einsum's bf16 ones (torch 1.13's CPU bf16 matmul adds
in bf16 for small matrices, so its error grows with the length); histc's bf16 and f16 counts are torch's
f32 histc of the values between the dtype's bin edges (histc_low). No histc input holds a NaN (torch
1.13's CPU histc counts NaN in the first bin).
Exits 3 when torch is missing.
"""
import sys

try:
    import torch
except ImportError:
    print("ref_shape_ops.py: torch is not importable", file=sys.stderr)
    sys.exit(3)

torch.manual_seed(1515)
torch.set_num_threads(1)
DTYPES = {"f32": torch.float32, "f64": torch.float64, "bf16": torch.bfloat16, "f16": torch.float16}
INT_NAMES = {torch.int64: "i64", torch.int32: "i32", torch.bool: "bool"}


def emit(f, key, t, transposed=False):
    t = t.detach()
    if transposed:  # written as laid out: the op takes its transpose
        t = t.transpose(-1, -2)
    t = t.contiguous()
    dt = INT_NAMES.get(t.dtype, "f64")
    vals = t.reshape(-1).tolist()
    text = " ".join(str(int(v)) if dt != "f64" else "%.17g" % v for v in vals)
    f.write("tensor %s %s %d %d %s %s\n" % (key, dt, 1 if transposed else 0, t.dim(),
                                            " ".join(map(str, t.shape)), text))


def normal(*shape):
    return torch.randn(shape, dtype=torch.float64)


def eighths(*shape):
    """multiples of 1/8 in [-2, 2]: exact in every dtype, ties with the clamp bounds"""
    return torch.randint(-16, 17, shape).double() / 8


def with_nan(t):
    t = t.clone()
    t.view(-1)[::7] = float("nan")
    return t


EINSUM = [
    ("attn_scores", "bhtd,bhsd->bhts", [(normal(2, 3, 5, 7), 0), (normal(2, 3, 7, 4), 1)]),
    ("attn_values", "bhts,bhsd->bhtd", [(normal(2, 3, 5, 4), 0), (normal(2, 3, 4, 6), 0)]),
    ("matmul_t", "ij,jk->ik", [(normal(7, 5), 1), (normal(7, 3), 0)]),
    ("matmul_implicit", "ij,jk", [(normal(5, 7), 0), (normal(3, 7), 1)]),
    ("dot", "i,i->", [(normal(13), 0), (normal(13), 0)]),
    ("outer", "i,j->ij", [(normal(5), 0), (normal(3), 0)]),
    ("batched", "bij,bjk->bik", [(normal(3, 4, 5), 0), (normal(3, 6, 5), 1)]),
    ("transpose_only", "ij->ji", [(normal(4, 5), 1)]),
    ("sum_all", "ijk->", [(normal(3, 4, 5), 0)]),
    ("sum_some", "ijk->j", [(normal(3, 4, 5), 1)]),
    ("diagonal", "ii->i", [(normal(5, 5), 1)]),
    ("trace", "ii", [(normal(6, 6), 0)]),
    ("diag_3d", "iji->j", [(normal(4, 3, 4), 0)]),
    ("ellipsis_broadcast", "...ij,...jk->...ik", [(normal(2, 3, 4, 5), 0), (normal(6, 5), 1)]),
    ("ellipsis_implicit", "...ij,jk", [(normal(3, 4, 5), 0), (normal(5, 2), 0)]),
    ("ellipsis_summed", "...ij->ij", [(normal(3, 2, 4, 5), 1)]),
    ("three_operands", "abc,cd,de->abe", [(normal(2, 3, 4), 0), (normal(5, 4), 1), (normal(5, 3), 0)]),
    ("bilinear", "bn,anm,bm->ba", [(normal(3, 4), 0), (normal(2, 4, 5), 0), (normal(3, 5), 0)]),
    ("capitals", "Ba,ab", [(normal(2, 3), 0), (normal(3, 2), 0)]),
    ("broadcast_one", "ij,jk->ik", [(normal(4, 1), 0), (normal(5, 3), 0)]),
    ("elementwise", "ij,ij->ij", [(normal(5, 4), 1), (normal(4, 5), 0)]),
    ("only_in_one", "ij,k->i", [(normal(3, 4), 0), (normal(5), 0)]),
]


def random_einsums(count):
    """count equations drawn from a fixed seed: 1 to 3 operands of up to 4 letters from "abcdeF" (sizes 1 to
    4), a letter sometimes twice in one operand (a diagonal), sometimes of size 1 in one operand (it
    broadcasts); the output implicit, or explicit: a shuffled subset of the letters"""
    rng = torch.Generator().manual_seed(77)

    def pick(n):
        return int(torch.randint(0, n, (1,), generator=rng))

    out = []
    for k in range(count):
        sizes = {c: 2 + pick(3) for c in "abcdeF"}
        terms, shapes = [], []
        for _ in range(1 + pick(3)):
            term = "".join("abcdeF"[pick(6)] for _ in range(1 + pick(4)))
            shape = [sizes[c] for c in term]
            if pick(4) == 0:  # a size-1 dim, where the letter is not repeated in this operand
                i = pick(len(term))
                if term.count(term[i]) == 1:
                    shape[i] = 1
            terms.append(term)
            shapes.append(shape)
        eq = ",".join(terms)
        if pick(3) > 0:
            letters = sorted(set("".join(terms)))
            keep = [c for c in letters if pick(2) == 0]
            keep = [keep[i] for i in torch.randperm(len(keep), generator=rng).tolist()]
            eq += "->" + "".join(keep)
        out.append(("random_%d" % k, eq, [(normal(*sh), 0) for sh in shapes]))
    return out


RANDOM_EINSUMS = random_einsums(30)


def cases():
    """(name, op, args, inputs [(base tensor f64 or int, transposed, grad)], fn(*inputs) -> list of results)"""
    out = []
    for name, eq, ins in EINSUM + RANDOM_EINSUMS:
        out.append(("einsum_" + name, "einsum", eq, [(t, tr, True) for t, tr in ins],
                    lambda *xs, eq=eq: [torch.einsum(eq, *xs)]))
    out += [
        ("split_int", "split", "3 0", [(normal(10, 4), 0, True)], lambda x: list(torch.split(x, 3, 0))),
        ("split_list_t", "split", "[2,5,1] 1", [(normal(8, 3), 1, True)],
         lambda x: list(torch.split(x, [2, 5, 1], 1))),
        ("split_big", "split", "9 -1", [(normal(3, 5), 0, True)], lambda x: list(torch.split(x, 9, -1))),
        ("chunk_3", "chunk", "3 -1", [(normal(7, 5), 1, True)], lambda x: list(torch.chunk(x, 3, -1))),
        ("chunk_fewer", "chunk", "4 0", [(normal(6, 2), 0, True)], lambda x: list(torch.chunk(x, 4, 0))),
        ("unbind_1", "unbind", "1", [(normal(3, 2, 4), 1, True)], lambda x: list(torch.unbind(x, 1))),
        ("unbind_0", "unbind", "0", [(normal(3, 5), 0, True)], lambda x: list(torch.unbind(x, 0))),
        ("cat_1", "cat", "1", [(normal(4, 3), 1, True), (normal(3, 2), 0, True), (normal(3, 5), 0, True)],
         lambda *xs: [torch.cat(xs, 1)]),
        ("cat_neg", "cat", "-2", [(normal(2, 3, 4), 0, True), (normal(2, 1, 4), 0, True)],
         lambda *xs: [torch.cat(xs, -2)]),
        ("stack_0", "stack", "0", [(normal(4, 3), 1, True), (normal(3, 4), 0, True)],
         lambda *xs: [torch.stack(xs, 0)]),
        ("stack_last", "stack", "-1", [(normal(2, 5), 0, True), (normal(5, 2), 1, True)],
         lambda *xs: [torch.stack(xs, -1)]),
        ("clamp_numbers", "clamp", "-0.5 0.75", [(with_nan(eighths(5, 7)), 1, True)],
         lambda x: [torch.clamp(x, -0.5, 0.75)]),
        ("clamp_min_number", "clamp_min", "0.25", [(with_nan(eighths(6, 5)), 0, True)],
         lambda x: [torch.clamp_min(x, 0.25)]),
        ("clamp_max_number", "clamp_max", "-0.25", [(eighths(4, 9), 1, True)],
         lambda x: [torch.clamp_max(x, -0.25)]),
        ("clip_numbers", "clip", "-1 1", [(eighths(3, 11), 0, True)], lambda x: [torch.clip(x, -1, 1)]),
        ("clamp_max_only", "clamp", "nil 0.5", [(eighths(5, 6), 0, True)], lambda x: [torch.clamp(x, max=0.5)]),
        # tensor bounds: lo (7) and hi (5, 1) broadcast with x (5, 7); lo > hi in places; ties on 1/8 steps
        ("clamp_tensors", "clamp", "", [(with_nan(eighths(7, 5)), 1, True), (eighths(7) / 2, 0, True),
                                          (eighths(5, 1) / 2 + 0.5, 0, True)],
         lambda x, lo, hi: [torch.clamp(x, lo, hi)]),
        ("clamp_broadcast_up", "clamp", "", [(eighths(6), 0, True), (eighths(6, 4), 1, True),
                                               (eighths(4, 1) + 1, 0, True)],
         lambda x, lo, hi: [torch.clamp(x, lo, hi)]),
        ("clamp_min_tensor", "clamp_min", "", [(eighths(6, 5), 1, True), (eighths(6, 5), 1, True)],
         lambda x, lo: [torch.clamp_min(x, lo)]),
        ("clamp_max_tensor", "clamp_max", "", [(with_nan(eighths(4, 7)), 0, True), (eighths(7), 0, True)],
         lambda x, hi: [torch.clamp_max(x, hi)]),
        ("clamp_tensor_number", "clamp_tn", "0.5", [(eighths(5, 4), 0, True), (eighths(5, 4) / 2, 0, True)],
         lambda x, lo: [torch.clamp(x, lo, torch.tensor(0.5, dtype=x.dtype))]),  # torch: a 0-d max
        ("repeat_int_dim", "repeat_interleave", "3 1", [(normal(4, 3), 1, True)],
         lambda x: [torch.repeat_interleave(x, 3, dim=1)]),
        ("repeat_int_flat", "repeat_interleave", "2", [(normal(3, 4), 1, True)],
         lambda x: [torch.repeat_interleave(x, 2)]),
        ("repeat_tensor", "repeat_interleave", "0", [(normal(5, 3), 0, True),
                                                       (torch.tensor([2, 0, 1, 3, 2]), 0, False)],
         lambda x, r: [torch.repeat_interleave(x, r, dim=0)]),
        ("repeat_tensor_one", "repeat_interleave", "-1", [(normal(2, 4), 1, True), (torch.tensor([3]), 0, False)],
         lambda x, r: [torch.repeat_interleave(x, r, dim=-1)]),
        ("repeat_tensor_zeros", "repeat_interleave", "1", [(normal(3, 4), 0, True),
                                                             (torch.tensor([0, 2, 0, 1]), 0, False)],
         lambda x, r: [torch.repeat_interleave(x, r, dim=1)]),
    ]
    return out


COUNTS = [
    # name, op, args, inputs (not differentiable), fn
    ("bincount", "bincount", "", lambda d: [torch.randint(0, 9, (31,))], lambda x: [torch.bincount(x)]),
    ("bincount_minlength", "bincount", "15", lambda d: [torch.randint(0, 9, (23,))],
     lambda x: [torch.bincount(x, minlength=15)]),
    ("bincount_weights", "bincount", "", lambda d: [torch.randint(0, 7, (29,)), normal(29).to(d)],
     lambda x, w: [torch.bincount(x, w)]),
    ("bincount_weights_min", "bincount", "4", lambda d: [torch.randint(2, 5, (17,)), normal(17).to(d)],
     lambda x, w: [torch.bincount(x, w, minlength=4)]),
    ("histc_range", "histc", "7 -2 3", lambda d: [torch.cat([normal(41) * 2, torch.tensor(
        [-2.0, 3.0, 3.5, -2.5, float("inf"), -float("inf"), 0.5])]).to(d)], lambda x: [torch.histc(x, 7, -2, 3)]),
    ("histc_data_range", "histc", "10", lambda d: [(normal(6, 9) * 3).to(d)], lambda x: [torch.histc(x, 10)]),
    ("histc_one_bin", "histc", "1 -1 1", lambda d: [normal(33).to(d)], lambda x: [torch.histc(x, 1, -1, 1)]),
    ("histc_one_value", "histc", "4", lambda d: [torch.full((5,), 2.5, dtype=torch.float64).to(d)],
     lambda x: [torch.histc(x, 4)]),
    ("histc_odd_range", "histc", "13 -0.3 0.7", lambda d: [normal(60).to(d)],
     lambda x: [torch.histc(x, 13, -0.3, 0.7)]),
]


def histc_low(x, bins, lo=0.0, hi=0.0):
    """bf16/f16 histc: torch's f32 one on x's values, between the ends of x's dtype's bin edges (torch's
    range: the data's when lo == hi, widened by 1 each side when that is one value, rounded to x's dtype);
    the counts in x's dtype. (torch 1.13's bf16 histc rounds its steps otherwise; it has no f16 one.)"""
    if lo == hi and x.numel() > 0:
        lo, hi = x.min().item(), x.max().item()
    if lo == hi:
        lo, hi = lo - 1, hi + 1
    edges = torch.tensor([lo, hi], dtype=torch.float64).to(x.dtype).double().tolist()
    return torch.histc(x.float(), int(bins), edges[0], edges[1]).to(x.dtype)


# ops torch 1.13 has no f16 CPU kernel for; clamp picks one of its inputs, so its f32 result on f16
# values, rounded to f16, is the f16 result exactly
F16_VIA_F32 = {"einsum", "clamp", "clamp_min", "clamp_max", "clip", "clamp_tn"}


def main():
    f = open(sys.argv[1], "w")
    for dn, dt in DTYPES.items():
        for name, op, args, ins, fn in cases():
            # torch 1.13 has no f16 matmul or clamp on the CPU, and its bf16 matmul adds in bf16 for small
            # matrices (its error grows with the length): the reference of those is torch's f32 result on
            # the same f16/bf16 inputs, rounded (lutra's low-precision matmul adds in f32, rounds once)
            low = (op in F16_VIA_F32 and dn == "f16") or (op == "einsum" and dn == "bf16")
            via = torch.float32 if low else dt
            xs = []
            for base, tr, grad in ins:
                b = base.to(dt).to(via) if base.is_floating_point() else base
                x = (b.transpose(-1, -2) if tr else b).detach()
                xs.append(x.requires_grad_() if grad else x)
            ys = fn(*xs)
            gouts = [torch.randn(y.shape, dtype=torch.float64).to(dt).to(via) for y in ys]
            floats = [x for x in xs if x.requires_grad]
            grads = torch.autograd.grad(sum((y * g).sum() for y, g in zip(ys, gouts)), floats)
            ys, grads = [y.to(dt) for y in ys], [g.to(dt) for g in grads]
            f.write("case %s %s %s %s\n" % (name, op, dn, args))
            for k, (x, (_, tr, _)) in enumerate(zip(xs, ins)):
                emit(f, "x%d" % (k + 1), x, tr)
            for k, (y, g) in enumerate(zip(ys, gouts)):
                emit(f, "y%d" % (k + 1), y)
                emit(f, "gout%d" % (k + 1), g)
            gi = iter(grads)
            for k, x in enumerate(xs):
                if x.requires_grad:
                    emit(f, "d%d" % (k + 1), next(gi))
            if op == "einsum":  # the same sums of |products|: the scale of each value's rounding errors
                ax = [x.detach().double().abs().requires_grad_() for x in xs]
                sy = fn(*ax)
                sd = torch.autograd.grad(sum((y * g.double().abs()).sum() for y, g in zip(sy, gouts)), ax)
                emit(f, "s_y1", sy[0])
                for k, d in enumerate(sd):
                    emit(f, "s_d%d" % (k + 1), d)
            f.write("end\n")
        for name, op, args, make, fn in COUNTS:
            if op == "bincount" and "weights" not in name and dn != "f32":
                continue  # no float input: once
            xs = make(dt)
            if op == "histc" and dn in ("bf16", "f16"):
                ys = [histc_low(xs[0], *[float(a) for a in args.split()])]
            else:
                ys = fn(*xs)
            f.write("case %s %s %s %s\n" % (name, op, dn, args))
            for k, x in enumerate(xs):
                emit(f, "x%d" % (k + 1), x)
            for k, y in enumerate(ys):
                emit(f, "y%d" % (k + 1), y)
                f.write("dtype y%d %s\n" % (k + 1, str(y.dtype).replace("torch.", "")))
            f.write("end\n")
    f.close()


main()
