/* internal.h — what the host/dist_*.c files share: groups, requests, the flight
 * recorder and the watchdog's view of the wait in progress. */
#ifndef LUTRA_DIST_INTERNAL_H
#define LUTRA_DIST_INTERNAL_H
#include "core/internal.h"
#ifdef LUTRA_HAVE_MPI
#include <mpi.h>
#endif

enum { LT_GROUP_NAME = 32 };

struct lt_group {
  char name[LT_GROUP_NAME];
  int rank, size;
  int *world_ranks; /* size entries */
  int64_t seq;      /* collectives and p2p calls made on this group so far */
#ifdef LUTRA_HAVE_MPI
  MPI_Comm comm; /* MPI_COMM_NULL in a singleton */
#endif
  void *nccl; /* lt_nccl_comm, made at the group's first CUDA collective */
};

/* What a request must do once its MPI requests complete. */
struct lt_comm_request {
  int nreq;
  int done;
  int64_t seq_slot; /* the flight-recorder entry's global index */
  const char *op;   /* for messages */
  lt_group *group;
  int nkeep;
  lt_tensor **keep; /* retained until completion */
  lt_tensor *avg;   /* divide by avg_n after completion (AVG) */
  int avg_n;
  int *counts; /* v-collective arrays that MPI reads until completion */
  int *displs;
  /* CUDA path: the event that marks completion on the comm stream, and how to wait for it or
   * test it (set by dist/nccl.cu, so that requests need not know NCCL) */
  void *device_event;
  int (*device_wait)(lt_comm_request *r);
  int (*device_test)(lt_comm_request *r, int *done);
#ifdef LUTRA_HAVE_MPI
  MPI_Request *reqs;
#endif
  lt_comm_request *prev, *next; /* the list of live requests (lt_request_settle) */
};

/* dist/world.c */
int lt_comm_ensure_init(const char *op);
bool lt_comm_mpi_active(void);
int lt_comm_check_group(const char *op, const lt_group *g);
/* fn runs at a clean exit before MPI_Finalize (last registered first): what upper floors
 * (NCCL communicators) must end while MPI still runs. */
int lt_comm_at_finalize(void (*fn)(void));

/* dist/watchdog.c: the flight recorder. begin returns the global index of the entry.
 * The watchdog watches the entry in state LT_COMM_WAITING (one at a time: the wait in
 * progress) until its state becomes DONE or FAILED. */
int64_t lt_flight_begin(const char *op, const lt_group *g, int64_t seq, int dtype, int64_t count, int ndim,
                        const int64_t *shape, int peer, int state);
void lt_flight_set_state(int64_t index, int state);
/* Starts the watchdog thread of world rank `rank` (its reports and hold files name it). */
int lt_watchdog_start(int rank);
/* Debug mode: compares the call's fingerprint across g; -1 with the mismatch message. */
int lt_fingerprint_check(lt_group *g, const char *op, int dtype, int64_t count, int ndim, const int64_t *shape,
                         int peer, int64_t seq);
/* Debug mode, all_to_all: what each rank sends to each equals what that one expects from it;
 * else -1 on every rank, naming the first pair (sender, receiver) that differs and both counts. */
int lt_exchange_check(lt_group *g, const char *op, const int64_t *send, const int64_t *recv, int64_t seq);

/* dist/mpi_types.c */
#ifdef LUTRA_HAVE_MPI
int lt_mpi_datatype(const char *op, int dtype, MPI_Datatype *out);
int lt_mpi_op(const char *op, int reduce, int dtype, MPI_Op *out);
void lt_mpi_types_free(void);
#endif
int lt_comm_check_op(const char *opname, int op, int dtype);
/* t (contiguous) *= 1 / n, in t's dtype (bf16/f16 through f32). */
void lt_comm_scale(lt_tensor *t, int n);

/* dist/request.c */
lt_comm_request *lt_request_new(const char *op, lt_group *g, int nreq, int64_t slot);
lt_tensor *lt_request_keep(lt_comm_request *r, lt_tensor *t); /* a view holding t's storage */
void lt_request_free(lt_comm_request *r);
/* At a clean exit, before MPI_Finalize (which must not run with communication pending): the
 * requests never waited for (an error raised and caught between post and wait, a dropped
 * handle) are finished when complete, cancelled when point-to-point (a nonblocking collective
 * cannot be); returns how many are still in flight, and the first one's op and group. */
int lt_request_settle(const char **op, const char **group);
/* Waits for r (watched), finishes it (AVG scaling, flight state) and frees it. */
int lt_request_complete(lt_comm_request *r);

/* host/dist/nccl.cu (CUDA builds with NCCL), else the stubs in dist/nccl_stub.c */
int lt_nccl_all_reduce(lt_group *g, lt_tensor *t, int op, lt_comm_request **req);
int lt_nccl_reduce_scatter(lt_group *g, lt_tensor *out, const lt_tensor *inp, int op, const int64_t *counts,
                           lt_comm_request **req);
int lt_nccl_all_gather(lt_group *g, lt_tensor *out, const lt_tensor *inp, const int64_t *counts, lt_comm_request **req);
int lt_nccl_broadcast(lt_group *g, lt_tensor *t, int root, lt_comm_request **req);
int lt_nccl_all_to_all(lt_group *g, lt_tensor *out, const lt_tensor *inp, const int64_t *send_counts,
                       const int64_t *recv_counts, lt_comm_request **req);
int lt_nccl_p2p(lt_group *g, int n, const int *kinds, lt_tensor *const *tensors, const int *peers,
                lt_comm_request **req);

/* The host's time blocked in collectives and waits (main thread only): call.c and request.c
 * add to it, lt_comm_blocked_seconds reads it. */
double lt_comm_clock(void);
void lt_comm_add_blocked(double seconds);

#endif
