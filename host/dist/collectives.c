/* collectives.c — all_reduce, reduce_scatter, all_gather, broadcast and barrier.
 * CPU tensors call the blocking MPI function directly when the caller waits (the
 * fastest path), MPI_I* when it asks for a request; CUDA tensors go to NCCL. */
#include "dist/call.h"
#include <limits.h>
#include <stdlib.h>

/* all_reduce and broadcast move more than MPI's int counts allow in several calls of at
 * most this many elements (env LUTRA_COMM_CHUNK sets it lower, for tests). */
static int64_t chunk_elements(void) {
  static int64_t chunk;
  if (!chunk) {
    const char *v = getenv("LUTRA_COMM_CHUNK");
    chunk = v && atoll(v) > 0 && atoll(v) < INT_MAX ? atoll(v) : INT_MAX;
  }
  return chunk;
}
static int num_chunks(int64_t n) { return n == 0 ? 1 : (int)((n + chunk_elements() - 1) / chunk_elements()); }

int lt_comm_all_reduce(lt_group *g, lt_tensor *t, int op, lt_comm_request **req) {
  static const char *name = "all_reduce";
  if (req) *req = NULL;
  LT_TRY(lt_comm_check_group(name, g));
  LT_TRY(lt_comm_check_tensor(name, g, "t", t));
  LT_TRY(lt_comm_check_reduce(name, g, op, t->dtype));
  if (t->device >= 0) return lt_nccl_all_reduce(g, t, op, req);
  int64_t n = lt_numel(t);
  lt_comm_call c;
  LT_TRY(lt_call_begin(&c, name, g, t, n, -1, req != NULL, true));
  if (g->size == 1 || !lt_comm_mpi_active()) return lt_call_local_done(&c, req, t);
#ifdef LUTRA_HAVE_MPI
  MPI_Datatype type;
  MPI_Op mop;
  if (lt_mpi_datatype(name, t->dtype, &type) || lt_mpi_op(name, op, t->dtype, &mop)) return lt_call_fail(&c);
  char *p = lt_data_ptr(t);
  int64_t esize = lt_dtype_size(t->dtype), chunk = chunk_elements();
  if (!req) {
    int rc = MPI_SUCCESS;
    for (int64_t at = 0; at < n && rc == MPI_SUCCESS; at += chunk)
      rc = MPI_Allreduce(MPI_IN_PLACE, p + at * esize, (int)(n - at < chunk ? n - at : chunk), type, mop, g->comm);
    LT_TRY(lt_call_end(&c, rc));
    if (op == LT_COMM_AVG) lt_comm_scale(t, g->size);
    return 0;
  }
  lt_comm_request *r = lt_call_request(&c, num_chunks(n));
  if (!r) return -1;
  lt_tensor *kept = lt_request_keep(r, t);
  if (op == LT_COMM_AVG) r->avg = kept, r->avg_n = g->size;
  int rc = MPI_SUCCESS;
  for (int k = 0; k < r->nreq && rc == MPI_SUCCESS; k++) {
    int64_t at = k * chunk;
    rc = MPI_Iallreduce(MPI_IN_PLACE, p + at * esize, (int)(n - at < chunk ? n - at : chunk), type, mop, g->comm,
                        &r->reqs[k]);
  }
  return lt_call_posted(&c, r, rc, req);
#else
  return -1;
#endif
}

// Fills int counts (and displacements) for the v-collectives; counts_in NULL: `each` for all.
static int piece_counts(const char *op, lt_group *g, const int64_t *counts_in, int64_t each, int **counts, int **displs,
                        int64_t *total) {
  *counts = calloc((size_t)g->size, sizeof **counts);
  *displs = calloc((size_t)g->size, sizeof **displs);
  if (!*counts || !*displs) return free(*counts), free(*displs), lt_errorf("%s: out of memory", op);
  int64_t sum = 0;
  for (int i = 0; i < g->size; i++) {
    int64_t n = counts_in ? counts_in[i] : each;
    if (n < 0)
      return free(*counts), free(*displs),
             lt_errorf("%s on group %s: counts[%d] = %lld is negative", op, g->name, i, (long long)n);
    if (lt_comm_check_count(op, g, sum + n)) return free(*counts), free(*displs), -1;
    (*counts)[i] = (int)n, (*displs)[i] = (int)sum;
    sum += n;
  }
  *total = sum;
  return 0;
}

