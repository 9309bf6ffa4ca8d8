/* test_core.c — the tensor core: views and their shared storage, reshape, the view ops,
 * contiguous, refcounts, lt_free_storage, memory statistics, element access, the output
 * convention of lt_prepare_out, and the errors of bad input. Copies, dtype conversions
 * and creation ops are in test_copy.c. */
#include "check.h"

static lt_tensor *new_empty(int ndim, const int64_t *shape, int dtype) {
  lt_tensor *t = lt_tensor_new();
  CHECK_OK(lt_empty(t, ndim, shape, dtype, LT_DEVICE_CPU));
  return t;
}

/* A tensor of shape holding 0, 1, 2, ... in row-major order. */
static lt_tensor *iota(int ndim, const int64_t *shape, int dtype) {
  lt_tensor *t = new_empty(ndim, shape, dtype);
  for (int64_t i = 0; i < lt_numel(t); i++) lt_store_f64(lt_data_ptr(t), dtype, i, (double)i);
  return t;
}

static bool has_shape(const lt_tensor *t, int ndim, const int64_t *shape) {
  if (t->ndim != ndim) return false;
  for (int d = 0; d < ndim; d++)
    if (t->shape[d] != shape[d]) return false;
  return true;
}

static double at2(const lt_tensor *t, int64_t i, int64_t j) {
  int64_t idx[2] = {i, j};
  double v = NAN;
  lt_get_at(t, idx, &v);
  return v;
}

/* ---- views ------------------------------------------------------------------------------ */

/* lua_slot is the Lua binding's own index: a new tensor has 0, and an op writing a view, a copy or
 * a new geometry into `out` keeps out's (the binding finds out's autograd state under it). */
static void test_lua_slot_kept(void) {
  int64_t s[2] = {3, 4}, vs[1] = {12};
  lt_tensor *t = iota(2, s, LT_F32), *out = lt_tensor_new();
  CHECK(out->lua_slot == 0 && t->lua_slot == 0, "a new tensor has lua_slot 0");
  t->lua_slot = 5;
  out->lua_slot = 7;
  CHECK_OK(lt_view(out, t, 1, vs));
  CHECK(out->lua_slot == 7, "view keeps out's lua_slot, got %d", out->lua_slot);
  CHECK_OK(lt_transpose(out, t, 0, 1));
  CHECK(out->lua_slot == 7, "transpose keeps out's lua_slot, got %d", out->lua_slot);
  CHECK_OK(lt_set(out, t));
  CHECK(out->lua_slot == 7, "set keeps out's lua_slot, got %d", out->lua_slot);
  CHECK_OK(lt_contiguous(out, t));
  CHECK(out->lua_slot == 7 && t->lua_slot == 5, "contiguous keeps both slots, got %d and %d", out->lua_slot,
        t->lua_slot);
  lt_release(out);
  lt_release(t);
}

