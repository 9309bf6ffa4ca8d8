/* p2p.c — send, recv and batches of them posted together (pipeline stages). */
#include "dist/call.h"
#include <stdlib.h>

static int check_peer(const char *op, const lt_group *g, int peer) {
  if (peer < 0 || peer >= g->size)
    return lt_errorf("%s on group %s: peer %d is out of range for a group of %d", op, g->name, peer, g->size);
  return 0;
}

static int check_tag(const char *op, const lt_group *g, int tag) {
  if (tag < 0 || tag > 32766) return lt_errorf("%s on group %s: tag %d is out of range [0, 32766]", op, g->name, tag);
  return 0;
}

// One send or receive, blocking or posted.
static int one(const char *name, int kind, lt_group *g, lt_tensor *t, int peer, int tag, lt_comm_request **req) {
  if (req) *req = NULL;
  LT_TRY(lt_comm_check_group(name, g));
  LT_TRY(lt_comm_check_tensor(name, g, "t", t));
  LT_TRY(check_peer(name, g, peer));
  LT_TRY(check_tag(name, g, tag));
  if (peer == g->rank)
    return lt_errorf("%s on group %s: peer %d is this rank (use p2p to exchange with oneself)", name, g->name, peer);
  if (t->device >= 0) {
    lt_tensor *ts[1] = {t};
    return lt_nccl_p2p(g, 1, &kind, ts, &peer, req);
  }
  int64_t n = lt_numel(t);
  LT_TRY(lt_comm_check_count(name, g, n));
#ifdef LUTRA_HAVE_MPI
  lt_comm_call c;
  LT_TRY(lt_call_begin(&c, name, g, t, n, peer, req != NULL, false));
  MPI_Datatype type;
  if (lt_mpi_datatype(name, t->dtype, &type)) return lt_call_fail(&c);
  void *p = lt_data_ptr(t);
  if (!req) {
    int rc = kind == LT_COMM_SEND ? MPI_Send(p, (int)n, type, peer, tag, g->comm)
                                  : MPI_Recv(p, (int)n, type, peer, tag, g->comm, MPI_STATUS_IGNORE);
    return lt_call_end(&c, rc);
  }
  lt_comm_request *r = lt_call_request(&c, 1);
  if (!r) return -1;
  lt_request_keep(r, t);
  int rc = kind == LT_COMM_SEND ? MPI_Isend(p, (int)n, type, peer, tag, g->comm, r->reqs)
                                : MPI_Irecv(p, (int)n, type, peer, tag, g->comm, r->reqs);
  return lt_call_posted(&c, r, rc, req);
#else
  return lt_errorf("%s on group %s: built without MPI", name, g->name);
#endif
}

int lt_comm_send(lt_group *g, const lt_tensor *t, int peer, int tag, lt_comm_request **req) {
  return one("send", LT_COMM_SEND, g, (lt_tensor *)t, peer, tag, req);
}

int lt_comm_recv(lt_group *g, lt_tensor *t, int peer, int tag, lt_comm_request **req) {
  return one("recv", LT_COMM_RECV, g, t, peer, tag, req);
}

// Exchanges with oneself: the k-th send to self fills the k-th receive from self.
static int self_exchange(lt_group *g, int n, const int *kinds, lt_tensor *const *tensors, const int *peers) {
  int sends = 0, recvs = 0;
  for (int i = 0; i < n; i++)
    if (peers[i] == g->rank) *(kinds[i] == LT_COMM_SEND ? &sends : &recvs) += 1;
  if (sends != recvs)
    return lt_errorf("p2p on group %s: %d sends to this rank but %d receives from it (a %s has no matching %s)",
                     g->name, sends, recvs, sends > recvs ? "send" : "receive", sends > recvs ? "receive" : "send");
  for (int s = 0, r = 0; s < n; s++) {
    if (kinds[s] != LT_COMM_SEND || peers[s] != g->rank) continue;
    while (!(kinds[r] == LT_COMM_RECV && peers[r] == g->rank)) r++;
    char da[LT_DESC_STR], db[LT_DESC_STR];
    if (lt_numel(tensors[r]) != lt_numel(tensors[s]) || tensors[r]->dtype != tensors[s]->dtype)
      return lt_errorf("p2p on group %s: send %s to this rank does not fit its receive %s", g->name,
                       lt_desc(da, tensors[s]), lt_desc(db, tensors[r]));
    LT_TRY(lt_copy_from_buffer(tensors[r], lt_data_ptr(tensors[s]), tensors[s]->dtype, lt_numel(tensors[s])));
    r++;
  }
  return 0;
}