// counts (when given) are non-negative.
static int check_counts(const char *op, const lt_group *g, const int64_t *counts) {
  for (int i = 0; counts && i < g->size; i++)
    if (counts[i] < 0)
      return lt_errorf("%s on group %s: counts[%d] = %lld is negative", op, g->name, i + 1, (long long)counts[i]);
  return 0;
}

int lt_comm_reduce_scatter(lt_group *g, lt_tensor *out, const lt_tensor *inp, int op, const int64_t *counts,
                           lt_comm_request **req) {
  static const char *name = "reduce_scatter";
  if (req) *req = NULL;
  LT_TRY(lt_comm_check_group(name, g));
  LT_TRY(lt_comm_check_tensor(name, g, "inp", inp));
  LT_TRY(lt_comm_check_reduce(name, g, op, inp->dtype));
  LT_TRY(check_counts(name, g, counts));
  int64_t n_in = lt_numel(inp), mine;
  char d[LT_DESC_STR];
  if (counts) {
    int64_t sum = 0;
    for (int i = 0; i < g->size; i++) sum += counts[i];
    if (sum != n_in)
      return lt_errorf("%s on group %s: inp %s has %lld elements but counts sum to %lld", name, g->name,
                       lt_desc(d, inp), (long long)n_in, (long long)sum);
    mine = counts[g->rank];
  } else {
    if (n_in % g->size != 0)
      return lt_errorf("%s on group %s: inp %s has %lld elements, not a multiple of the group size %d (pass counts)",
                       name, g->name, lt_desc(d, inp), (long long)n_in, g->size);
    mine = n_in / g->size;
  }
  if (!out) return lt_errorf("%s on group %s: out is NULL", name, g->name);
  if (!lt_is_defined(out)) LT_TRY(lt_empty(out, 1, &mine, inp->dtype, inp->device));
  LT_TRY(lt_comm_check_tensor(name, g, "out", out));
  LT_TRY(lt_comm_check_pair(name, g, out, inp));
  if (lt_numel(out) != mine)
    return lt_errorf("%s on group %s: out %s has %lld elements, expected %lld (inp %lld elements over %d ranks)", name,
                     g->name, lt_desc(d, out), (long long)lt_numel(out), (long long)mine, (long long)n_in, g->size);
  if (out->device < 0) LT_TRY(lt_comm_check_count(name, g, mine));
  if (out->device >= 0) return lt_nccl_reduce_scatter(g, out, inp, op, counts, req);
  lt_comm_call c;
  LT_TRY(lt_call_begin(&c, name, g, inp, n_in, -1, req != NULL, true));
  if (g->size == 1 || !lt_comm_mpi_active()) {
    if (lt_data_ptr(out) != lt_data_ptr(inp) && lt_copy_from_buffer(out, lt_data_ptr(inp), inp->dtype, n_in) != 0)
      return lt_call_fail(&c);
    return lt_call_local_done(&c, req, out);
  }
#ifdef LUTRA_HAVE_MPI
  MPI_Datatype type;
  MPI_Op mop;
  if (lt_mpi_datatype(name, inp->dtype, &type) || lt_mpi_op(name, op, inp->dtype, &mop)) return lt_call_fail(&c);
  int *ic = NULL, *id = NULL;
  int64_t total;
  if (counts && piece_counts(name, g, counts, 0, &ic, &id, &total)) return lt_call_fail(&c);
  const void *src = lt_data_ptr(inp);
  void *dst = lt_data_ptr(out);
  if (!req) {
    int rc = counts ? MPI_Reduce_scatter(src, dst, ic, type, mop, g->comm)
                    : MPI_Reduce_scatter_block(src, dst, (int)mine, type, mop, g->comm);
    free(ic), free(id);
    LT_TRY(lt_call_end(&c, rc));
    if (op == LT_COMM_AVG) lt_comm_scale(out, g->size);
    return 0;
  }
  lt_comm_request *r = lt_call_request(&c, 1);
  if (!r) return free(ic), free(id), -1;
  lt_tensor *kept = lt_request_keep(r, out);
  lt_request_keep(r, (lt_tensor *)inp);
  r->counts = ic, r->displs = id;
  if (op == LT_COMM_AVG) r->avg = kept, r->avg_n = g->size;
  int rc = counts ? MPI_Ireduce_scatter(src, dst, ic, type, mop, g->comm, r->reqs)
                  : MPI_Ireduce_scatter_block(src, dst, (int)mine, type, mop, g->comm, r->reqs);
  return lt_call_posted(&c, r, rc, req);
#else
  return -1;
#endif
}

