/* binary.cu — out = a op b (broadcast, strided, in place), the scalar forms, and where, on CUDA,
 * with host/ops/binary.c's semantics: f32, bf16 and f16 compute in f32 (16-bit results rounded to
 * nearest even), f64 in f64, integers in their own type wrapping on overflow (u8 through 32 bits,
 * as C promotes it); maximum/minimum propagate NaN; comparisons write bool (0/1 bytes); bool
 * tensors compare as bytes. A scalar operand is held in the compute type (f32 for bf16/f16, so
 * it is not rounded to 16 bits). Results are bit-identical with the CPU except pow (the device's
 * powf/pow are within a few ulp, glibc's within one). */
#include "kernels/elementwise.cuh"

/* The unsigned type integer arithmetic wraps in (u8 in 32 bits, as C promotes it). */
template <typename T>
using ew_unsigned = typename std::conditional<(sizeof(T) < 4), uint32_t, typename std::make_unsigned<T>::type>::type;

__host__ __device__ inline float ew_pow(float x, float y) { return powf(x, y); }
__host__ __device__ inline double ew_pow(double x, double y) { return pow(x, y); }

/* add .. minimum in C, the compute type. */
template <typename C> __host__ __device__ inline C binary_arith(int op, C x, C y) {
  if constexpr (std::is_floating_point<C>::value) {
    switch (op) {
    case LT_ADD: return x + y;
    case LT_SUB: return x - y;
    case LT_MUL: return x * y;
    case LT_DIV: return x / y;
    case LT_POW: return ew_pow(x, y);
    case LT_MAXIMUM: return x > y || x != x ? x : y; /* NaN-propagating, as torch (fmax would drop it) */
    default: return x < y || x != x ? x : y;         /* LT_MINIMUM */
    }
  } else {
    using UT = ew_unsigned<C>;
    switch (op) {
    case LT_ADD: return (C)((UT)x + (UT)y);
    case LT_SUB: return (C)((UT)x - (UT)y);
    case LT_MUL: return (C)((UT)x * (UT)y);
    case LT_MAXIMUM: return x > y ? x : y;
    default: return x < y ? x : y; /* LT_MINIMUM; div and pow are refused for integers */
    }
  }
}

template <typename C> __host__ __device__ inline uint8_t binary_compare(int op, C x, C y) {
  switch (op) {
  case LT_EQ: return x == y;
  case LT_NE: return x != y;
  case LT_LT: return x < y;
  case LT_LE: return x <= y;
  case LT_GT: return x > y;
  default: return x >= y; /* LT_GE */
  }
}

/* out (TO: T, or uint8_t for comparisons) = a op b over three operands. With scalar_side 1
 * (2) a (b) is the scalar s and is not read: the caller points its geometry at the tensor's. */
template <typename T, typename TO> struct binary_fn {
  using C = typename ew_compute<T>::type;
  static constexpr int nops = 3, vec_n = ew_vec_n<T, TO>();
  TO *out;
  const T *a, *b;
  C s;
  int op, scalar_side, is_compare;
  __host__ __device__ TO apply(C x, C y) const {
    if constexpr (std::is_same<TO, uint8_t>::value && !std::is_same<T, uint8_t>::value) {
      return binary_compare(op, x, y);
    } else if constexpr (std::is_same<T, uint8_t>::value) { /* u8 and bool: either kind */
      return is_compare ? binary_compare(op, x, y) : (TO)binary_arith(op, x, y);
    } else {
      return ew_store<TO>(binary_arith(op, x, y));
    }
  }
  __host__ __device__ void one(const int64_t *off) const {
    C x = scalar_side == 1 ? s : ew_load<C>(a[off[1]]);
    C y = scalar_side == 2 ? s : ew_load<C>(b[off[2]]);
    out[off[0]] = apply(x, y);
  }
  __host__ __device__ void vec(int64_t r) const {
    lt_dev_vec<T, vec_n> va = {}, vb = {};
    lt_dev_vec<TO, vec_n> vo;
    if (scalar_side != 1) va = ew_vload<vec_n>(a, r);
    if (scalar_side != 2) vb = ew_vload<vec_n>(b, r);
    LT_EW_UNROLL for (int k = 0; k < vec_n; k++) {
      C x = scalar_side == 1 ? s : ew_load<C>(va.v[k]);
      C y = scalar_side == 2 ? s : ew_load<C>(vb.v[k]);
      vo.v[k] = apply(x, y);
    }
    ew_vstore<vec_n>(out, r, vo);
  }
  bool aligned() const {
    return lt_aligned(out, sizeof(TO) * vec_n) && (scalar_side == 1 || lt_aligned(a, sizeof(T) * vec_n)) &&
           (scalar_side == 2 || lt_aligned(b, sizeof(T) * vec_n));
  }
};

