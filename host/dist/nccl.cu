/* nccl.cu — collectives on CUDA tensors through NCCL (the lt_nccl_* functions of
 * host/dist/internal.h; host/dist/nccl_stub.c stands in for builds without NCCL).
 *
 * Each group gets, at its first CUDA collective, one NCCL communicator (the unique id
 * made by group rank 0 and broadcast over the group's MPI communicator) and a
 * communication stream on the tensor's device. Point-to-point goes over two-rank
 * communicators made on first use between the pair (the id sent over MPI), so that a
 * send between two stages never needs the rest of the group. A call waits (on the
 * comm stream) for the work queued so far on the compute stream (the legacy default
 * stream the kernels use), runs on the comm stream, and records an event that the
 * request waits for; p2p batches run inside ncclGroupStart/End. */
#ifdef LUTRA_HAVE_MPI
#define OMPI_SKIP_MPICXX 1
#include <mpi.h>
#endif
#include "kernels/common.cuh"

#ifdef LUTRA_HAVE_NCCL
#include <nccl.h>
#include <stdlib.h>
extern "C" {
#include "dist/call.h"
}

enum { NCCL_ID_TAG = 32767 }; /* MPI tag of the pair ids; user tags stay below it */

struct nccl_group {
  int device;
  ncclComm_t comm;    /* the whole group; NULL until its first collective */
  ncclComm_t *pairs;  /* [size]: two-rank communicators with each peer, for p2p */
  cudaStream_t stream;
  nccl_group *next;   /* every state, for the clean-up at exit */
};
static nccl_group *all_states;

static int nccl_fail(const char *op, const lt_group *g, ncclResult_t r) {
  return lt_errorf("%s on group %s: NCCL error: %s", op, g->name, ncclGetErrorString(r));
}

static int cuda_fail(const char *op, int device, cudaError_t err) { return lt_cuda_error(op, device, err); }

static int nccl_type(const char *op, const lt_group *g, int dtype, ncclDataType_t *out) {
  switch (dtype) {
  case LT_F32: *out = ncclFloat32; return 0;
  case LT_F64: *out = ncclFloat64; return 0;
  case LT_BF16: *out = ncclBfloat16; return 0;
  case LT_F16: *out = ncclFloat16; return 0;
  case LT_I32: *out = ncclInt32; return 0;
  case LT_I64: *out = ncclInt64; return 0;
  case LT_U8: *out = ncclUint8; return 0;
  default: return lt_errorf("%s on group %s: dtype %s cannot travel over NCCL", op, g->name, lt_dtype_name(dtype));
  }
}

static ncclRedOp_t nccl_op(int op) {
  return op == LT_COMM_AVG ? ncclAvg : op == LT_COMM_MAX ? ncclMax : op == LT_COMM_MIN ? ncclMin : ncclSum;
}

static void free_all(void);
static int nccl_wait(lt_comm_request *r);
static int nccl_test(lt_comm_request *r, int *done);

// A request completes when `done` fires on the comm stream; requests wait through these.
static void set_event(lt_comm_request *r, cudaEvent_t done) {
  r->device_event = (void *)done;
  r->device_wait = nccl_wait;
  r->device_test = nccl_test;
}

// The group's NCCL state on `device` (made at first use; one device per group).
static nccl_group *state_of(const char *op, lt_group *g, int device) {
  nccl_group *st = (nccl_group *)g->nccl;
  if (st) {
    if (st->device != device) {
      lt_errorf("%s on group %s: tensor on cuda:%d, but the group's NCCL communicator is on cuda:%d", op, g->name,
                device, st->device);
      return NULL;
    }
    return st;
  }
  if (lt_cuda_use_device(op, device) != 0) return NULL;
  if (!all_states && lt_comm_at_finalize(free_all) != 0) return NULL; /* communicators end before MPI */
  st = (nccl_group *)calloc(1, sizeof *st);
  ncclComm_t *pairs = (ncclComm_t *)calloc((size_t)g->size, sizeof *pairs);
  if (!st || !pairs) {
    free(st), free(pairs);
    lt_errorf("%s on group %s: out of memory", op, g->name);
    return NULL;
  }
  cudaError_t err = cudaStreamCreateWithFlags(&st->stream, cudaStreamNonBlocking);
  if (err != cudaSuccess) {
    free(st), free(pairs);
    cuda_fail(op, device, err);
    return NULL;
  }
  st->device = device, st->pairs = pairs, st->next = all_states;
  all_states = st;
  g->nccl = st;
  return st;
}

