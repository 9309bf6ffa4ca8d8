/* atomic_file.c — how lutra writes a file (lutra.h, "files written safely"): whole files go
 * to a temporary beside the target, created exclusively and without following links, are
 * fsync'ed and renamed over it; appended files are opened without following links. A reader
 * sees the old file or the new one, never half of one; a link planted at the target is
 * replaced, never written through; a failure leaves the old file and no temporary. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "io/atomic_file.h"
#include "core/internal.h"
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

struct lt_atomic_file {
  int fd;
  char *path, *tmp;
};

struct lt_append_file {
  int fd;
  char *path;
};

/* The OS's reason for err, in a message's lower case: "no space left on device". */
static const char *reason(int err, char *buf, size_t cap) {
  snprintf(buf, cap, "%s", strerror(err));
  buf[0] = (char)tolower((unsigned char)buf[0]);
  return buf;
}

int lt_io_error_prefix(const char *prefix) {
  char msg[1024];
  snprintf(msg, sizeof msg, "%s", lt_last_error());
  return lt_errorf("%s%s", prefix, msg);
}

static int fail_errno(const char *path, const char *what, int err) {
  char r[128];
  return lt_errorf("cannot write %s%s: %s", path, what, reason(err, r, sizeof r));
}

static void dir_of(const char *path, char *buf, size_t cap) {
  const char *s = strrchr(path, '/');
  if (!s)
    snprintf(buf, cap, ".");
  else if (s == path)
    snprintf(buf, cap, "/");
  else
    snprintf(buf, cap, "%.*s", (int)(s - path), path);
}

static int write_all(int fd, const void *src, int64_t n) {
  const char *p = src;
  while (n > 0) {
    size_t chunk = n > (1 << 30) ? (size_t)1 << 30 : (size_t)n;
    ssize_t put = write(fd, p, chunk);
    if (put < 0 && errno == EINTR) continue;
    if (put < 0) return -1;
    if (put == 0) {
      errno = EIO;
      return -1;
    }
    p += put, n -= put;
  }
  return 0;
}

static uint64_t random_u64(void) {
  uint64_t x = 0;
  if (getrandom(&x, sizeof x, GRND_NONBLOCK) == (ssize_t)sizeof x) return x;
  static _Thread_local uint64_t counter;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  x = ((uint64_t)getpid() << 32) ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^ ++counter;
  x ^= x >> 33, x *= 0xff51afd7ed558ccdull, x ^= x >> 33;
  return x;
}

int lt_fsync_dir(const char *dir) {
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return fail_errno(dir, " (opening the directory to fsync it)", errno);
  int rc = fsync(fd), err = errno;
  close(fd);
  if (rc != 0 && err != EINVAL) return fail_errno(dir, " (fsync of the directory)", err); /* EINVAL: no sync here */
  return 0;
}

/* ---- whole files ----------------------------------------------------------------------- */

static void free_atomic(lt_atomic_file *f) {
  if (!f) return;
  free(f->path), free(f->tmp);
  free(f);
}

