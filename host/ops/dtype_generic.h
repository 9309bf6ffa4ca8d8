/* dtype_generic.h — the one way the ops write a loop once for several element types: a `##`
 * generator, a macro that defines one function per type, invoked once per type.
 *
 *   // y = x / sqrt(mean(x^2) + eps) over one row of n: float and double alike
 *   #define DEFINE_ROW_RMS(T, S, SQRT, SIMD)                                   \
 *     static void row_rms_##S(T *y, const T *x, int64_t n, T eps) {            \
 *       T ss = 0;                                                              \
 *       SIMD(reduction(+ : ss))                                                \
 *       for (int64_t j = 0; j < n; j++) ss += x[j] * x[j];                     \
 *       T r = (T)1 / SQRT(ss / (T)n + eps);                                    \
 *       for (int64_t j = 0; j < n; j++) y[j] = x[j] * r;                       \
 *     }
 *   DEFINE_ROW_RMS(float, f32, sqrtf, LT_SIMD)
 *   DEFINE_ROW_RMS(double, f64, sqrt, LT_SIMD)
 *
 *   ... row_rms_f32(y, x, n, 1e-5f) ...
 *
 * The rules that keep every instance readable and its results exact:
 * - The generator is DEFINE_<WHAT>(T, S, ...): T the element (or compute) type, S the suffix its
 *   functions get (f32, f64, i32, ...), then whatever differs between the types: math functions
 *   (SQRT, EXP, LOG, FMA: sqrtf or sqrt, ...), a BLAS call, a loop pragma. Nothing else varies.
 * - Constants are written (T)1, (T)0.5, casts (T)n: the float instance does float arithmetic, as
 *   a hand-written float twin with 1.0f would, and the double one double arithmetic.
 * - A vectorising pragma inside a generator is SIMD(clauses), SIMD being LT_SIMD (#pragma omp simd
 *   clauses) or LT_IN_ORDER (nothing: the loop keeps its element order, for a type whose results
 *   are the reference). A pragma every instance takes may be written LT_SIMD(...) directly.
 * - Comments in the body are block comments (a // comment would swallow the continuation lines).
 * - The instances follow the generator at once; callers name them (row_rms_f32) or pick one by
 *   dtype in a switch. 16-bit types go through f32 rows (lt_load_row_f32 / lt_store_row_f32).
 * Examples in the ops: ops/layer_norm_cpu.c (rows), ops/attention_cpu.c (a whole block kernel family),
 * ops/unary.c and ops/binary.c (one instance per dtype and op). */
#ifndef LUTRA_OPS_DTYPE_GENERIC_H
#define LUTRA_OPS_DTYPE_GENERIC_H

#define LT_PRAGMA_TEXT(...) #__VA_ARGS__
/* #pragma omp simd <clauses>, usable inside a macro body */
#define LT_SIMD(...) _Pragma(LT_PRAGMA_TEXT(omp simd __VA_ARGS__))
/* no pragma: the loop runs in element order */
#define LT_IN_ORDER(...)

#endif
