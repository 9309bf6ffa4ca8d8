/* watchdog.c — the flight recorder (the last collectives of this rank) and the
 * watchdog thread that ends the process, with a report, when a wait lasts too long.
 *
 * The main thread records each call (begin, state changes); the entry in state "waiting"
 * is the wait in progress, which the watchdog thread, waking a few times a second, looks at.
 * Both sides take one mutex: uncontended, it costs tens of nanoseconds per call. */
#include "dist/internal.h"
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

enum { RING = 64, REPORT_LAST = 16, WATCHDOG_EXIT = 3 };

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
/* A recorded call. op is a static string and groups live until exit, so pointers do. */
typedef struct flight_entry {
  int64_t index; /* the global index of the entry in this slot */
  int64_t seq, count;
  double start, end;
  int32_t dtype, state, peer, ndim; /* ndim -1: shape unknown, show [count] */
  int64_t shape[LT_MAX_DIMS];
  const char *op;
  const lt_group *group;
} flight_entry;

static flight_entry ring[RING];
static int64_t next_index;   /* entries recorded so far */
static int64_t watched = -1; /* index of the entry being waited for, -1 when none */
static double watch_since;
static double timeout_s = -1; /* < 0: not read from the environment yet */
static int hold_depth;
static bool watchdog_running; /* only under MPI: a singleton has nobody to wait for */
static int watchdog_rank;

/* Seconds on the coarse monotonic clock (a few ms resolution, several times cheaper than
 * lt_wall_time): two reads per call, and the watchdog counts whole seconds. */
static double coarse_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double timeout_locked(void) {
  if (timeout_s < 0) {
    const char *v = getenv("LUTRA_COMM_TIMEOUT");
    timeout_s = v && *v ? atof(v) : 600.0;
  }
  return timeout_s;
}

int64_t lt_flight_begin(const char *op, const lt_group *g, int64_t seq, int dtype, int64_t count, int ndim,
                        const int64_t *shape, int peer, int state) {
  /* plain stores only (no formatting): this runs before every call */
  double now = coarse_now();
  if (!shape || ndim < 0 || ndim > LT_MAX_DIMS) ndim = -1;
  pthread_mutex_lock(&lock);
  int64_t index = next_index++;
  flight_entry *e = &ring[index % RING];
  e->index = index, e->seq = seq, e->count = count, e->start = now, e->end = 0;
  e->dtype = dtype, e->state = state, e->peer = peer, e->ndim = ndim, e->op = op, e->group = g;
  if (ndim > 0) memcpy(e->shape, shape, (size_t)ndim * sizeof *shape);
  if (state == LT_COMM_WAITING) watched = index, watch_since = now;
  pthread_mutex_unlock(&lock);
  return index;
}

void lt_flight_set_state(int64_t index, int state) {
  double now = coarse_now();
  pthread_mutex_lock(&lock);
  if (index >= 0 && ring[index % RING].index == index) {
    flight_entry *r = &ring[index % RING];
    r->state = state;
    if (state == LT_COMM_DONE || state == LT_COMM_FAILED) r->end = now;
  }
  if (state == LT_COMM_WAITING)
    watched = index, watch_since = now;
  else if (watched == index)
    watched = -1;
  pthread_mutex_unlock(&lock);
}

// The public form of an entry (formatted strings).
static void to_record(lt_comm_record *r, const flight_entry *e) {
  memset(r, 0, sizeof *r);
  r->seq = e->seq, r->count = e->count, r->start = e->start, r->end = e->end;
  r->dtype = e->dtype, r->state = e->state, r->peer = e->peer;
  snprintf(r->op, sizeof r->op, "%s", e->op ? e->op : "?");
  snprintf(r->group, sizeof r->group, "%s", e->group ? e->group->name : "?");
  char buf[LT_SHAPE_STR];
  if (e->ndim >= 0)
    lt_shape_str(buf, e->ndim, e->shape);
  else
    snprintf(buf, sizeof buf, "[%lld]", (long long)e->count);
  snprintf(r->shape, sizeof r->shape, "%.63s", buf);
}