// The group communicator: rank 0's unique id broadcast over MPI (every rank of g calls this).
static int ensure_comm(const char *op, lt_group *g, nccl_group *st) {
  if (st->comm) return 0;
  ncclUniqueId id;
  if (g->rank == 0) {
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) return nccl_fail(op, g, r);
  }
#ifdef LUTRA_HAVE_MPI
  if (g->size > 1 && MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, g->comm) != MPI_SUCCESS)
    return lt_errorf("%s on group %s: broadcasting the NCCL id over MPI failed", op, g->name);
#endif
  int64_t slot = lt_flight_begin("nccl_init", g, g->seq, LT_U8, 0, 0, NULL, -1, LT_COMM_WAITING); /* watched */
  ncclResult_t r = ncclCommInitRank(&st->comm, g->size, id, g->rank);
  lt_flight_set_state(slot, r == ncclSuccess ? LT_COMM_DONE : LT_COMM_FAILED);
  return r == ncclSuccess ? 0 : nccl_fail(op, g, r);
}

// The two-rank communicator with `peer`: the lower rank makes the id and sends it.
static int ensure_pair(const char *op, lt_group *g, nccl_group *st, int peer) {
  if (st->pairs[peer]) return 0;
  ncclUniqueId id;
#ifdef LUTRA_HAVE_MPI
  if (g->rank < peer) {
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) return nccl_fail(op, g, r);
    if (MPI_Send(&id, (int)sizeof id, MPI_BYTE, peer, NCCL_ID_TAG, g->comm) != MPI_SUCCESS)
      return lt_errorf("%s on group %s: sending the NCCL id to rank %d failed", op, g->name, peer);
  } else if (MPI_Recv(&id, (int)sizeof id, MPI_BYTE, peer, NCCL_ID_TAG, g->comm, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
    return lt_errorf("%s on group %s: receiving the NCCL id from rank %d failed", op, g->name, peer);
  }
#else
  return lt_errorf("%s on group %s: p2p between ranks needs MPI", op, g->name);
#endif
  int64_t slot = lt_flight_begin("nccl_init_pair", g, g->seq, LT_U8, 0, 0, NULL, peer, LT_COMM_WAITING);
  ncclResult_t r = ncclCommInitRank(&st->pairs[peer], 2, id, g->rank < peer ? 0 : 1);
  lt_flight_set_state(slot, r == ncclSuccess ? LT_COMM_DONE : LT_COMM_FAILED);
  return r == ncclSuccess ? 0 : nccl_fail(op, g, r);
}

// The comm stream waits for what the compute stream has queued so far.
static int order_after_compute(const char *op, nccl_group *st) {
  cudaEvent_t ready;
  cudaError_t err = cudaEventCreateWithFlags(&ready, cudaEventDisableTiming);
  if (err == cudaSuccess) err = cudaEventRecord(ready, lt_cuda_compute_stream(st->device));
  if (err == cudaSuccess) err = cudaStreamWaitEvent(st->stream, ready, 0);
  cudaEventDestroy(ready); /* released once the wait is done */
  return err == cudaSuccess ? 0 : cuda_fail(op, st->device, err);
}

// After queueing: an event marks completion; a blocking call waits for it (watched).
static int finish_call(lt_comm_call *c, nccl_group *st, lt_tensor *keep0, const lt_tensor *keep1,
                       lt_comm_request **req) {
  cudaEvent_t done;
  cudaError_t err = cudaEventCreateWithFlags(&done, cudaEventDisableTiming);
  if (err == cudaSuccess) err = cudaEventRecord(done, st->stream);
  if (err != cudaSuccess) return lt_call_fail(c), cuda_fail(c->op, st->device, err);
  lt_comm_request *r = lt_call_request(c, 0);
  if (!r) return cudaEventDestroy(done), -1;
  set_event(r, done);
  if (keep0) lt_request_keep(r, keep0);
  if (keep1) lt_request_keep(r, (lt_tensor *)keep1);
  if (req) {
    *req = r;
    return 0;
  }
  return lt_request_complete(r);
}

