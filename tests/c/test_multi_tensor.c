/* test_multi_tensor.c — the multi-tensor optimizer ops on the CPU: AdamW over many tensors of
 * odd sizes (0 and 1 elements, chunk edges, non-contiguous, every dtype, master weights) equals
 * per-tensor lt_adamw_step bit for bit and follows a naive double loop; the sum of squares
 * against a double loop and independent of the thread count; the scale bit for bit as
 * lt_binary_scalar's mul; clipping's coefficient; bad input. */
#include "check.h"

enum { NT = 12 };
/* numel of each tensor: empty, one, odd, chunk edges (16384), large enough for the OpenMP path */
static const int64_t sizes[NT] = {0, 1, 7, 16384, 16385, 70001, 15, 33, 1, 3000, 0, 257};

typedef struct entry {
  int pdtype, gdtype, master;
} entry;
static const entry kinds[NT] = {{LT_F32, LT_F32, 0},  {LT_F64, LT_F64, 0}, {LT_BF16, LT_BF16, 0}, {LT_F16, LT_F32, 0},
                                {LT_BF16, LT_F32, 1}, {LT_F32, LT_F32, 0}, {LT_F16, LT_F16, 1},   {LT_BF16, LT_BF16, 1},
                                {LT_F16, LT_F32, 1},  {LT_F64, LT_F64, 0}, {LT_BF16, LT_F32, 1},  {LT_F32, LT_F32, 0}};

/* A tensor of n elements in [lo, hi): 1-D, or a non-contiguous (rows, cols) view when strided. */
static lt_tensor *make(int64_t n, int dtype, bool strided, double lo, double hi) {
  int64_t rows = n % 3 == 0 && n > 0 ? 3 : 1, shape[2] = {rows, n / rows};
  lt_tensor *t = check_random(strided ? 2 : 1, strided ? shape : &n, dtype, lo, hi);
  if (!strided) return t;
  lt_tensor *nc = check_noncontig(t);
  lt_release(t);
  return nc;
}

static lt_tensor *clone(const lt_tensor *t, int dtype) {
  lt_tensor *c = lt_tensor_new();
  lt_empty(c, t->ndim, t->shape, dtype, LT_DEVICE_CPU);
  lt_copy(c, t);
  return c;
}

/* a and b hold the same bits element by element. */
static bool same_bits(const lt_tensor *a, const lt_tensor *b) {
  if (lt_numel(a) != lt_numel(b) || a->dtype != b->dtype) return false;
  int size = lt_dtype_size(a->dtype);
  for (int64_t i = 0, n = lt_numel(a); i < n; i++) {
    const char *pa = (const char *)lt_data_ptr(a) + lt_offset_of(i, a->ndim, a->shape, a->stride) * size;
    const char *pb = (const char *)lt_data_ptr(b) + lt_offset_of(i, b->ndim, b->shape, b->stride) * size;
    if (memcmp(pa, pb, (size_t)size)) return false;
  }
  return true;
}

static const double LR = 3e-2, B1 = 0.9, B2 = 0.95, EPS = 1e-6, WD = 0.1;

