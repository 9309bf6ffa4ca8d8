/* alltoall.c — all_to_all with uneven counts: rank i sends rows [sdispl[j], +send[j]) of
 * inp to rank j, which stores them at its rows [rdispl[i], +recv[i]) of out. CPU tensors
 * call MPI_Alltoallv (MPI_Ialltoallv for a request); CUDA tensors go to NCCL. */
#include "dist/call.h"
#include <limits.h>
#include <stdlib.h>

// Elements in one row (dim 0) of t: the product of its other dims.
static int64_t row_elements(const lt_tensor *t) {
  int64_t n = 1;
  for (int d = 1; d < t->ndim; d++) n *= t->shape[d];
  return n;
}

// counts non-negative; their sum into *sum.
static int sum_counts(const lt_group *g, const char *what, const int64_t *counts, int64_t *sum) {
  if (!counts) return lt_errorf("all_to_all on group %s: %s is NULL", g->name, what);
  *sum = 0;
  for (int i = 0; i < g->size; i++) {
    if (counts[i] < 0)
      return lt_errorf("all_to_all on group %s: %s[%d] = %lld is negative", g->name, what, i, (long long)counts[i]);
    *sum += counts[i];
  }
  return 0;
}

// The checks of every path: counts against the tensors' rows, out allocated when undefined.
static int check_args(lt_group *g, lt_tensor *out, const lt_tensor *inp, const int64_t *send, const int64_t *recv) {
  static const char *name = "all_to_all";
  LT_TRY(lt_comm_check_group(name, g));
  LT_TRY(lt_comm_check_tensor(name, g, "inp", inp));
  char d[LT_DESC_STR], e[LT_DESC_STR];
  if (inp->ndim < 1) return lt_errorf("%s on group %s: inp %s has no rows (dim 0)", name, g->name, lt_desc(d, inp));
  int64_t sent = 0, received = 0;
  LT_TRY(sum_counts(g, "send_counts", send, &sent));
  LT_TRY(sum_counts(g, "recv_counts", recv, &received));
  if (sent != inp->shape[0])
    return lt_errorf("%s on group %s: send_counts sum to %lld rows but inp %s has %lld", name, g->name,
                     (long long)sent, lt_desc(d, inp), (long long)inp->shape[0]);
  if (!out) return lt_errorf("%s on group %s: out is NULL", name, g->name);
  if (!lt_is_defined(out)) { /* (sum of recv_counts, inp's other dims...) */
    int64_t shape[LT_MAX_DIMS];
    memcpy(shape, inp->shape, (size_t)inp->ndim * sizeof *shape);
    shape[0] = received;
    LT_TRY(lt_empty(out, inp->ndim, shape, inp->dtype, inp->device));
  }
  LT_TRY(lt_comm_check_tensor(name, g, "out", out));
  LT_TRY(lt_comm_check_pair(name, g, out, inp));
  if (out->ndim < 1 || out->shape[0] != received || row_elements(out) != row_elements(inp))
    return lt_errorf("%s on group %s: recv_counts sum to %lld rows of %lld elements (inp %s) but out is %s", name,
                     g->name, (long long)received, (long long)row_elements(inp), lt_desc(d, inp), lt_desc(e, out));
  if (lt_numel(out) > 0 && lt_numel(inp) > 0 && lt_data_ptr(out) == lt_data_ptr(inp))
    return lt_errorf("%s on group %s: out and inp share memory", name, g->name);
  return 0;
}

#ifdef LUTRA_HAVE_MPI
// One block of 4 * size ints: send counts, send displs, recv counts, recv displs, in elements;
// an error when one passes MPI's int counts.
static int mpi_counts(lt_group *g, const int64_t *send, const int64_t *recv, int64_t row, int **block) {
  int n = g->size, *b = calloc((size_t)n * 4, sizeof *b);
  if (!b) return lt_errorf("all_to_all on group %s: out of memory", g->name);
  const int64_t *counts[2] = {send, recv};
  for (int k = 0; k < 2; k++) {
    int64_t at = 0;
    for (int i = 0; i < n; i++) {
      int64_t c = counts[k][i] * row;
      if (c > INT_MAX || at > INT_MAX)
        return free(b), lt_errorf("all_to_all on group %s: %s[%d] = %lld rows of %lld elements at element %lld: more "
                                  "than MPI's int counts allow",
                                  g->name, k ? "recv_counts" : "send_counts", i, (long long)counts[k][i],
                                  (long long)row, (long long)at);
      b[2 * k * n + i] = (int)c, b[(2 * k + 1) * n + i] = (int)at;
      at += c;
    }
  }
  *block = b;
  return 0;
}
#endif

int lt_comm_all_to_all(lt_group *g, lt_tensor *out, const lt_tensor *inp, const int64_t *send_counts,
                       const int64_t *recv_counts, lt_comm_request **req) {
  static const char *name = "all_to_all";
  if (req) *req = NULL;
  LT_TRY(check_args(g, out, inp, send_counts, recv_counts));
  if (out->device >= 0) return lt_nccl_all_to_all(g, out, inp, send_counts, recv_counts, req);
  int64_t row = row_elements(inp);
  lt_comm_call c;
  LT_TRY(lt_call_begin(&c, name, g, inp, lt_numel(inp), -1, req != NULL, true));
  if (lt_exchange_check(g, name, send_counts, recv_counts, c.seq)) return lt_call_fail(&c);
  if (g->size == 1 || !lt_comm_mpi_active()) {
    if (recv_counts[0] != send_counts[0]) /* unreachable: both are the rows of inp and out */
      return lt_errorf("%s on group %s: send_counts[0] %lld != recv_counts[0] %lld", name, g->name,
                       (long long)send_counts[0], (long long)recv_counts[0]),
             lt_call_fail(&c);
    if (lt_copy_from_buffer(out, lt_data_ptr(inp), inp->dtype, lt_numel(inp)) != 0) return lt_call_fail(&c);
    return lt_call_local_done(&c, req, out);
  }
#ifdef LUTRA_HAVE_MPI
  MPI_Datatype type;
  if (lt_mpi_datatype(name, inp->dtype, &type)) return lt_call_fail(&c);
  int *b = NULL;
  if (mpi_counts(g, send_counts, recv_counts, row, &b)) return lt_call_fail(&c);
  int n = g->size;
  const void *src = lt_data_ptr(inp);
  void *dst = lt_data_ptr(out);
  if (!req) {
    int rc = MPI_Alltoallv(src, b, b + n, type, dst, b + 2 * n, b + 3 * n, type, g->comm);
    free(b);
    return lt_call_end(&c, rc);
  }
  lt_comm_request *r = lt_call_request(&c, 1);
  if (!r) return free(b), -1;
  lt_request_keep(r, out);
  lt_request_keep(r, (lt_tensor *)inp);
  r->counts = b; /* MPI reads the arrays until completion */
  return lt_call_posted(&c, r, MPI_Ialltoallv(src, b, b + n, type, dst, b + 2 * n, b + 3 * n, type, g->comm, r->reqs),
                        req);
#else
  return lt_call_fail(&c);
#endif
}
