/* test_atomic_file.c — files written safely (host/io/atomic_file.c): a whole file lands by a
 * rename (an old descriptor and an old hard link keep the old bytes), with mode 0644 less the
 * umask; a symbolic link planted at the path is replaced and its target left as it was; a
 * failure midway (a file size limit, a directory at the path, an abort) leaves the old file
 * and no temporary, and the error names the path and the reason; appended files never write
 * through a link or into another name's inode, and refuse what is not a regular file. */
#include "check.h"
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

static char dir[64], outside[64];

/* base/name in a rotating buffer (base is never one of them: a dir[] or outside[]). */
static const char *in(const char *base, const char *name) {
  static char buf[8][256];
  static int k;
  k = (k + 1) % 8;
  size_t n = strlen(base);
  if (n + strlen(name) + 2 > sizeof buf[k]) exit(2);
  memcpy(buf[k], base, n);
  buf[k][n] = '/';
  strcpy(buf[k] + n + 1, name);
  return buf[k];
}

static void put(const char *path, const char *text) {
  FILE *f = fopen(path, "wb");
  if (!f || fputs(text, f) < 0 || fclose(f) != 0) {
    perror(path);
    exit(2);
  }
}

/* The file's bytes as a string ("" when unreadable), in a rotating buffer. */
static const char *get(const char *path) {
  static char buf[4][4096];
  static int k;
  k = (k + 1) % 4;
  buf[k][0] = 0;
  FILE *f = fopen(path, "rb");
  if (!f) return buf[k];
  size_t n = fread(buf[k], 1, sizeof buf[k] - 1, f);
  buf[k][n] = 0;
  fclose(f);
  return buf[k];
}

/* Names in d other than . and .. (every name, so that a temporary of any name shows). */
static int entries(const char *d) {
  DIR *h = opendir(d);
  int n = 0;
  for (struct dirent *e; h && (e = readdir(h));) n += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
  if (h) closedir(h);
  return n;
}

static int is_link(const char *path) {
  struct stat st;
  return lstat(path, &st) == 0 && S_ISLNK(st.st_mode);
}

static void test_whole_file(void) {
  const char *p = in(dir, "config.json");
  CHECK_OK(lt_write_file_atomic(p, "one", 3, 0));
  CHECK(strcmp(get(p), "one") == 0, "new file: '%s'", get(p));
  CHECK(entries(dir) == 1, "only the file: %d entries", entries(dir));
  struct stat st;
  CHECK(stat(p, &st) == 0 && (st.st_mode & 0777) == 0644, "mode 0644 under umask 022: %o", st.st_mode & 0777);

  /* replaced by a rename: an open descriptor and a hard link keep the old inode and bytes */
  int old_fd = open(p, O_RDONLY);
  CHECK(link(p, in(dir, "hard")) == 0, "hard link: %s", strerror(errno));
  CHECK_OK(lt_write_file_atomic(p, "two, longer", 11, 1));
  char seen[16] = {0};
  CHECK(pread(old_fd, seen, sizeof seen - 1, 0) == 3 && strcmp(seen, "one") == 0, "the old inode keeps 'one': '%s'",
        seen);
  close(old_fd);
  CHECK(strcmp(get(in(dir, "hard")), "one") == 0, "the other hard link keeps 'one'");
  CHECK(strcmp(get(p), "two, longer") == 0, "replaced: '%s'", get(p));
  unlink(in(dir, "hard"));

  /* the umask is honoured */
  mode_t was = umask(077);
  CHECK_OK(lt_write_file_atomic(in(dir, "private"), "x", 1, 0));
  umask(was);
  CHECK(stat(in(dir, "private"), &st) == 0 && (st.st_mode & 0777) == 0600, "mode 0600 under umask 077: %o",
        st.st_mode & 0777);
  unlink(in(dir, "private"));

  /* streamed: nothing at the path until the commit, then all of it */
  lt_atomic_file *f = NULL;
  const char *q = in(dir, "streamed.bin");
  CHECK_OK(lt_atomic_file_open(&f, q));
  CHECK_OK(lt_atomic_file_write(f, "ab", 2));
  CHECK_OK(lt_atomic_file_write(f, "cd", 2));
  CHECK(access(q, F_OK) != 0, "nothing at the path before the commit");
  CHECK(entries(dir) == 2, "the temporary beside it: %d entries", entries(dir));
  CHECK_OK(lt_atomic_file_commit(f, 0));
  CHECK(strcmp(get(q), "abcd") == 0 && entries(dir) == 2, "committed: '%s', %d entries", get(q), entries(dir));
  unlink(q);
  unlink(p);
}