static const char *state_name(int state) {
  static const char *const names[] = {"posted", "waiting", "done", "failed"};
  return state >= 0 && state < 4 ? names[state] : "?";
}

static void format_record(char *buf, size_t len, const lt_comm_record *r, double now) {
  double age = (r->end > 0 ? r->end : now) - r->start;
  char peer[32] = "";
  if (r->peer >= 0) snprintf(peer, sizeof peer, ", peer/root %d", r->peer);
  snprintf(buf, len, "seq %lld %s on group %s (%s, %s%s) %s, %.3f s%s", (long long)r->seq, r->op, r->group,
           lt_dtype_name(r->dtype), r->shape, peer, state_name(r->state), age, r->end > 0 ? "" : " so far");
}

// Called with the lock held: prints the timed-out wait and the last records, then exits.
static void report_and_exit(const lt_comm_record *w, double waited) {
  int rank = watchdog_rank;
  double now = coarse_now();
  fprintf(stderr,
          "lutra watchdog: rank %d: %s on group %s (seq %lld, %s, %s) has not completed after %.0f s "
          "(LUTRA_COMM_TIMEOUT=%g)\n",
          rank, w->op, w->group, (long long)w->seq, lt_dtype_name(w->dtype), w->shape, waited, timeout_s);
  if (w->peer >= 0 && (!strcmp(w->op, "p2p") || !strcmp(w->op, "send") || !strcmp(w->op, "recv")))
    fprintf(stderr, "lutra watchdog: rank %d: the pending %s is with rank %d of group %s%s\n", rank, w->op, w->peer,
            w->group, strcmp(w->op, "p2p") ? "" : " (the batch's first item)");
  int64_t first = next_index > REPORT_LAST ? next_index - REPORT_LAST : 0;
  fprintf(stderr, "lutra watchdog: rank %d: last %lld collectives, oldest first:\n", rank,
          (long long)(next_index - first));
  for (int64_t i = first; i < next_index; i++) {
    char line[256];
    lt_comm_record r;
    to_record(&r, &ring[i % RING]);
    format_record(line, sizeof line, &r, now);
    fprintf(stderr, "lutra watchdog: rank %d:   %s\n", rank, line);
  }
  fflush(stderr);
  _exit(WATCHDOG_EXIT);
}

/* The hold file: env LUTRA_HOLD_FILE, else one per job in /tmp (mpirun's PMIx namespace
 * or Slurm's job and step ids; ranks on other nodes see it only on a shared /tmp). */
static const char *hold_path(void) {
  static char path[256];
  static bool known;
  if (known) return path[0] ? path : NULL;
  known = true;
  const char *given = getenv("LUTRA_HOLD_FILE"), *ns = getenv("PMIX_NAMESPACE"), *job = getenv("SLURM_JOB_ID");
  const char *step = getenv("SLURM_STEP_ID");
  char id[160] = "";
  if (given && *given)
    snprintf(path, sizeof path, "%s", given);
  else if (ns && *ns)
    snprintf(id, sizeof id, "%s", ns);
  else if (job && *job)
    snprintf(id, sizeof id, "slurm-%s-%s", job, step ? step : "0");
  if (id[0]) {
    for (char *c = id; *c; c++) /* one plain file name */
      if (*c == '/' || *c == ' ') *c = '_';
    snprintf(path, sizeof path, "/tmp/lutra-hold-%s", id);
  }
  return path[0] ? path : NULL;
}

/* Held while the hold file exists, or any rank's own one (PATH.<rank>, made by comm.hold): a
 * rank leaving its hold must not end another's. Scanned only once a wait is past its timeout. */
static bool hold_file_exists(void) {
  const char *path = hold_path();
  struct stat st;
  if (!path) return false;
  if (stat(path, &st) == 0) return true;
  char dir[PATH_MAX];
  snprintf(dir, sizeof dir, "%s", path);
  char *slash = strrchr(dir, '/');
  const char *base = slash ? slash + 1 : path;
  if (slash) *slash = 0;
  size_t n = strlen(base);
  DIR *d = opendir(slash ? (dir[0] ? dir : "/") : ".");
  if (!d) return false;
  bool found = false;
  for (struct dirent *e; !found && (e = readdir(d)) != NULL;)
    found = strncmp(e->d_name, base, n) == 0 && e->d_name[n] == '.';
  closedir(d);
  return found;
}

