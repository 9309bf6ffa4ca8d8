/* test_embedding.c — embedding lookup: forward against a naive gather, backward against a naive
 * double scatter-add and central finite differences, layouts, dtypes, determinism, bad inputs. */
#include "check.h"

static double *to_doubles(const lt_tensor *t) {
  int64_t n = lt_numel(t);
  double *v = malloc((size_t)(n > 0 ? n : 1) * sizeof(double));
  if (lt_copy_to_buffer(t, v, LT_F64, n)) fprintf(stderr, "to_doubles: %s\n", lt_last_error());
  return v;
}

/* A (V, C) weight in one of three layouts: contiguous, transposed storage (column stride V),
 * or rows of a wider table (row stride C + 3, unit column stride). */
static lt_tensor *make_weight(int64_t V, int64_t C, int dtype, int layout) {
  int64_t shape[2] = {V, C}, tshape[2] = {C, V}, wide[2] = {V, C + 3};
  if (layout == 0) return check_random(2, shape, dtype, -2, 2);
  lt_tensor *w = lt_tensor_new(), *base;
  if (layout == 1) {
    base = check_random(2, tshape, dtype, -2, 2);
    lt_transpose(w, base, 0, 1);
  } else {
    base = check_random(2, wide, dtype, -2, 2);
    lt_narrow(w, base, 1, 2, C);
  }
  lt_release(base);
  return w;
}

static lt_tensor *make_ids(int ndim, const int64_t *shape, int dtype, int64_t V, int noncontig) {
  lt_tensor *ids = check_random(ndim, shape, dtype, 0, (double)V);
  if (!noncontig || ndim < 2) return ids;
  lt_tensor *nc = check_noncontig(ids);
  lt_release(ids);
  return nc;
}

static void test_forward(int wdtype, int idtype, int64_t V, int64_t C, int ndim, const int64_t *ishape, int layout,
                         int noncontig) {
  lt_tensor *w = make_weight(V, C, wdtype, layout), *ids = make_ids(ndim, ishape, idtype, V, noncontig);
  lt_tensor *out = lt_tensor_new(), *tmp = lt_tensor_new();
  int64_t n = lt_numel(ids);
  if (noncontig && ndim == 1) { /* a defined, non-contiguous out: (n, C) seen through (C, n) storage */
    int64_t tshape[2] = {C, n};
    lt_empty(tmp, 2, tshape, wdtype, LT_DEVICE_CPU);
    lt_transpose(out, tmp, 0, 1);
  }
  CHECK_OK(lt_embedding_forward(out, w, ids));
  int bad = out->ndim != ndim + 1 || out->shape[ndim] != C || out->dtype != wdtype;
  for (int64_t i = 0; !bad && i < n; i++) {
    int64_t id = (int64_t)check_at(ids, i);
    for (int64_t j = 0; j < C; j++)
      if (check_at(out, i * C + j) != check_at(w, id * C + j)) bad++;
  }
  CHECK(bad == 0, "embedding %s ids %s V %lld C %lld ndim %d layout %d nc %d: %d bad", lt_dtype_name(wdtype),
        lt_dtype_name(idtype), (long long)V, (long long)C, ndim, layout, noncontig, bad);
  lt_release(w), lt_release(ids), lt_release(out), lt_release(tmp);
}