static void test_view_shares_storage(void) {
  int64_t s[2] = {3, 4}, vs[2] = {2, -1}, flat[1] = {12};
  lt_tensor *t = iota(2, s, LT_F32), *v = lt_tensor_new(), *f = lt_tensor_new();
  CHECK_OK(lt_view(v, t, 2, vs));
  int64_t want[2] = {2, 6};
  CHECK(has_shape(v, 2, want) && v->storage == t->storage && lt_is_contiguous(v), "view (3,4) as (2,-1) is (2,6)");
  int64_t idx[2] = {1, 5};
  CHECK_OK(lt_set_at(v, idx, 42));
  CHECK(at2(t, 2, 3) == 42, "writing through a view changes the source: %g", at2(t, 2, 3));
  CHECK_OK(lt_view(f, t, 1, flat));
  CHECK(check_at(f, 11) == 42 && check_at(f, 4) == 4, "flat view");
  CHECK_ERR(lt_view(f, t, 2, (int64_t[]){5, -1}), "view: shape [5,-1] is invalid for input of shape [3,4]");
  CHECK_ERR(lt_view(f, t, 2, (int64_t[]){-1, -1}), "only one dim can be -1");
  CHECK_ERR(lt_view(f, t, 2, (int64_t[]){7, 2}), "invalid for input");
  CHECK_ERR(lt_view(f, t, 2, (int64_t[]){-2, -6}), "negative size");
  CHECK_ERR(lt_view(f, t, 9, flat), "9 dims requested, at most 8");
  /* a transpose is not viewable as flat, but reshape copies */
  lt_tensor *tr = lt_tensor_new(), *r = lt_tensor_new();
  CHECK_OK(lt_transpose(tr, t, 0, 1));
  CHECK(!lt_is_contiguous(tr), "a transpose is not contiguous");
  CHECK_ERR(lt_view(f, tr, 1, flat), "view: cannot view a non-contiguous tensor of shape [4,3] as [12]");
  CHECK_OK(lt_reshape(r, tr, 1, flat));
  CHECK(r->storage != t->storage && lt_is_contiguous(r), "reshape of a transpose copies");
  CHECK(check_at(r, 0) == 0 && check_at(r, 1) == 4 && check_at(r, 2) == 8 && check_at(r, 3) == 1, "reshape values");
  CHECK_OK(lt_reshape(r, t, 2, (int64_t[]){4, -1}));
  CHECK(r->storage == t->storage && r->shape[1] == 3, "reshape of a contiguous tensor is a view");
  /* a narrow keeps a stride that a split of dim 0 can still view */
  lt_tensor *src = iota(2, (int64_t[]){4, 6}, LT_F64), *n = lt_tensor_new(), *nv = lt_tensor_new();
  CHECK_OK(lt_narrow(n, src, 1, 2, 3));
  CHECK_OK(lt_view(nv, n, 3, (int64_t[]){2, 2, 3}));
  CHECK(nv->stride[0] == 12 && nv->stride[1] == 6 && nv->stride[2] == 1, "view of a narrow: strides %lld %lld %lld",
        (long long)nv->stride[0], (long long)nv->stride[1], (long long)nv->stride[2]);
  int64_t i3[3] = {1, 1, 2};
  double v3 = 0;
  lt_get_at(nv, i3, &v3);
  CHECK(v3 == 3 * 6 + 2 + 2, "view of a narrow: value %g", v3);
  CHECK_ERR(lt_view(nv, n, 1, flat), "cannot view a non-contiguous");
  /* 0-d and empty tensors */
  lt_tensor *sc = new_empty(0, NULL, LT_F32), *sv = lt_tensor_new(), *e = new_empty(2, (int64_t[]){0, 5}, LT_F32);
  CHECK_OK(lt_view(sv, sc, 2, (int64_t[]){1, -1}));
  CHECK(sv->ndim == 2 && sv->shape[0] == 1 && sv->shape[1] == 1, "0-d viewed as (1,1)");
  CHECK_OK(lt_view(sv, e, 3, (int64_t[]){5, 0, 2}));
  CHECK(sv->shape[1] == 0 && lt_numel(sv) == 0, "empty viewed as (5,0,2)");
  CHECK_ERR(lt_view(sv, e, 2, (int64_t[]){-1, 0}), "invalid for input");
  lt_release(t), lt_release(v), lt_release(f), lt_release(tr), lt_release(r), lt_release(src), lt_release(n);
  lt_release(nv), lt_release(sc), lt_release(sv), lt_release(e);
}

