/* dist.h — the C API, part: process groups and collectives.
 * Include lutra.h, which includes every part in order (and cmake/gen_cdef.awk follows the
 * same order into the one ffi.cdef text); the conventions are at the head of lutra.h. */
#ifndef LUTRA_DIST_H
#define LUTRA_DIST_H

/* ---- distributed: process groups and collectives (host/dist_*.c) ----------------
 * Ranks are processes started by mpirun or srun (OpenMPI): lt_comm_init calls
 * MPI_Init_thread there. Without a launcher (or in a build without MPI) the process
 * is a singleton: a world of one rank, no MPI at all; collectives are local copies.
 * A group is an MPI communicator for CPU tensors (and an NCCL communicator, made at
 * its first CUDA collective, for CUDA tensors). Group ranks are 0-based indices in
 * the group. Tensors must be contiguous and of one dtype across the group. Over MPI,
 * all_reduce and broadcast take any count (in pieces of at most 2^31-1 elements); the
 * other calls take at most 2^31-1 elements per rank's piece (MPI's int counts).
 * Passing req == NULL waits for the result; else *req receives a request that
 * lt_comm_wait (or lt_comm_test until done) completes and frees; the tensors are
 * retained until then. Every call is recorded in a per-rank flight recorder, and a
 * watchdog thread ends the process (status 3) with a report on stderr when a wait
 * lasts longer than the timeout (env LUTRA_COMM_TIMEOUT, default 600 s). */

typedef struct lt_group lt_group;               /* opaque, lives until exit */
typedef struct lt_comm_request lt_comm_request; /* opaque async handle */

typedef enum lt_comm_op { LT_COMM_SUM = 0, LT_COMM_AVG, LT_COMM_MAX, LT_COMM_MIN, LT_NUM_COMM_OPS } lt_comm_op;
typedef enum lt_comm_state { LT_COMM_POSTED = 0, LT_COMM_WAITING, LT_COMM_DONE, LT_COMM_FAILED } lt_comm_state;
enum { LT_COMM_SEND = 0, LT_COMM_RECV = 1 }; /* kinds in lt_comm_p2p */

/* One flight-recorder entry. start/end: seconds on a coarse monotonic clock (ms resolution;
 * end 0 while pending). */
typedef struct lt_comm_record {
  int64_t seq;   /* per group, from 1 */
  int64_t count; /* elements */
  double start;
  double end;
  int32_t dtype;
  int32_t state; /* lt_comm_state */
  int32_t peer;  /* root or peer (group rank), -1 when none */
  int32_t pad_;
  char op[24];
  char group[32];
  char shape[64];
} lt_comm_record;

int lt_comm_init(void); /* idempotent */
int lt_comm_initialized(void);
int lt_comm_uses_mpi(void); /* 1 when running under MPI, 0 as a singleton */
int lt_comm_rank(void);
int lt_comm_size(void);
int lt_comm_local_rank(void);
int lt_comm_world(lt_group **out);
/* Collective over parent (every rank calls it in the same order): the ranks of parent
 * with the same color form a group ordered by (key, parent rank). *out is NULL where
 * color < 0. name (up to 31 bytes) is used in messages. */
int lt_comm_split(lt_group **out, lt_group *parent, int color, int key, const char *name);
const char *lt_comm_group_name(const lt_group *g);
int lt_comm_group_rank(const lt_group *g);
int lt_comm_group_size(const lt_group *g);
int lt_comm_group_ranks(const lt_group *g, int *world_ranks); /* fills group-size ints */

/* t is reduced in place over the group; AVG needs a floating dtype; bf16/f16 reduce in f32. */
int lt_comm_all_reduce(lt_group *g, lt_tensor *t, int op, lt_comm_request **req);
/* inp holds the pieces of every rank, rank-major: counts[i] elements for rank i (counts
 * NULL: inp's numel / group size each); out (counts[rank]) gets this rank's reduced piece. */
int lt_comm_reduce_scatter(lt_group *g, lt_tensor *out, const lt_tensor *inp, int op, const int64_t *counts,
                           lt_comm_request **req);
/* out = the inps of every rank, rank-major; counts[i] elements from rank i (NULL: equal). */
int lt_comm_all_gather(lt_group *g, lt_tensor *out, const lt_tensor *inp, const int64_t *counts,
                       lt_comm_request **req);
/* Rows (dim 0) to and from every rank: send_counts[j] rows of inp, in rank order, go to rank j;
 * recv_counts[i] rows from rank i fill out, in rank order. The counts sum to inp's and out's
 * rows; every row has inp's other dims (an undefined out is allocated so). What rank i sends
 * to j must be what j expects from i: debug mode checks it (an error naming both ranks). */
int lt_comm_all_to_all(lt_group *g, lt_tensor *out, const lt_tensor *inp, const int64_t *send_counts,
                       const int64_t *recv_counts, lt_comm_request **req);
int lt_comm_broadcast(lt_group *g, lt_tensor *t, int root, lt_comm_request **req);
int lt_comm_send(lt_group *g, const lt_tensor *t, int peer, int tag, lt_comm_request **req);
int lt_comm_recv(lt_group *g, lt_tensor *t, int peer, int tag, lt_comm_request **req);
/* n sends and receives (kinds[i] LT_COMM_SEND/RECV with peers[i]) posted together. */
int lt_comm_p2p(lt_group *g, int n, const int *kinds, lt_tensor *const *tensors, const int *peers, int tag,
                lt_comm_request **req);
int lt_comm_barrier(lt_group *g, lt_comm_request **req);
int lt_comm_wait(lt_comm_request *req);             /* completes and frees req */
/* Lets MPI advance posted requests (OpenMPI moves nonblocking collectives only inside MPI
 * calls): call it now and then while computing to overlap communication. */
int lt_comm_progress(void);
/* Seconds this process's host has spent blocked in collectives and in waits on requests, since
 * start: a rank that waits least while the others wait is the straggler they wait for. */
int lt_comm_blocked_seconds(double *seconds);
int lt_comm_test(lt_comm_request *req, int *done);  /* done = 1 once complete (still call wait) */

int lt_comm_set_timeout(double seconds); /* watchdog timeout; <= 0 disables it */
double lt_comm_timeout(void);
/* hold != 0 disables this rank's watchdog until a matching hold(0) (nests). While held,
 * the hold file exists (env LUTRA_HOLD_FILE, else /tmp/lutra-hold-<job id>), and the
 * other ranks' watchdogs keep waiting instead of ending the job. */
int lt_comm_hold(int hold);
/* Fingerprint mode: before each collective the group compares (op, dtype, count, root,
 * seq, call site) and every rank fails with the first mismatch. */
int lt_comm_set_debug(int on);
int lt_comm_debug(void);
int lt_comm_set_callsite(const char *where); /* the caller's file:line, for fingerprints */
/* The last n records, oldest first, into out[0 .. n); *count gets how many there were. */
int lt_comm_recent(int n, lt_comm_record *out, int *count);

#endif
