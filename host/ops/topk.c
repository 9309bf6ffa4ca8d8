/* topk.c — the k largest (or smallest) along one dim, sorted, with their indices: the first k
 * of sort's rows (host/ops/sort.c, kernels/sort.h's order), so a tie keeps the lower index and
 * NaN counts as the largest value, as in torch. */
#include "ops/sort_rows.h"

int lt_topk(lt_tensor *values, lt_tensor *indices, const lt_tensor *x, int64_t k, int dim, int largest) {
  int d;
  LT_TRY(lt_sort_check("topk", x, dim, &d));
  int64_t n = x->ndim ? x->shape[d] : 1;
  if (k < 0 || k > n)
    return lt_errorf("topk: k %lld out of range for dim %d of size %lld", (long long)k, dim, (long long)n);
  return lt_sort_rows("topk", values, indices, x, d, k, largest);
}
