/* ckpt_files.c — the file operations an atomic checkpoint save needs: fsync of files and
 * directories, rename + fsync of the directory, atomic small files, rm -r, and the
 * fault-injection hook (lutra.h, "checkpoint io"). */
#define _GNU_SOURCE
#include "io/ckpt.h"
#include "core/internal.h"
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int lt_ckpt_fsync_path(const char *path) {
  if (!path) return lt_errorf("ckpt: fsync: path is NULL");
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return lt_errorf("ckpt: cannot open %s to fsync it: %s", path, strerror(errno));
  int rc = fsync(fd);
  int err = errno;
  close(fd);
  if (rc != 0 && err != EINVAL) return lt_errorf("ckpt: fsync %s: %s", path, strerror(err)); /* EINVAL: no sync here */
  return 0;
}

static void parent_of(const char *path, char *buf, size_t cap) {
  const char *s = strrchr(path, '/');
  if (!s)
    snprintf(buf, cap, ".");
  else if (s == path)
    snprintf(buf, cap, "/");
  else
    snprintf(buf, cap, "%.*s", (int)(s - path), path);
}

int lt_ckpt_rename(const char *from, const char *to) {
  if (!from || !to) return lt_errorf("ckpt: rename: NULL path");
  if (rename(from, to) != 0) return lt_errorf("ckpt: cannot rename %s to %s: %s", from, to, strerror(errno));
  char dir[4096];
  parent_of(to, dir, sizeof dir);
  return lt_ckpt_fsync_path(dir);
}

int lt_ckpt_write_file(const char *path, const void *data, int64_t nbytes) {
  if (!path || (!data && nbytes > 0) || nbytes < 0) return lt_errorf("ckpt: write_file: bad arguments");
  char tmp[4096];
  if (snprintf(tmp, sizeof tmp, "%s.tmp-%d", path, (int)getpid()) >= (int)sizeof tmp)
    return lt_errorf("ckpt: write_file: path too long");
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return lt_errorf("ckpt: cannot create %s: %s", tmp, strerror(errno));
  if (lt_ckpt_write_all(fd, data, nbytes) != 0 || fsync(fd) != 0) {
    int err = errno;
    close(fd);
    unlink(tmp);
    return lt_errorf("ckpt: cannot write %s: %s", tmp, strerror(err));
  }
  close(fd);
  if (lt_ckpt_rename(tmp, path) != 0) {
    unlink(tmp);
    return -1;
  }
  return 0;
}

static int remove_one(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  (void)st, (void)flag, (void)ftw;
  remove(path);
  return 0;
}

int lt_ckpt_remove_tree(const char *path) {
  if (!path || !*path) return lt_errorf("ckpt: remove_tree: empty path");
  struct stat st;
  if (lstat(path, &st) != 0) return 0; /* nothing there */
  nftw(path, remove_one, 16, FTW_DEPTH | FTW_PHYS);
  if (lstat(path, &st) == 0) return lt_errorf("ckpt: cannot remove %s", path);
  return 0;
}

/* This process's rank in the job (the launcher's environment), or -1. */
static int job_rank(void) {
  const char *names[] = {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "LUTRA_RANK"};
  for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
    const char *v = getenv(names[k]);
    if (v && *v) return atoi(v);
  }
  return -1;
}

int lt_ckpt_fault(const char *point) {
  const char *want = getenv("LUTRA_FAULT");
  if (!point || !want) return 0;
  size_t n = strlen(point);
  if (strncmp(want, point, n) != 0) return 0;
  if (want[n] == '@') { /* LUTRA_FAULT=save:mid_file@2: only rank 2 */
    if (atoi(want + n + 1) != job_rank()) return 0;
  } else if (want[n] != 0) {
    return 0;
  }
  fprintf(stderr, "lutra: fault injected at %s (LUTRA_FAULT=%s): exiting\n", point, want);
  fflush(stderr);
  _exit(86);
}
