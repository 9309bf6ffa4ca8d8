/* emu_sort.c — the ops along a dim under the emulator: sort and topk (kernels/sort.cu: values
 * and indices exactly, ties and all), their backward's scatter, cumsum (forward and reversed),
 * cumprod and its backward (kernels/cumsum.cu), tril and triu (kernels/tril.cu), on contiguous,
 * strided and transposed inputs, against the CPU ops. */
#include "emu_check.h"

static const int sort_dts[] = {LT_F32, LT_F64, LT_BF16, LT_F16, LT_I32, LT_I64};

static void check_pair(const char *name, int dt, int rc, int rd, lt_tensor *gv, lt_tensor *wv, lt_tensor *gi,
                       lt_tensor *wi, double tol) {
  if (rc || rd) {
    emu_fails++, printf("FAIL %s %s: cpu rc %d device rc %d: %s\n", name, lt_dtype_name(dt), rc, rd, lt_last_error());
    return;
  }
  emu_check(name, dt, gv, wv, tol);
  if (gi) emu_check(name, LT_I64, gi, wi, 0);
}

static void sort_cases(int nd, const int64_t *shape, int dim, int64_t k) {
  char name[96];
  for (int t = 0; t < 6; t++) {
    int dt = sort_dts[t];
    lt_tensor *x = emu_rnd(nd, shape, dt, -4, 4, 1); /* small integers: many ties */
    for (int mode = 0; mode < 3; mode++) {
      lt_tensor *xd = emu_dev(x, mode);
      for (int desc = 0; desc < 2; desc++) {
        lt_tensor *v = lt_tensor_new(), *i = lt_tensor_new(), *vd = emu_out(x, mode % 2), *id = lt_tensor_new();
        snprintf(name, sizeof name, "sort dim %d desc %d%s", dim, desc, emu_mode_name[mode]);
        check_pair(name, dt, lt_sort(v, i, x, dim, desc), lt_sort(vd, id, xd, dim, desc), vd, v, id, i, 0);
        lt_release(v), lt_release(i), lt_release(vd), lt_release(id);
        v = lt_tensor_new(), i = lt_tensor_new(), vd = lt_tensor_new(), id = lt_tensor_new();
        snprintf(name, sizeof name, "topk k %lld dim %d largest %d%s", (long long)k, dim, desc, emu_mode_name[mode]);
        int rc = lt_topk(v, i, x, k, dim, desc), rd = lt_topk(vd, id, xd, k, dim, desc);
        check_pair(name, dt, rc, rd, vd, v, id, i, 0);
        if (!rc && !rd) { /* the backward scatters topk's indices */
          lt_tensor *g = emu_rnd(v->ndim, v->shape, dt, -2, 2, 0), *gd = emu_dev(g, mode), *ix = emu_dev(i, 0);
          lt_tensor *w = lt_tensor_new(), *got = lt_tensor_new();
          int64_t n = x->ndim ? x->shape[dim < 0 ? dim + x->ndim : dim] : 1;
          snprintf(name, sizeof name, "sort_backward k %lld dim %d%s", (long long)k, dim, emu_mode_name[mode]);
          check_pair(name, dt, lt_sort_backward(w, g, i, dim, n), lt_sort_backward(got, gd, ix, dim, n), got, w, NULL,
                     NULL, 0);
          lt_release(g), lt_release(gd), lt_release(ix), lt_release(w), lt_release(got);
        }
        lt_release(v), lt_release(i), lt_release(vd), lt_release(id);
      }
      lt_release(xd);
    }
    lt_release(x);
  }
}