static void test_planted_link(void) {
  const char *target = in(outside, "precious.txt");
  put(target, "precious");
  const char *p = in(dir, "metrics.json");
  CHECK(symlink(target, p) == 0, "symlink: %s", strerror(errno));
  CHECK_OK(lt_write_file_atomic(p, "mine", 4, 1));
  CHECK(!is_link(p), "the link is replaced by a regular file");
  CHECK(strcmp(get(p), "mine") == 0, "the new bytes at the path");
  CHECK(strcmp(get(target), "precious") == 0, "the link's target is untouched: '%s'", get(target));
  unlink(p);

  /* a dangling link: the file is made at the path, not at the link's target */
  const char *nowhere = in(outside, "created-through-link");
  CHECK(symlink(nowhere, p) == 0, "symlink");
  CHECK_OK(lt_write_file_atomic(p, "x", 1, 0));
  CHECK(access(nowhere, F_OK) != 0 && !is_link(p), "nothing created at a dangling link's target");
  unlink(p);
}

static void test_failures(void) {
  const char *p = in(dir, "model.safetensors");
  put(p, "old bytes");
  /* a write that fails midway (the file size limit; EFBIG, as ENOSPC would): the old file
   * stays, no temporary is left, the error names the path and the reason */
  struct rlimit lim, was;
  getrlimit(RLIMIT_FSIZE, &was);
  lim = was;
  lim.rlim_cur = 4096;
  signal(SIGXFSZ, SIG_IGN);
  CHECK(setrlimit(RLIMIT_FSIZE, &lim) == 0, "setrlimit: %s", strerror(errno));
  static char big[10000];
  memset(big, 'z', sizeof big);
  char want[512];
  snprintf(want, sizeof want, "cannot write %s: file too large", p);
  CHECK_ERR(lt_write_file_atomic(p, big, sizeof big, 0), want);
  lt_atomic_file *f = NULL;
  CHECK_OK(lt_atomic_file_open(&f, p));
  CHECK_ERR(lt_atomic_file_write(f, big, sizeof big), want);
  CHECK_OK(lt_atomic_file_abort(f));
  setrlimit(RLIMIT_FSIZE, &was);
  CHECK(strcmp(get(p), "old bytes") == 0, "the old file is intact: '%s'", get(p));
  CHECK(entries(dir) == 1, "no temporary left: %d entries", entries(dir));

  /* an abort before the commit */
  CHECK_OK(lt_atomic_file_open(&f, p));
  CHECK_OK(lt_atomic_file_write(f, "new", 3));
  CHECK_OK(lt_atomic_file_abort(f));
  CHECK(strcmp(get(p), "old bytes") == 0 && entries(dir) == 1, "abort: the old file, no temporary");
  CHECK_OK(lt_atomic_file_abort(NULL));

  /* a directory at the path: the rename fails, the directory is as it was */
  char d[256];
  snprintf(d, sizeof d, "%s/adir", dir);
  mkdir(d, 0755);
  put(in(d, "inside"), "kept");
  snprintf(want, sizeof want, "cannot write %s (renaming the temporary over it): is a directory", d);
  CHECK_ERR(lt_write_file_atomic(d, "x", 1, 0), want);
  CHECK(strcmp(get(in(d, "inside")), "kept") == 0 && entries(dir) == 2, "the directory as it was, no temporary");
  unlink(in(d, "inside"));
  rmdir(d);

  /* no such directory: the path and the reason */
  snprintf(want, sizeof want, "cannot write %s/no/such/x.json: cannot create a temporary file in %s/no/such: no such "
           "file or directory", dir, dir);
  CHECK_ERR(lt_write_file_atomic(in(dir, "no/such/x.json"), "x", 1, 0), want);
  CHECK_ERR(lt_write_file_atomic(NULL, "x", 1, 0), "bad arguments");
  unlink(p);
}

