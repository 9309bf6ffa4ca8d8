/* ckpt_write.c — writing a checkpoint shard file (lz4 frames through one large output buffer
 * into a temporary beside PATH, then the footer, fsync, rename to PATH: host/io/atomic_file.c) and rank 0's commit of the whole
 * checkpoint directory, on the calling thread or on a background pthread. Every started
 * job is registered and joined at exit. Format and contract: lutra.h ("checkpoint io"). */
#define _GNU_SOURCE
#include "io/ckpt.h"
#include "io/atomic_file.h"
#include "core/internal.h"
#include <errno.h>
#include <lz4frame.h>
#include <omp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

enum { OUT_BUFFER = 16 << 20, ERR_LEN = 1024 };

struct lt_ckpt_job {
  char *path;
  int64_t chunk;
  int level, threads;
  int64_t n, cap;
  const void **data;
  char *owned; /* data[i] is the job's copy */
  int64_t copied;
  atomic_int copies_done; /* the deferred copies (copy == 2) are taken: the sources may change */
  lt_tensor **held;       /* the sources' tensors, retained until their copies are taken */
  int64_t n_held, cap_held;
  int64_t *nbytes;
  lt_ckpt_piece *pieces;
  int64_t n_files, n_remove;
  char **file_paths, **file_data, **remove_paths;
  int64_t *file_bytes;
  /* rank 0's commit */
  int commit, world;
  char *tmp_dir, *final_dir, *manifest, *latest_path, *latest_text;
  double timeout;
  /* running */
  pthread_t thread;
  int started, joined;
  atomic_int done;
  int status;
  char error[ERR_LEN];
  int64_t raw, compressed;
  double seconds;
  struct lt_ckpt_job *next; /* the registry of started, unjoined jobs */
};

static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static lt_ckpt_job *registry;
static int atexit_done;

/* Host buffers of async saves, kept for the next save (the same tensors, the same sizes):
 * copying into pages already touched is several times faster than into fresh malloc'ed
 * ones, and the copy is what the training loop waits for. At most POOL_MAX blocks. */
enum { POOL_MAX = 8192 };
static struct {
  void *ptr;
  int64_t size;
} pool[POOL_MAX];
static int pool_n;
static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;

static void *pool_get(int64_t n) {
  void *p = NULL;
  pthread_mutex_lock(&pool_lock);
  for (int i = pool_n - 1; i >= 0; i--) {
    if (pool[i].size == n) {
      p = pool[i].ptr;
      pool[i] = pool[--pool_n];
      break;
    }
  }
  pthread_mutex_unlock(&pool_lock);
  return p ? p : malloc(n ? (size_t)n : 1);
}