static int nccl_wait(lt_comm_request *r) {
  cudaEvent_t done = (cudaEvent_t)r->device_event;
  lt_flight_set_state(r->seq_slot, LT_COMM_WAITING);
  cudaError_t err = cudaEventSynchronize(done);
  if (err == cudaSuccess) /* later compute sees the result */
    err = cudaStreamWaitEvent(lt_cuda_compute_stream(((nccl_group *)r->group->nccl)->device), done, 0);
  cudaEventDestroy(done);
  r->device_event = NULL;
  return err == cudaSuccess ? 0 : lt_errorf("%s on group %s: CUDA error: %s", r->op, r->group->name, cudaGetErrorString(err));
}

static int nccl_test(lt_comm_request *r, int *done) {
  cudaEvent_t ev = (cudaEvent_t)r->device_event;
  cudaError_t err = cudaEventQuery(ev);
  if (err == cudaErrorNotReady) return *done = 0, 0;
  if (err != cudaSuccess) return lt_errorf("%s on group %s: CUDA error: %s", r->op, r->group->name, cudaGetErrorString(err));
  cudaStreamWaitEvent(lt_cuda_compute_stream(((nccl_group *)r->group->nccl)->device), ev, 0);
  cudaEventDestroy(ev);
  r->device_event = NULL;
  *done = 1;
  return 0;
}

// The steps before queueing a collective: state, communicator, ordering, flight record.
static nccl_group *begin(lt_comm_call *c, const char *op, lt_group *g, const lt_tensor *t, int64_t count, int peer) {
  nccl_group *st = state_of(op, g, t->device);
  if (!st || ensure_comm(op, g, st) != 0 || lt_cuda_use_device(op, st->device) != 0) return NULL;
  if (order_after_compute(op, st) != 0) return NULL;
  if (lt_call_begin(c, op, g, t, count, peer, true, true) != 0) return NULL;
  return st;
}

int lt_nccl_all_reduce(lt_group *g, lt_tensor *t, int op, lt_comm_request **req) {
  ncclDataType_t type = ncclFloat32;
  LT_TRY(nccl_type("all_reduce", g, t->dtype, &type));
  lt_comm_call c;
  int64_t n = lt_numel(t);
  nccl_group *st = begin(&c, "all_reduce", g, t, n, -1);
  if (!st) return -1;
  void *p = lt_data_ptr(t);
  ncclResult_t r = ncclAllReduce(p, p, (size_t)n, type, nccl_op(op), st->comm, st->stream);
  if (r != ncclSuccess) return lt_call_fail(&c), nccl_fail("all_reduce", g, r);
  return finish_call(&c, st, t, NULL, req);
}

int lt_nccl_reduce_scatter(lt_group *g, lt_tensor *out, const lt_tensor *inp, int op, const int64_t *counts,
                           lt_comm_request **req) {
  ncclDataType_t type = ncclFloat32;
  LT_TRY(nccl_type("reduce_scatter", g, inp->dtype, &type));
  lt_comm_call c;
  nccl_group *st = begin(&c, "reduce_scatter", g, inp, lt_numel(inp), -1);
  if (!st) return -1;
  const char *src = (const char *)lt_data_ptr(inp);
  void *dst = lt_data_ptr(out);
  int64_t esize = lt_dtype_size(inp->dtype);
  ncclResult_t r;
  if (!counts) {
    r = ncclReduceScatter(src, dst, (size_t)lt_numel(out), type, nccl_op(op), st->comm, st->stream);
  } else { /* uneven pieces: one reduce per piece, rooted at its owner */
    r = ncclGroupStart();
    int64_t displ = 0;
    for (int i = 0; i < g->size && r == ncclSuccess; i++) {
      r = ncclReduce(src + displ * esize, i == g->rank ? dst : NULL, (size_t)counts[i], type, nccl_op(op), i,
                     st->comm, st->stream);
      displ += counts[i];
    }
    ncclResult_t end = ncclGroupEnd();
    if (r == ncclSuccess) r = end;
  }
  if (r != ncclSuccess) return lt_call_fail(&c), nccl_fail("reduce_scatter", g, r);
  return finish_call(&c, st, out, inp, req);
}

