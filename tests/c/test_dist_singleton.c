/* test_dist_singleton.c — the comm C API without a launcher: a world of one, local
 * collectives, the flight recorder, and bad arguments (NULLs, ranges) as clean errors. */
#include "check.h"
#include <stdlib.h>

static lt_tensor *filled(int64_t n, int dtype, double base) {
  lt_tensor *t = lt_tensor_new();
  lt_empty(t, 1, &n, dtype, LT_DEVICE_CPU);
  for (int64_t i = 0; i < n; i++) lt_set_at(t, &i, base + (double)i);
  return t;
}

int main(void) {
  /* ctest runs this without mpirun; a launcher's variables would make it a rank */
  unsetenv("OMPI_COMM_WORLD_SIZE"), unsetenv("PMIX_RANK"), unsetenv("SLURM_PROCID"), unsetenv("PMI_RANK");
  CHECK_OK(lt_comm_init());
  CHECK_OK(lt_comm_init()); /* idempotent */
  CHECK(lt_comm_initialized() == 1 && lt_comm_uses_mpi() == 0, "singleton");
  CHECK(lt_comm_rank() == 0 && lt_comm_size() == 1 && lt_comm_local_rank() == 0, "world of one");
  lt_group *world = NULL;
  CHECK_OK(lt_comm_world(&world));
  CHECK(world && lt_comm_group_size(world) == 1 && lt_comm_group_rank(world) == 0, "world group");
  CHECK(strcmp(lt_comm_group_name(world), "world") == 0, "name %s", lt_comm_group_name(world));

  /* collectives are local: values unchanged, gathers and scatters copy */
  for (int dtype = 0; dtype < LT_BOOL; dtype++) {
    lt_tensor *t = filled(5, dtype, 1);
    CHECK_OK(lt_comm_all_reduce(world, t, LT_COMM_MAX, NULL));
    CHECK_OK(lt_comm_broadcast(world, t, 0, NULL));
    lt_tensor *out = lt_tensor_new();
    CHECK_OK(lt_comm_all_gather(world, out, t, NULL, NULL));
    CHECK(lt_numel(out) == 5 && out->ndim == 2 && check_at(out, 4) == 5, "all_gather %s", lt_dtype_name(dtype));
    lt_tensor *rs = lt_tensor_new();
    int64_t counts[1] = {5};
    CHECK_OK(lt_comm_reduce_scatter(world, rs, t, LT_COMM_SUM, counts, NULL));
    CHECK(lt_numel(rs) == 5 && check_at(rs, 2) == 3, "reduce_scatter %s", lt_dtype_name(dtype));
    lt_release(t), lt_release(out), lt_release(rs);
  }

  /* async: already done, wait frees */
  lt_tensor *t = filled(3, LT_F32, 0);
  lt_comm_request *req = NULL;
  int done = 0;
  CHECK_OK(lt_comm_all_reduce(world, t, LT_COMM_AVG, &req));
  CHECK_OK(lt_comm_test(req, &done));
  CHECK(done == 1, "a singleton request is done at once");
  CHECK_OK(lt_comm_wait(req));
  CHECK_OK(lt_comm_barrier(world, NULL));

  /* p2p with oneself */
  lt_tensor *got = lt_tensor_new();
  int64_t three = 3;
  lt_empty(got, 1, &three, LT_F32, LT_DEVICE_CPU);
  int kinds[2] = {LT_COMM_SEND, LT_COMM_RECV}, peers[2] = {0, 0};
  lt_tensor *items[2] = {t, got};
  CHECK_OK(lt_comm_p2p(world, 2, kinds, items, peers, 0, NULL));
  CHECK(check_at(got, 2) == 2, "p2p to self");

  /* split */
  lt_group *g = NULL;
  CHECK_OK(lt_comm_split(&g, world, 0, 0, "solo"));
  CHECK(g && lt_comm_group_size(g) == 1 && strcmp(lt_comm_group_name(g), "solo") == 0, "split");
  CHECK_OK(lt_comm_split(&g, world, -1, 0, "none"));
  CHECK(g == NULL, "color < 0 gives no group");

  /* flight recorder */
  lt_comm_record rec[4];
  int count = 0;
  CHECK_OK(lt_comm_recent(4, rec, &count));
  CHECK(count == 4 && strcmp(rec[3].op, "p2p") == 0 && rec[3].state == LT_COMM_DONE, "recent: %s", rec[3].op);
  CHECK(rec[1].seq + 1 == rec[2].seq, "seq increases");

  /* bad arguments */
  CHECK_ERR(lt_comm_all_reduce(NULL, t, LT_COMM_SUM, NULL), "group is NULL");
  CHECK_ERR(lt_comm_all_reduce(world, NULL, LT_COMM_SUM, NULL), "t is NULL");
  CHECK_ERR(lt_comm_all_reduce(world, t, 9, NULL), "unknown reduction op 9");
  lt_tensor *undefined = lt_tensor_new();
  CHECK_ERR(lt_comm_broadcast(world, undefined, 0, NULL), "t is undefined");
  CHECK_ERR(lt_comm_broadcast(world, t, -1, NULL), "root -1 is out of range");
  CHECK_ERR(lt_comm_send(world, t, 1, 0, NULL), "peer 1 is out of range");
  CHECK_ERR(lt_comm_recv(world, t, 0, 40000, NULL), "tag 40000 is out of range");
  CHECK_ERR(lt_comm_all_gather(world, NULL, t, NULL, NULL), "out is NULL");
  int64_t bad_counts[1] = {2};
  CHECK_ERR(lt_comm_all_gather(world, got, t, bad_counts, NULL), "but counts[0] = 2");
  CHECK_ERR(lt_comm_reduce_scatter(world, got, t, LT_COMM_SUM, bad_counts, NULL), "counts sum to 2");
  CHECK_ERR(lt_comm_p2p(world, 1, NULL, items, peers, 0, NULL), "bad list");
  int recv_only[1] = {LT_COMM_RECV};
  CHECK_ERR(lt_comm_p2p(world, 1, recv_only, items, peers, 0, NULL), "has no matching send");
  CHECK_ERR(lt_comm_wait(NULL), "request is NULL");
  CHECK_ERR(lt_comm_test(NULL, &done), "request or done is NULL");
  CHECK_ERR(lt_comm_recent(-1, rec, &count), "n must be >= 0");
  CHECK_ERR(lt_comm_split(NULL, world, 0, 0, "x"), "out is NULL");
  CHECK_ERR(lt_comm_split(&g, world, 0, 0, "a name that is much too long for a group"), "longer than 31 bytes");
  CHECK_ERR(lt_comm_world(NULL), "out is NULL");
  CHECK_ERR(lt_comm_group_ranks(NULL, NULL), "NULL");
  lt_tensor *boolean = lt_tensor_new();
  lt_empty(boolean, 1, &three, LT_BOOL, LT_DEVICE_CPU);
  CHECK_ERR(lt_comm_all_reduce(world, boolean, LT_COMM_SUM, NULL), "unsupported dtype");
  lt_tensor *ints = filled(3, LT_I32, 0);
  CHECK_ERR(lt_comm_all_reduce(world, ints, LT_COMM_AVG, NULL), "avg needs a floating dtype, got i32");

  /* the watchdog's settings */
  CHECK_OK(lt_comm_set_timeout(7));
  CHECK(lt_comm_timeout() == 7, "timeout");
  CHECK_OK(lt_comm_hold(1));
  CHECK_OK(lt_comm_hold(0));
  CHECK_OK(lt_comm_set_debug(1));
  CHECK(lt_comm_debug() == 1, "debug on");
  CHECK_OK(lt_comm_all_reduce(world, t, LT_COMM_SUM, NULL)); /* debug mode in a singleton: no exchange */
  CHECK_OK(lt_comm_set_debug(0));

  lt_release(t), lt_release(got), lt_release(undefined), lt_release(boolean), lt_release(ints);
  return check_summary();
}