static void pool_put(void *p, int64_t n) {
  pthread_mutex_lock(&pool_lock);
  if (pool_n < POOL_MAX) pool[pool_n].ptr = p, pool[pool_n].size = n, pool_n++, p = NULL;
  pthread_mutex_unlock(&pool_lock);
  free(p);
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static char *dup_str(const char *s) { return s ? strdup(s) : NULL; }

int lt_ckpt_job_new(lt_ckpt_job **out, const char *path, int64_t chunk_bytes, int level) {
  if (!out) return lt_errorf("ckpt: job_new: out is NULL");
  *out = NULL;
  if (!path || !*path) return lt_errorf("ckpt: job_new: path is empty");
  if (level < 0 || level > 12) return lt_errorf("ckpt: job_new: level %d outside [0, 12]", level);
  lt_ckpt_job *j = calloc(1, sizeof *j);
  if (!j || !(j->path = strdup(path))) {
    free(j);
    return lt_errorf("ckpt: job_new: out of memory");
  }
  j->chunk = chunk_bytes > 0 ? chunk_bytes : CKPT_DEFAULT_CHUNK;
  if (j->chunk > ((int64_t)64 << 20)) j->chunk = (int64_t)64 << 20;
  j->chunk = j->chunk < 64 ? 64 : j->chunk & ~(int64_t)7; /* whole elements of any shuffle */
  j->level = level;
  j->threads = 1;
  *out = j;
  return 0;
}

int lt_ckpt_job_add(lt_ckpt_job *j, const void *data, int64_t nbytes, int shuffle, int copy) {
  if (!j || nbytes < 0 || (!data && nbytes > 0)) return lt_errorf("ckpt: job_add: bad arguments");
  if (shuffle < 0 || shuffle > 8 || (shuffle & (shuffle - 1)) != 0 || (shuffle > 1 && nbytes % shuffle != 0))
    return lt_errorf("ckpt: job_add: shuffle %d must be 0, 1, 2, 4 or 8 and divide the %lld bytes", shuffle,
                     (long long)nbytes);
  if (j->started) return lt_errorf("ckpt: job_add: the job already started");
  if (j->n == j->cap) {
    int64_t cap = j->cap ? 2 * j->cap : 64;
    const void **d = realloc(j->data, (size_t)cap * sizeof *d);
    if (d) j->data = d;
    int64_t *b = realloc(j->nbytes, (size_t)cap * sizeof *b);
    if (b) j->nbytes = b;
    lt_ckpt_piece *p = realloc(j->pieces, (size_t)cap * sizeof *p);
    if (p) j->pieces = p;
    char *o = realloc(j->owned, (size_t)cap);
    if (o) j->owned = o;
    if (!d || !b || !p || !o) return lt_errorf("ckpt: job_add: out of memory");
    j->cap = cap;
  }
  j->owned[j->n] = 0;
  if (copy == 2) { /* copied by the job's thread first (lt_ckpt_job_wait_copied fences it) */
    j->owned[j->n] = 2;
    j->copied += nbytes;
  } else if (copy) {
    void *buf = pool_get(nbytes);
    if (!buf) return lt_errorf("ckpt: job_add: out of memory for a host copy of %lld bytes", (long long)nbytes);
    /* the copy is the stall of an async save: spread it over the threads when it is large */
    const int64_t block = (int64_t)1 << 20, nblocks = (nbytes + block - 1) / block;
#pragma omp parallel for schedule(static) if (nblocks > 4)
    for (int64_t b = 0; b < nblocks; b++) {
      int64_t at = b * block, len = nbytes - at < block ? nbytes - at : block;
      memcpy((char *)buf + at, (const char *)data + at, (size_t)len);
    }
    data = buf;
    j->owned[j->n] = 1;
    j->copied += nbytes;
  }
  j->data[j->n] = data;
  j->nbytes[j->n] = nbytes;
  memset(&j->pieces[j->n], 0, sizeof j->pieces[j->n]);
  j->pieces[j->n].shuffle = shuffle > 1 ? shuffle : 0;
  j->n++;
  return 0;
}

int lt_ckpt_job_threads(lt_ckpt_job *j, int threads) {
  if (!j || threads < 0) return lt_errorf("ckpt: job_threads: bad arguments");
  if (j->started) return lt_errorf("ckpt: job_threads: the job already started");
  j->threads = threads > 0 ? threads : omp_get_max_threads();
  if (j->threads > 64) j->threads = 64;
  return 0;
}

int lt_ckpt_job_remove_after(lt_ckpt_job *j, const char *path) {
  if (!j || !path || !*path) return lt_errorf("ckpt: job_remove_after: bad arguments");
  if (j->started) return lt_errorf("ckpt: job_remove_after: the job already started");
  char **p = realloc(j->remove_paths, (size_t)(j->n_remove + 1) * sizeof *p);
  if (p) j->remove_paths = p;
  char *c = strdup(path);
  if (!p || !c) {
    free(c);
    return lt_errorf("ckpt: job_remove_after: out of memory");
  }
  j->remove_paths[j->n_remove++] = c;
  return 0;
}

int lt_ckpt_job_add_file(lt_ckpt_job *j, const char *path, const void *data, int64_t nbytes) {
  if (!j || !path || nbytes < 0 || (!data && nbytes > 0)) return lt_errorf("ckpt: job_add_file: bad arguments");
  if (j->started) return lt_errorf("ckpt: job_add_file: the job already started");
  size_t k = (size_t)j->n_files + 1;
  char **p = realloc(j->file_paths, k * sizeof *p);
  if (p) j->file_paths = p;
  char **d = realloc(j->file_data, k * sizeof *d);
  if (d) j->file_data = d;
  int64_t *b = realloc(j->file_bytes, k * sizeof *b);
  if (b) j->file_bytes = b;
  char *pc = strdup(path), *dc = malloc(nbytes ? (size_t)nbytes : 1);
  if (!p || !d || !b || !pc || !dc) {
    free(pc), free(dc);
    return lt_errorf("ckpt: job_add_file: out of memory");
  }
  if (nbytes) memcpy(dc, data, (size_t)nbytes);
  j->file_paths[j->n_files] = pc, j->file_data[j->n_files] = dc, j->file_bytes[j->n_files] = nbytes;
  j->n_files++;
  return 0;
}

int lt_ckpt_job_commit(lt_ckpt_job *j, const char *tmp_dir, const char *final_dir, const char *manifest_text, int world,
                       const char *latest_path, const char *latest_text, double timeout_s) {
  if (!j || !tmp_dir || !final_dir || !manifest_text) return lt_errorf("ckpt: job_commit: NULL argument");
  if (world < 1) return lt_errorf("ckpt: job_commit: world must be >= 1, got %d", world);
  if (latest_path && !latest_text) return lt_errorf("ckpt: job_commit: latest_path without latest_text");
  if (j->started) return lt_errorf("ckpt: job_commit: the job already started");
  j->commit = 1, j->world = world, j->timeout = timeout_s > 0 ? timeout_s : 600;
  j->tmp_dir = dup_str(tmp_dir), j->final_dir = dup_str(final_dir), j->manifest = dup_str(manifest_text);
  j->latest_path = dup_str(latest_path), j->latest_text = dup_str(latest_text);
  if (!j->tmp_dir || !j->final_dir || !j->manifest || (latest_path && (!j->latest_path || !j->latest_text)))
    return lt_errorf("ckpt: job_commit: out of memory");
  return 0;
}

/* ---- the shard file --------------------------------------------------------------------- */

typedef struct {
  lt_atomic_file *file;
  unsigned char *buf;
  size_t cap, used;
  int64_t file_off; /* bytes in the file + in buf */
} sink;

static int flush(sink *s) {
  if (s->used && lt_atomic_file_write(s->file, s->buf, (int64_t)s->used) != 0) return lt_io_error_prefix("ckpt: ");
  s->used = 0;
  return 0;
}

/* A frame being compressed by one thread: its (shuffled) input and its output. */
typedef struct {
  unsigned char *shuf, *out;
  size_t cap, w;
} slot;

/* Frames of `chunk` bytes, compressed a batch at a time by the job's threads, appended in
 * order. An empty piece is one empty frame. */
static int write_piece(lt_ckpt_job *j, sink *s, int64_t i, const LZ4F_preferences_t *base, slot *slots, int nslots) {
  const unsigned char *src = j->data[i];
  int k = j->pieces[i].shuffle;
  int64_t n = j->nbytes[i], chunk = j->chunk;
  lt_ckpt_piece *p = &j->pieces[i];
  p->offset = s->file_off, p->raw_bytes = n, p->nframes = 0;
  uint32_t h = lt_ckpt_piece_seed(n);
  int64_t nframes = n == 0 ? 1 : (n + chunk - 1) / chunk;
  for (int64_t f0 = 0; f0 < nframes; f0 += nslots) {
    int cnt = nframes - f0 < nslots ? (int)(nframes - f0) : nslots;
#pragma omp parallel for num_threads(j->threads) schedule(dynamic, 1) if (j->threads > 1 && cnt > 1)
    for (int q = 0; q < cnt; q++) {
      int64_t off = (f0 + q) * chunk, len = n - off < chunk ? n - off : chunk;
      LZ4F_preferences_t prefs = *base;
      prefs.frameInfo.contentSize = (unsigned long long)len;
      const unsigned char *in = src + off;
      if (k > 1 && len > 0) {
        lt_ckpt_shuffle(slots[q].shuf, in, len, k);
        in = slots[q].shuf;
      }
      slots[q].w = LZ4F_compressFrame(slots[q].out, slots[q].cap, in, (size_t)len, &prefs);
    }
    for (int q = 0; q < cnt; q++) {
      size_t w = slots[q].w;
      if (LZ4F_isError(w))
        return lt_errorf("ckpt: %s: piece %lld: lz4: %s", j->path, (long long)i, LZ4F_getErrorName(w));
      if (s->used + w > s->cap && flush(s) != 0) return -1;
      memcpy(s->buf + s->used, slots[q].out, w);
      const unsigned char *c = slots[q].out + w - 4; /* the frame's content checksum */
      h = lt_ckpt_piece_hash(h, (uint32_t)c[0] | (uint32_t)c[1] << 8 | (uint32_t)c[2] << 16 | (uint32_t)c[3] << 24);
      s->used += w, s->file_off += (int64_t)w;
      p->nframes++;
    }
  }
  p->csize = s->file_off - p->offset, p->checksum = h;
  j->raw += n, j->compressed += p->csize;
  return 0;
}

static void free_slots(slot *slots, int n) {
  for (int q = 0; slots && q < n; q++) free(slots[q].shuf), free(slots[q].out);
  free(slots);
}

static int write_shard(lt_ckpt_job *j) {
  LZ4F_preferences_t prefs;
  memset(&prefs, 0, sizeof prefs);
  prefs.frameInfo.blockSizeID = LZ4F_max4MB;
  prefs.frameInfo.contentChecksumFlag = LZ4F_contentChecksumEnabled;
  prefs.compressionLevel = j->level;
  size_t cap = LZ4F_compressFrameBound((size_t)j->chunk, &prefs);
  cap = cap < OUT_BUFFER ? OUT_BUFFER : 2 * cap;
  int nslots = j->threads > 1 ? 2 * j->threads : 1;
  if (nslots > 32) nslots = 32;
  size_t bound = LZ4F_compressFrameBound((size_t)j->chunk, &prefs);
  sink s = {NULL, malloc(cap), cap, 0, 0};
  slot *slots = calloc((size_t)nslots, sizeof *slots);
  int oom = !s.buf || !slots;
  for (int q = 0; !oom && q < nslots; q++) {
    slots[q].shuf = malloc((size_t)j->chunk), slots[q].out = malloc(bound), slots[q].cap = bound;
    oom = !slots[q].shuf || !slots[q].out;
  }
  if (oom) {
    free_slots(slots, nslots), free(s.buf);
    return lt_errorf("ckpt: %s: out of memory for the output buffers", j->path);
  }
  if (lt_atomic_file_open(&s.file, j->path) != 0) {
    free_slots(slots, nslots), free(s.buf);
    return lt_io_error_prefix("ckpt: ");
  }
  int rc = 0;
  for (int64_t i = 0; i < j->n && rc == 0; i++) {
    rc = write_piece(j, &s, i, &prefs, slots, nslots);
    if (rc == 0 && i == j->n / 2 && getenv("LUTRA_FAULT")) {
      flush(&s);
      lt_ckpt_fault("save:mid_file");
    }
  }
  size_t footer = (size_t)j->n * CKPT_ENTRY_BYTES + CKPT_TRAILER_BYTES;
  if (rc == 0 && s.used + footer > s.cap) rc = flush(&s);
  unsigned char *fb = NULL;
  if (rc == 0 && footer > s.cap && !(fb = malloc(footer))) rc = lt_errorf("ckpt: out of memory for the footer");
  if (rc == 0) {
    unsigned char *dst = fb ? fb : s.buf + s.used;
    lt_ckpt_encode_footer(dst, j->pieces, j->n);
    if (fb) {
      rc = flush(&s);
      if (rc == 0 && lt_atomic_file_write(s.file, fb, (int64_t)footer) != 0) rc = lt_io_error_prefix("ckpt: ");
    } else {
      s.used += footer, rc = flush(&s);
    }
  }
  free(fb);
  free_slots(slots, nslots), free(s.buf);
  if (rc != 0) {
    lt_atomic_file_abort(s.file);
    return -1;
  }
  if (lt_atomic_file_commit(s.file, 1) != 0) return lt_io_error_prefix("ckpt: ");
  lt_ckpt_fault("save:after_file");
  return 0;
}

/* ---- rank 0's commit -------------------------------------------------------------------- */

int lt_ckpt_commit(const char *tmp_dir, const char *final_dir, const char *manifest_text, int world,
                   const char *latest_path, const char *latest_text, double timeout_s) {
  if (!tmp_dir || !final_dir || !manifest_text || world < 1 || (latest_path && !latest_text))
    return lt_errorf("ckpt: commit: bad arguments");
  char path[4096];
  double deadline = now() + timeout_s;
  for (int r = 0; r < world; r++) { /* every rank's file, renamed into place after its fsync */
    snprintf(path, sizeof path, "%s/rank_%05d.lz4", tmp_dir, r);
    struct stat st;
    while (stat(path, &st) != 0) {
      if (now() > deadline)
        return lt_errorf("ckpt: commit: %s did not appear within %.0f s (rank %d failed?); %s stays uncommitted",
                         lt_ckpt_base(path), timeout_s, r, tmp_dir);
      struct timespec ts = {0, 5 * 1000 * 1000};
      nanosleep(&ts, NULL);
    }
  }
  snprintf(path, sizeof path, "%s/manifest.json", tmp_dir);
  LT_TRY(lt_ckpt_write_file(path, manifest_text, (int64_t)strlen(manifest_text)));
  LT_TRY(lt_ckpt_fsync_path(tmp_dir));
  lt_ckpt_fault("save:after_manifest");
  char old[4096] = {0};
  struct stat st;
  if (stat(final_dir, &st) == 0) { /* saving the same step again: the older one goes aside */
    snprintf(old, sizeof old, "%s.old-%d", final_dir, (int)getpid());
    lt_ckpt_remove_tree(old);
    if (rename(final_dir, old) != 0)
      return lt_errorf("ckpt: cannot move the older %s aside: %s", final_dir, strerror(errno));
  }
  LT_TRY(lt_ckpt_rename(tmp_dir, final_dir));
  if (old[0]) lt_ckpt_remove_tree(old);
  lt_ckpt_fault("save:after_rename");
  if (latest_path) LT_TRY(lt_ckpt_write_file(latest_path, latest_text, (int64_t)strlen(latest_text)));
  return 0;
}

static int commit(lt_ckpt_job *j) {
  LT_TRY(lt_ckpt_commit(j->tmp_dir, j->final_dir, j->manifest, j->world, j->latest_path, j->latest_text, j->timeout));
  for (int64_t i = 0; i < j->n_remove; i++) lt_ckpt_remove_checkpoint(j->remove_paths[i]); /* older checkpoints */
  return 0;
}

static void release_held(lt_ckpt_job *j) {
  for (int64_t i = 0; i < j->n_held; i++) lt_release(j->held[i]);
  j->n_held = 0;
}

int lt_ckpt_job_hold(lt_ckpt_job *j, lt_tensor *t) {
  if (!j || !t) return lt_errorf("ckpt: job_hold: NULL argument");
  if (j->started) return lt_errorf("ckpt: job_hold: the job already started");
  if (j->n_held == j->cap_held) {
    int64_t cap = j->cap_held ? 2 * j->cap_held : 32;
    lt_tensor **h = realloc(j->held, (size_t)cap * sizeof *h);
    if (!h) return lt_errorf("ckpt: job_hold: out of memory");
    j->held = h, j->cap_held = cap;
  }
  lt_retain(t);
  j->held[j->n_held++] = t;
  return 0;
}

/* The deferred copies, before anything else the job does: the caller goes on computing and
 * waits (lt_ckpt_job_wait_copied) only before it changes the sources. */
static int take_copies(lt_ckpt_job *j) {
  int rc = 0;
  for (int64_t i = 0; i < j->n && rc == 0; i++) {
    if (j->owned[i] != 2) continue;
    void *buf = pool_get(j->nbytes[i]);
    if (!buf) {
      rc = lt_errorf("ckpt: out of memory for a host copy of %lld bytes", (long long)j->nbytes[i]);
      j->owned[i] = 0;
      break;
    }
    memcpy(buf, j->data[i], (size_t)j->nbytes[i]);
    j->data[i] = buf;
    j->owned[i] = 1;
  }
  for (int64_t i = 0; i < j->n; i++) /* after a failure no source is read again */
    if (j->owned[i] == 2) j->owned[i] = 0, j->data[i] = NULL;
  release_held(j);
  atomic_store(&j->copies_done, 1);
  return rc;
}

static void run_job(lt_ckpt_job *j) {
  double t0 = now();
  j->raw = j->compressed = 0;
  int rc = take_copies(j);
  for (int64_t i = 0; i < j->n_files && rc == 0; i++)
    rc = lt_ckpt_write_file(j->file_paths[i], j->file_data[i], j->file_bytes[i]);
  if (rc == 0) rc = write_shard(j);
  for (int64_t i = 0; i < j->n; i++) { /* the host copies are written: give the memory back now */
    if (j->owned[i]) pool_put((void *)j->data[i], j->nbytes[i]);
    j->owned[i] = 0, j->data[i] = NULL;
  }
  if (rc == 0 && j->commit) rc = commit(j);
  j->status = rc;
  if (rc != 0) snprintf(j->error, sizeof j->error, "%s", lt_last_error());
  j->seconds = now() - t0;
  atomic_store(&j->done, 1);
}

int lt_ckpt_job_run(lt_ckpt_job *j) {
  if (!j) return lt_errorf("ckpt: job_run: job is NULL");
  if (j->started) return lt_errorf("ckpt: job_run: the job already started");
  j->started = j->joined = 1;
  run_job(j);
  return j->status == 0 ? 0 : lt_set_error(j->error);
}

static void *thread_main(void *arg) {
  run_job(arg);
  return NULL;
}

static void at_exit(void) { lt_ckpt_wait_all(); }

int lt_ckpt_job_start(lt_ckpt_job *j) {
  if (!j) return lt_errorf("ckpt: job_start: job is NULL");
  if (j->started) return lt_errorf("ckpt: job_start: the job already started");
  pthread_mutex_lock(&registry_lock);
  if (!atexit_done) atexit_done = atexit(at_exit) == 0;
  int rc = pthread_create(&j->thread, NULL, thread_main, j);
  if (rc == 0) {
    j->started = 1;
    j->next = registry, registry = j;
  }
  pthread_mutex_unlock(&registry_lock);
  if (rc != 0) return lt_errorf("ckpt: cannot start the save thread: %s", strerror(rc));
  return 0;
}

int lt_ckpt_job_wait_copied(lt_ckpt_job *j) {
  if (!j) return lt_errorf("ckpt: job_wait_copied: job is NULL");
  if (!j->started) return 0;
  const struct timespec tick = {0, 100000}; /* 0.1 ms: the copy takes milliseconds */
  while (!atomic_load(&j->copies_done) && !atomic_load(&j->done)) nanosleep(&tick, NULL);
  return 0;
}

int lt_ckpt_job_poll(lt_ckpt_job *j, int *done) {
  if (!j || !done) return lt_errorf("ckpt: job_poll: NULL argument");
  *done = !j->started || atomic_load(&j->done);
  return 0;
}

/* Joins j if it is in the registry (under the lock: at exit and a waiter never both join). */
static void join(lt_ckpt_job *j) {
  pthread_mutex_lock(&registry_lock);
  if (j->started && !j->joined) {
    pthread_join(j->thread, NULL);
    j->joined = 1;
    for (lt_ckpt_job **p = &registry; *p; p = &(*p)->next) {
      if (*p == j) {
        *p = j->next;
        break;
      }
    }
  }
  pthread_mutex_unlock(&registry_lock);
}

int lt_ckpt_job_wait(lt_ckpt_job *j) {
  if (!j) return lt_errorf("ckpt: job_wait: job is NULL");
  if (!j->started) return lt_errorf("ckpt: job_wait: the job was never started");
  join(j);
  return j->status == 0 ? 0 : lt_set_error(j->error);
}

int lt_ckpt_wait_all(void) {
  int status = 0;
  for (;;) {
    pthread_mutex_lock(&registry_lock);
    lt_ckpt_job *j = registry;
    pthread_mutex_unlock(&registry_lock);
    if (!j) break;
    join(j);
    if (j->status != 0 && status == 0) status = lt_set_error(j->error);
  }
  return status;
}

int lt_ckpt_job_piece(const lt_ckpt_job *j, int64_t i, lt_ckpt_piece *piece) {
  if (!j || !piece) return lt_errorf("ckpt: job_piece: NULL argument");
  if (i < 0 || i >= j->n)
    return lt_errorf("ckpt: job_piece: index %lld outside [0, %lld)", (long long)i, (long long)j->n);
  if (!atomic_load(&j->done)) return lt_errorf("ckpt: job_piece: the job has not finished");
  *piece = j->pieces[i];
  return 0;
}

int lt_ckpt_job_stats(const lt_ckpt_job *j, int64_t *raw, int64_t *compressed, double *seconds) {
  if (!j) return lt_errorf("ckpt: job_stats: job is NULL");
  if (raw) *raw = j->raw;
  if (compressed) *compressed = j->compressed;
  if (seconds) *seconds = j->seconds;
  return 0;
}

int lt_ckpt_job_free(lt_ckpt_job *j) {
  if (!j) return 0;
  join(j);
  for (int64_t i = 0; i < j->n; i++) /* 2: a deferred copy never taken (the job never ran) */
    if (j->owned[i] == 1) pool_put((void *)j->data[i], j->nbytes[i]);
  release_held(j);
  free(j->held);
  free(j->path), free(j->data), free(j->owned), free(j->nbytes), free(j->pieces);
  for (int64_t i = 0; i < j->n_files; i++) free(j->file_paths[i]), free(j->file_data[i]);
  free(j->file_paths), free(j->file_data), free(j->file_bytes);
  for (int64_t i = 0; i < j->n_remove; i++) free(j->remove_paths[i]);
  free(j->remove_paths);
  free(j->tmp_dir), free(j->final_dir), free(j->manifest), free(j->latest_path), free(j->latest_text);
  free(j);
  return 0;
}
