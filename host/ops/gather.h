/* gather.h — the gather plan's CPU row (ops/gather_cpu.c); the plan is kernels/gather.h's. */
#ifndef LUTRA_OPS_GATHER_H
#define LUTRA_OPS_GATHER_H
#include "core/internal.h"
#include "kernels/gather.h"

/* Runs the plan on the CPU: 0, or -1 with the error set (a dtype the mode does not take). */
int lt_gather_cpu(const lt_gather_plan *p);

/* What the fronts of the plan's ops share (ops/gather.c), for index_select.c. */
/* index (i32/i64, on like's device) with every value checked in [0, size): a tensor to read it
 * from (a view on the CPU, a contiguous copy on CUDA), released by the caller. NULL on error, whose
 * message names op, the bad value, its position in index and dim. */
lt_tensor *lt_gather_checked_index(const char *op, const lt_tensor *index, const lt_tensor *like, int64_t size,
                                   int dim);
/* out made ready as x (shape, dtype, device) and holding x's values (nothing copied when out is x). */
int lt_gather_copy_into(const char *op, lt_tensor *out, const lt_tensor *x);
/* Runs the plan on its device's backend. */
int lt_gather_dispatch(const char *op, const lt_gather_plan *p);

#endif