/* dweight against a double scatter-add of dout over ids; dweight pre-filled with garbage. */
static void test_backward(int dtype, int idtype, int64_t V, int64_t C, int ndim, const int64_t *ishape, int noncontig) {
  lt_tensor *ids = make_ids(ndim, ishape, idtype, V, noncontig);
  int64_t n = lt_numel(ids), dshape[LT_MAX_DIMS], wshape[2] = {V, C};
  memcpy(dshape, ids->shape, sizeof(int64_t) * (size_t)ndim);
  dshape[ndim] = C;
  lt_tensor *dout = check_random(ndim + 1, dshape, dtype, -1, 1), *dw = lt_tensor_new(), *tmp = lt_tensor_new();
  if (noncontig) {
    int64_t tshape[2] = {C, V};
    lt_empty(tmp, 2, tshape, dtype, LT_DEVICE_CPU);
    lt_transpose(dw, tmp, 0, 1);
  } else {
    lt_empty(dw, 2, wshape, dtype, LT_DEVICE_CPU);
  }
  lt_fill(dw, 7.0);
  CHECK_OK(lt_embedding_backward(dw, dout, ids));
  double *want = calloc((size_t)(V * C), sizeof(double)), *dv = to_doubles(dout), scale = 0;
  for (int64_t i = 0; i < n; i++) {
    int64_t id = (int64_t)check_at(ids, i);
    for (int64_t j = 0; j < C; j++) want[id * C + j] += dv[i * C + j];
  }
  for (int64_t i = 0; i < V * C; i++) scale = fmax(scale, fabs(want[i]));
  double tol = check_tol(dtype) * 4 * fmax(scale, 1), worst = 0;
  for (int64_t i = 0; i < V * C; i++) worst = fmax(worst, fabs(check_at(dw, i) - want[i]));
  CHECK(worst <= tol, "embedding_backward %s ids %s V %lld C %lld n %lld nc %d: max err %g", lt_dtype_name(dtype),
        lt_dtype_name(idtype), (long long)V, (long long)C, (long long)n, noncontig, worst);
  free(want), free(dv);
  lt_release(ids), lt_release(dout), lt_release(dw), lt_release(tmp);
}

/* Central differences in f64 of sum(out * R) with respect to every weight entry. */
static void test_backward_fd(void) {
  int64_t wshape[2] = {6, 5}, ishape[2] = {3, 4}, oshape[3] = {3, 4, 5};
  lt_tensor *w = check_random(2, wshape, LT_F64, -1, 1), *ids = check_random(2, ishape, LT_I64, 0, 6);
  lt_tensor *R = check_random(3, oshape, LT_F64, -1, 1), *dw = lt_tensor_new(), *out = lt_tensor_new();
  lt_empty(dw, 2, wshape, LT_F64, LT_DEVICE_CPU);
  CHECK_OK(lt_embedding_backward(dw, R, ids));
  double *p = lt_data_ptr(w), *r = lt_data_ptr(R), h = 1e-4;
  int bad = 0;
  for (int64_t i = 0; i < 30; i++) {
    double f[2], keep = p[i];
    for (int s = 0; s < 2; s++) {
      p[i] = keep + (s ? -h : h);
      lt_embedding_forward(out, w, ids);
      const double *o = lt_data_ptr(out);
      f[s] = 0;
      for (int k = 0; k < 60; k++) f[s] += o[k] * r[k];
    }
    p[i] = keep;
    if (!check_close(check_at(dw, i), (f[0] - f[1]) / (2 * h), 1e-8, 1e-9)) bad++;
  }
  CHECK(bad == 0, "embedding dweight vs finite differences: %d bad", bad);
  lt_release(w), lt_release(ids), lt_release(R), lt_release(dw), lt_release(out);
}

/* The same dweight bitwise with 1 and 2 threads, on skewed ids (a few ids repeated a lot). */
static void test_determinism(void) {
  int64_t V = 500, C = 96, ishape[1] = {4000}, dshape[2] = {4000, 96}, wshape[2] = {500, 96};
  lt_tensor *ids = lt_tensor_new(), *dout = check_random(2, dshape, LT_F32, -1, 1), *dw[2];
  lt_empty(ids, 1, ishape, LT_I32, LT_DEVICE_CPU);
  int32_t *ip = lt_data_ptr(ids);
  for (int i = 0; i < 4000; i++) ip[i] = (int32_t)(check_uniform() < 0.5 ? check_randint(0, 4) : check_randint(0, V));
  int threads = lt_get_num_threads();
  for (int r = 0; r < 2; r++) {
    dw[r] = lt_tensor_new();
    lt_empty(dw[r], 2, wshape, LT_F32, LT_DEVICE_CPU);
    lt_set_num_threads(r == 0 ? 1 : 2);
    CHECK_OK(lt_embedding_backward(dw[r], dout, ids));
  }
  lt_set_num_threads(threads);
  CHECK(memcmp(lt_data_ptr(dw[0]), lt_data_ptr(dw[1]), (size_t)(V * C) * 4) == 0,
        "embedding dweight differs between 1 and 2 threads");
  lt_release(ids), lt_release(dout), lt_release(dw[0]), lt_release(dw[1]);
}

