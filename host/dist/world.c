/* world.c — the process world: MPI start-up under a launcher (else a singleton),
 * the world group, splits, and what a group knows about itself. */
#include "dist/internal.h"
#include <stdio.h>
#include <stdlib.h>

static bool initialized, mpi_active, we_initialized_mpi;
static int world_rank, world_size = 1, local_rank;
static lt_group *world;
static lt_group **groups; /* every group made (they live until exit) */
static int num_groups, cap_groups;
static void (*at_finalize[4])(void);
static int num_at_finalize;

bool lt_comm_mpi_active(void) { return mpi_active; }

static int env_int(const char *name, int fallback) {
  const char *v = getenv(name);
  return v && *v ? atoi(v) : fallback;
}

/* Started by mpirun (OpenMPI) or srun (Slurm, PMIx or PMI)? A batch script's own shell
 * has SLURM_PROCID but no step: a program run there directly is a singleton. */
static bool launched(void) {
  return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMIX_RANK") || getenv("PMI_RANK") ||
         (getenv("SLURM_PROCID") && getenv("SLURM_STEP_ID"));
}

static lt_group *group_new(const char *name, int rank, int size) {
  if (num_groups == cap_groups) {
    int cap = cap_groups ? 2 * cap_groups : 16;
    lt_group **more = realloc(groups, (size_t)cap * sizeof *more);
    if (!more) {
      lt_errorf("comm.split: out of memory");
      return NULL;
    }
    groups = more, cap_groups = cap;
  }
  lt_group *g = calloc(1, sizeof *g);
  int *ranks = calloc((size_t)size, sizeof *ranks);
  if (!g || !ranks) {
    free(g), free(ranks);
    lt_errorf("comm.split: out of memory");
    return NULL;
  }
  snprintf(g->name, sizeof g->name, "%s", name && *name ? name : "group");
  g->rank = rank, g->size = size, g->world_ranks = ranks;
#ifdef LUTRA_HAVE_MPI
  g->comm = MPI_COMM_NULL;
#endif
  groups[num_groups++] = g;
  return g;
}

/* At exit (on_exit, which sees the status): MPI_Finalize after a clean run. After a
 * failure the other ranks may wait in a collective that this rank will never join, and
 * MPI_Finalize would wait for them: the rank ends without it and mpirun ends the job. So it
 * does when requests posted and never waited for are still in flight (an error caught
 * between post and wait): point-to-point ones are cancelled first (lt_request_settle). */
static void finalize(int status, void *arg) {
  (void)arg;
  if (status != 0) return;
  for (int i = num_at_finalize - 1; i >= 0; i--) at_finalize[i]();
#ifdef LUTRA_HAVE_MPI
  if (!we_initialized_mpi) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  const char *op, *group;
  int pending = lt_request_settle(&op, &group);
  if (pending > 0) { /* MPI_Finalize would wait for them (or crash): leave without it */
    fprintf(stderr,
            "lutra: rank %d: %d communication request%s still in flight at exit (the first: %s on group %s); "
            "exiting without MPI_Finalize\n",
            world_rank, pending, pending == 1 ? "" : "s", op, group);
    return;
  }
  for (int i = 0; i < num_groups; i++)
    if (groups[i]->comm != MPI_COMM_NULL && groups[i]->comm != MPI_COMM_WORLD) MPI_Comm_free(&groups[i]->comm);
  lt_mpi_types_free();
  MPI_Finalize();
#endif
}

int lt_comm_at_finalize(void (*fn)(void)) {
  if (num_at_finalize == (int)(sizeof at_finalize / sizeof at_finalize[0]))
    return lt_errorf("comm: too many finalize steps registered");
  at_finalize[num_at_finalize++] = fn;
  return 0;
}

