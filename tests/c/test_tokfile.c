/* test_tokfile.c — token files: write/read round trips (u16 and u32), header validation
 * (wrong magic, version, width, truncated, extra bytes, corrupt tokens), batches against a
 * naive reference, range and argument errors, FNV-1a known answers. */
#include "check.h"
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

static char dir[64];

static const char *path_in_dir(const char *name) {
  static char buf[4][256];
  static int k;
  k = (k + 1) % 4;
  snprintf(buf[k], sizeof buf[k], "%s/%s", dir, name);
  return buf[k];
}

/* Names in dir that start with prefix. */
static int count_temporaries(const char *prefix) {
  DIR *d = opendir(dir);
  int n = 0;
  for (struct dirent *e; d && (e = readdir(d));) n += strncmp(e->d_name, prefix, strlen(prefix)) == 0;
  if (d) closedir(d);
  return n;
}

/* Writes ids (n of them) to path in a few appends of both id dtypes. */
static int write_file(const char *path, const int64_t *ids, int64_t n, int64_t vocab, uint64_t tok_hash) {
  lt_tokwriter *w = NULL;
  if (lt_tokwriter_open(&w, path, vocab, tok_hash)) return -1;
  int32_t *ids32 = malloc((size_t)(n > 0 ? n : 1) * sizeof *ids32);
  for (int64_t i = 0; i < n; i++) ids32[i] = (int32_t)ids[i];
  int64_t done = 0, part = 0;
  while (done < n) {
    int64_t m = check_randint(0, n / 3 + 2);
    if (m > n - done) m = n - done;
    int rc =
        part++ % 2 ? lt_tokwriter_append(w, ids + done, LT_I64, m) : lt_tokwriter_append(w, ids32 + done, LT_I32, m);
    if (rc) {
      free(ids32);
      lt_tokwriter_abort(w);
      return -1;
    }
    done += m;
  }
  free(ids32);
  return lt_tokwriter_finish(w, 12345, 0xdeadbeefcafef00dull, 1700000000123456789ll);
}

static int64_t *random_ids(int64_t n, int64_t vocab) {
  int64_t *ids = malloc((size_t)n * sizeof *ids);
  for (int64_t i = 0; i < n; i++) ids[i] = check_randint(0, vocab);
  if (n > 1) ids[0] = vocab - 1, ids[1] = 0; /* the extremes */
  return ids;
}

static void test_round_trip(int64_t vocab, int64_t n, uint32_t want_width) {
  const char *path = path_in_dir("rt.bin");
  int64_t *ids = random_ids(n, vocab);
  CHECK_OK(write_file(path, ids, n, vocab, 0x1234567890abcdefull));
  int64_t size = 0, mtime = 0;
  CHECK_OK(lt_file_stat(path, &size, &mtime));
  CHECK(size == 128 + n * (int64_t)want_width, "file size %lld for %lld tokens of %u bytes", (long long)size,
        (long long)n, want_width);
  CHECK(mtime > 0, "mtime %lld", (long long)mtime);
  lt_tokfile *f = NULL;
  CHECK_OK(lt_tokfile_open(&f, path));
  if (!f) return;
  lt_tokfile_info info, hinfo;
  CHECK_OK(lt_tokfile_get_info(f, &info));
  CHECK_OK(lt_tokfile_read_header(path, &hinfo));
  CHECK(memcmp(&info, &hinfo, sizeof info) == 0, "read_header agrees with open");
  CHECK(info.version == 1 && info.token_bytes == want_width && info.count == n && info.vocab_size == vocab,
        "info: version %u width %u count %lld vocab %lld", info.version, info.token_bytes, (long long)info.count,
        (long long)info.vocab_size);
  CHECK(info.tokenizer_hash == 0x1234567890abcdefull && info.source_bytes == 12345 &&
            info.source_hash == 0xdeadbeefcafef00dull && info.source_mtime_ns == 1700000000123456789ll,
        "metadata round trip");
  CHECK_OK(lt_tokfile_verify(f));

  int dtypes[2] = {LT_I64, LT_I32};
  for (int k = 0; k < 2; k++) { /* all tokens, then a random slice, into i64 and i32 */
    lt_tensor *all = lt_tensor_new();
    if (k == 1) lt_empty(all, 1, &n, LT_I32, LT_DEVICE_CPU);
    CHECK_OK(lt_tokfile_tokens(all, f, 0, n));
    CHECK(all->dtype == dtypes[k] && all->shape[0] == n, "tokens dtype %s", lt_dtype_name(all->dtype));
    int bad = 0;
    for (int64_t i = 0; i < n; i++) bad += check_at(all, i) != (double)ids[i];
    CHECK(bad == 0, "%d tokens differ (vocab %lld)", bad, (long long)vocab);
    int64_t a = check_randint(0, n), c = check_randint(0, n - a + 1);
    lt_tensor *part = lt_tensor_new();
    CHECK_OK(lt_tokfile_tokens(part, f, a, c));
    for (int64_t i = 0; i < c; i++) bad += check_at(part, i) != (double)ids[a + i];
    CHECK(bad == 0, "slice [%lld, +%lld)", (long long)a, (long long)c);
    lt_release(all);
    lt_release(part);
  }
  lt_tensor *t = lt_tensor_new();
  CHECK_ERR(lt_tokfile_tokens(t, f, n - 2, 3), "out of range");
  CHECK_ERR(lt_tokfile_tokens(t, f, -1, 1), "out of range");
  lt_release(t);
  CHECK_OK(lt_tokfile_close(f));
  free(ids);
}

