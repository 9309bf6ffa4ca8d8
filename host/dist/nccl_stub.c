/* nccl_stub.c — CUDA tensors in a build without NCCL (host/dist/nccl.cu
 * provides these functions when the build has it). */
#include "dist/internal.h"

#ifndef LUTRA_HAVE_NCCL
static int unavailable(const char *op, lt_comm_request **req) {
  if (req) *req = NULL;
  return lt_errorf("%s: CUDA tensors need NCCL: NCCL is not available in this build", op);
}

int lt_nccl_all_reduce(lt_group *g, lt_tensor *t, int op, lt_comm_request **req) {
  (void)g, (void)t, (void)op;
  return unavailable("all_reduce", req);
}
int lt_nccl_reduce_scatter(lt_group *g, lt_tensor *out, const lt_tensor *inp, int op, const int64_t *counts,
                           lt_comm_request **req) {
  (void)g, (void)out, (void)inp, (void)op, (void)counts;
  return unavailable("reduce_scatter", req);
}
int lt_nccl_all_gather(lt_group *g, lt_tensor *out, const lt_tensor *inp, const int64_t *counts,
                       lt_comm_request **req) {
  (void)g, (void)out, (void)inp, (void)counts;
  return unavailable("all_gather", req);
}
int lt_nccl_broadcast(lt_group *g, lt_tensor *t, int root, lt_comm_request **req) {
  (void)g, (void)t, (void)root;
  return unavailable("broadcast", req);
}
int lt_nccl_all_to_all(lt_group *g, lt_tensor *out, const lt_tensor *inp, const int64_t *send_counts,
                       const int64_t *recv_counts, lt_comm_request **req) {
  (void)g, (void)out, (void)inp, (void)send_counts, (void)recv_counts;
  return unavailable("all_to_all", req);
}
int lt_nccl_p2p(lt_group *g, int n, const int *kinds, lt_tensor *const *tensors, const int *peers,
                lt_comm_request **req) {
  (void)g, (void)n, (void)kinds, (void)tensors, (void)peers;
  return unavailable("p2p", req);
}

#endif