static void test_bad_inputs(void) {
  int64_t wshape[2] = {4096, 8}, ishape[2] = {4, 5}, dshape[3] = {4, 5, 8}, d7[3] = {4, 5, 7}, v1[1] = {8};
  lt_tensor *w = check_random(2, wshape, LT_F32, -1, 1), *ids = check_random(2, ishape, LT_I64, 0, 4096);
  lt_tensor *idf = check_random(2, ishape, LT_F32, 0, 4096), *w1 = check_random(1, v1, LT_F32, 0, 1);
  lt_tensor *out = lt_tensor_new(), *dw = lt_tensor_new(), *dout = check_random(3, dshape, LT_F32, -1, 1);
  lt_tensor *dout7 = check_random(3, d7, LT_F32, -1, 1), *dout64 = check_random(3, dshape, LT_F64, -1, 1);
  ((int64_t *)lt_data_ptr(ids))[17] = 5000;
  CHECK_ERR(lt_embedding_forward(out, w, ids), "embedding: index 5000 out of range [0, 4096) at position 17");
  ((int64_t *)lt_data_ptr(ids))[17] = -1;
  CHECK_ERR(lt_embedding_forward(out, w, ids), "embedding: index -1 out of range [0, 4096) at position 17");
  lt_empty(dw, 2, wshape, LT_F32, LT_DEVICE_CPU);
  CHECK_ERR(lt_embedding_backward(dw, dout, ids), "embedding_backward: index -1 out of range");
  ((int64_t *)lt_data_ptr(ids))[17] = 3;
  CHECK_ERR(lt_embedding_forward(out, w, idf), "ids is [4,5] f32 cpu, expected i32 or i64");
  CHECK_ERR(lt_embedding_forward(out, w1, ids), "weight is [8] f32 cpu, expected (V, C)");
  CHECK_ERR(lt_embedding_forward(out, w, NULL), "ids is NULL");
  CHECK_ERR(lt_embedding_backward(dw, dout7, ids), "dout is [4,5,7] f32 cpu, expected ids' shape [4,5] plus (C = 8)");
  CHECK_ERR(lt_embedding_backward(dw, dout64, ids), "dweight's dtype ([4096,8] f32 cpu)");
  lt_tensor *undef = lt_tensor_new();
  CHECK_ERR(lt_embedding_backward(undef, dout, ids), "dweight must be a defined (V, C) tensor");
  CHECK_OK(lt_embedding_backward(dw, dout, ids));
  w->device = 15; /* claims cuda:15, which no machine here has: refused before any kernel */
  CHECK_ERR(lt_embedding_forward(out, w, ids), "embedding: tensors on different devices: cuda:15 vs cpu");
  w->device = LT_DEVICE_CPU;
  lt_release(w), lt_release(ids), lt_release(idf), lt_release(w1), lt_release(out), lt_release(dw);
  lt_release(dout), lt_release(dout7), lt_release(dout64), lt_release(undef);
}

int main(void) {
  static const int64_t widths[] = {1, 7, 33, 257};
  static const int dtypes[] = {LT_F32, LT_F64, LT_BF16, LT_F16};
  int64_t s0[1] = {0}, s1[1] = {13}, s2[2] = {3, 5}, s3[3] = {2, 3, 4};
  const int64_t *shapes[4] = {s0, s1, s2, s3};
  for (int d = 0; d < 4; d++)
    for (int k = 0; k < 4; k++) {
      int64_t V = check_randint(1, 50), C = widths[k];
      for (int nd = 0; nd < 4; nd++) {
        int idt = (nd + k) & 1 ? LT_I32 : LT_I64;
        test_forward(dtypes[d], idt, V, C, nd, shapes[nd], (nd + d) % 3, nd == 1 && (k & 1));
        if (nd > 0) test_backward(dtypes[d], idt, V, C, nd, shapes[nd], k & 1);
      }
    }
  test_forward(LT_I32, LT_I64, 10, 4, 2, s2, 1, 0); /* an integer table gathers too */
  int64_t big[2] = {64, 300};
  test_forward(LT_F32, LT_I32, 1000, 256, 2, big, 0, 0); /* the parallel paths */
  test_backward(LT_F32, LT_I32, 1000, 256, 2, big, 0);
  test_backward(LT_BF16, LT_I64, 50, 64, 2, big, 1); /* many repeats: f32 accumulation */
  test_backward_fd();
  test_determinism();
  test_bad_inputs();
  return check_summary();
}