/* Batches of windows against the reference ids: (x, y) pairs, the (B, T + 1) form, i32 and
 * non-contiguous outs, and every kind of bad input. */
static void test_batch(void) {
  const char *path = path_in_dir("batch.bin");
  int64_t n = 3000, vocab = 300;
  int64_t *ids = random_ids(n, vocab);
  CHECK_OK(write_file(path, ids, n, vocab, 7));
  lt_tokfile *f = NULL;
  CHECK_OK(lt_tokfile_open(&f, path));
  if (!f) return;
  for (int trial = 0; trial < 6; trial++) {
    int64_t B = check_randint(1, 9), T = check_randint(1, 200);
    int64_t starts[8];
    for (int64_t b = 0; b < B; b++) starts[b] = check_randint(0, n - T);
    starts[0] = n - T - 1; /* the last window that fits */
    if (B > 1) starts[1] = 0;
    lt_tensor *x = lt_tensor_new(), *y = lt_tensor_new(), *xy = lt_tensor_new();
    int64_t shape[2] = {B, T}, tshape[2] = {T, B};
    lt_tensor *ybase = lt_tensor_new();
    if (trial % 2) { /* y: an i32 transposed view; x: allocated i64 */
      lt_empty(ybase, 2, tshape, LT_I32, LT_DEVICE_CPU);
      lt_transpose(y, ybase, 0, 1);
    } else if (trial == 2) {
      lt_empty(y, 2, shape, LT_I64, LT_DEVICE_CPU);
    }
    CHECK_OK(lt_tokfile_batch(x, y, f, starts, B, T));
    CHECK_OK(lt_tokfile_batch(xy, NULL, f, starts, B, T));
    CHECK(x->dtype == LT_I64 && x->shape[0] == B && x->shape[1] == T, "x shape");
    CHECK(xy->shape[1] == T + 1, "x without y is (B, T + 1)");
    int bad = 0;
    for (int64_t b = 0; b < B; b++)
      for (int64_t t = 0; t < T; t++) {
        bad += check_at(x, b * T + t) != (double)ids[starts[b] + t];
        bad += check_at(y, b * T + t) != (double)ids[starts[b] + t + 1];
      }
    for (int64_t b = 0; b < B; b++)
      for (int64_t t = 0; t <= T; t++) bad += check_at(xy, b * (T + 1) + t) != (double)ids[starts[b] + t];
    CHECK(bad == 0, "batch B %lld T %lld: %d tokens differ", (long long)B, (long long)T, bad);

    /* range errors leave the outputs untouched */
    starts[B - 1] = n - T;
    CHECK_ERR(lt_tokfile_batch(x, y, f, starts, B, T), "out of range");
    CHECK_ERR(lt_tokfile_batch(x, y, f, starts, B, T), "batch.bin");
    starts[B - 1] = -1;
    CHECK_ERR(lt_tokfile_batch(x, y, f, starts, B, T), "start -1 of row");
    CHECK(check_at(x, 0) == (double)ids[n - T - 1], "x unchanged by a failed call");
    lt_release(x);
    lt_release(y);
    lt_release(xy);
    lt_release(ybase);
  }
  int64_t starts[2] = {0, 5}, shape[2] = {2, 4}, wrong[2] = {2, 5};
  lt_tensor *x = lt_tensor_new(), *y = lt_tensor_new();
  CHECK_ERR(lt_tokfile_batch(x, x, f, starts, 2, 4), "same tensor");
  CHECK_ERR(lt_tokfile_batch(x, y, f, starts, 0, 4), "must be >= 1");
  CHECK_ERR(lt_tokfile_batch(x, y, f, starts, 2, 0), "must be >= 1");
  CHECK_ERR(lt_tokfile_batch(x, y, f, NULL, 2, 4), "starts is NULL");
  CHECK_ERR(lt_tokfile_batch(x, y, NULL, starts, 2, 4), "file is NULL");
  CHECK_ERR(lt_tokfile_batch(NULL, y, f, starts, 2, 4), "x is NULL");
  CHECK_ERR(lt_tokfile_batch(x, y, f, starts, 2, n), "out of range");
  lt_empty(x, 2, shape, LT_F32, LT_DEVICE_CPU);
  CHECK_ERR(lt_tokfile_batch(x, y, f, starts, 2, 4), "expected i32 or i64");
  lt_empty(x, 2, wrong, LT_I64, LT_DEVICE_CPU);
  CHECK_ERR(lt_tokfile_batch(x, y, f, starts, 2, 4), "tokfile_batch");
  int64_t one[2] = {2, 1};
  lt_tensor *base = lt_tensor_new();
  lt_empty(base, 2, one, LT_I64, LT_DEVICE_CPU);
  lt_expand(x, base, 2, shape);
  CHECK_ERR(lt_tokfile_batch(x, y, f, starts, 2, 4), "expanded");
  lt_release(base);
  lt_release(x);
  lt_release(y);
  lt_tokfile_close(f);
  free(ids);
}

