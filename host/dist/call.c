/* call.c — the steps every collective and p2p call shares. */
#include "dist/call.h"
#include <limits.h>
#include <stdio.h>
#include <time.h>

static double blocked_s; /* main thread only, as the comm layer */

double lt_comm_clock(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void lt_comm_add_blocked(double seconds) { blocked_s += seconds; }

int lt_comm_blocked_seconds(double *seconds) {
  if (!seconds) return lt_errorf("comm.blocked_seconds: seconds is NULL");
  *seconds = blocked_s;
  return 0;
}

int lt_comm_check_tensor(const char *op, const lt_group *g, const char *what, const lt_tensor *t) {
  if (!t) return lt_errorf("%s on group %s: %s is NULL", op, g->name, what);
  if (!lt_is_defined(t)) return lt_errorf("%s on group %s: %s is undefined", op, g->name, what);
  char d[LT_DESC_STR];
  if (t->dtype == LT_BOOL || lt_dtype_size(t->dtype) == 0)
    return lt_errorf("%s on group %s: %s %s: unsupported dtype (expected f32, f64, bf16, f16, i32, i64 or u8)", op,
                     g->name, what, lt_desc(d, t));
  if (!lt_is_contiguous(t))
    return lt_errorf("%s on group %s: %s %s must be contiguous", op, g->name, what, lt_desc(d, t));
  return 0;
}

int lt_comm_check_pair(const char *op, const lt_group *g, const lt_tensor *a, const lt_tensor *b) {
  char da[LT_DESC_STR], db[LT_DESC_STR];
  if (a->dtype != b->dtype || a->device != b->device)
    return lt_errorf("%s on group %s: out %s and inp %s differ in dtype or device", op, g->name, lt_desc(da, a),
                     lt_desc(db, b));
  return 0;
}

int lt_comm_check_reduce(const char *op, const lt_group *g, int reduce, int dtype) {
  if (reduce < 0 || reduce >= LT_NUM_COMM_OPS)
    return lt_errorf("%s on group %s: unknown reduction op %d (expected sum, avg, max or min)", op, g->name, reduce);
  if (reduce == LT_COMM_AVG && !lt_dtype_is_float(dtype))
    return lt_errorf("%s on group %s: avg needs a floating dtype, got %s", op, g->name, lt_dtype_name(dtype));
  return 0;
}

int lt_comm_check_count(const char *op, const lt_group *g, int64_t n) {
  if (n > INT_MAX)
    return lt_errorf("%s on group %s: %lld elements is more than MPI's int counts allow", op, g->name, (long long)n);
  return 0;
}

int lt_call_begin(lt_comm_call *c, const char *op, lt_group *g, const lt_tensor *t, int64_t count, int peer, bool async,
                  bool fingerprint) {
  c->op = op, c->g = g, c->async = async, c->slot = -1;
  c->t0 = async ? 0 : lt_comm_clock();
  c->seq = ++g->seq;
  int dtype = t ? t->dtype : LT_U8;
  if (fingerprint && lt_comm_mpi_active() && g->size > 1 && lt_comm_debug())
    LT_TRY(lt_fingerprint_check(g, op, dtype, count, t ? t->ndim : 0, t ? t->shape : NULL, peer, c->seq));
  c->slot = lt_flight_begin(op, g, c->seq, dtype, count, t ? t->ndim : 1, t ? t->shape : NULL, peer,
                            async ? LT_COMM_POSTED : LT_COMM_WAITING);
  return 0;
}

#ifdef LUTRA_HAVE_MPI
static const char *mpi_error(int rc, char *buf) {
  int len = 0;
  if (MPI_Error_string(rc, buf, &len) != MPI_SUCCESS) snprintf(buf, 64, "MPI error %d", rc);
  return buf;
}
#endif

int lt_call_end(lt_comm_call *c, int mpi_rc) {
  if (!c->async) lt_comm_add_blocked(lt_comm_clock() - c->t0);
  lt_flight_set_state(c->slot, mpi_rc == 0 ? LT_COMM_DONE : LT_COMM_FAILED);
  if (mpi_rc == 0) return 0;
#ifdef LUTRA_HAVE_MPI
  char buf[MPI_MAX_ERROR_STRING];
  return lt_errorf("%s on group %s (seq %lld): %s", c->op, c->g->name, (long long)c->seq, mpi_error(mpi_rc, buf));
#else
  return lt_errorf("%s on group %s: failed", c->op, c->g->name);
#endif
}

int lt_call_fail(lt_comm_call *c) {
  lt_flight_set_state(c->slot, LT_COMM_FAILED);
  return -1;
}

int lt_call_local_done(lt_comm_call *c, lt_comm_request **req, lt_tensor *keep) {
  if (!c->async) return lt_call_end(c, 0);
  lt_flight_set_state(c->slot, LT_COMM_DONE);
  lt_comm_request *r = lt_request_new(c->op, c->g, 0, c->slot);
  if (!r) return lt_errorf("%s on group %s: out of memory", c->op, c->g->name);
  if (keep) lt_request_keep(r, keep);
  r->done = 1;
  *req = r;
  return 0;
}

lt_comm_request *lt_call_request(lt_comm_call *c, int nreq) {
  lt_comm_request *r = lt_request_new(c->op, c->g, nreq, c->slot);
  if (!r) {
    lt_errorf("%s on group %s: out of memory", c->op, c->g->name);
    lt_flight_set_state(c->slot, LT_COMM_FAILED);
  }
  return r;
}

int lt_call_posted(lt_comm_call *c, lt_comm_request *r, int mpi_rc, lt_comm_request **req) {
  if (mpi_rc != 0) {
    lt_request_free(r);
    lt_flight_set_state(c->slot, LT_COMM_FAILED);
#ifdef LUTRA_HAVE_MPI
    char buf[MPI_MAX_ERROR_STRING];
    return lt_errorf("%s on group %s (seq %lld): %s", c->op, c->g->name, (long long)c->seq, mpi_error(mpi_rc, buf));
#else
    return lt_errorf("%s on group %s: failed", c->op, c->g->name);
#endif
  }
  *req = r;
  return 0;
}
