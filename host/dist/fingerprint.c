/* fingerprint.c — debug mode: before each collective the ranks of the group
 * exchange a fixed-size fingerprint of the call (op, dtype, count, shape, root, seq,
 * call site) and every rank fails with the same message at the first rank that differs. */
#include "dist/internal.h"
#include <stdio.h>
#include <stdlib.h>

static int debug_mode = -1; /* -1: read env LUTRA_COMM_DEBUG at first use */
static char callsite[64];

int lt_comm_set_debug(int on) {
  debug_mode = on != 0;
  return 0;
}

int lt_comm_debug(void) {
  if (debug_mode < 0) {
    const char *v = getenv("LUTRA_COMM_DEBUG");
    debug_mode = v && *v && strcmp(v, "0") != 0;
  }
  return debug_mode;
}

int lt_comm_set_callsite(const char *where) {
  snprintf(callsite, sizeof callsite, "%s", where ? where : "");
  return 0;
}

typedef struct fingerprint {
  int64_t seq, count;
  int32_t dtype, peer;
  char op[24];
  char shape[64];
  char where[64];
} fingerprint;

static void describe(char *buf, size_t len, int rank, const fingerprint *f) {
  char root[32] = "", where[80] = "";
  if (f->peer >= 0) snprintf(root, sizeof root, " root %d", f->peer);
  if (f->where[0]) snprintf(where, sizeof where, " at %s", f->where);
  snprintf(buf, len, "rank %d %s %s %s%s%s", rank, f->op, lt_dtype_name(f->dtype), f->shape, root, where);
}

static bool same(const fingerprint *a, const fingerprint *b) {
  return a->seq == b->seq && a->count == b->count && a->dtype == b->dtype && a->peer == b->peer &&
         strcmp(a->op, b->op) == 0 && strcmp(a->shape, b->shape) == 0;
}

int lt_fingerprint_check(lt_group *g, const char *op, int dtype, int64_t count, int ndim, const int64_t *shape,
                         int peer, int64_t seq) {
#ifdef LUTRA_HAVE_MPI
  fingerprint mine;
  memset(&mine, 0, sizeof mine);
  mine.seq = seq, mine.count = count, mine.dtype = dtype, mine.peer = peer;
  snprintf(mine.op, sizeof mine.op, "%s", op);
  char shape_buf[LT_SHAPE_STR];
  if (shape)
    lt_shape_str(shape_buf, ndim, shape);
  else
    snprintf(shape_buf, sizeof shape_buf, "[%lld]", (long long)count);
  snprintf(mine.shape, sizeof mine.shape, "%.63s", shape_buf);
  snprintf(mine.where, sizeof mine.where, "%s", callsite);
  /* shapes may legitimately differ where only counts must agree (uneven all_gather pieces) */
  if (strcmp(op, "all_gather") == 0 || strcmp(op, "reduce_scatter") == 0)
    snprintf(mine.shape, sizeof mine.shape, "[%lld]", (long long)count);
  /* all_to_all: the rows differ, the row (dims past 0) must agree; counts: lt_exchange_check */
  if (strcmp(op, "all_to_all") == 0 && shape && ndim >= 1) {
    mine.count = 1;
    for (int d = 1; d < ndim; d++) mine.count *= shape[d];
    shape_buf[0] = '*', shape_buf[1] = '\0';
    for (int d = 1; d < ndim; d++)
      snprintf(shape_buf + strlen(shape_buf), sizeof shape_buf - strlen(shape_buf), ",%lld", (long long)shape[d]);
    snprintf(mine.shape, sizeof mine.shape, "[%.60s]", shape_buf);
  }
  fingerprint *all = calloc((size_t)g->size, sizeof *all);
  if (!all) return lt_errorf("%s on group %s: out of memory (fingerprints)", op, g->name);
  int64_t slot = lt_flight_begin("fingerprint", g, seq, dtype, count, ndim, shape, peer, LT_COMM_WAITING);
  int rc = MPI_Allgather(&mine, (int)sizeof mine, MPI_BYTE, all, (int)sizeof mine, MPI_BYTE, g->comm);
  lt_flight_set_state(slot, rc == MPI_SUCCESS ? LT_COMM_DONE : LT_COMM_FAILED);
  if (rc != MPI_SUCCESS) return free(all), lt_errorf("%s on group %s: fingerprint exchange failed", op, g->name);
  for (int r = 1; r < g->size; r++) {
    if (same(&all[0], &all[r])) continue;
    char a[256], b[256];
    describe(a, sizeof a, 0, &all[0]);
    describe(b, sizeof b, r, &all[r]);
    free(all);
    return lt_errorf("comm: collective mismatch on group %s at seq %lld: %s, %s", g->name, (long long)seq, a, b);
  }
  free(all);
  return 0;
#else
  (void)g, (void)op, (void)dtype, (void)count, (void)ndim, (void)shape, (void)peer, (void)seq;
  return 0;
#endif
}

int lt_exchange_check(lt_group *g, const char *op, const int64_t *send, const int64_t *recv, int64_t seq) {
#ifdef LUTRA_HAVE_MPI
  if (!lt_comm_debug() || !lt_comm_mpi_active() || g->size < 2) return 0;
  /* every rank's (send[size], recv[size]): each rank checks the whole matrix, so all raise alike */
  int n = g->size;
  int64_t *mine = malloc(sizeof *mine * 2 * (size_t)n), *all = malloc(sizeof *all * 2 * (size_t)n * (size_t)n);
  if (!mine || !all) return free(mine), free(all), lt_errorf("%s on group %s: out of memory (counts)", op, g->name);
  memcpy(mine, send, sizeof *mine * (size_t)n);
  memcpy(mine + n, recv, sizeof *mine * (size_t)n);
  int64_t slot = lt_flight_begin("exchange_counts", g, seq, LT_I64, 2 * (int64_t)n, 0, NULL, -1, LT_COMM_WAITING);
  int rc = MPI_Allgather(mine, 2 * n, MPI_INT64_T, all, 2 * n, MPI_INT64_T, g->comm);
  lt_flight_set_state(slot, rc == MPI_SUCCESS ? LT_COMM_DONE : LT_COMM_FAILED);
  free(mine);
  if (rc != MPI_SUCCESS) return free(all), lt_errorf("%s on group %s: exchanging the counts failed", op, g->name);
  for (int i = 0; i < n; i++)
    for (int j = 0; j < n; j++) {
      int64_t sent = all[(size_t)i * 2 * n + j], expected = all[(size_t)j * 2 * n + n + i];
      if (sent == expected) continue;
      free(all);
      return lt_errorf("comm: %s count mismatch on group %s at seq %lld: rank %d sends %lld rows to rank %d, which "
                       "expects %lld from it",
                       op, g->name, (long long)seq, i, (long long)sent, j, (long long)expected);
    }
  free(all);
  return 0;
#else
  (void)g, (void)op, (void)send, (void)recv, (void)seq;
  return 0;
#endif
}
