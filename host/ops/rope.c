/* rope.c — rotary position embedding, "rotate half" convention (Hugging Face Llama).
 *
 * x is (B, T, H, D), D even, half = D / 2. For i < half, with p the position of (b, t):
 *   freq_i = pow(theta, -(2 i) / D), angle = p * freq_i      (both in double)
 *   out[i]        = x[i] * cos(angle) - x[i + half] * sin(angle)
 *   out[i + half] = x[i + half] * cos(angle) + x[i] * sin(angle)
 * inverse != 0 rotates by -angle: the exact backward, a rotation being orthogonal.
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

int lt_rope(lt_tensor *out, const lt_tensor *x, const lt_tensor *positions, double theta, int inverse) {
  char a[LT_DESC_STR];
  LT_TRY(lt_check_defined("rope", "x", x));
  if (x->ndim != 4 || !lt_dtype_is_float(x->dtype) || x->shape[3] % 2 != 0)
    return lt_errorf("rope: x must be (B, T, H, D) with D even and a floating dtype, got %s", lt_desc(a, x));
  if (!(theta > 0) || !isfinite(theta)) return lt_errorf("rope: theta must be positive and finite, got %g", theta);
  LT_TRY(check_positions(positions, x));
  const lt_backend *be = lt_backend_for("rope", x->device);
  if (!be) return -1;
  LT_TRY(lt_prepare_out_like("rope", out, x, x->dtype));
  if (lt_numel(x) == 0) return 0;
  const int64_t D = x->shape[3], half = D / 2;
  double *freq = malloc((size_t)(half > 0 ? half : 1) * sizeof(double));
  if (!freq) return lt_errorf("rope: out of host memory");
  for (int64_t i = 0; i < half; i++) freq[i] = pow(theta, -(double)(2 * i) / (double)D);
  lt_rope_plan p = {.device = x->device,
                    .dtype = x->dtype,
                    .B = x->shape[0],
                    .T = x->shape[1],
                    .H = x->shape[2],
                    .D = D,
                    .x = lt_data_ptr(x),
                    .out = lt_data_ptr(out),
                    .pos = positions ? lt_data_ptr(positions) : NULL,
                    .pdtype = positions ? positions->dtype : LT_I64,
                    .per_batch = positions && positions->ndim == 2,
                    .freq = freq,
                    .sign = inverse ? -1.0 : 1.0};
  for (int d = 0; d < 4; d++) p.xs[d] = x->stride[d], p.os[d] = out->stride[d];
  if (positions) p.ps[0] = positions->stride[0], p.ps[1] = positions->ndim == 2 ? positions->stride[1] : 0;
  int rc = be->rope(&p);
  free(freq);
  return rc;
}