static void test_view_ops(void) {
  int64_t s[3] = {2, 3, 4};
  lt_tensor *t = iota(3, s, LT_I32), *v = lt_tensor_new();
  /* transpose and permute */
  CHECK_OK(lt_transpose(v, t, 0, -1));
  CHECK(has_shape(v, 3, (int64_t[]){4, 3, 2}) && v->storage == t->storage, "transpose shape");
  int64_t idx[3] = {3, 1, 1};
  double x = 0;
  lt_get_at(v, idx, &x);
  CHECK(x == 1 * 12 + 1 * 4 + 3, "transpose value %g", x);
  CHECK_OK(lt_permute(v, t, 3, (int64_t[]){2, 0, 1}));
  CHECK(has_shape(v, 3, (int64_t[]){4, 2, 3}) && v->stride[0] == 1 && v->stride[1] == 12 && v->stride[2] == 4,
        "permute (2,0,1)");
  CHECK_ERR(lt_permute(v, t, 3, (int64_t[]){0, 0, 1}), "permute: dim 0 repeated");
  CHECK_ERR(lt_permute(v, t, 2, (int64_t[]){0, 1}), "permute: 2 dims given for a 3-d tensor");
  CHECK_ERR(lt_transpose(v, t, 0, 3), "transpose: dim 3 out of range for a 3-d tensor");
  /* narrow, slice with a step, select */
  CHECK_OK(lt_narrow(v, t, 2, 1, 2));
  CHECK(has_shape(v, 3, (int64_t[]){2, 3, 2}) && check_at(v, 0) == 1 && check_at(v, 11) == 22, "narrow");
  CHECK_ERR(lt_narrow(v, t, 2, 3, 2), "narrow: range [3, 5) out of bounds for dim 2 of size 4");
  CHECK_OK(lt_slice(v, t, 2, -3, 100, 2)); /* indices 1, 3 */
  CHECK(has_shape(v, 3, (int64_t[]){2, 3, 2}) && v->stride[2] == 2, "slice shape and stride");
  CHECK(check_at(v, 0) == 1 && check_at(v, 1) == 3 && check_at(v, 2) == 5 && check_at(v, 11) == 23, "slice values");
  CHECK_OK(lt_slice(v, t, 1, 2, 1, 1));
  CHECK(v->shape[1] == 0, "slice with stop < start is empty");
  CHECK_ERR(lt_slice(v, t, 1, 0, 3, 0), "slice: step must be positive");
  CHECK_OK(lt_select(v, t, 1, -1));
  CHECK(has_shape(v, 2, (int64_t[]){2, 4}) && check_at(v, 0) == 8 && check_at(v, 7) == 23, "select index -1");
  CHECK_ERR(lt_select(v, t, 1, 3), "select: index 3 out of range for dim 1 of size 3");
  CHECK_ERR(lt_select(v, t, -4, 0), "dim -4 out of range");
  /* expand, unsqueeze, squeeze */
  lt_tensor *col = iota(2, (int64_t[]){3, 1}, LT_F32), *e = lt_tensor_new();
  CHECK_OK(lt_expand(e, col, 3, (int64_t[]){2, -1, 4}));
  CHECK(has_shape(e, 3, (int64_t[]){2, 3, 4}) && e->stride[0] == 0 && e->stride[2] == 0, "expand strides");
  CHECK(check_at(e, 5) == 1 && check_at(e, 23) == 2, "expand values");
  CHECK_ERR(lt_expand(e, col, 2, (int64_t[]){2, 4}), "expand: shape [3,1] cannot expand to [2,4]");
  CHECK_ERR(lt_expand(e, col, 3, (int64_t[]){-1, 3, 4}), "-1 not allowed for a new leading dim");
  CHECK_OK(lt_unsqueeze(v, t, -1));
  CHECK(has_shape(v, 4, (int64_t[]){2, 3, 4, 1}) && v->stride[3] == 1, "unsqueeze -1");
  CHECK_OK(lt_unsqueeze(v, t, 1));
  CHECK(has_shape(v, 4, (int64_t[]){2, 1, 3, 4}) && v->stride[1] == 12, "unsqueeze 1");
  CHECK_ERR(lt_unsqueeze(v, t, 4), "unsqueeze: dim 4 out of range for a 4-d result");
  CHECK_ERR(lt_view(v, t, 2, NULL), "view: shape is NULL");
  CHECK_ERR(lt_permute(v, t, 3, NULL), "permute: dims is NULL");
  CHECK_ERR(lt_expand(e, col, 2, NULL), "expand: shape is NULL");
  CHECK(lt_is_contiguous(NULL) == 0 && lt_numel(NULL) == 0 && !lt_is_defined(NULL), "queries on NULL");
  lt_tensor *sq = lt_tensor_new();
  CHECK_OK(lt_squeeze(sq, v, 1));
  CHECK(has_shape(sq, 3, s) && lt_is_contiguous(sq), "squeeze 1");
  CHECK_ERR(lt_squeeze(sq, v, 2), "squeeze: dim 2 of shape [2,1,3,4] has size 3, not 1");
  lt_tensor *ones = new_empty(4, (int64_t[]){1, 3, 1, 1}, LT_F32);
  lt_tensor *scalar = new_empty(0, NULL, LT_F32);
  CHECK_OK(lt_squeeze(sq, scalar, -1));
  CHECK(sq->ndim == 0 && sq->storage == scalar->storage, "squeeze of a 0-d tensor");
  CHECK_ERR(lt_squeeze(sq, scalar, 3), "squeeze: dim 3 out of range for a 0-d tensor");
  lt_release(scalar);
  CHECK_OK(lt_squeeze_all(sq, ones));
  CHECK(has_shape(sq, 1, (int64_t[]){3}), "squeeze_all");
  /* an op may write its view into its own input */
  lt_tensor *self = iota(2, (int64_t[]){2, 5}, LT_F32);
  CHECK_OK(lt_transpose(self, self, 0, 1));
  CHECK(has_shape(self, 2, (int64_t[]){5, 2}) && check_at(self, 1) == 5, "transpose in place");
  /* contiguous */
  lt_tensor *tr = lt_tensor_new(), *c = lt_tensor_new();
  CHECK_OK(lt_transpose(tr, t, 1, 2));
  CHECK_OK(lt_contiguous(c, tr));
  CHECK(lt_is_contiguous(c) && c->storage != t->storage && has_shape(c, 3, (int64_t[]){2, 4, 3}), "contiguous copy");
  bool same = true;
  for (int64_t i = 0; i < 24; i++) same &= check_at(c, i) == check_at(tr, i);
  CHECK(same, "contiguous keeps the values");
  CHECK_OK(lt_contiguous(c, t));
  CHECK(c->storage == t->storage, "contiguous of a contiguous tensor is a view");
  CHECK_ERR(lt_contiguous(tr, tr), "contiguous: out must not be the input");
  lt_release(t), lt_release(v), lt_release(col), lt_release(e), lt_release(sq), lt_release(ones);
  lt_release(self), lt_release(tr), lt_release(c);
}