/* Element types of the binary kernels: bool is compared as bytes, like u8. */
template <typename T> struct binary_type { using type = T; };
template <> struct binary_type<lt_bool_byte> { using type = uint8_t; };

template <typename T, typename TO>
static int launch_binary(const char *name, int device, int op, const lt_ew_geom *g, void *out, const void *a,
                         const void *b, int scalar_side, const void *scalar, bool compare) {
  using C = typename ew_compute<T>::type;
  C s = 0;
  if (scalar_side) memcpy(&s, scalar, sizeof s);
  binary_fn<T, TO> f = {(TO *)out, (const T *)a, (const T *)b, s, op, scalar_side, compare};
  return ew_launch(name, device, f, *g);
}

int lt_cuda_binary(int device, int op, int dtype, const lt_ew_geom *g, void *out, const void *a, const void *b,
                   int scalar_side, const void *scalar) {
  const char *name = lt_binary_name(op);
  bool compare = op >= LT_EQ && op <= LT_GE;
  int rc = lt_errorf("%s: dtype %s is not supported on cuda", name, lt_dtype_name(dtype));
  lt_with_dtype(dtype, [&](auto tag) {
    using T = typename binary_type<typename decltype(tag)::type>::type;
    if constexpr (std::is_same<T, uint8_t>::value)
      rc = launch_binary<T, T>(name, device, op, g, out, a, b, scalar_side, scalar, compare);
    else if (compare)
      rc = launch_binary<T, uint8_t>(name, device, op, g, out, a, b, scalar_side, scalar, true);
    else
      rc = launch_binary<T, T>(name, device, op, g, out, a, b, scalar_side, scalar, false);
  });
  return rc;
}

/* ---- where: out = cond ? a : b, elements moved unchanged ------------------------------------------- */

template <typename T> struct where_fn {
  static constexpr int nops = 4, vec_n = ew_vec_n<T>();
  T *out;
  const uint8_t *cond;
  const T *a, *b;
  __host__ __device__ void one(const int64_t *off) const { out[off[0]] = cond[off[1]] ? a[off[2]] : b[off[3]]; }
  __host__ __device__ void vec(int64_t r) const {
    lt_dev_vec<uint8_t, vec_n> c = ew_vload<vec_n>(cond, r);
    lt_dev_vec<T, vec_n> x = ew_vload<vec_n>(a, r), y = ew_vload<vec_n>(b, r), o;
    LT_EW_UNROLL for (int k = 0; k < vec_n; k++) o.v[k] = c.v[k] ? x.v[k] : y.v[k];
    ew_vstore<vec_n>(out, r, o);
  }
  bool aligned() const {
    return lt_aligned(out, 16) && lt_aligned(a, 16) && lt_aligned(b, 16) && lt_aligned(cond, vec_n);
  }
};

int lt_cuda_where(int device, int size, const lt_ew_geom *g, void *out, const void *cond, const void *a,
                  const void *b) {
  const uint8_t *c = (const uint8_t *)cond;
  switch (size) {
  case 1:
    return ew_launch("where", device, where_fn<uint8_t>{(uint8_t *)out, c, (const uint8_t *)a, (const uint8_t *)b}, *g);
  case 2:
    return ew_launch("where", device, where_fn<uint16_t>{(uint16_t *)out, c, (const uint16_t *)a, (const uint16_t *)b},
                     *g);
  case 4:
    return ew_launch("where", device, where_fn<uint32_t>{(uint32_t *)out, c, (const uint32_t *)a, (const uint32_t *)b},
                     *g);
  case 8:
    return ew_launch("where", device, where_fn<uint64_t>{(uint64_t *)out, c, (const uint64_t *)a, (const uint64_t *)b},
                     *g);
  default: return lt_errorf("where: elements of %d bytes are not supported on cuda", size);
  }
}
