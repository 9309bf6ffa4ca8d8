/* mpi_types.c — lutra dtypes as MPI datatypes, reduction ops as MPI_Ops, and the
 * user ops that reduce bf16 and f16 in f32. */
#include "dist/internal.h"

int lt_comm_check_op(const char *opname, int op, int dtype) {
  if (op < 0 || op >= LT_NUM_COMM_OPS)
    return lt_errorf("%s: unknown reduction op %d (expected sum, avg, max or min)", opname, op);
  if (dtype == LT_BOOL || lt_dtype_size(dtype) == 0)
    return lt_errorf("%s: unsupported dtype %s (expected f32, f64, bf16, f16, i32, i64 or u8)", opname,
                     lt_dtype_name(dtype));
  if (op == LT_COMM_AVG && !lt_dtype_is_float(dtype))
    return lt_errorf("%s: avg needs a floating dtype, got %s", opname, lt_dtype_name(dtype));
  return 0;
}

// t (contiguous, n elements) *= 1 / divisor
void lt_comm_scale(lt_tensor *t, int divisor) {
  int64_t n = lt_numel(t);
  void *p = lt_data_ptr(t);
  if (t->dtype == LT_F32) {
    float s = 1.0f / (float)divisor, *x = p;
    for (int64_t i = 0; i < n; i++) x[i] *= s;
  } else if (t->dtype == LT_F64) {
    double s = 1.0 / divisor, *x = p;
    for (int64_t i = 0; i < n; i++) x[i] *= s;
  } else {
    for (int64_t i = 0; i < n; i++) lt_store_f64(p, t->dtype, i, lt_load_f64(p, t->dtype, i) / divisor);
  }
}

#ifdef LUTRA_HAVE_MPI

/* bf16 and f16 travel as 2-byte types of their own so that the user ops know which is which. */
static MPI_Datatype type_bf16 = MPI_DATATYPE_NULL, type_f16 = MPI_DATATYPE_NULL;
static MPI_Op half_ops[3] = {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL}; /* sum, max, min */

static inline float half_load(const uint16_t *p, int64_t i, bool bf) {
  return bf ? lt_bf16_to_f32(p[i]) : lt_f16_to_f32(p[i]);
}
static inline uint16_t half_store(float v, bool bf) { return bf ? lt_f32_to_bf16(v) : lt_f32_to_f16(v); }

// inout[i] = inout[i] op in[i], computed in f32 and rounded once
static void half_reduce(void *in, void *inout, int *len, MPI_Datatype *type, int which) {
  const uint16_t *a = in;
  uint16_t *b = inout;
  bool bf = *type == type_bf16;
  for (int i = 0; i < *len; i++) {
    float x = half_load(a, i, bf), y = half_load(b, i, bf);
    float r = which == 0 ? x + y : which == 1 ? (x > y ? x : y) : (x < y ? x : y);
    b[i] = half_store(r, bf);
  }
}
static void half_sum(void *in, void *inout, int *len, MPI_Datatype *type) { half_reduce(in, inout, len, type, 0); }
static void half_max(void *in, void *inout, int *len, MPI_Datatype *type) { half_reduce(in, inout, len, type, 1); }
static void half_min(void *in, void *inout, int *len, MPI_Datatype *type) { half_reduce(in, inout, len, type, 2); }

static void make_half_types(void) {
  if (type_bf16 != MPI_DATATYPE_NULL) return;
  MPI_Type_contiguous(2, MPI_BYTE, &type_bf16);
  MPI_Type_commit(&type_bf16);
  MPI_Type_contiguous(2, MPI_BYTE, &type_f16);
  MPI_Type_commit(&type_f16);
  MPI_Op_create(half_sum, 1, &half_ops[0]);
  MPI_Op_create(half_max, 1, &half_ops[1]);
  MPI_Op_create(half_min, 1, &half_ops[2]);
}

int lt_mpi_datatype(const char *op, int dtype, MPI_Datatype *out) {
  switch (dtype) {
  case LT_F32: *out = MPI_FLOAT; return 0;
  case LT_F64: *out = MPI_DOUBLE; return 0;
  case LT_I32: *out = MPI_INT32_T; return 0;
  case LT_I64: *out = MPI_INT64_T; return 0;
  case LT_U8: *out = MPI_UINT8_T; return 0;
  case LT_BF16:
    make_half_types();
    *out = type_bf16;
    return 0;
  case LT_F16:
    make_half_types();
    *out = type_f16;
    return 0;
  default:
    return lt_errorf("%s: unsupported dtype %s (expected f32, f64, bf16, f16, i32, i64 or u8)", op,
                     lt_dtype_name(dtype));
  }
}

// AVG reduces as SUM; the caller divides afterwards.
int lt_mpi_op(const char *op, int reduce, int dtype, MPI_Op *out) {
  LT_TRY(lt_comm_check_op(op, reduce, dtype));
  int which = reduce == LT_COMM_MAX ? 1 : reduce == LT_COMM_MIN ? 2 : 0;
  if (dtype == LT_BF16 || dtype == LT_F16) {
    make_half_types();
    *out = half_ops[which];
  } else {
    *out = which == 0 ? MPI_SUM : which == 1 ? MPI_MAX : MPI_MIN;
  }
  return 0;
}

void lt_mpi_types_free(void) {
  if (type_bf16 == MPI_DATATYPE_NULL) return;
  MPI_Type_free(&type_bf16);
  MPI_Type_free(&type_f16);
  for (int i = 0; i < 3; i++) MPI_Op_free(&half_ops[i]);
}

#endif