/* ---- lifetime and memory ---------------------------------------------------------------- */

static void test_refcounts_and_memory(void) {
  lt_memory_stats s0, s1, s2, s3;
  CHECK_OK(lt_memory_get_stats(LT_DEVICE_CPU, &s0));
  int64_t n = 1000; /* 4000 bytes: below the caching threshold, so counted exactly */
  lt_tensor *t = new_empty(1, &n, LT_F32), *v = lt_tensor_new();
  CHECK_OK(lt_memory_get_stats(LT_DEVICE_CPU, &s1));
  CHECK(s1.allocated - s0.allocated == 4000, "allocated rises by 4000: %lld", (long long)(s1.allocated - s0.allocated));
  CHECK(s1.num_allocs == s0.num_allocs + 1 && s1.peak >= s1.allocated, "num_allocs and peak");
  CHECK(lt_memory_cpu_counters()->allocated == s1.allocated, "the direct counters agree");
  lt_fill(t, 3);
  CHECK_OK(lt_narrow(v, t, 0, 10, 5));
  CHECK(t->storage->refcount == 2, "a view holds a reference to the storage: %d", t->storage->refcount);
  CHECK_OK(lt_release(t)); /* the view keeps the storage alive */
  CHECK_OK(lt_memory_get_stats(LT_DEVICE_CPU, &s2));
  CHECK(s2.allocated == s1.allocated && check_at(v, 4) == 3, "storage alive while a view holds it");
  CHECK_OK(lt_release(v));
  CHECK_OK(lt_memory_get_stats(LT_DEVICE_CPU, &s3));
  CHECK(s3.allocated == s0.allocated && s3.num_frees == s0.num_frees + 1, "released: allocated falls back");
  /* retain / release pairs */
  t = new_empty(1, &n, LT_F32);
  CHECK_OK(lt_retain(t));
  CHECK(t->refcount == 2, "retain");
  lt_release(t);
  CHECK(t->refcount == 1 && lt_is_defined(t), "release of one of two references");
  /* free_storage: t becomes undefined now, its views keep the bytes */
  v = lt_tensor_new();
  CHECK_OK(lt_select(v, t, 0, 7));
  CHECK_OK(lt_free_storage(t));
  CHECK(!lt_is_defined(t) && lt_numel(t) == 0 && lt_data_ptr(t) == NULL, "free_storage leaves t undefined");
  CHECK(lt_is_defined(v) && v->storage->refcount == 1, "the view still owns the storage");
  CHECK_ERR(lt_fill(t, 1), "fill: out is undefined");
  CHECK_OK(lt_free_storage(v));
  CHECK_OK(lt_memory_get_stats(LT_DEVICE_CPU, &s1));
  CHECK(s1.allocated == s0.allocated, "free_storage returns the bytes");
  CHECK_OK(lt_free_storage(t)); /* twice is fine */
  lt_release(t), lt_release(v);
  CHECK_OK(lt_release(NULL));
  /* peak, and the cache of large blocks */
  int64_t big = 1 << 20; /* 4 MiB of f32 */
  CHECK_OK(lt_memory_reset_peak(LT_DEVICE_CPU));
  CHECK_OK(lt_memory_get_stats(LT_DEVICE_CPU, &s0));
  t = new_empty(1, &big, LT_F32);
  CHECK_OK(lt_memory_get_stats(LT_DEVICE_CPU, &s1));
  CHECK(s1.allocated - s0.allocated == 4 << 20 && s1.peak == s1.allocated, "4 MiB allocated, peak follows");
  CHECK(s1.reserved >= s1.allocated, "reserved >= allocated");
  lt_release(t);
  CHECK_OK(lt_memory_get_stats(LT_DEVICE_CPU, &s2));
  CHECK(s2.allocated == s0.allocated && s2.peak == s1.peak, "peak stays after release");
  CHECK(s2.reserved == s1.reserved, "a large block is cached, still reserved");
  t = new_empty(1, &big, LT_F32);
  CHECK_OK(lt_memory_get_stats(LT_DEVICE_CPU, &s3));
  CHECK(s3.reserved == s1.reserved && s3.allocated == s1.allocated, "the cached block is reused");
  lt_release(t);
  CHECK_OK(lt_memory_empty_cache(LT_DEVICE_CPU));
  CHECK_OK(lt_memory_get_stats(LT_DEVICE_CPU, &s3));
  CHECK(s3.reserved == s3.allocated, "empty_cache hands cached blocks back: reserved %lld allocated %lld",
        (long long)s3.reserved, (long long)s3.allocated);
  CHECK_OK(lt_memory_reset_peak(LT_DEVICE_CPU));
  CHECK_OK(lt_memory_get_stats(LT_DEVICE_CPU, &s3));
  CHECK(s3.peak == s3.allocated, "reset_peak");
  CHECK_OK(lt_memory_collected(LT_DEVICE_CPU));
  CHECK_OK(lt_memory_get_stats(LT_DEVICE_CPU, &s3));
  CHECK(s3.since_collect == 0, "memory_collected resets since_collect");
  CHECK_ERR(lt_memory_get_stats(-7, &s3), "invalid device -7");
  /* CPU storage is 64-byte aligned */
  t = new_empty(1, &n, LT_U8);
  CHECK(((uintptr_t)lt_data_ptr(t) & 63) == 0, "64-byte alignment");
  lt_release(t);
}