int lt_comm_all_gather(lt_group *g, lt_tensor *out, const lt_tensor *inp, const int64_t *counts,
                       lt_comm_request **req) {
  static const char *name = "all_gather";
  if (req) *req = NULL;
  LT_TRY(lt_comm_check_group(name, g));
  LT_TRY(lt_comm_check_tensor(name, g, "inp", inp));
  LT_TRY(check_counts(name, g, counts));
  int64_t n_in = lt_numel(inp), total = 0;
  char d[LT_DESC_STR];
  if (counts) {
    for (int i = 0; i < g->size; i++) total += counts[i];
    if (counts[g->rank] != n_in)
      return lt_errorf("%s on group %s: inp %s has %lld elements but counts[%d] = %lld", name, g->name, lt_desc(d, inp),
                       (long long)n_in, g->rank, (long long)counts[g->rank]);
  } else {
    total = n_in * g->size;
  }
  if (!out) return lt_errorf("%s on group %s: out is NULL", name, g->name);
  if (!lt_is_defined(out)) {
    if (counts || inp->ndim >= LT_MAX_DIMS) {
      LT_TRY(lt_empty(out, 1, &total, inp->dtype, inp->device));
    } else { /* (size, inp's shape...) */
      int64_t shape[LT_MAX_DIMS] = {g->size};
      memcpy(shape + 1, inp->shape, (size_t)inp->ndim * sizeof *shape);
      LT_TRY(lt_empty(out, inp->ndim + 1, shape, inp->dtype, inp->device));
    }
  }
  LT_TRY(lt_comm_check_tensor(name, g, "out", out));
  LT_TRY(lt_comm_check_pair(name, g, out, inp));
  if (lt_numel(out) != total)
    return lt_errorf("%s on group %s: out %s has %lld elements, expected %lld (inp %s from each of %d ranks)", name,
                     g->name, lt_desc(d, out), (long long)lt_numel(out), (long long)total, lt_desc(d, inp), g->size);
  if (out->device >= 0) return lt_nccl_all_gather(g, out, inp, counts, req);
  lt_comm_call c;
  LT_TRY(lt_call_begin(&c, name, g, out, total, -1, req != NULL, true));
  if (g->size == 1 || !lt_comm_mpi_active()) {
    if (lt_data_ptr(out) != lt_data_ptr(inp) && lt_copy_from_buffer(out, lt_data_ptr(inp), inp->dtype, n_in) != 0)
      return lt_call_fail(&c);
    return lt_call_local_done(&c, req, out);
  }
#ifdef LUTRA_HAVE_MPI
  MPI_Datatype type;
  if (lt_mpi_datatype(name, inp->dtype, &type)) return lt_call_fail(&c);
  int *ic = NULL, *id = NULL;
  if (piece_counts(name, g, counts, n_in, &ic, &id, &total)) return lt_call_fail(&c);
  /* inp already in its place in out (ZeRO's flat buffers): gather in place */
  int64_t esize = lt_dtype_size(inp->dtype);
  const void *src = lt_data_ptr(inp);
  void *dst = lt_data_ptr(out);
  if (src == (char *)dst + id[g->rank] * esize) src = MPI_IN_PLACE;
  if (!req) {
    int rc = counts ? MPI_Allgatherv(src, (int)n_in, type, dst, ic, id, type, g->comm)
                    : MPI_Allgather(src, (int)n_in, type, dst, (int)n_in, type, g->comm);
    free(ic), free(id);
    return lt_call_end(&c, rc);
  }
  lt_comm_request *r = lt_call_request(&c, 1);
  if (!r) return free(ic), free(id), -1;
  lt_request_keep(r, out);
  lt_request_keep(r, (lt_tensor *)inp);
  r->counts = ic, r->displs = id;
  int rc = counts ? MPI_Iallgatherv(src, (int)n_in, type, dst, ic, id, type, g->comm, r->reqs)
                  : MPI_Iallgather(src, (int)n_in, type, dst, (int)n_in, type, g->comm, r->reqs);
  return lt_call_posted(&c, r, rc, req);
#else
  return -1;
#endif
}