static void write_bytes(const char *path, const unsigned char *data, size_t n) {
  FILE *fp = fopen(path, "wb");
  if (n) fwrite(data, 1, n, fp);
  fclose(fp);
}

/* Reads a good file, damages a copy in one way, and expects open to fail with `needle`. */
static void expect_open_error(const unsigned char *good, size_t n, size_t at, int set_byte, long new_size,
                              const char *needle) {
  const char *path = path_in_dir("bad.bin");
  unsigned char *copy = malloc(n + 16);
  memcpy(copy, good, n);
  memset(copy + n, 7, 16);
  if (set_byte >= 0) copy[at] = (unsigned char)set_byte;
  write_bytes(path, copy, new_size >= 0 ? (size_t)new_size : n);
  lt_tokfile *f = (lt_tokfile *)&f; /* not NULL: open must reset it */
  CHECK_ERR(lt_tokfile_open(&f, path), needle);
  CHECK(f == NULL, "open leaves out NULL on error");
  CHECK_ERR(lt_tokfile_open(&f, path), "bad.bin"); /* every error names the file */
  lt_tokfile_info info;
  CHECK_ERR(lt_tokfile_read_header(path, &info), needle);
  free(copy);
}

static void test_corrupt(void) {
  const char *path = path_in_dir("good.bin");
  int64_t n = 100, vocab = 50;
  int64_t *ids = random_ids(n, vocab);
  CHECK_OK(write_file(path, ids, n, vocab, 0));
  size_t size = 128 + 2 * (size_t)n;
  unsigned char *good = malloc(size);
  FILE *fp = fopen(path, "rb");
  CHECK(fread(good, 1, size, fp) == size, "read back");
  fclose(fp);
  CHECK(memcmp(good, "LUTRATOK", 8) == 0, "magic at offset 0");

  expect_open_error(good, size, 0, 'X', -1, "not a lutra token file (magic \"XUTRATOK\"");
  expect_open_error(good, size, 3, 0, -1, "\\x00");
  expect_open_error(good, size, 8, 2, -1, "format version 2, this build reads version 1");
  expect_open_error(good, size, 12, 3, -1, "tokens of 3 bytes");
  expect_open_error(good, size, 26, 2, -1, "does not fit 2-byte tokens"); /* vocab_size + 2^17 */
  expect_open_error(good, size, 23, 0x80, -1, "corrupt header: token count");
  expect_open_error(good, size, 0, -1, (long)size - 1, "truncated: the header says 100 tokens");
  expect_open_error(good, size, 0, -1, (long)size + 3, "size mismatch");
  expect_open_error(good, size, 0, -1, 100, "shorter than the 128-byte token file header");
  expect_open_error(good, size, 0, -1, 0, "0 bytes, shorter");
  expect_open_error(good, size, 72, 1, -1, "corrupt header: byte 72 is 1, the bytes from 72 on are reserved");
  expect_open_error(good, size, 127, 0xff, -1, "byte 127 is 255");
  expect_open_error(good, size, 55, 0x80, -1, "corrupt header: source_bytes -");

  /* a damaged token opens (the header is fine) but fails verification */
  const char *bad = path_in_dir("flipped.bin");
  good[128 + 37] ^= 1;
  write_bytes(bad, good, size);
  lt_tokfile *f = NULL;
  CHECK_OK(lt_tokfile_open(&f, bad));
  CHECK_ERR(lt_tokfile_verify(f), "flipped.bin");
  CHECK_ERR(lt_tokfile_verify(f), "checksum");
  lt_tokfile_close(f);

  /* ids out of the vocabulary: the first one is named by index and byte offset, against the
   * header's vocabulary and against a smaller one (a model's), whether the checksum agrees or not */
  good[128 + 37] ^= 1; /* undo the flip */
  unsigned char *ffff = malloc(size);
  memcpy(ffff, good, size);
  ffff[128 + 2 * 60] = 0xff, ffff[128 + 2 * 60 + 1] = 0xff; /* token 60 = 65535 */
  ffff[128 + 2 * 70] = 0xff, ffff[128 + 2 * 70 + 1] = 0xff; /* and token 70: the first is named */
  const char *oov = path_in_dir("oov.bin");
  write_bytes(oov, ffff, size);
  CHECK_OK(lt_tokfile_open(&f, oov));
  CHECK_ERR(lt_tokfile_verify(f), "oov.bin': token 60 (byte offset 248) is 65535, outside the vocabulary [0, 50) "
                                  "of the header; the tokens checksum differs from the header's too");
  lt_tokfile_close(f);
  uint64_t h = 0xcbf29ce484222325ull; /* the same ids with the header's hash made to agree */
  CHECK_OK(lt_hash64(ffff + 128, (int64_t)size - 128, &h));
  memcpy(ffff + 40, &h, 8);
  write_bytes(oov, ffff, size);
  CHECK_OK(lt_tokfile_open(&f, oov));
  CHECK_ERR(lt_tokfile_verify(f), "token 60 (byte offset 248) is 65535, outside the vocabulary [0, 50) of the header; "
                                  "the tokens checksum matches the header's");
  lt_tokfile_close(f);
  free(ffff);
  int64_t small = 0; /* the good file against a vocabulary one below its largest id */
  for (int64_t i = 0; i < n; i++) small = ids[i] > small ? ids[i] : small;
  int64_t first = 0;
  while (ids[first] != small) first++;
  CHECK_OK(lt_tokfile_open(&f, path_in_dir("good.bin")));
  CHECK_OK(lt_tokfile_verify_ids(f, small + 1));
  CHECK_OK(lt_tokfile_verify_ids(f, 1000)); /* larger than the header's: the header's counts */
  char want[160];
  snprintf(want, sizeof want, "token %lld (byte offset %lld) is %lld, outside the vocabulary [0, %lld) of the tokenizer",
           (long long)first, (long long)(128 + 2 * first), (long long)small, (long long)small);
  CHECK_ERR(lt_tokfile_verify_ids(f, small), want);
  CHECK_ERR(lt_tokfile_verify_ids(NULL, 5), "file is NULL");
  lt_tokfile_close(f);

  CHECK_ERR(lt_tokfile_open(&f, path_in_dir("missing.bin")), "cannot open: No such file");
  CHECK_ERR(lt_tokfile_open(&f, dir), "not a regular file");
  CHECK_ERR(lt_tokfile_open(&f, NULL), "path is NULL");
  CHECK_ERR(lt_tokfile_open(NULL, path), "out is NULL");
  CHECK_ERR(lt_file_stat(path_in_dir("missing.bin"), NULL, NULL), "missing.bin");
  free(good);
  free(ids);
}

