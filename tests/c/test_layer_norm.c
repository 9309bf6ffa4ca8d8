/* test_layer_norm.c — LayerNorm, plain and fused with the residual add (add_layer_norm,
 * layer_norm_backward_add): the cases it shares with RMSNorm (layer_norm_cases.h, center = 1),
 * determinism over thread counts, in place, bad inputs. */
#include "layer_norm_cases.h"

/* dweight/dbias are bitwise the same with 1 and 2 threads; in-place forward (out == x). */
static void test_determinism_and_inplace(void) {
  int64_t shape[2] = {300, 257}, cshape[1] = {257};
  lt_tensor *x = check_random(2, shape, LT_F32, -2, 2), *w = check_random(1, cshape, LT_F32, 0.5, 1.5);
  lt_tensor *b = check_random(1, cshape, LT_F32, -1, 1), *dout = check_random(2, shape, LT_F32, -1, 1);
  lt_tensor *out = lt_tensor_new(), *mean = lt_tensor_new(), *rstd = lt_tensor_new();
  CHECK_OK(lt_layer_norm_forward(out, mean, rstd, x, w, b, EPS));
  lt_tensor *dw[2], *db[2], *dx[2];
  int threads = lt_get_num_threads();
  for (int r = 0; r < 2; r++) {
    dw[r] = lt_tensor_new(), db[r] = lt_tensor_new(), dx[r] = lt_tensor_new();
    lt_set_num_threads(r == 0 ? 1 : 2);
    CHECK_OK(lt_layer_norm_backward(dx[r], dw[r], db[r], dout, x, w, mean, rstd));
  }
  lt_set_num_threads(threads);
  CHECK(memcmp(lt_data_ptr(dw[0]), lt_data_ptr(dw[1]), 257 * 4) == 0 &&
            memcmp(lt_data_ptr(db[0]), lt_data_ptr(db[1]), 257 * 4) == 0,
        "layer_norm dweight/dbias differ between 1 and 2 threads");
  /* in place: out == x, and dx == dout */
  lt_tensor *xc = lt_tensor_new(), *dc = lt_tensor_new();
  lt_empty(xc, 2, shape, LT_F32, LT_DEVICE_CPU), lt_copy(xc, x);
  lt_empty(dc, 2, shape, LT_F32, LT_DEVICE_CPU), lt_copy(dc, dout);
  CHECK_OK(lt_layer_norm_forward(xc, NULL, NULL, xc, w, b, EPS));
  CHECK(memcmp(lt_data_ptr(xc), lt_data_ptr(out), 300 * 257 * 4) == 0, "in-place layer_norm forward differs");
  CHECK_OK(lt_layer_norm_backward(dc, NULL, NULL, dc, x, w, mean, rstd));
  CHECK(memcmp(lt_data_ptr(dc), lt_data_ptr(dx[0]), 300 * 257 * 4) == 0, "in-place layer_norm backward differs");
  for (int r = 0; r < 2; r++) lt_release(dw[r]), lt_release(db[r]), lt_release(dx[r]);
  lt_release(x), lt_release(w), lt_release(b), lt_release(dout), lt_release(out), lt_release(mean), lt_release(rstd);
  lt_release(xc), lt_release(dc);
}

