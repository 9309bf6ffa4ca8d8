/* sort_rows.h — the sorted rows sort (host/ops/sort.c) and topk (host/ops/topk.c) share. */
#ifndef LUTRA_OPS_SORT_ROWS_H
#define LUTRA_OPS_SORT_ROWS_H
#include "core/internal.h"

/* x defined, of a sortable dtype; dim wrapped into *wrapped. */
int lt_sort_check(const char *op, const lt_tensor *x, int dim, int *wrapped);
/* The first k of each sorted row (kernels/sort.h's order) into values and indices (I64). */
int lt_sort_rows(const char *op, lt_tensor *values, lt_tensor *indices, const lt_tensor *x, int dim, int64_t k,
                 int descending);

#endif