static void test_writer_errors(void) {
  const char *path = path_in_dir("w.bin");
  lt_tokwriter *w = NULL;
  CHECK_ERR(lt_tokwriter_open(&w, path, 0, 0), "vocab_size 0");
  CHECK_ERR(lt_tokwriter_open(&w, path, ((int64_t)1 << 32) + 1, 0), "vocab_size");
  CHECK_ERR(lt_tokwriter_open(&w, path_in_dir("no/such/dir.bin"), 10, 0), "cannot create");
  CHECK_OK(lt_tokwriter_open(&w, path, 10, 0));
  int32_t ok[3] = {0, 9, 5}, big[2] = {3, 10}, neg[1] = {-1};
  CHECK_OK(lt_tokwriter_append(w, ok, LT_I32, 3));
  CHECK_ERR(lt_tokwriter_append(w, big, LT_I32, 2), "id 10 at position 1 is out of range [0, 10)");
  CHECK_ERR(lt_tokwriter_append(w, neg, LT_I32, 1), "id -1");
  CHECK_ERR(lt_tokwriter_append(w, ok, LT_F32, 3), "expected i32 or i64");
  CHECK_ERR(lt_tokwriter_append(w, NULL, LT_I32, 3), "bad id buffer");
  CHECK_ERR(lt_tokwriter_append(NULL, ok, LT_I32, 3), "writer is NULL");
  CHECK(access(path, F_OK) != 0, "nothing at the path before finish");
  CHECK(count_temporaries("w.bin.tmp.") == 1, "the temporary file (w.bin.tmp.<random>) exists while writing");
  CHECK_OK(lt_tokwriter_abort(w));
  CHECK(count_temporaries("w.bin.tmp.") == 0 && access(path, F_OK) != 0, "abort removes the temporary file");
  CHECK_OK(lt_tokwriter_abort(NULL));

  /* an empty file is valid */
  CHECK_OK(lt_tokwriter_open(&w, path, 10, 0));
  CHECK_OK(lt_tokwriter_finish(w, 0, 0, 0));
  lt_tokfile *f = NULL;
  lt_tokfile_info info;
  CHECK_OK(lt_tokfile_open(&f, path));
  CHECK_OK(lt_tokfile_get_info(f, &info));
  CHECK(info.count == 0, "empty count");
  CHECK_OK(lt_tokfile_verify(f));
  int64_t s[1] = {0};
  lt_tensor *x = lt_tensor_new();
  CHECK_ERR(lt_tokfile_batch(x, NULL, f, s, 1, 1), "out of range");
  lt_release(x);
  lt_tokfile_close(f);
  CHECK_OK(lt_tokfile_close(NULL));
}