int lt_atomic_file_open(lt_atomic_file **out, const char *path) {
  if (!out || !path || !*path) return lt_errorf("atomic_file_open: out or path is NULL or empty");
  *out = NULL;
  lt_atomic_file *f = calloc(1, sizeof *f);
  size_t n = strlen(path);
  if (!f || !(f->path = strdup(path)) || !(f->tmp = malloc(n + 32))) {
    free_atomic(f);
    return lt_errorf("cannot write %s: out of memory", path);
  }
  char dir[PATH_MAX];
  dir_of(path, dir, sizeof dir);
  const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
  /* NAME.tmp.<12 hex digits>, NAME cut so that the whole stays within NAME_MAX */
  int keep = (int)strlen(base) > 200 ? 200 : (int)strlen(base);
  int err = 0;
  for (int attempt = 0; attempt < 64; attempt++) {
    snprintf(f->tmp, n + 32, "%.*s%.*s.tmp.%012llx", (int)(base - path), path, keep, base,
             (unsigned long long)(random_u64() & 0xffffffffffffull));
    f->fd = open(f->tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (f->fd >= 0) {
      *out = f;
      return 0;
    }
    err = errno;
    if (err != EEXIST) break;
  }
  char r[128];
  lt_errorf("cannot write %s: cannot create a temporary file in %s: %s", path, dir, reason(err, r, sizeof r));
  free_atomic(f);
  return -1;
}

/* The crash tests' hook (lutra.h): with LUTRA_FAULT=write:N the process kills itself (SIGKILL)
 * once N bytes have gone through lt_atomic_file_write, the write that crosses N cut there. */
static _Atomic int64_t fault_written;
static int64_t fault_at(void) {
  static _Atomic int64_t at = -2; /* -2: not read yet, -1: no hook */
  int64_t v = atomic_load(&at);
  if (v == -2) {
    const char *e = getenv("LUTRA_FAULT");
    v = e && strncmp(e, "write:", 6) == 0 ? atoll(e + 6) : -1;
    atomic_store(&at, v);
  }
  return v;
}

static void fault_write(int fd, const void *data, int64_t nbytes) {
  int64_t at = fault_at();
  if (at < 0) return;
  int64_t before = atomic_fetch_add(&fault_written, nbytes);
  if (before + nbytes < at) return;
  if (at > before) (void)!write_all(fd, data, at - before);
  fprintf(stderr, "lutra: fault injected at byte %lld of the files written (LUTRA_FAULT=write:%lld): SIGKILL\n",
          (long long)at, (long long)at);
  fflush(stderr);
  kill(getpid(), SIGKILL);
}

int lt_atomic_file_write(lt_atomic_file *f, const void *data, int64_t nbytes) {
  if (!f || f->fd < 0) return lt_errorf("atomic_file_write: file is NULL or closed");
  if (nbytes < 0 || (nbytes > 0 && !data)) return lt_errorf("cannot write %s: bad buffer", f->path);
  fault_write(f->fd, data, nbytes);
  if (write_all(f->fd, data, nbytes) != 0) return fail_errno(f->path, "", errno);
  return 0;
}

int lt_atomic_file_fd(const lt_atomic_file *f) { return f ? f->fd : -1; }
const char *lt_atomic_file_path(const lt_atomic_file *f) { return f ? f->path : NULL; }

int lt_atomic_file_abort(lt_atomic_file *f) {
  if (!f) return 0;
  if (f->fd >= 0) close(f->fd);
  unlink(f->tmp);
  free_atomic(f);
  return 0;
}

/* "lutra: PATH is a symbolic link (to TARGET): ..." once the link was replaced. */
static void say_link_replaced(const char *path, const char *target) {
  fprintf(stderr, "lutra: %s was a symbolic link (to %s): replaced by a regular file; %s is left as it was\n", path,
          target, target);
  fflush(stderr);
}

int lt_atomic_file_commit(lt_atomic_file *f, int sync_dir) {
  if (!f) return lt_errorf("atomic_file_commit: file is NULL");
  int rc = 0;
  if (fsync(f->fd) != 0 && errno != EINVAL) rc = fail_errno(f->path, " (fsync)", errno);
  if (close(f->fd) != 0 && rc == 0) rc = fail_errno(f->path, " (closing it)", errno);
  f->fd = -1;
  char target[PATH_MAX] = {0};
  struct stat st;
  int was_link = rc == 0 && lstat(f->path, &st) == 0 && S_ISLNK(st.st_mode);
  if (was_link && readlink(f->path, target, sizeof target - 1) < 0) snprintf(target, sizeof target, "?");
  if (rc == 0 && rename(f->tmp, f->path) != 0) rc = fail_errno(f->path, " (renaming the temporary over it)", errno);
  if (rc != 0) {
    lt_atomic_file_abort(f);
    return -1;
  }
  if (was_link) say_link_replaced(f->path, target);
  if (sync_dir) {
    char dir[PATH_MAX];
    dir_of(f->path, dir, sizeof dir);
    rc = lt_fsync_dir(dir);
  }
  free_atomic(f);
  return rc;
}

int lt_write_file_atomic(const char *path, const void *data, int64_t nbytes, int sync_dir) {
  if (!path || nbytes < 0 || (nbytes > 0 && !data)) return lt_errorf("write_file_atomic: bad arguments");
  lt_atomic_file *f;
  LT_TRY(lt_atomic_file_open(&f, path));
  if (lt_atomic_file_write(f, data, nbytes) != 0) {
    lt_atomic_file_abort(f);
    return -1;
  }
  return lt_atomic_file_commit(f, sync_dir);
}

/* ---- appended files -------------------------------------------------------------------- */

int lt_append_file_open(lt_append_file **out, const char *path, int truncate) {
  if (!out || !path || !*path) return lt_errorf("append_file_open: out or path is NULL or empty");
  *out = NULL;
  struct stat st;
  int exists = lstat(path, &st) == 0;
  if (exists && !S_ISLNK(st.st_mode) && !S_ISREG(st.st_mode))
    return lt_errorf("cannot write %s: it exists and is not a regular file", path);
  int linked = exists && S_ISREG(st.st_mode) && st.st_nlink > 1;
  if (linked) {
    fprintf(stderr, "lutra: %s has %lu hard links: replaced by a fresh regular file; the other names keep theirs\n",
            path, (unsigned long)st.st_nlink);
    fflush(stderr);
  }
  /* a fresh file (truncate), or a link planted there: a new empty file renamed over the name */
  if (truncate || linked || (exists && S_ISLNK(st.st_mode))) LT_TRY(lt_write_file_atomic(path, NULL, 0, 0));
  /* O_NONBLOCK: a FIFO planted since the lstat fails the check below instead of blocking */
  int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644);
  if (fd < 0) {
    char r[128];
    int err = errno;
    if (err == ELOOP) return lt_errorf("cannot write %s: a symbolic link appeared there; not writing through it", path);
    return lt_errorf("cannot write %s (opening it to append): %s", path, reason(err, r, sizeof r));
  }
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return lt_errorf("cannot write %s: it is not a regular file", path);
  }
  lt_append_file *f = calloc(1, sizeof *f);
  if (!f || !(f->path = strdup(path))) {
    free(f);
    close(fd);
    return lt_errorf("cannot write %s: out of memory", path);
  }
  f->fd = fd;
  *out = f;
  return 0;
}

int lt_append_file_write(lt_append_file *f, const void *data, int64_t nbytes) {
  if (!f || f->fd < 0) return lt_errorf("append_file_write: file is NULL or closed");
  if (nbytes < 0 || (nbytes > 0 && !data)) return lt_errorf("cannot write %s: bad buffer", f->path);
  if (write_all(f->fd, data, nbytes) != 0) return fail_errno(f->path, "", errno);
  return 0;
}

int lt_append_file_close(lt_append_file *f) {
  if (!f) return 0;
  int rc = 0;
  if (f->fd >= 0 && close(f->fd) != 0) rc = fail_errno(f->path, " (closing it)", errno);
  free(f->path);
  free(f);
  return rc;
}