int lt_nccl_all_gather(lt_group *g, lt_tensor *out, const lt_tensor *inp, const int64_t *counts,
                       lt_comm_request **req) {
  ncclDataType_t type = ncclFloat32;
  LT_TRY(nccl_type("all_gather", g, inp->dtype, &type));
  lt_comm_call c;
  nccl_group *st = begin(&c, "all_gather", g, out, lt_numel(out), -1);
  if (!st) return -1;
  const void *src = lt_data_ptr(inp);
  char *dst = (char *)lt_data_ptr(out);
  int64_t esize = lt_dtype_size(inp->dtype);
  ncclResult_t r;
  if (!counts) {
    r = ncclAllGather(src, dst, (size_t)lt_numel(inp), type, st->comm, st->stream);
  } else { /* uneven pieces: one broadcast per piece from its owner */
    r = ncclGroupStart();
    int64_t displ = 0;
    for (int i = 0; i < g->size && r == ncclSuccess; i++) {
      r = ncclBroadcast(i == g->rank ? src : dst + displ * esize, dst + displ * esize, (size_t)counts[i], type, i,
                        st->comm, st->stream);
      displ += counts[i];
    }
    ncclResult_t end = ncclGroupEnd();
    if (r == ncclSuccess) r = end;
  }
  if (r != ncclSuccess) return lt_call_fail(&c), nccl_fail("all_gather", g, r);
  return finish_call(&c, st, out, inp, req);
}

int lt_nccl_broadcast(lt_group *g, lt_tensor *t, int root, lt_comm_request **req) {
  ncclDataType_t type = ncclFloat32;
  LT_TRY(nccl_type("broadcast", g, t->dtype, &type));
  lt_comm_call c;
  int64_t n = lt_numel(t);
  nccl_group *st = begin(&c, "broadcast", g, t, n, root);
  if (!st) return -1;
  void *p = lt_data_ptr(t);
  ncclResult_t r = ncclBroadcast(p, p, (size_t)n, type, root, st->comm, st->stream);
  if (r != ncclSuccess) return lt_call_fail(&c), nccl_fail("broadcast", g, r);
  return finish_call(&c, st, t, NULL, req);
}

// Uneven rows to and from every rank: one grouped send and receive per peer (self included,
// which NCCL copies); pairs with no rows either way are left out on both sides alike.
int lt_nccl_all_to_all(lt_group *g, lt_tensor *out, const lt_tensor *inp, const int64_t *send_counts,
                       const int64_t *recv_counts, lt_comm_request **req) {
  static const char *name = "all_to_all";
  ncclDataType_t type = ncclFloat32;
  LT_TRY(nccl_type(name, g, inp->dtype, &type));
  lt_comm_call c;
  nccl_group *st = begin(&c, name, g, inp, lt_numel(inp), -1);
  if (!st) return -1;
  if (lt_exchange_check(g, name, send_counts, recv_counts, c.seq) != 0) return lt_call_fail(&c);
  int64_t row = 1;
  for (int d = 1; d < inp->ndim; d++) row *= inp->shape[d];
  const char *src = (const char *)lt_data_ptr(inp);
  char *dst = (char *)lt_data_ptr(out);
  int64_t bytes_per_row = row * lt_dtype_size(inp->dtype), sent = 0, received = 0;
  ncclResult_t r = ncclGroupStart();
  for (int i = 0; i < g->size && r == ncclSuccess; i++) {
    if (send_counts[i] > 0)
      r = ncclSend(src + sent * bytes_per_row, (size_t)(send_counts[i] * row), type, i, st->comm, st->stream);
    if (r == ncclSuccess && recv_counts[i] > 0)
      r = ncclRecv(dst + received * bytes_per_row, (size_t)(recv_counts[i] * row), type, i, st->comm, st->stream);
    sent += send_counts[i], received += recv_counts[i];
  }
  ncclResult_t end = ncclGroupEnd();
  if (r == ncclSuccess) r = end;
  if (r != ncclSuccess) return lt_call_fail(&c), nccl_fail(name, g, r);
  return finish_call(&c, st, out, inp, req);
}

static int compare_int(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }

int lt_nccl_p2p(lt_group *g, int n, const int *kinds, lt_tensor *const *tensors, const int *peers,
                lt_comm_request **req) {
  static const char *name = "p2p";
  if (n == 0) return lt_errorf("%s on group %s: an empty batch of CUDA tensors", name, g->name);
  nccl_group *st = state_of(name, g, tensors[0]->device);
  if (!st || lt_cuda_use_device(name, st->device) != 0) return -1;
  /* pair communicators first, in ascending peer order on every rank: no cycle of waits */
  int *order = (int *)malloc((size_t)n * sizeof *order);
  if (!order) return lt_errorf("%s: out of memory", name);
  memcpy(order, peers, (size_t)n * sizeof *order);
  qsort(order, (size_t)n, sizeof *order, compare_int);
  for (int i = 0; i < n; i++)
    if (order[i] != g->rank && ensure_pair(name, g, st, order[i]) != 0) return free(order), -1;
  free(order);
  LT_TRY(order_after_compute(name, st));
  int64_t total = 0;
  for (int i = 0; i < n; i++) total += lt_numel(tensors[i]);
  lt_comm_call c;
  LT_TRY(lt_call_begin(&c, name, g, tensors[0], total, peers[0], true, false));
  /* sends to oneself: a device copy into the matching receive, in order */
  for (int s = 0, r = 0; s < n; s++) {
    if (kinds[s] != LT_COMM_SEND || peers[s] != g->rank) continue;
    while (r < n && !(kinds[r] == LT_COMM_RECV && peers[r] == g->rank)) r++;
    if (r == n || lt_numel(tensors[r]) != lt_numel(tensors[s]) || tensors[r]->dtype != tensors[s]->dtype)
      return lt_call_fail(&c), lt_errorf("%s on group %s: a send to this rank has no matching receive", name, g->name);
    cudaError_t err = cudaMemcpyAsync(lt_data_ptr(tensors[r]), lt_data_ptr(tensors[s]),
                                      (size_t)(lt_numel(tensors[s]) * lt_dtype_size(tensors[s]->dtype)),
                                      cudaMemcpyDeviceToDevice, st->stream);
    if (err != cudaSuccess) return lt_call_fail(&c), cuda_fail(name, st->device, err);
    r++;
  }
  ncclResult_t res = ncclGroupStart();
  for (int i = 0; i < n && res == ncclSuccess; i++) {
    if (peers[i] == g->rank) continue;
    ncclDataType_t type = ncclFloat32;
    if (nccl_type(name, g, tensors[i]->dtype, &type) != 0) {
      ncclGroupEnd();
      return lt_call_fail(&c);
    }
    int pair_peer = g->rank < peers[i] ? 1 : 0; /* the peer's rank in the pair communicator */
    size_t count = (size_t)lt_numel(tensors[i]);
    res = kinds[i] == LT_COMM_SEND
              ? ncclSend(lt_data_ptr(tensors[i]), count, type, pair_peer, st->pairs[peers[i]], st->stream)
              : ncclRecv(lt_data_ptr(tensors[i]), count, type, pair_peer, st->pairs[peers[i]], st->stream);
  }
  ncclResult_t end = ncclGroupEnd();
  if (res == ncclSuccess) res = end;
  if (res != ncclSuccess) return lt_call_fail(&c), nccl_fail(name, g, res);
  /* the request keeps every tensor of the batch alive */
  cudaEvent_t done;
  cudaError_t err = cudaEventCreateWithFlags(&done, cudaEventDisableTiming);
  if (err == cudaSuccess) err = cudaEventRecord(done, st->stream);
  if (err != cudaSuccess) return lt_call_fail(&c), cuda_fail(name, st->device, err);
  lt_comm_request *r = lt_call_request(&c, 0);
  if (!r) return cudaEventDestroy(done), -1;
  free(r->keep);
  r->keep = (lt_tensor **)calloc((size_t)n, sizeof *r->keep);
  if (!r->keep) return lt_request_free(r), cudaEventDestroy(done), lt_call_fail(&c);
  for (int i = 0; i < n; i++) lt_request_keep(r, tensors[i]);
  set_event(r, done);
  if (req) return *req = r, 0;
  return lt_request_complete(r);
}

static void free_all(void) {
  for (nccl_group *st = all_states; st; st = st->next) {
    if (st->comm) ncclCommDestroy(st->comm);
    /* pairs: the size is the group's, unknown here; pairs are destroyed with the process */
  }
}

#endif