static void test_adamw_multi(void) {
  lt_tensor *p[NT], *m[NT], *v[NT], *master[NT], *p2[NT], *m2[NT], *v2[NT], *master2[NT];
  for (int i = 0; i < NT; i++) {
    entry k = kinds[i];
    int sd = k.pdtype == LT_F64 ? LT_F64 : LT_F32;
    p[i] = make(sizes[i], k.pdtype, i % 3 == 2, -1, 1);
    m[i] = make(sizes[i], sd, i % 4 == 1, -0.1, 0.1);
    v[i] = make(sizes[i], sd, false, 0, 0.01);
    master[i] = k.master ? clone(p[i], LT_F32) : NULL;
    p2[i] = clone(p[i], k.pdtype), m2[i] = clone(m[i], sd), v2[i] = clone(v[i], sd);
    master2[i] = k.master ? clone(p[i], LT_F32) : NULL;
  }
  bool bitwise = true, naive = true;
  for (int64_t step = 1; step <= 3; step++) {
    lt_tensor *g[NT];
    double *before[NT][4]; /* master or param, m, v, grad in double, before the step */
    for (int i = 0; i < NT; i++) {
      g[i] = make(sizes[i], kinds[i].gdtype, i % 2 == 1, -1, 1);
      const lt_tensor *src[4] = {master[i] ? master[i] : p[i], m[i], v[i], g[i]};
      for (int k = 0; k < 4; k++) {
        before[i][k] = malloc((size_t)(sizes[i] + 1) * sizeof(double));
        for (int64_t e = 0; e < sizes[i]; e++) before[i][k][e] = check_at(src[k], e);
      }
    }
    CHECK_OK(lt_adamw_step_multi(NT, p, g, m, v, master, LR, B1, B2, EPS, WD, step));
    for (int i = 0; i < NT; i++) { /* the per-tensor path: f32 grad for a master, the master rounded into p */
      if (master2[i]) {
        lt_tensor *g32 = clone(g[i], LT_F32);
        CHECK_OK(lt_adamw_step(master2[i], g32, m2[i], v2[i], LR, B1, B2, EPS, WD, step));
        CHECK_OK(lt_copy(p2[i], master2[i]));
        lt_release(g32);
      } else {
        CHECK_OK(lt_adamw_step(p2[i], g[i], m2[i], v2[i], LR, B1, B2, EPS, WD, step));
      }
      bool same = same_bits(p[i], p2[i]) && same_bits(m[i], m2[i]) && same_bits(v[i], v2[i]) &&
                  (!master[i] || same_bits(master[i], master2[i]));
      CHECK(same, "adamw_multi: tensor %d (%s, %lld elements) differs from lt_adamw_step at step %lld", i,
            lt_dtype_name(kinds[i].pdtype), (long long)sizes[i], (long long)step);
      bitwise &= same;
      /* torch's AdamW in double from the values before the step */
      double bc1 = 1 - pow(B1, (double)step), bc2 = 1 - pow(B2, (double)step);
      double tol = kinds[i].pdtype == LT_F64 ? 1e-12 : 1e-5;
      for (int64_t e = 0; e < sizes[i]; e++) {
        double pw = before[i][0][e], gw = before[i][3][e];
        double mw = B1 * before[i][1][e] + (1 - B1) * gw, vw = B2 * before[i][2][e] + (1 - B2) * gw * gw;
        pw = pw * (1 - LR * WD) - LR * (mw / bc1) / (sqrt(vw / bc2) + EPS);
        double pgot = check_at(master[i] ? master[i] : p[i], e);
        bool ok = check_close(check_at(m[i], e), mw, tol, 1e-7) && check_close(check_at(v[i], e), vw, tol, 1e-9);
        ok &= kinds[i].pdtype == LT_BF16 || kinds[i].pdtype == LT_F16 ? fabs(pgot - pw) <= 1e-2 + 1e-2 * fabs(pw)
                                                                      : check_close(pgot, pw, tol, 1e-6);
        if (!ok && naive) {
          CHECK(0, "adamw_multi: tensor %d element %lld: param %.9g want %.9g (m %.9g want %.9g)", i, (long long)e,
                pgot, pw, check_at(m[i], e), mw);
          naive = false;
        }
      }
      for (int k = 0; k < 4; k++) free(before[i][k]);
      lt_release(g[i]);
    }
  }
  CHECK(bitwise, "adamw_multi equals per-tensor lt_adamw_step bit for bit");
  CHECK(naive, "adamw_multi follows the double reference");
  /* a master's param is the master rounded */
  for (int i = 0; i < NT; i++)
    if (master[i]) {
      lt_tensor *r = clone(master[i], kinds[i].pdtype);
      CHECK(same_bits(r, p[i]), "adamw_multi: params[%d] is its master rounded to %s", i,
            lt_dtype_name(kinds[i].pdtype));
      lt_release(r);
    }
  CHECK_OK(lt_adamw_step_multi(0, NULL, NULL, NULL, NULL, NULL, LR, B1, B2, EPS, WD, 1));
  for (int i = 0; i < NT; i++) {
    lt_release(p[i]), lt_release(m[i]), lt_release(v[i]), lt_release(master[i]);
    lt_release(p2[i]), lt_release(m2[i]), lt_release(v2[i]), lt_release(master2[i]);
  }
}