int lt_comm_broadcast(lt_group *g, lt_tensor *t, int root, lt_comm_request **req) {
  static const char *name = "broadcast";
  if (req) *req = NULL;
  LT_TRY(lt_comm_check_group(name, g));
  LT_TRY(lt_comm_check_tensor(name, g, "t", t));
  if (root < 0 || root >= g->size)
    return lt_errorf("%s on group %s: root %d is out of range for a group of %d", name, g->name, root, g->size);
  if (t->device >= 0) return lt_nccl_broadcast(g, t, root, req);
  int64_t n = lt_numel(t);
  lt_comm_call c;
  LT_TRY(lt_call_begin(&c, name, g, t, n, root, req != NULL, true));
  if (g->size == 1 || !lt_comm_mpi_active()) return lt_call_local_done(&c, req, t);
#ifdef LUTRA_HAVE_MPI
  MPI_Datatype type;
  if (lt_mpi_datatype(name, t->dtype, &type)) return lt_call_fail(&c);
  char *p = lt_data_ptr(t);
  int64_t esize = lt_dtype_size(t->dtype), chunk = chunk_elements();
  if (!req) {
    int rc = MPI_SUCCESS;
    for (int64_t at = 0; at < n && rc == MPI_SUCCESS; at += chunk)
      rc = MPI_Bcast(p + at * esize, (int)(n - at < chunk ? n - at : chunk), type, root, g->comm);
    return lt_call_end(&c, rc);
  }
  lt_comm_request *r = lt_call_request(&c, num_chunks(n));
  if (!r) return -1;
  lt_request_keep(r, t);
  int rc = MPI_SUCCESS;
  for (int k = 0; k < r->nreq && rc == MPI_SUCCESS; k++) {
    int64_t at = k * chunk;
    rc = MPI_Ibcast(p + at * esize, (int)(n - at < chunk ? n - at : chunk), type, root, g->comm, &r->reqs[k]);
  }
  return lt_call_posted(&c, r, rc, req);
#else
  return -1;
#endif
}

int lt_comm_barrier(lt_group *g, lt_comm_request **req) {
  static const char *name = "barrier";
  if (req) *req = NULL;
  LT_TRY(lt_comm_check_group(name, g));
  lt_comm_call c;
  LT_TRY(lt_call_begin(&c, name, g, NULL, 0, -1, req != NULL, true));
  if (g->size == 1 || !lt_comm_mpi_active()) return lt_call_local_done(&c, req, NULL);
#ifdef LUTRA_HAVE_MPI
  if (!req) return lt_call_end(&c, MPI_Barrier(g->comm));
  lt_comm_request *r = lt_call_request(&c, 1);
  if (!r) return -1;
  return lt_call_posted(&c, r, MPI_Ibarrier(g->comm, r->reqs), req);
#else
  return -1;
#endif
}
