/* ckpt_files.c — the file operations an atomic checkpoint save needs: fsync of files and
 * directories, rename + fsync of the directory, small files (host/io/atomic_file.c, then
 * the directory fsync'ed), rm -r, the removal of a whole checkpoint, and the
 * fault-injection hook (lutra.h, "checkpoint io"). */
#define _GNU_SOURCE
#include "io/ckpt.h"
#include "io/atomic_file.h"
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
  if (lt_write_file_atomic(path, data, nbytes, 1) != 0) return lt_io_error_prefix("ckpt: ");
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

int lt_ckpt_remove_checkpoint(const char *dir) {
  if (!dir || !*dir) return lt_errorf("ckpt: remove_checkpoint: empty path");
  struct stat st;
  if (lstat(dir, &st) != 0) return 0; /* nothing there */
  char aside[4096];
  if (snprintf(aside, sizeof aside, "%s.old-%d", dir, (int)getpid()) >= (int)sizeof aside)
    return lt_errorf("ckpt: remove_checkpoint: path too long");
  lt_ckpt_remove_tree(aside);
  if (rename(dir, aside) != 0) return lt_errorf("ckpt: cannot move %s aside to remove it: %s", dir, strerror(errno));
  return lt_ckpt_remove_tree(aside);
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