static void test_bad_inputs(void) {
  int64_t shape[2] = {4, 8}, c8[1] = {8}, c7[1] = {7}, n4[1] = {4}, n5[1] = {5};
  lt_tensor *x = check_random(2, shape, LT_F32, -1, 1), *w = check_random(1, c8, LT_F32, 0, 1);
  lt_tensor *w7 = check_random(1, c7, LT_F32, 0, 1), *out = lt_tensor_new(), *mean = lt_tensor_new();
  lt_tensor *rstd = lt_tensor_new(), *dx = lt_tensor_new(), *undef = lt_tensor_new();
  lt_tensor *r5 = check_random(1, n5, LT_F32, 1, 2), *r4d = check_random(1, n4, LT_I32, 1, 2);
  lt_tensor *wrong_out = check_random(2, shape, LT_F64, 0, 1), *d3 = check_random(1, c8, LT_F32, 0, 1);
  CHECK_ERR(lt_layer_norm_forward(out, mean, rstd, x, w7, NULL, EPS), "weight is [7] f32 cpu, expected [8]");
  CHECK_ERR(lt_layer_norm_forward(out, mean, rstd, x, w, w7, EPS), "bias is [7]");
  CHECK_ERR(lt_layer_norm_forward(out, mean, rstd, NULL, w, NULL, EPS), "x is NULL");
  CHECK_ERR(lt_layer_norm_forward(out, mean, rstd, undef, w, NULL, EPS), "x is undefined");
  CHECK_ERR(lt_layer_norm_forward(wrong_out, mean, rstd, x, w, NULL, EPS), "out is [4,8] f64 cpu, expected [4,8] f32");
  CHECK_ERR(lt_layer_norm_forward(out, mean, r4d, x, w, NULL, EPS),
            "layer_norm (rstd): out is [4] i32 cpu, expected [4] f32");
  lt_tensor *row = check_random(1, c8, LT_F32, 0, 1), *expanded = lt_tensor_new();
  lt_expand(expanded, row, 2, shape);
  CHECK_ERR(lt_layer_norm_forward(expanded, NULL, NULL, x, w, NULL, EPS), "layer_norm: out is an expanded view");
  lt_release(row), lt_release(expanded);
  CHECK_OK(lt_layer_norm_forward(out, mean, rstd, x, w, NULL, EPS));
  CHECK_ERR(lt_layer_norm_backward(dx, NULL, NULL, d3, x, w, mean, rstd), "dout is [8] f32 cpu, expected the shape");
  CHECK_ERR(lt_layer_norm_backward(dx, NULL, NULL, x, x, w, mean, r5), "rstd is [5] f32 cpu, expected f32 [4]");
  CHECK_ERR(lt_layer_norm_backward(dx, NULL, NULL, x, x, w, r4d, rstd), "mean is [4] i32 cpu, expected f32 [4]");
  CHECK_ERR(lt_layer_norm_backward(dx, NULL, NULL, x, x, w, NULL, rstd), "mean is NULL");
  lt_release(x), lt_release(w), lt_release(w7), lt_release(out), lt_release(mean), lt_release(rstd), lt_release(dx);
  lt_release(undef), lt_release(r5), lt_release(r4d), lt_release(wrong_out), lt_release(d3);
}

/* add_layer_norm and layer_norm_backward_add's own refusals */
static void test_add_errors(void) {
  int64_t shape[2] = {4, 8}, other[2] = {4, 7};
  lt_tensor *x = check_random(2, shape, LT_F32, -1, 1), *r7 = check_random(2, other, LT_F32, -1, 1);
  lt_tensor *out = lt_tensor_new(), *res = lt_tensor_new();
  lt_tensor *mean = lt_tensor_new(), *rstd = lt_tensor_new(), *dx = lt_tensor_new();
  CHECK_ERR(lt_add_layer_norm_forward(res, out, mean, rstd, x, NULL, NULL, NULL, EPS),
            "add_layer_norm: residual is NULL");
  CHECK_ERR(lt_add_layer_norm_forward(res, out, mean, rstd, x, r7, NULL, NULL, EPS),
            "add_layer_norm: residual is [4,7] f32 cpu, expected the shape and dtype of x ([4,8] f32 cpu)");
  CHECK_OK(lt_add_layer_norm_forward(res, out, mean, rstd, x, x, NULL, NULL, EPS));
  CHECK_ERR(lt_add_layer_norm_forward(res, res, NULL, NULL, x, x, NULL, NULL, EPS),
            "res_out and out must be different");
  CHECK_ERR(lt_layer_norm_backward_add(dx, NULL, NULL, x, r7, res, NULL, mean, rstd),
            "layer_norm_backward_add: dres is [4,7] f32 cpu, expected the shape and dtype of x");
  CHECK_ERR(lt_layer_norm_backward_add(dx, NULL, NULL, x, NULL, res, NULL, NULL, rstd), "mean is NULL");
  CHECK_OK(lt_layer_norm_backward_add(dx, NULL, NULL, x, NULL, res, NULL, mean, rstd));
  lt_release(x), lt_release(r7), lt_release(out), lt_release(res), lt_release(mean), lt_release(rstd), lt_release(dx);
}

int main(void) {
  run_norm_cases(1);
  test_determinism_and_inplace();
  test_bad_inputs();
  test_add_errors();
  return check_summary();
}
