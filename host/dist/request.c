/* request.c — async handles: the MPI requests of one call, the tensors they keep
 * alive, and what completion must still do (AVG scaling, the flight-recorder state). */
#include "dist/internal.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static lt_comm_request *live; /* every request made and not yet freed (main thread only) */

lt_comm_request *lt_request_new(const char *op, lt_group *g, int nreq, int64_t slot) {
  lt_comm_request *r = calloc(1, sizeof *r);
  if (!r) return NULL;
  r->op = op, r->group = g, r->nreq = nreq, r->seq_slot = slot;
  r->keep = calloc((size_t)(nreq > 0 ? nreq : 1) + 2, sizeof *r->keep);
#ifdef LUTRA_HAVE_MPI
  r->reqs = calloc((size_t)(nreq > 0 ? nreq : 1), sizeof *r->reqs);
  for (int i = 0; i < nreq; i++) r->reqs[i] = MPI_REQUEST_NULL;
  if (!r->reqs) r->keep = (free(r->keep), NULL);
#endif
  if (!r->keep) {
    free(r);
    return NULL;
  }
  r->next = live;
  if (live) live->prev = r;
  live = r;
  return r;
}

// Holds t's storage until completion through a view of its own, so that freeing t's
// storage meanwhile (free(), lutra.tidy) cannot pull the buffer from under MPI or NCCL.
// keep has room for nreq + 2 tensors. Returns the view (NULL when out of memory: then
// only the tensor struct is retained).
lt_tensor *lt_request_keep(lt_comm_request *r, lt_tensor *t) {
  lt_tensor *view = lt_tensor_new();
  if (view && lt_set(view, t) == 0) {
    r->keep[r->nkeep++] = view;
    return view;
  }
  lt_release(view);
  lt_retain(t);
  r->keep[r->nkeep++] = t;
  return t;
}

void lt_request_free(lt_comm_request *r) {
  if (!r) return;
  if (r->prev)
    r->prev->next = r->next;
  else if (live == r)
    live = r->next;
  if (r->next) r->next->prev = r->prev;
  for (int i = 0; i < r->nkeep; i++) lt_release(r->keep[i]);
  free(r->keep), free(r->counts), free(r->displs);
#ifdef LUTRA_HAVE_MPI
  free(r->reqs);
#endif
  free(r);
}

static void finish(lt_comm_request *r) {
  if (r->avg) lt_comm_scale(r->avg, r->avg_n);
  r->avg = NULL;
  r->done = 1;
  lt_flight_set_state(r->seq_slot, LT_COMM_DONE);
}

int lt_request_complete(lt_comm_request *r) {
  int rc = 0;
  if (!r->done) {
    double t0 = lt_comm_clock();
    if (r->device_event) {
      rc = r->device_wait(r);
    } else {
#ifdef LUTRA_HAVE_MPI
      lt_flight_set_state(r->seq_slot, LT_COMM_WAITING);
      MPI_Status *st = calloc((size_t)(r->nreq > 0 ? r->nreq : 1), sizeof *st);
      int mrc = MPI_Waitall(r->nreq, r->reqs, st ? st : MPI_STATUSES_IGNORE);
      for (int i = 0; st && mrc == MPI_ERR_IN_STATUS && i < r->nreq; i++) /* the request's own error */
        if (st[i].MPI_ERROR != MPI_SUCCESS && st[i].MPI_ERROR != MPI_ERR_PENDING) mrc = st[i].MPI_ERROR;
      free(st);
      if (mrc != MPI_SUCCESS) {
        char msg[MPI_MAX_ERROR_STRING];
        int len = 0;
        if (MPI_Error_string(mrc, msg, &len) != MPI_SUCCESS) snprintf(msg, sizeof msg, "MPI error %d", mrc);
        rc = lt_errorf("%s on group %s: %s", r->op, r->group->name, msg);
      }
#endif
    }
    lt_comm_add_blocked(lt_comm_clock() - t0);
    if (rc == 0)
      finish(r);
    else
      lt_flight_set_state(r->seq_slot, LT_COMM_FAILED);
  }
  lt_request_free(r);
  return rc;
}

int lt_comm_wait(lt_comm_request *req) {
  if (!req) return lt_errorf("comm.wait: request is NULL");
  return lt_request_complete(req);
}

int lt_comm_test(lt_comm_request *req, int *done) {
  if (!req || !done) return lt_errorf("comm.test: request or done is NULL");
  if (!req->done) {
    if (req->device_event) {
      int complete = 0;
      LT_TRY(req->device_test(req, &complete));
      if (complete) finish(req);
    } else {
#ifdef LUTRA_HAVE_MPI
      int flag = 0;
      if (MPI_Testall(req->nreq, req->reqs, &flag, MPI_STATUSES_IGNORE) != MPI_SUCCESS)
        return lt_errorf("%s: MPI failed on group %s", req->op, req->group->name);
      if (flag) finish(req);
#else
      finish(req);
#endif
    }
  }
  *done = req->done;
  return 0;
}

#ifdef LUTRA_HAVE_MPI
static bool is_p2p(const lt_comm_request *r) {
  return !strcmp(r->op, "send") || !strcmp(r->op, "recv") || !strcmp(r->op, "p2p");
}

// Whether r's MPI requests are complete within about a second of progress (one the other ranks
// posted too completes; one they never will stays pending: never an unbounded wait). A
// point-to-point one still pending is cancelled first (a cancelled request completes; a send
// that MPI cannot take back any more stays pending).
static bool settled(lt_comm_request *r) {
  if (is_p2p(r))
    for (int i = 0; i < r->nreq; i++)
      if (r->reqs[i] != MPI_REQUEST_NULL) MPI_Cancel(&r->reqs[i]);
  struct timespec pause = {0, 1000000};
  for (int tries = 0; tries < 1000; tries++) {
    int flag = 0;
    if (MPI_Testall(r->nreq, r->reqs, &flag, MPI_STATUSES_IGNORE) != MPI_SUCCESS) return false;
    if (flag) return true;
    nanosleep(&pause, NULL);
  }
  return false;
}
#endif

int lt_request_settle(const char **op, const char **group) {
  int pending = 0;
  *op = *group = NULL;
  for (lt_comm_request *r = live; r; r = r->next) {
    if (r->done || r->device_event) continue; /* (device requests end with their communicator) */
#ifdef LUTRA_HAVE_MPI
    if (settled(r)) {
      r->done = 1;
      lt_flight_set_state(r->seq_slot, LT_COMM_DONE);
      continue;
    }
#endif
    if (pending++ == 0) *op = r->op, *group = r->group->name;
  }
  return pending;
}
