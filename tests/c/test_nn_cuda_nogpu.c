/* test_nn_cuda_nogpu.c — the CUDA paths of cross-entropy, embedding, rope and the RNG on a
 * machine without a GPU: tensors that claim cuda:0 (their bytes are never touched) get past
 * the argument checks and fail cleanly at the device, with "device cuda:15 is not available"
 * in a CUDA build and "lutra was built without CUDA" in a CPU build; mixed devices are an
 * error before that. (With a GPU, `lutra selftest` compares these ops with the CPU.) */
#include "check.h"

/* present only in a CUDA build (kernels/random.cu); weak so that a CPU build links */
struct lt_cuda_rng_args;
__attribute__((weak)) int lt_cuda_rng_fill(const struct lt_cuda_rng_args *a);

static lt_tensor *make(int ndim, const int64_t *shape, int dtype) {
  lt_tensor *t = lt_tensor_new();
  if (lt_empty(t, ndim, shape, dtype, LT_DEVICE_CPU)) exit(2);
  memset(lt_data_ptr(t), 0, (size_t)(lt_numel(t) * lt_dtype_size(dtype)));
  return t;
}

int main(void) {
  /* ctest hides any GPU (CUDA_VISIBLE_DEVICES=), so this runs on every machine; with a device
   * visible the fake cuda tensors could be dereferenced by it: a failure, not a pass */
  if (lt_cuda_device_count() > 0) {
    CHECK(0, "a GPU is visible: run with CUDA_VISIBLE_DEVICES= (as ctest does)");
    return check_summary();
  }
  const char *want = lt_cuda_rng_fill ? "device cuda:15 is not available" : "lutra was built without CUDA";
  int64_t nv[2] = {4, 7}, n[1] = {4}, ids_shape[2] = {2, 3}, emb[3] = {2, 3, 5}, w_shape[2] = {9, 5};
  int64_t x_shape[4] = {2, 3, 2, 4}, pos_shape[1] = {3};
  lt_tensor *logits = make(2, nv, LT_F32), *targets = make(1, n, LT_I64), *losses = make(1, n, LT_F32);
  lt_tensor *lse = make(1, n, LT_F32), *dlosses = make(1, n, LT_F32), *dlogits = make(2, nv, LT_F32);
  lt_tensor *w = make(2, w_shape, LT_BF16), *ids = make(2, ids_shape, LT_I32), *out = make(3, emb, LT_BF16);
  lt_tensor *x = make(4, x_shape, LT_F16), *xo = make(4, x_shape, LT_F16), *pos = make(1, pos_shape, LT_I64);
  lt_tensor *r = make(1, n, LT_F32),
            *all[] = {logits, targets, losses, lse, dlosses, dlogits, w, ids, out, x, xo, pos, r};
  int count = (int)(sizeof all / sizeof *all);

  /* mixed devices: caught first, in any build */
  logits->device = 15;
  CHECK_ERR(lt_cross_entropy_forward(losses, lse, logits, targets, -100),
            "cross_entropy: tensors on different devices: cuda:15 vs cpu");
  w->device = 15;
  CHECK_ERR(lt_embedding_forward(out, w, ids), "embedding: tensors on different devices: cuda:15 vs cpu");
  x->device = 15;
  CHECK_ERR(lt_rope(xo, x, pos, 10000, 0), "rope: tensors on different devices");

  for (int k = 0; k < count; k++) all[k]->device = 15;
  CHECK_ERR(lt_cross_entropy_forward(losses, lse, logits, targets, -100), want);
  CHECK_ERR(lt_cross_entropy_backward(dlogits, dlosses, logits, targets, lse, -100), want);
  /* argument errors keep the CPU's messages on the device path */
  CHECK_ERR(lt_cross_entropy_backward(dlogits, dlosses, logits, targets, NULL, -100), "lse is NULL");
  CHECK_ERR(lt_cross_entropy_forward(NULL, lse, logits, targets, -100), "losses is NULL");
  CHECK_ERR(lt_embedding_forward(out, w, ids), want);
  CHECK_ERR(lt_embedding_forward(out, w, logits), "expected i32 or i64");
  CHECK_ERR(lt_embedding_backward(w, out, ids), want);
  CHECK_ERR(lt_embedding_backward(w, dlogits, ids), "dout is [4,7] f32 cuda:15, expected ids' shape [2,3]");
  CHECK_ERR(lt_rope(xo, x, pos, 10000, 0), want);
  CHECK_ERR(lt_rope(xo, x, NULL, 10000, 1), want);
  CHECK_ERR(lt_rope(xo, x, pos, -1, 0), "theta must be positive");
  CHECK_ERR(lt_rand_uniform(r, 1, 3, 0, 1), want);
  CHECK_ERR(lt_rand_normal(r, 1, 3, 0, 1), want);
  CHECK_ERR(lt_rand_int(r, 1, 3, 0, 10), want);
  CHECK_ERR(lt_rand_bernoulli(r, 1, 3, 0.5), want);
  CHECK_ERR(lt_rand_uniform(r, 1, 3, 1, 0), "need finite lo < hi");

  for (int k = 0; k < count; k++) all[k]->device = LT_DEVICE_CPU, lt_release(all[k]);
  return check_summary();
}