/* ---- element access, output convention, bad input ----------------------------------------- */

static void test_access_and_prepare_out(void) {
  int64_t s[2] = {2, 3};
  lt_tensor *t = iota(2, s, LT_F64), *one = new_empty(0, NULL, LT_BF16);
  double v = 0;
  CHECK_ERR(lt_item(t, &v), "item: tensor of shape [2,3] has 6 elements, expected exactly 1");
  CHECK_OK(lt_fill(one, 1.5));
  CHECK(lt_item(one, &v) == 0 && v == 1.5, "item of a 0-d tensor");
  CHECK_ERR(lt_get_at(t, (int64_t[]){2, 0}, &v), "get: index 2 out of range for dim 0 of shape [2,3]");
  CHECK_ERR(lt_set_at(t, (int64_t[]){0, -1}, 1), "set: index -1 out of range for dim 1");
  CHECK_OK(lt_set_at(t, (int64_t[]){1, 2}, -7.25));
  CHECK(lt_get_at(t, (int64_t[]){1, 2}, &v) == 0 && v == -7.25, "set_at then get_at");
  CHECK_ERR(lt_get_at(t, NULL, &v), "get: index is NULL");
  lt_tensor *und = lt_tensor_new();
  CHECK_ERR(lt_item(und, &v), "item: tensor is undefined");
  CHECK_ERR(lt_get_at(NULL, s, &v), "get: tensor is NULL");
  /* lt_prepare_out: undefined out is allocated; a matching one is kept; others refused */
  lt_tensor *out = lt_tensor_new();
  CHECK_OK(lt_prepare_out("op", out, 2, s, LT_F32, LT_DEVICE_CPU));
  CHECK(lt_is_defined(out) && has_shape(out, 2, s) && out->dtype == LT_F32 && lt_is_contiguous(out),
        "undefined out is allocated");
  lt_storage *st = out->storage;
  CHECK_OK(lt_prepare_out("op", out, 2, s, LT_F32, LT_DEVICE_CPU));
  CHECK(out->storage == st, "a matching out is kept");
  CHECK_ERR(lt_prepare_out("op", out, 2, (int64_t[]){3, 2}, LT_F32, LT_DEVICE_CPU),
            "op: out is [2,3] f32 cpu, expected [3,2] f32 cpu");
  CHECK_ERR(lt_prepare_out("op", out, 1, (int64_t[]){6}, LT_F32, LT_DEVICE_CPU), "expected [6] f32 cpu");
  CHECK_ERR(lt_prepare_out("op", out, 2, s, LT_F64, LT_DEVICE_CPU), "op: out is [2,3] f32 cpu, expected [2,3] f64");
  CHECK_ERR(lt_prepare_out("op", out, 2, s, LT_F32, 0), "expected [2,3] f32 cuda:0");
  CHECK_ERR(lt_prepare_out("op", NULL, 2, s, LT_F32, LT_DEVICE_CPU), "op: out is NULL");
  lt_tensor *tr = lt_tensor_new();
  CHECK_OK(lt_transpose(tr, t, 0, 1));
  CHECK_OK(lt_prepare_out("op", tr, 2, (int64_t[]){3, 2}, LT_F64, LT_DEVICE_CPU)); /* non-contiguous is fine */
  lt_tensor *fresh = lt_tensor_new();
  CHECK_ERR(lt_prepare_out("op", fresh, 2, (int64_t[]){-1, 2}, LT_F32, LT_DEVICE_CPU), "op: empty: negative size");
  CHECK(!lt_is_defined(fresh), "a failed prepare leaves out undefined");
  CHECK_OK(lt_prepare_out_like("op", fresh, t, LT_I64));
  CHECK(has_shape(fresh, 2, s) && fresh->dtype == LT_I64, "prepare_out_like");
  /* lt_empty and lt_set */
  CHECK_ERR(lt_empty(und, 2, (int64_t[]){2, -3}, LT_F32, LT_DEVICE_CPU), "empty: negative size in shape [2,-3]");
  CHECK_ERR(lt_empty(und, 9, (int64_t[]){1, 1, 1, 1, 1, 1, 1, 1, 1}, LT_F32, LT_DEVICE_CPU),
            "empty: 9 dims requested, at most 8 supported");
  CHECK_ERR(lt_empty(und, -1, NULL, LT_F32, LT_DEVICE_CPU), "dims requested");
  CHECK_ERR(lt_empty(und, 1, s, 42, LT_DEVICE_CPU), "empty: unknown dtype 42");
  CHECK_ERR(lt_empty(und, 1, s, LT_F32, 3), "empty: device cuda:3 is not available");
  CHECK_ERR(lt_empty(und, 2, (int64_t[]){1ll << 40, 1ll << 40}, LT_F32, LT_DEVICE_CPU), "too large");
  CHECK_ERR(lt_empty(NULL, 1, s, LT_F32, LT_DEVICE_CPU), "empty: out is NULL");
  CHECK(!lt_is_defined(und), "failed lt_empty leaves out undefined");
  CHECK_OK(lt_set(und, t));
  CHECK(und->storage == t->storage && t->storage->refcount == 3 && has_shape(und, 2, s), "lt_set shares");
  CHECK_ERR(lt_set(und, fresh->storage ? NULL : t), "set: source is NULL");
  lt_release(t), lt_release(one), lt_release(und), lt_release(out), lt_release(tr), lt_release(fresh);
  /* names and small queries */
  int dt = -1;
  CHECK(lt_dtype_from_name("bfloat16", &dt) == 0 && dt == LT_BF16, "dtype alias");
  CHECK_ERR(lt_dtype_from_name("f8", &dt), "unknown dtype 'f8'");
  CHECK(lt_dtype_size(LT_BF16) == 2 && lt_dtype_size(99) == 0 && strcmp(lt_dtype_name(LT_I64), "i64") == 0,
        "dtype sizes and names");
}

int main(void) {
  test_lua_slot_kept();
  test_view_shares_storage();
  test_view_ops();
  test_refcounts_and_memory();
  test_access_and_prepare_out();
  return check_summary();
}
