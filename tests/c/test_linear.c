/* lt_linear and lt_linear_backward_params on the CPU against naive loops in double: bias
 * or none, GELU or none, 2-d and 3-d inputs, a non-contiguous x, f32/f64/bf16, and bad
 * input. (The CUDA path, cuBLASLt with epilogues, is checked by `lutra selftest`.) */
#include "check.h"
#include "lutra.h"

static double gelu(double v) { return 0.5 * v * (1 + tanh(0.7978845608028654 * (v + 0.044715 * v * v * v))); }

static void check_forward(int ndim, const int64_t *xshape, int64_t N, int dtype, bool with_bias, int act,
                          bool noncontig) {
  int64_t K = xshape[ndim - 1], rows = 1;
  for (int d = 0; d < ndim - 1; d++) rows *= xshape[d];
  int64_t wshape[2] = {N, K}, bshape[1] = {N};
  lt_tensor *x0 = check_random(ndim, xshape, dtype, -1, 1), *w = check_random(2, wshape, dtype, -1, 1);
  lt_tensor *b = with_bias ? check_random(1, bshape, dtype, -1, 1) : NULL, *out = lt_tensor_new();
  lt_tensor *x = noncontig ? check_noncontig(x0) : x0;
  CHECK_OK(lt_linear(out, x, w, b, act));
  CHECK(out->ndim == ndim && out->shape[ndim - 1] == N && out->dtype == dtype, "linear: out shape/dtype");
  double worst = 0;
  for (int64_t i = 0; i < rows; i++)
    for (int64_t j = 0; j < N; j++) {
      double acc = b ? check_at(b, j) : 0;
      for (int64_t k = 0; k < K; k++) acc += check_at(x, i * K + k) * check_at(w, j * K + k);
      double want = act ? gelu(acc) : acc, got = check_at(out, i * N + j);
      double err = fabs(got - want) / (1 + fabs(want));
      if (err > worst) worst = err;
    }
  /* bf16 rounds the bias copy and the result: a few units of 2^-8 on sums of K products */
  double tol = dtype == LT_BF16 ? 3e-2 : dtype == LT_F32 ? 1e-5 : 1e-12;
  CHECK(worst <= tol, "linear %s rows %lld K %lld N %lld bias %d act %d noncontig %d: worst %.3g", lt_dtype_name(dtype),
        (long long)rows, (long long)K, (long long)N, with_bias, act, noncontig, worst);
  if (x != x0) lt_release(x);
  lt_release(x0), lt_release(w), lt_release(out);
  if (b) lt_release(b);
}

static void check_backward(int64_t rows, int64_t K, int64_t N, int dtype, bool want_bias) {
  int64_t dyshape[3] = {2, rows, N}, xshape[3] = {2, rows, K};
  lt_tensor *dy = check_random(3, dyshape, dtype, -1, 1), *x = check_random(3, xshape, dtype, -1, 1);
  lt_tensor *dw = lt_tensor_new(), *db = want_bias ? lt_tensor_new() : NULL;
  CHECK_OK(lt_linear_backward_params(dw, db, dy, x));
  double worst = 0;
  for (int64_t j = 0; j < N; j++) {
    double sb = 0;
    for (int64_t i = 0; i < 2 * rows; i++) sb += check_at(dy, i * N + j);
    if (db) worst = fmax(worst, fabs(check_at(db, j) - sb) / (1 + fabs(sb)));
    for (int64_t k = 0; k < K; k++) {
      double acc = 0;
      for (int64_t i = 0; i < 2 * rows; i++) acc += check_at(dy, i * N + j) * check_at(x, i * K + k);
      worst = fmax(worst, fabs(check_at(dw, j * K + k) - acc) / (1 + fabs(acc)));
    }
  }
  double tol = dtype == LT_BF16 ? 3e-2 : dtype == LT_F32 ? 1e-5 : 1e-12;
  CHECK(worst <= tol, "linear_backward %s %lldx%lldx%lld: worst %.3g", lt_dtype_name(dtype), (long long)rows,
        (long long)K, (long long)N, worst);
  CHECK(dw->ndim == 2 && dw->shape[0] == N && dw->shape[1] == K, "linear_backward: dw shape");
  lt_release(dy), lt_release(x), lt_release(dw);
  if (db) lt_release(db);
}

int main(void) {
  int dtypes[3] = {LT_F32, LT_F64, LT_BF16};
  for (int di = 0; di < 3; di++) {
    int64_t x2[2] = {7, 13}, x3[3] = {2, 5, 33}, x1[2] = {1, 1};
    for (int act = 0; act <= 1; act++)
      for (int bias = 0; bias <= 1; bias++) {
        check_forward(2, x2, 5, dtypes[di], bias, act, false);
        check_forward(3, x3, 17, dtypes[di], bias, act, false);
        check_forward(3, x3, 17, dtypes[di], bias, act, true);
        check_forward(2, x1, 1, dtypes[di], bias, act, false);
      }
    check_backward(9, 13, 5, dtypes[di], true);
    check_backward(3, 1, 1, dtypes[di], false);
  }
  /* bad input */
  int64_t xs[2] = {3, 4}, ws[2] = {5, 6}, bs[1] = {4}, b5[1] = {5};
  lt_tensor *x = check_random(2, xs, LT_F32, -1, 1), *w = check_random(2, ws, LT_F32, -1, 1);
  lt_tensor *b = check_random(1, bs, LT_F32, -1, 1), *out = lt_tensor_new();
  CHECK_ERR(lt_linear(out, x, w, NULL, 0), "needs x (..., K) and w (N, K)");
  int64_t ws2[2] = {4, 4};
  lt_tensor *w2 = check_random(2, ws2, LT_F32, -1, 1);
  CHECK_ERR(lt_linear(out, x, w2, b, 2), "act must be 0");
  lt_tensor *b64 = check_random(1, b5, LT_F64, -1, 1);
  CHECK_ERR(lt_linear(out, x, w2, b64, 0), "bias must be (4) f32");
  lt_tensor *w64 = check_random(2, ws2, LT_F64, -1, 1);
  CHECK_ERR(lt_linear(out, x, w64, NULL, 0), "dtype");
  CHECK_ERR(lt_linear(out, NULL, w2, NULL, 0), "x");
  int64_t dys[2] = {2, 4};
  lt_tensor *dy = check_random(2, dys, LT_F32, -1, 1), *dw = lt_tensor_new();
  CHECK_ERR(lt_linear_backward_params(dw, NULL, dy, x), "same rows");
  lt_release(x), lt_release(w), lt_release(b), lt_release(out), lt_release(w2), lt_release(b64), lt_release(w64);
  lt_release(dy), lt_release(dw);
  return check_summary();
}