static void test_sumsq_scale(void) {
  lt_tensor *t[NT];
  double want = 0;
  for (int i = 0; i < NT; i++) {
    t[i] = make(sizes[i], kinds[i].pdtype, i % 2 == 0, -2, 2);
    for (int64_t e = 0; e < sizes[i]; e++) want += check_at(t[i], e) * check_at(t[i], e);
  }
  lt_tensor *const *ct = t;
  lt_tensor *out = lt_tensor_new(), *out64 = lt_tensor_new(), *one = lt_tensor_new();
  int64_t shape1[1] = {1};
  CHECK_OK(lt_multi_tensor_sumsq(out, NT, ct));
  CHECK(out->ndim == 0 && out->dtype == LT_F32 && out->device == LT_DEVICE_CPU, "sumsq allocates a 0-dim f32");
  CHECK(check_close(check_at(out, 0), want, 1e-6, 0), "sumsq f32: %.9g want %.9g", check_at(out, 0), want);
  lt_empty(out64, 1, shape1, LT_F64, LT_DEVICE_CPU);
  CHECK_OK(lt_multi_tensor_sumsq(out64, NT, ct));
  double two_threads = check_at(out64, 0);
  CHECK(check_close(two_threads, want, 1e-13, 0), "sumsq f64: %.17g want %.17g", two_threads, want);
  int threads = lt_get_num_threads();
  lt_set_num_threads(1);
  CHECK_OK(lt_multi_tensor_sumsq(out64, NT, ct));
  lt_set_num_threads(threads);
  CHECK(check_at(out64, 0) == two_threads, "sumsq does not depend on the thread count");
  CHECK_OK(lt_multi_tensor_sumsq(out64, 0, NULL));
  CHECK(check_at(out64, 0) == 0, "sumsq of no tensors is 0");
  /* scale: as lt_binary_scalar's mul, bit for bit, through an f64 and an f32 scale */
  lt_tensor *s64 = lt_tensor_new(), *s32 = lt_tensor_new();
  lt_empty(s64, 0, NULL, LT_F64, LT_DEVICE_CPU), lt_empty(s32, 1, shape1, LT_F32, LT_DEVICE_CPU);
  lt_fill(s64, 0.3711), lt_fill(s32, 1.7);
  lt_tensor *ref[NT];
  for (int i = 0; i < NT; i++) {
    ref[i] = clone(t[i], t[i]->dtype);
    lt_binary_scalar(ref[i], ref[i], 0.3711, LT_MUL, 0);
    lt_binary_scalar(ref[i], ref[i], (float)1.7, LT_MUL, 0);
  }
  CHECK_OK(lt_multi_tensor_scale(NT, t, s64));
  CHECK_OK(lt_multi_tensor_scale(NT, t, s32));
  bool same = true;
  for (int i = 0; i < NT; i++) same &= same_bits(t[i], ref[i]);
  CHECK(same, "multi_tensor_scale equals lt_binary_scalar's mul bit for bit");
  /* clipping's coefficient */
  static const double cases[][3] = {{4, 1, 1 / (2 + 1e-6)}, {4, 10, 1}, {0, 1, 1}, {NAN, 1, 1},
                                    {INFINITY, 1, 1},       {1e4, 0, 0}};
  for (int c = 0; c < 6; c++) {
    lt_fill(s64, cases[c][0]);
    CHECK_OK(lt_clip_coef(one, s64, cases[c][1]));
    CHECK(check_at(one, 0) == (float)cases[c][2], "clip_coef(%g, %g) = %g want %g", cases[c][0], cases[c][1],
          check_at(one, 0), cases[c][2]);
    CHECK_OK(lt_clip_coef(out64, s64, cases[c][1]));
    CHECK(check_at(out64, 0) == cases[c][2], "clip_coef f64 (%g, %g)", cases[c][0], cases[c][1]);
  }
  for (int i = 0; i < NT; i++) lt_release(t[i]), lt_release(ref[i]);
  lt_release(out), lt_release(out64), lt_release(one), lt_release(s64), lt_release(s32);
}