static void *watchdog_main(void *arg) {
  (void)arg;
  int64_t held_for = -1; /* the wait for which "held" was printed */
  for (;;) {
    usleep(200 * 1000);
    pthread_mutex_lock(&lock);
    double limit = timeout_locked(), now = coarse_now();
    if (watched < 0 || limit <= 0 || hold_depth > 0 || now - watch_since <= limit) {
      pthread_mutex_unlock(&lock);
      continue;
    }
    lt_comm_record w;
    to_record(&w, &ring[watched % RING]);
    int64_t this_wait = watched;
    double waited = now - watch_since;
    if (hold_file_exists()) {
      /* another rank is in a debugger: wait on, and count the timeout from when it ends */
      watch_since = now;
      pthread_mutex_unlock(&lock);
      if (held_for != this_wait) {
        fprintf(stderr, "lutra watchdog: rank %d: held: %s on group %s (seq %lld) waits while %s exists\n",
                watchdog_rank, w.op, w.group, (long long)w.seq, hold_path());
        fflush(stderr);
        held_for = this_wait;
      }
      continue;
    }
    report_and_exit(&w, waited);
  }
  return NULL;
}

int lt_watchdog_start(int rank) {
  if (watchdog_running) return 0;
  watchdog_rank = rank;
  pthread_t thread;
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  int rc = pthread_create(&thread, &attr, watchdog_main, NULL);
  pthread_attr_destroy(&attr);
  if (rc != 0) return lt_errorf("comm.init: cannot start the watchdog thread (%s)", strerror(rc));
  watchdog_running = true;
  return 0;
}

int lt_comm_set_timeout(double seconds) {
  pthread_mutex_lock(&lock);
  timeout_s = seconds > 0 ? seconds : 0;
  pthread_mutex_unlock(&lock);
  return 0;
}

double lt_comm_timeout(void) {
  pthread_mutex_lock(&lock);
  double t = timeout_locked();
  pthread_mutex_unlock(&lock);
  return t;
}

int lt_comm_hold(int hold) {
  const char *path = watchdog_running ? hold_path() : NULL; /* a singleton has nobody to hold */
  pthread_mutex_lock(&lock);
  int before = hold_depth;
  hold_depth = hold ? hold_depth + 1 : (hold_depth > 0 ? hold_depth - 1 : 0);
  int after = hold_depth;
  if (after == 0) watch_since = coarse_now();
  pthread_mutex_unlock(&lock);
  char own[PATH_MAX]; /* this rank's hold file: PATH.<rank> */
  if (path && *path) snprintf(own, sizeof own, "%s.%d", path, watchdog_rank);
  if (path && *path && before == 0 && after > 0) {
    FILE *f = fopen(own, "w");
    if (!f) {
      int err = errno;
      pthread_mutex_lock(&lock);
      hold_depth--; /* not held after all */
      pthread_mutex_unlock(&lock);
      return lt_errorf("comm.hold: cannot create the hold file %s: %s", own, strerror(err));
    }
    fprintf(f, "rank %d\n", watchdog_rank);
    fclose(f);
  } else if (path && *path && before > 0 && after == 0) {
    remove(own);
  }
  return 0;
}

int lt_comm_recent(int n, lt_comm_record *out, int *count) {
  if (!out || !count) return lt_errorf("comm.recent: out or count is NULL");
  if (n < 0) return lt_errorf("comm.recent: n must be >= 0, got %d", n);
  pthread_mutex_lock(&lock);
  int64_t have = next_index < RING ? next_index : RING;
  if (n > have) n = (int)have;
  for (int i = 0; i < n; i++) to_record(&out[i], &ring[(next_index - n + i) % RING]);
  pthread_mutex_unlock(&lock);
  *count = n;
  return 0;
}