int lt_comm_init(void) {
  if (initialized) return 0;
  world_rank = 0, world_size = 1, local_rank = 0;
  if (launched()) {
#ifdef LUTRA_HAVE_MPI
    int already = 0;
    MPI_Initialized(&already);
    if (!already) {
      int provided = 0;
      if (MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
        return lt_errorf("comm.init: MPI_Init_thread failed");
      we_initialized_mpi = true;
    }
    mpi_active = true;
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world_size);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    local_rank = env_int("OMPI_COMM_WORLD_LOCAL_RANK", env_int("SLURM_LOCALID", env_int("MPI_LOCALRANKID", 0)));
#else
    /* A launcher without MPI in the build: every process would think it is rank 0. */
    if (env_int("OMPI_COMM_WORLD_SIZE", env_int("SLURM_NTASKS", 1)) > 1)
      return lt_errorf("comm.init: started by a launcher with several ranks, but lutra was built without MPI");
#endif
  }
  world = group_new("world", world_rank, world_size);
  if (!world) return -1;
  for (int i = 0; i < world_size; i++) world->world_ranks[i] = i;
#ifdef LUTRA_HAVE_MPI
  if (mpi_active) world->comm = MPI_COMM_WORLD;
#endif
  initialized = true;
  on_exit(finalize, NULL);
  if (mpi_active && lt_watchdog_start(world_rank) != 0) return -1;
  return 0;
}

int lt_comm_ensure_init(const char *op) {
  if (initialized) return 0;
  if (lt_comm_init() != 0) return lt_errorf("%s: %s", op, lt_last_error());
  return 0;
}

int lt_comm_initialized(void) { return initialized; }
int lt_comm_uses_mpi(void) { return mpi_active; }
int lt_comm_rank(void) { return world_rank; }
int lt_comm_size(void) { return world_size; }
int lt_comm_local_rank(void) { return local_rank; }

int lt_comm_progress(void) {
#ifdef LUTRA_HAVE_MPI
  if (mpi_active) { /* any MPI call runs OpenMPI's progress engine; a probe is the cheapest */
    int flag = 0;
    MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &flag, MPI_STATUS_IGNORE);
  }
#endif
  return 0;
}

int lt_comm_world(lt_group **out) {
  if (!out) return lt_errorf("comm.world: out is NULL");
  LT_TRY(lt_comm_ensure_init("comm.world"));
  *out = world;
  return 0;
}

int lt_comm_check_group(const char *op, const lt_group *g) {
  if (!g) return lt_errorf("%s: group is NULL", op);
  return lt_comm_ensure_init(op);
}

int lt_comm_split(lt_group **out, lt_group *parent, int color, int key, const char *name) {
  if (!out) return lt_errorf("comm.split: out is NULL");
  *out = NULL;
  LT_TRY(lt_comm_check_group("comm.split", parent));
  if (name && strlen(name) >= LT_GROUP_NAME)
    return lt_errorf("comm.split: name '%s' is longer than %d bytes", name, LT_GROUP_NAME - 1);
  if (!mpi_active) {
    if (color < 0) return 0;
    lt_group *g = group_new(name, 0, 1);
    if (!g) return -1;
    g->world_ranks[0] = world_rank;
    *out = g;
    return 0;
  }
#ifdef LUTRA_HAVE_MPI
  int64_t seq = ++parent->seq;
  int64_t slot = lt_flight_begin("split", parent, seq, LT_I32, 1, 0, NULL, -1, LT_COMM_WAITING);
  MPI_Comm comm = MPI_COMM_NULL;
  int rc = MPI_Comm_split(parent->comm, color < 0 ? MPI_UNDEFINED : color, key, &comm);
  lt_flight_set_state(slot, rc == MPI_SUCCESS ? LT_COMM_DONE : LT_COMM_FAILED);
  if (rc != MPI_SUCCESS) return lt_errorf("comm.split: MPI_Comm_split failed on group %s", parent->name);
  if (comm == MPI_COMM_NULL) return 0;
  int rank, size;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  lt_group *g = group_new(name, rank, size);
  if (!g) {
    MPI_Comm_free(&comm);
    return -1;
  }
  g->comm = comm;
  MPI_Allgather(&world_rank, 1, MPI_INT, g->world_ranks, 1, MPI_INT, comm);
  *out = g;
  return 0;
#else
  return lt_errorf("comm.split: built without MPI");
#endif
}

const char *lt_comm_group_name(const lt_group *g) { return g ? g->name : "?"; }
int lt_comm_group_rank(const lt_group *g) { return g ? g->rank : -1; }
int lt_comm_group_size(const lt_group *g) { return g ? g->size : 0; }

int lt_comm_group_ranks(const lt_group *g, int *world_ranks) {
  if (!g || !world_ranks) return lt_errorf("comm.group_ranks: group or buffer is NULL");
  memcpy(world_ranks, g->world_ranks, (size_t)g->size * sizeof *world_ranks);
  return 0;
}