static void test_hash(void) {
  uint64_t h = 0xcbf29ce484222325ull;
  CHECK_OK(lt_hash64("", 0, &h));
  CHECK(h == 0xcbf29ce484222325ull, "empty input keeps the basis");
  h = 0xcbf29ce484222325ull;
  CHECK_OK(lt_hash64("a", 1, &h));
  CHECK(h == 0xaf63dc4c8601ec8cull, "fnv1a64('a') = %016llx", (unsigned long long)h);
  h = 0xcbf29ce484222325ull;
  CHECK_OK(lt_hash64("foo", 3, &h));
  CHECK_OK(lt_hash64("bar", 3, &h));
  CHECK(h == 0x85944171f73967e8ull, "fnv1a64('foobar') streamed = %016llx", (unsigned long long)h);
  CHECK_ERR(lt_hash64(NULL, 3, &h), "bad buffer");
  CHECK_ERR(lt_hash64("a", 1, NULL), "hash is NULL");
}

int main(void) {
  snprintf(dir, sizeof dir, "/tmp/lutra_tokfile_XXXXXX");
  if (!mkdtemp(dir)) {
    perror("mkdtemp");
    return 2;
  }
  test_round_trip(1000, 5000, 2);
  test_round_trip(65536, 3000, 2); /* the largest vocab of u16 tokens: id 65535 */
  test_round_trip(65537, 3000, 4);
  test_round_trip(200000, 4000, 4);
  test_round_trip(7, 1, 2);
  test_batch();
  test_corrupt();
  test_writer_errors();
  test_hash();
  const char *names[] = {"rt.bin", "batch.bin", "bad.bin", "good.bin", "flipped.bin", "oov.bin", "w.bin"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) unlink(path_in_dir(names[i]));
  rmdir(dir);
  return check_summary();
}