int lt_comm_p2p(lt_group *g, int n, const int *kinds, lt_tensor *const *tensors, const int *peers, int tag,
                lt_comm_request **req) {
  static const char *name = "p2p";
  if (req) *req = NULL;
  LT_TRY(lt_comm_check_group(name, g));
  LT_TRY(check_tag(name, g, tag));
  if (n < 0 || (n > 0 && (!kinds || !tensors || !peers)))
    return lt_errorf("%s on group %s: bad list (n = %d)", name, g->name, n);
  int64_t total = 0;
  int device = LT_DEVICE_CPU;
  for (int i = 0; i < n; i++) {
    if (kinds[i] != LT_COMM_SEND && kinds[i] != LT_COMM_RECV)
      return lt_errorf("%s on group %s: item %d: kind %d is neither send nor recv", name, g->name, i + 1, kinds[i]);
    LT_TRY(lt_comm_check_tensor(name, g, "tensor", tensors[i]));
    LT_TRY(check_peer(name, g, peers[i]));
    if (i > 0 && tensors[i]->device != device)
      return lt_errorf("%s on group %s: item %d is on another device than item 1", name, g->name, i + 1);
    device = tensors[i]->device;
    total += lt_numel(tensors[i]);
    LT_TRY(lt_comm_check_count(name, g, lt_numel(tensors[i])));
  }
  if (device >= 0) return lt_nccl_p2p(g, n, kinds, tensors, peers, req);
  lt_comm_call c;
  LT_TRY(lt_call_begin(&c, name, g, n > 0 ? tensors[0] : NULL, total, n > 0 ? peers[0] : -1, req != NULL, false));
  if (self_exchange(g, n, kinds, tensors, peers) != 0) return lt_call_fail(&c);
  int remote = 0;
  for (int i = 0; i < n; i++) remote += peers[i] != g->rank;
  if (remote == 0 || !lt_comm_mpi_active()) {
    if (remote > 0) return lt_call_fail(&c); /* unreachable: a singleton has only itself */
    return lt_call_local_done(&c, req, NULL);
  }
#ifdef LUTRA_HAVE_MPI
  lt_comm_request *r = lt_call_request(&c, remote);
  if (!r) return -1;
  free(r->keep);
  r->keep = calloc((size_t)n, sizeof *r->keep);
  if (!r->keep) return lt_request_free(r), lt_errorf("%s: out of memory", name), lt_call_fail(&c);
  int posted = 0, rc = MPI_SUCCESS;
  for (int i = 0; i < n && rc == MPI_SUCCESS; i++) {
    if (peers[i] == g->rank) continue;
    MPI_Datatype type;
    if (lt_mpi_datatype(name, tensors[i]->dtype, &type)) return lt_request_free(r), lt_call_fail(&c);
    void *p = lt_data_ptr(tensors[i]);
    int cnt = (int)lt_numel(tensors[i]);
    rc = kinds[i] == LT_COMM_SEND ? MPI_Isend(p, cnt, type, peers[i], tag, g->comm, &r->reqs[posted])
                                  : MPI_Irecv(p, cnt, type, peers[i], tag, g->comm, &r->reqs[posted]);
    lt_request_keep(r, tensors[i]);
    posted++;
  }
  if (req) return lt_call_posted(&c, r, rc, req);
  if (rc != MPI_SUCCESS) return lt_request_free(r), lt_call_end(&c, rc);
  /* blocking: the call's watch is already on; wait here and record the outcome */
  rc = MPI_Waitall(r->nreq, r->reqs, MPI_STATUSES_IGNORE);
  lt_request_free(r);
  return lt_call_end(&c, rc);
#else
  return lt_call_fail(&c);
#endif
}