static void scan_cases(int nd, const int64_t *shape, int dim) {
  static const int fdts[] = {LT_F32, LT_F64, LT_BF16, LT_F16};
  char name[96];
  for (int t = 0; t < 4; t++) {
    int dt = fdts[t];
    double tol = emu_tol(dt, 1e-6, 1e-13, 1.0 / 128, 1.0 / 1024);
    lt_tensor *x = emu_rnd(nd, shape, dt, -1, 1, 0), *g = emu_rnd(nd, shape, dt, -1, 1, 0);
    lt_tensor *z = emu_rnd(nd, shape, dt, -1, 2, 1); /* -1, 0 and 1: rows with zeros for cumprod */
    for (int mode = 0; mode < 3; mode++) {
      lt_tensor *xd = emu_dev(x, mode), *gd = emu_dev(g, (mode + 1) % 3), *zd = emu_dev(z, mode);
      for (int kind = 0; kind < 6; kind++) {
        lt_tensor *w = lt_tensor_new(), *got = emu_out(x, mode % 2);
        int rc, rd;
        switch (kind) {
        case 0: rc = lt_cumsum(w, x, dim, 0), rd = lt_cumsum(got, xd, dim, 0); break;
        case 1: rc = lt_cumsum(w, x, dim, 1), rd = lt_cumsum(got, xd, dim, 1); break;
        case 2: rc = lt_cumprod(w, x, dim), rd = lt_cumprod(got, xd, dim); break;
        case 3: rc = lt_cumprod(w, z, dim), rd = lt_cumprod(got, zd, dim); break;
        case 4: rc = lt_cumprod_backward(w, g, x, dim), rd = lt_cumprod_backward(got, gd, xd, dim); break;
        default: rc = lt_cumprod_backward(w, g, z, dim), rd = lt_cumprod_backward(got, gd, zd, dim);
        }
        static const char *kinds[] = {"cumsum", "cumsum reverse", "cumprod", "cumprod zeros", "cumprod_backward",
                                      "cumprod_backward zeros"};
        snprintf(name, sizeof name, "%s dim %d%s", kinds[kind], dim, emu_mode_name[mode]);
        /* the backward divides where the CPU keeps every product: a few more roundings */
        check_pair(name, dt, rc, rd, got, w, NULL, NULL, tol * (kind >= 4 ? 8 : 1));
        lt_release(w), lt_release(got);
      }
      lt_release(xd), lt_release(gd), lt_release(zd);
    }
    lt_release(x), lt_release(g), lt_release(z);
  }
}

static void tril_cases(int nd, const int64_t *shape) {
  char name[96];
  for (int t = 0; t < 6; t++) {
    int dt = sort_dts[t];
    lt_tensor *x = emu_rnd(nd, shape, dt, -3, 3, 0);
    for (int mode = 0; mode < 3; mode++) {
      lt_tensor *xd = emu_dev(x, mode);
      for (int64_t diag = -2; diag <= 2; diag++)
        for (int upper = 0; upper < 2; upper++) {
          lt_tensor *w = lt_tensor_new(), *got = emu_out(x, mode % 2);
          int rc = upper ? lt_triu(w, x, diag) : lt_tril(w, x, diag);
          int rd = upper ? lt_triu(got, xd, diag) : lt_tril(got, xd, diag);
          snprintf(name, sizeof name, "%s %lld%s", upper ? "triu" : "tril", (long long)diag, emu_mode_name[mode]);
          check_pair(name, dt, rc, rd, got, w, NULL, NULL, 0);
          lt_release(w), lt_release(got);
        }
      lt_release(xd);
    }
    lt_release(x);
  }
}

void emu_suite_sort(void) {
  sort_cases(2, (int64_t[]){3, 7}, -1, 3);
  sort_cases(3, (int64_t[]){4, 5, 2}, 0, 4);
  sort_cases(1, (int64_t[]){1}, 0, 1);
  scan_cases(2, (int64_t[]){3, 9}, 1);
  scan_cases(3, (int64_t[]){5, 2, 3}, 0);
  tril_cases(2, (int64_t[]){4, 6});
  tril_cases(3, (int64_t[]){2, 5, 3});
  /* a row longer than the kernel sorts: the error names the limit */
  lt_tensor *big = emu_rnd(1, (int64_t[]){5000}, LT_F32, 0, 1, 0), *bd = emu_dev(big, 0);
  lt_tensor *v = lt_tensor_new(), *i = lt_tensor_new();
  if (lt_sort(v, i, bd, 0, 0) == 0 || !strstr(lt_last_error(), "longer than cuda sorts (at most 4096"))
    emu_fails++, printf("FAIL sort of 5000: expected the row-length error, got '%s'\n", lt_last_error());
  else
    emu_passes++;
  lt_release(big), lt_release(bd), lt_release(v), lt_release(i);
  if (emu_quick) return;
  sort_cases(2, (int64_t[]){5, 1000}, 1, 37);
  sort_cases(2, (int64_t[]){4096, 2}, 0, 4096);
  scan_cases(2, (int64_t[]){3, 700}, 1);
  tril_cases(4, (int64_t[]){2, 3, 17, 9});
}
