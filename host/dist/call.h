/* call.h — the steps every collective and p2p call shares (host/dist/call.c):
 * argument checks, the flight record, the watch around a blocking MPI call, and the
 * request of an async one. */
#ifndef LUTRA_DIST_CALL_H
#define LUTRA_DIST_CALL_H
#include "dist/internal.h"

/* t defined, contiguous, of a dtype the comm layer moves. */
int lt_comm_check_tensor(const char *op, const lt_group *g, const char *what, const lt_tensor *t);
/* The same device for both, and the same dtype. */
int lt_comm_check_pair(const char *op, const lt_group *g, const lt_tensor *a, const lt_tensor *b);
/* op is a reduction op valid for dtype. */
int lt_comm_check_reduce(const char *op, const lt_group *g, int reduce, int dtype);
/* n fits the int counts of MPI. */
int lt_comm_check_count(const char *op, const lt_group *g, int64_t n);

typedef struct lt_comm_call {
  const char *op;
  lt_group *g;
  int64_t seq;
  int64_t slot;
  bool async;
  double t0; /* a blocking call's start (lt_comm_clock), for lt_comm_blocked_seconds */
} lt_comm_call;

/* Takes the group's next seq, checks the fingerprint in debug mode (collectives:
 * fingerprint != 0), records the call and, when blocking, starts watching it. */
int lt_call_begin(lt_comm_call *c, const char *op, lt_group *g, const lt_tensor *t, int64_t count, int peer, bool async,
                  bool fingerprint);
/* After the blocking MPI call: stops watching, records the outcome. */
int lt_call_end(lt_comm_call *c, int mpi_rc);
/* After a failure before the MPI call (message already set): stops watching, returns -1. */
int lt_call_fail(lt_comm_call *c);
/* A finished call of a singleton (or group of one): an already-done request if asked for. */
int lt_call_local_done(lt_comm_call *c, lt_comm_request **req, lt_tensor *keep);
/* After posting async requests: hands r to *req, or frees it and fails. */
int lt_call_posted(lt_comm_call *c, lt_comm_request *r, int mpi_rc, lt_comm_request **req);
lt_comm_request *lt_call_request(lt_comm_call *c, int nreq);

#endif
