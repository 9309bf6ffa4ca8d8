/* rope.c — rotary position embedding, "rotate half" convention (Hugging Face Llama).
 *
 * x is (B, T, H, D), D even, half = D / 2. For i < half, with p the position of (b, t):
 *   freq_i = pow(theta, -(2 i) / D), angle = p * freq_i      (both in double)
 *   out[i]        = a * (x[i] * cos(angle) - x[i + half] * sin(angle))
 *   out[i + half] = a * (x[i + half] * cos(angle) + x[i] * sin(angle))
 * with a = 1 (lt_rope). lt_rope_freq takes the frequencies from the caller instead (Hugging Face's
 * inv_freq of the rope types linear, dynamic, llama3, yarn, longrope, computed in double) and a
 * scale a (their attention_scaling), folded into cos and sin: a * cos, a * sin, in double.
 * inverse != 0 rotates by -angle: the exact backward (a rotation being orthogonal, the transpose
 * of a * R(angle) is a * R(-angle)).
 * Precision: angles, cos and sin are always computed in double (positions stay exact up to 2^53
 * and large positions keep their phase); f64 then rotates in double, while f32, bf16 and f16 round
 * cos and sin to f32 and rotate in f32 (bf16/f16 rows are converted to f32 and rounded back).
 * The CPU row (ops/rope_cpu.c) and the CUDA kernel (kernels/rope.cu) take one plan (kernels/rope.h)
 * with these frequencies.
 */
#include "ops/rope.h"
#include "core/internal.h"
#include "ops/backend.h"
#include <stdlib.h>

static int check_positions(const lt_tensor *pos, const lt_tensor *x) {
  if (!pos) return 0;
  char a[LT_DESC_STR], b[LT_DESC_STR];
  LT_TRY(lt_check_defined("rope", "positions", pos));
  if (pos->dtype != LT_I32 && pos->dtype != LT_I64)
    return lt_errorf("rope: positions must be i32 or i64, got %s", lt_desc(a, pos));
  if (pos->device != x->device) return lt_check_same_device("rope", pos, x);
  bool ok = (pos->ndim == 1 && pos->shape[0] == x->shape[1]) ||
            (pos->ndim == 2 && pos->shape[0] == x->shape[0] && pos->shape[1] == x->shape[1]);
  if (!ok) return lt_errorf("rope: positions %s must be (T) or (B, T) for x %s", lt_desc(a, pos), lt_desc(b, x));
  return 0;
}

/* The checks of x and positions, then out = x rotated by the D / 2 frequencies freq (host doubles). */
static int rope_run(lt_tensor *out, const lt_tensor *x, const lt_tensor *positions, const double *freq, double scale,
                    int inverse) {
  LT_TRY(check_positions(positions, x));
  const lt_backend *be = lt_backend_for("rope", x->device);
  if (!be) return -1;
  LT_TRY(lt_prepare_out_like("rope", out, x, x->dtype));
  if (lt_numel(x) == 0) return 0;
  lt_rope_plan p = {.device = x->device,
                    .dtype = x->dtype,
                    .B = x->shape[0],
                    .T = x->shape[1],
                    .H = x->shape[2],
                    .D = x->shape[3],
                    .x = lt_data_ptr(x),
                    .out = lt_data_ptr(out),
                    .pos = positions ? lt_data_ptr(positions) : NULL,
                    .pdtype = positions ? positions->dtype : LT_I64,
                    .per_batch = positions && positions->ndim == 2,
                    .freq = freq,
                    .sign = inverse ? -1.0 : 1.0,
                    .scale = scale};
  for (int d = 0; d < 4; d++) p.xs[d] = x->stride[d], p.os[d] = out->stride[d];
  if (positions) p.ps[0] = positions->stride[0], p.ps[1] = positions->ndim == 2 ? positions->stride[1] : 0;
  return be->rope(&p);
}

static int check_x(const lt_tensor *x) {
  char a[LT_DESC_STR];
  LT_TRY(lt_check_defined("rope", "x", x));
  if (x->ndim != 4 || !lt_dtype_is_float(x->dtype) || x->shape[3] % 2 != 0)
    return lt_errorf("rope: x must be (B, T, H, D) with D even and a floating dtype, got %s", lt_desc(a, x));
  return 0;
}

int lt_rope(lt_tensor *out, const lt_tensor *x, const lt_tensor *positions, double theta, int inverse) {
  LT_TRY(check_x(x));
  if (!(theta > 0) || !isfinite(theta)) return lt_errorf("rope: theta must be positive and finite, got %g", theta);
  const int64_t D = x->shape[3], half = D / 2;
  double *freq = malloc((size_t)(half > 0 ? half : 1) * sizeof(double));
  if (!freq) return lt_errorf("rope: out of host memory");
  for (int64_t i = 0; i < half; i++) freq[i] = pow(theta, -(double)(2 * i) / (double)D);
  int rc = rope_run(out, x, positions, freq, 1.0, inverse);
  free(freq);
  return rc;
}

int lt_rope_freq(lt_tensor *out, const lt_tensor *x, const lt_tensor *positions, const lt_tensor *inv_freq,
                 double scale, int inverse) {
  char a[LT_DESC_STR], b[LT_DESC_STR];
  LT_TRY(check_x(x));
  LT_TRY(lt_check_defined("rope", "inv_freq", inv_freq));
  const int64_t half = x->shape[3] / 2;
  if (inv_freq->ndim != 1 || inv_freq->shape[0] != half || inv_freq->dtype != LT_F64 ||
      inv_freq->device != LT_DEVICE_CPU)
    return lt_errorf("rope: inv_freq must be (D / 2) = (%lld) f64 on the cpu for x %s, got %s", (long long)half,
                     lt_desc(a, x), lt_desc(b, inv_freq));
  if (!(scale > 0) || !isfinite(scale)) return lt_errorf("rope: scale must be positive and finite, got %g", scale);
  double *freq = malloc((size_t)(half > 0 ? half : 1) * sizeof(double));
  if (!freq) return lt_errorf("rope: out of host memory");
  const double *src = lt_data_ptr(inv_freq);
  for (int64_t i = 0; i < half; i++) {
    freq[i] = src[i * inv_freq->stride[0]];
    if (!isfinite(freq[i])) {
      free(freq);
      return lt_errorf("rope: inv_freq[%lld] must be finite, got %g", (long long)i, src[i * inv_freq->stride[0]]);
    }
  }
  int rc = rope_run(out, x, positions, freq, scale, inverse);
  free(freq);
  return rc;
}