static void test_bad_inputs(void) {
  int64_t s8[1] = {8}, s7[1] = {7}, s2[1] = {2};
  lt_tensor *p[2], *g[2], *m[2], *v[2];
  for (int i = 0; i < 2; i++) {
    p[i] = check_random(1, s8, LT_F32, -1, 1), g[i] = check_random(1, s8, LT_F32, -1, 1);
    m[i] = check_random(1, s8, LT_F32, 0, 1), v[i] = check_random(1, s8, LT_F32, 0, 1);
  }
  lt_tensor *g7 = check_random(1, s7, LT_F32, -1, 1), *m64 = check_random(1, s8, LT_F64, 0, 1);
  lt_tensor *pb = check_random(1, s8, LT_BF16, -1, 1), *mb = check_random(1, s8, LT_BF16, -1, 1);
  lt_tensor *pi = check_random(1, s8, LT_I32, 0, 3), *two = check_random(1, s2, LT_F32, 0, 1);
  lt_tensor *undef = lt_tensor_new(), *out = lt_tensor_new();
  double before[8];
  for (int e = 0; e < 8; e++) before[e] = check_at(p[0], e);
  lt_tensor *const *cg = g;
#define MULTI(params, grads, ms, vs, masters, step)                                                                    \
  lt_adamw_step_multi(2, params, grads, ms, vs, masters, 1e-3, 0.9, 0.999, 1e-8, 0.1, step)
  CHECK_ERR(lt_adamw_step_multi(-1, p, cg, m, v, NULL, 1e-3, 0.9, 0.999, 1e-8, 0.1, 1), "n must be >= 0, got -1");
  CHECK_ERR(MULTI(NULL, cg, m, v, NULL, 1), "adamw_multi: params, grads, m and v must be arrays of 2 tensors");
  CHECK_ERR(MULTI(p, cg, m, v, NULL, 0), "adamw_multi: step must be >= 1");
  lt_tensor *pp[2] = {p[0], NULL}, *gg[2] = {g[0], g7}, *mm[2] = {m[0], m64}, *vv[2] = {v[0], m[1]};
  lt_tensor *ms[2] = {NULL, pb}, *pbs[2] = {p[0], pb}, *mbs[2] = {NULL, mb}, *gu[2] = {g[0], undef};
  CHECK_ERR(MULTI(pp, cg, m, v, NULL, 1), "adamw_multi: params[1] is NULL");
  CHECK_ERR(MULTI(p, gg, m, v, NULL, 1), "grads[1] is [7] f32 cpu, expected 8 elements");
  CHECK_ERR(MULTI(p, gu, m, v, NULL, 1), "adamw_multi: grads[1] is undefined");
  CHECK_ERR(MULTI(p, cg, mm, v, NULL, 1), "m[1] is [8] f64 cpu, expected f32");
  CHECK_ERR(MULTI(p, cg, m, vv, NULL, 1), "adamw_multi: m[1] and v[1] must be different tensors");
  CHECK_ERR(MULTI(p, cg, m, v, ms, 1), "masters[1] is given for params[1] [8] f32 cpu: master weights are for bf16");
  CHECK_ERR(MULTI(pbs, cg, m, v, mbs, 1), "masters[1] is [8] bf16 cpu, expected f32");
  pp[1] = pi;
  CHECK_ERR(MULTI(pp, cg, m, v, NULL, 1), "adamw_multi: params[1] is i32, expected a floating dtype");
  g[1]->device = 15; /* claims cuda:15, which no machine here has: refused before any kernel */
  CHECK_ERR(MULTI(p, cg, m, v, NULL, 1), "grads[1] is [8] f32 cuda:15, expected it on the device of param");
  g[1]->device = LT_DEVICE_CPU, p[1]->device = 15;
  CHECK_ERR(MULTI(p, cg, m, v, NULL, 1), "params[1] is [8] f32 cuda:15, expected it on cpu as params[0]");
  p[1]->device = LT_DEVICE_CPU;
  /* every tensor claims cuda:15 while its storage is on the CPU: refused before any kernel */
  bool cuda = strstr(lt_build_info(), "cuda: built") != NULL;
  lt_tensor *s1 = check_random(1, (int64_t[]){1}, LT_F32, 0, 1);
  for (int i = 0; i < 2; i++) p[i]->device = g[i]->device = m[i]->device = v[i]->device = s1->device = 15;
  CHECK_ERR(MULTI(p, cg, m, v, NULL, 1), cuda ? "grads[0] on cuda:15 has its storage on cpu" : "built without CUDA");
  CHECK_ERR(lt_multi_tensor_sumsq(out, 2, p), cuda ? "tensors[0] on cuda:15 has its storage on cpu" : "without CUDA");
  CHECK_ERR(lt_multi_tensor_scale(2, p, s1), cuda ? "tensors[0] on cuda:15 has its storage on cpu" : "without CUDA");
  for (int i = 0; i < 2; i++) p[i]->device = g[i]->device = m[i]->device = v[i]->device = LT_DEVICE_CPU;
  lt_release(s1);
  bool untouched = true;
  for (int e = 0; e < 8; e++) untouched &= check_at(p[0], e) == before[e];
  CHECK(untouched, "a failed multi step touches no tensor, not even the valid ones");
  /* sum of squares, scale, coefficient */
  lt_tensor *bad[2] = {p[0], NULL}, *ints[2] = {p[0], pi};
  CHECK_ERR(lt_multi_tensor_sumsq(out, 1, NULL), "multi_tensor_sumsq: tensors is NULL");
  CHECK_ERR(lt_multi_tensor_sumsq(out, 2, bad), "multi_tensor_sumsq: tensors[1] is NULL");
  CHECK_ERR(lt_multi_tensor_sumsq(out, 2, ints), "tensors[1] is [8] i32 cpu, expected f32");
  CHECK_ERR(lt_multi_tensor_sumsq(two, 2, cg), "out is [2] f32 cpu, expected one f32 or f64 element");
  CHECK_ERR(lt_multi_tensor_sumsq(NULL, 2, cg), "multi_tensor_sumsq: out is NULL");
  g[1]->device = 15;
  CHECK_ERR(lt_multi_tensor_sumsq(out, 2, cg), "tensors[1] is [8] f32 cuda:15, expected it on cpu as tensors[0]");
  g[1]->device = LT_DEVICE_CPU;
  CHECK_ERR(lt_multi_tensor_scale(2, g, NULL), "multi_tensor_scale: scale is NULL");
  CHECK_ERR(lt_multi_tensor_scale(2, g, two), "scale is [2] f32 cpu, expected one f32 or f64 element");
  CHECK_ERR(lt_multi_tensor_scale(2, ints, p[0]), "expected one f32 or f64 element");
  CHECK_ERR(lt_clip_coef(out, two, 1.0), "clip_coef: sumsq is [2] f32 cpu, expected one f32 or f64 element");
  CHECK_ERR(lt_clip_coef(out, undef, 1.0), "clip_coef: sumsq is undefined");
  lt_tensor *one = lt_tensor_new();
  CHECK_OK(lt_multi_tensor_sumsq(one, 2, cg));
  CHECK_ERR(lt_clip_coef(out, one, -1), "clip_coef: max_norm must be >= 0, got -1");
  CHECK_ERR(lt_clip_coef(two, one, 1), "clip_coef: coef is [2] f32 cpu");
  lt_tensor *sc = lt_tensor_new();
  lt_empty(sc, 0, NULL, LT_F32, LT_DEVICE_CPU);
  lt_fill(sc, 2);
  CHECK_ERR(lt_multi_tensor_scale(2, ints, sc), "multi_tensor_scale: tensors[1] is [8] i32 cpu");
  for (int e = 0; e < 8; e++) untouched &= check_at(p[0], e) == before[e];
  CHECK(untouched, "a failed scale touches no tensor");
  for (int i = 0; i < 2; i++) lt_release(p[i]), lt_release(g[i]), lt_release(m[i]), lt_release(v[i]);
  lt_release(g7), lt_release(m64), lt_release(pb), lt_release(mb), lt_release(pi), lt_release(two);
  lt_release(undef), lt_release(out), lt_release(one), lt_release(sc);
}

int main(void) {
  test_adamw_multi();
  test_sumsq_scale();
  test_bad_inputs();
  return check_summary();
}