static void test_append(void) {
  const char *p = in(dir, "metrics.jsonl");
  lt_append_file *a = NULL;
  CHECK_OK(lt_append_file_open(&a, p, 0));
  CHECK_OK(lt_append_file_write(a, "1\n", 2));
  CHECK_OK(lt_append_file_close(a));
  CHECK_OK(lt_append_file_open(&a, p, 0));
  CHECK_OK(lt_append_file_write(a, "2\n", 2));
  CHECK_OK(lt_append_file_close(a));
  CHECK(strcmp(get(p), "1\n2\n") == 0, "appended: '%s'", get(p));
  CHECK_OK(lt_append_file_open(&a, p, 1));
  CHECK_OK(lt_append_file_write(a, "3\n", 2));
  CHECK_OK(lt_append_file_close(a));
  CHECK(strcmp(get(p), "3\n") == 0, "truncate starts empty: '%s'", get(p));
  unlink(p);

  /* a planted link, appended to or started afresh: a new regular file, the target untouched */
  const char *target = in(outside, "victim.log");
  for (int truncate = 0; truncate <= 1; truncate++) {
    put(target, "victim");
    CHECK(symlink(target, p) == 0, "symlink");
    CHECK_OK(lt_append_file_open(&a, p, truncate));
    CHECK_OK(lt_append_file_write(a, "4\n", 2));
    CHECK_OK(lt_append_file_close(a));
    CHECK(!is_link(p) && strcmp(get(p), "4\n") == 0, "truncate=%d: a fresh regular file: '%s'", truncate, get(p));
    CHECK(strcmp(get(target), "victim") == 0, "truncate=%d: the target untouched: '%s'", truncate, get(target));
    unlink(p);
  }
  /* a hard link to a file elsewhere: not appended through */
  put(target, "victim");
  CHECK(link(target, p) == 0, "hard link: %s", strerror(errno));
  CHECK_OK(lt_append_file_open(&a, p, 0));
  CHECK_OK(lt_append_file_write(a, "5\n", 2));
  CHECK_OK(lt_append_file_close(a));
  CHECK(strcmp(get(target), "victim") == 0 && strcmp(get(p), "5\n") == 0, "hard link: the other name untouched");
  unlink(p);

  /* not a regular file: refused by name */
  CHECK(mkfifo(p, 0644) == 0, "mkfifo");
  char want[512];
  snprintf(want, sizeof want, "cannot write %s: it exists and is not a regular file", p);
  CHECK_ERR(lt_append_file_open(&a, p, 0), want);
  unlink(p);
  CHECK_OK(lt_append_file_close(NULL));
  unlink(target);
}

int main(void) {
  umask(022);
  snprintf(dir, sizeof dir, "/tmp/lutra_atomic_XXXXXX");
  snprintf(outside, sizeof outside, "/tmp/lutra_atomic_out_XXXXXX");
  if (!mkdtemp(dir) || !mkdtemp(outside)) {
    perror("mkdtemp");
    return 2;
  }
  test_whole_file();
  test_planted_link();
  test_failures();
  test_append();
  CHECK(entries(dir) == 0, "the directory is empty at the end: %d entries", entries(dir));
  rmdir(dir);
  unlink(in(outside, "precious.txt"));
  rmdir(outside);
  return check_summary();
}
