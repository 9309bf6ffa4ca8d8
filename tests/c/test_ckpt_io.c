/* test_ckpt_io.c — checkpoint shard files (host/io/ckpt_read.c, io/ckpt_write.c, io/ckpt_manifest.c):
 * round trips of pieces (empty, one frame, many frames, incompressible) written on this
 * thread and in the background; every single-byte flip anywhere in a file is detected;
 * truncation, a footer that lies (sizes, swapped pieces), a wrong destination size; random
 * mutations never crash; the atomic file helpers; rank 0's commit (and its timeout when a
 * rank's file never comes); the manifest validator on good and bad manifests. */
#include "check.h"
#include "io/ckpt.h"
#include "lutra.h"
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char root[256];

static uint64_t rng_state = 88172645463325252ull;
static uint64_t next_u64(void) {
  rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
  return rng_state;
}

enum { NPIECES = 5 };
static unsigned char *piece_data[NPIECES];
static int64_t piece_bytes[NPIECES] = {0, 100, 10000, 5000, 3000};

static void make_pieces(void) {
  for (int i = 0; i < NPIECES; i++) {
    piece_data[i] = malloc(piece_bytes[i] ? (size_t)piece_bytes[i] : 1);
    for (int64_t k = 0; k < piece_bytes[i]; k++) /* structured (compressible) except piece 3: random */
      piece_data[i][k] = i == 3 ? (unsigned char)next_u64() : (unsigned char)((k / 7) % 13 + i);
  }
}

static char *read_all(const char *path, int64_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  *n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *b = malloc((size_t)*n + 1);
  if (fread(b, 1, (size_t)*n, f) != (size_t)*n) *n = -1;
  fclose(f);
  b[*n > 0 ? *n : 0] = 0;
  return b;
}

static void write_all_file(const char *path, const void *b, int64_t n) {
  FILE *f = fopen(path, "wb");
  fwrite(b, 1, (size_t)n, f);
  fclose(f);
}

/* Writes the pieces to path (chunk 1000 bytes: piece 2 is 10 frames); async or not. */
static int write_file_of_pieces(const char *path, int async) {
  lt_ckpt_job *j = NULL;
  if (lt_ckpt_job_new(&j, path, 1000, 0) != 0) return -1;
  for (int i = 0; i < NPIECES; i++)
    if (lt_ckpt_job_add(j, piece_data[i], piece_bytes[i], i == 3 ? 4 : i == 4 ? 8 : 0, async) != 0) return -1;
  int rc;
  if (async) {
    rc = lt_ckpt_job_start(j);
    int done = 0;
    CHECK_OK(lt_ckpt_job_poll(j, &done));
    if (rc == 0) rc = lt_ckpt_job_wait(j);
    CHECK_OK(lt_ckpt_job_poll(j, &done));
    CHECK(done == 1, "poll after wait: done");
  } else {
    rc = lt_ckpt_job_run(j);
  }
  if (rc == 0) {
    int64_t raw = 0, comp = 0;
    double secs = -1;
    CHECK_OK(lt_ckpt_job_stats(j, &raw, &comp, &secs));
    CHECK(raw == 18100 && comp > 0 && secs >= 0, "stats raw %lld comp %lld", (long long)raw, (long long)comp);
    lt_ckpt_piece p;
    CHECK_OK(lt_ckpt_job_piece(j, 2, &p));
    CHECK(p.nframes == 10 && p.raw_bytes == 10000, "piece 2: %d frames", p.nframes);
    CHECK_ERR(lt_ckpt_job_piece(j, 5, &p), "outside");
  }
  lt_ckpt_job_free(j);
  return rc;
}

/* 0 when every piece reads back equal. */
static int read_back(const char *path) {
  lt_ckpt_piece pieces[8];
  int64_t count = 0, size = 0;
  if (lt_ckpt_read_index(path, pieces, 8, &count, &size) != 0) return -1;
  if (count != NPIECES) return lt_set_error("wrong count");
  for (int i = 0; i < NPIECES; i++) {
    unsigned char *buf = malloc((size_t)piece_bytes[i] + 1);
    int rc = lt_ckpt_read_piece(path, i, &pieces[i], buf, piece_bytes[i]);
    if (rc == 0 && memcmp(buf, piece_data[i], (size_t)piece_bytes[i]) != 0) rc = lt_set_error("bytes differ");
    free(buf);
    if (rc != 0) return -1;
  }
  return 0;
}

/* Names in root that start with prefix. */
static int names_starting(const char *prefix) {
  DIR *d = opendir(root);
  int n = 0;
  for (struct dirent *e; d && (e = readdir(d));) n += strncmp(e->d_name, prefix, strlen(prefix)) == 0;
  if (d) closedir(d);
  return n;
}

static void test_round_trip(void) {
  char path[512];
  for (int async = 0; async <= 1; async++) {
    snprintf(path, sizeof path, "%s/rank_%05d.lz4", root, async);
    CHECK_OK(write_file_of_pieces(path, async));
    CHECK(access(path, F_OK) == 0, "the file is in place");
    char prefix[64];
    snprintf(prefix, sizeof prefix, "rank_%05d.lz4.", async);
    CHECK(names_starting(prefix) == 0, "no temporary (%s*) left", prefix);
    CHECK_OK(read_back(path));
    int64_t raw = 0, comp = 0;
    CHECK_OK(lt_ckpt_verify_file(path, &raw, &comp));
    CHECK(raw == 18100, "verify raw %lld", (long long)raw);
    lt_ckpt_piece p[8];
    int64_t count = 0, size = 0;
    CHECK_OK(lt_ckpt_read_index(path, p, 8, &count, &size));
    CHECK(p[0].raw_bytes == 0 && p[0].nframes == 1 && p[1].nframes == 1 && p[3].nframes == 5, "frames per piece");
    CHECK(p[0].shuffle == 0 && p[3].shuffle == 4 && p[4].shuffle == 8, "shuffle recorded per piece");
    CHECK(p[2].csize < 10000 / 4, "structured piece compresses: %lld", (long long)p[2].csize);
    for (int piece = 1; piece <= 4; piece++) { /* byte ranges: inside a frame, across frames, all */
      int64_t rb = piece_bytes[piece];
      int64_t ranges[][2] = {{0, rb},     {1, rb / 3}, {rb / 2 - 7, 16},
                             {rb - 8, 8}, {rb, 0},     {999, 1002 < rb - 999 ? 1002 : rb - 999}};
      for (int q = 0; q < 6; q++) {
        int64_t b0 = ranges[q][0], len = ranges[q][1];
        if (b0 + len > rb || len < 0) continue;
        unsigned char *buf = malloc((size_t)len + 1);
        CHECK_OK(lt_ckpt_read_range(path, piece, &p[piece], b0, len, buf));
        CHECK(memcmp(buf, piece_data[piece] + b0, (size_t)len) == 0, "range [%lld, +%lld) of piece %d", (long long)b0,
              (long long)len, piece);
        free(buf);
      }
    }
    unsigned char one;
    CHECK_ERR(lt_ckpt_read_range(path, 2, &p[2], 9999, 2, &one), "outside its 10000");
    unsigned char small[10];
    CHECK_ERR(lt_ckpt_read_piece(path, 1, &p[1], small, 10), "size mismatch");
  }
  CHECK_ERR(lt_ckpt_read_index("/nonexistent/x.lz4", NULL, 0, &(int64_t){0}, NULL), "cannot open");
}

/* Every single-byte change anywhere in the file is caught by verify_file. */
static void test_shuffle(void) {
  unsigned char a[24], b[24], c[24];
  for (int i = 0; i < 24; i++) a[i] = (unsigned char)i;
  lt_ckpt_shuffle(b, a, 24, 4);
  CHECK(b[0] == 0 && b[1] == 4 && b[6] == 1 && b[23] == 23 && b[18] == 3, "byte planes");
  lt_ckpt_unshuffle(c, b, 24, 4);
  CHECK(memcmp(a, c, 24) == 0, "unshuffle undoes shuffle");
}

static void test_every_flip(void) {
  char path[512], bad[512];
  snprintf(path, sizeof path, "%s/rank_00000.lz4", root);
  snprintf(bad, sizeof bad, "%s/flipped.lz4", root);
  int64_t n = 0;
  char *img = read_all(path, &n);
  int detected = 0, tried = 0;
  for (int64_t pos = 0; pos < n; pos += (pos < 200 || pos > n - 300) ? 1 : 7) {
    char saved = img[pos];
    img[pos] = (char)(saved ^ (1 + (int)(next_u64() % 255)));
    write_all_file(bad, img, n);
    img[pos] = saved;
    tried++;
    if (lt_ckpt_verify_file(bad, NULL, NULL) != 0)
      detected++;
    else /* a match offset moved onto equal bytes decodes the same content: harmless, but only that */
      CHECK(read_back(bad) == 0, "a flip at byte %lld of %lld went unnoticed and changed the data", (long long)pos,
            (long long)n);
  }
  CHECK(detected >= tried - 10 && tried > 100, "%d of %d flips detected", detected, tried);
  /* named problems */
  lt_ckpt_piece p[8];
  int64_t count = 0;
  CHECK_OK(lt_ckpt_read_index(path, p, 8, &count, NULL));
  img[p[2].offset] ^= 0x10; /* the magic of piece 2's first frame */
  write_all_file(bad, img, n);
  static unsigned char dst[10000];
  CHECK_ERR(lt_ckpt_read_piece(bad, 2, &p[2], dst, 10000), "flipped.lz4: piece 2 frame 0 (at byte");
  CHECK_ERR(lt_ckpt_verify_file(bad, NULL, NULL), "bad magic");
  img[p[2].offset] ^= 0x10;
  img[p[2].offset + p[2].csize - 2] ^= 0x01; /* the content checksum of its last frame */
  write_all_file(bad, img, n);
  CHECK_ERR(lt_ckpt_verify_file(bad, NULL, NULL), "piece 2 frame 9: checksum mismatch");
  CHECK_ERR(lt_ckpt_read_range(bad, 2, &p[2], 9500, 10, dst), "piece 2 frame 9: checksum mismatch");
  CHECK_ERR(lt_ckpt_read_range(bad, 2, &p[2], 0, 10, dst), "piece 2: checksum mismatch"); /* frame 9 only walked */
  img[p[2].offset + p[2].csize - 2] ^= 0x01;
  free(img);
}

static void test_truncated_and_lying(void) {
  char path[512], bad[512];
  snprintf(path, sizeof path, "%s/rank_00000.lz4", root);
  snprintf(bad, sizeof bad, "%s/lying.lz4", root);
  int64_t n = 0;
  char *img = read_all(path, &n);
  lt_ckpt_piece p[8];
  int64_t count = 0;
  CHECK_OK(lt_ckpt_read_index(path, p, 8, &count, NULL));
  for (int64_t cut = 0; cut < n; cut += n / 37 + 1) { /* truncated anywhere */
    write_all_file(bad, img, cut);
    CHECK_ERR(lt_ckpt_verify_file(bad, NULL, NULL), "lying.lz4");
  }
  write_all_file(bad, img, n - 30);
  CHECK_ERR(lt_ckpt_read_index(bad, NULL, 0, &count, NULL), "truncated");
  /* footers that lie, with a valid footer hash */
  int64_t data_end = n - NPIECES * CKPT_ENTRY_BYTES - CKPT_TRAILER_BYTES;
  lt_ckpt_piece q[NPIECES];
  unsigned char *footer = malloc(NPIECES * CKPT_ENTRY_BYTES + CKPT_TRAILER_BYTES);
  for (int c = 0; c < 5; c++) {
    memcpy(q, p, sizeof q);
    const char *needle = "";
    if (c == 0) q[2].raw_bytes += 8, needle = "size mismatch"; /* decodes to fewer bytes */
    if (c == 1) q[2].csize -= 5, needle = "truncated";         /* the piece ends inside a frame */
    if (c == 2)
      q[4].offset = p[1].offset, q[4].csize = p[1].csize, q[4].nframes = 1, q[4].raw_bytes = 100, q[4].shuffle = 4,
      needle = "checksum mismatch";                                             /* another piece's frames */
    if (c == 3) q[1].offset = data_end + 8, needle = "out of the file's range"; /* past the data */
    if (c == 4) q[3].shuffle = 3, needle = "out of the file's range";           /* no such transposition */
    lt_ckpt_encode_footer(footer, q, NPIECES);
    memcpy(img + data_end, footer, NPIECES * CKPT_ENTRY_BYTES + CKPT_TRAILER_BYTES);
    write_all_file(bad, img, n);
    int64_t cnt = 0;
    lt_ckpt_piece r[8];
    if (c >= 3) {
      CHECK_ERR(lt_ckpt_read_index(bad, r, 8, &cnt, NULL), needle);
      continue;
    }
    CHECK_OK(lt_ckpt_read_index(bad, r, 8, &cnt, NULL));
    int k = c == 2 ? 4 : 2;
    unsigned char *buf = malloc((size_t)r[k].raw_bytes + 1);
    CHECK_ERR(lt_ckpt_read_piece(bad, k, &r[k], buf, r[k].raw_bytes), needle);
    free(buf);
  }
  free(footer);
  /* random mutations: never a crash (bounded) */
  for (int it = 0; it < 300; it++) {
    char *m = malloc((size_t)n);
    memcpy(m, img, (size_t)n);
    int flips = 1 + (int)(next_u64() % 8);
    for (int f = 0; f < flips; f++) m[next_u64() % (uint64_t)n] = (char)next_u64();
    int64_t len = next_u64() % 4 == 0 ? (int64_t)(next_u64() % (uint64_t)n) : n;
    write_all_file(bad, m, len);
    lt_ckpt_verify_file(bad, NULL, NULL);
    lt_ckpt_piece r[8];
    int64_t cnt = 0;
    if (lt_ckpt_read_index(bad, r, 8, &cnt, NULL) == 0)
      for (int k = 0; k < cnt && k < 8; k++) {
        if (r[k].raw_bytes > (1 << 20)) continue;
        void *buf = malloc((size_t)r[k].raw_bytes + 1);
        lt_ckpt_read_piece(bad, k, &r[k], buf, r[k].raw_bytes);
        lt_ckpt_read_range(bad, k, &r[k], r[k].raw_bytes / 4, r[k].raw_bytes / 2, buf);
        free(buf);
      }
    free(m);
  }
  CHECK(1, "300 random mutations without a crash");
  free(img);
}

static void test_files_and_commit(void) {
  char path[1024], tmp[512], fin[512], latest[512];
  snprintf(path, sizeof path, "%s/small.txt", root);
  CHECK_OK(lt_ckpt_write_file(path, "hello", 5));
  int64_t n = 0;
  char *s = read_all(path, &n);
  CHECK(n == 5 && memcmp(s, "hello", 5) == 0, "atomic write");
  free(s);
  CHECK_OK(lt_ckpt_fsync_path(root));
  CHECK_ERR(lt_ckpt_fsync_path("/nonexistent/dir"), "cannot open");
  CHECK_ERR(lt_ckpt_rename("/nonexistent/a", "/nonexistent/b"), "cannot rename");
  /* a two-rank commit: rank 1's file first, then rank 0 commits */
  snprintf(tmp, sizeof tmp, "%s/step_000007.tmp", root);
  snprintf(fin, sizeof fin, "%s/step_000007", root);
  snprintf(latest, sizeof latest, "%s/latest", root);
  mkdir(tmp, 0755);
  for (int rank = 1; rank >= 0; rank--) {
    snprintf(path, sizeof path, "%s/rank_%05d.lz4", tmp, rank);
    lt_ckpt_job *j = NULL;
    CHECK_OK(lt_ckpt_job_new(&j, path, 0, 1));
    CHECK_OK(lt_ckpt_job_add(j, piece_data[2], piece_bytes[2], 2, 0));
    if (rank == 0) CHECK_OK(lt_ckpt_job_commit(j, tmp, fin, "{\"m\": 1}", 2, latest, "step_000007\n", 5));
    CHECK_OK(lt_ckpt_job_start(j));
    CHECK_OK(lt_ckpt_job_wait(j));
    CHECK_ERR(lt_ckpt_job_start(j), "already started");
    CHECK_ERR(lt_ckpt_job_add(j, piece_data[1], 1, 0, 0), "already started");
    lt_ckpt_job_free(j);
  }
  snprintf(path, sizeof path, "%s/manifest.json", fin);
  s = read_all(path, &n);
  CHECK(s && strcmp(s, "{\"m\": 1}") == 0, "the manifest committed");
  free(s);
  s = read_all(latest, &n);
  CHECK(s && strcmp(s, "step_000007\n") == 0, "latest replaced");
  free(s);
  CHECK(access(tmp, F_OK) != 0, "the temp dir is gone (renamed)");
  /* committing the same step again replaces it */
  mkdir(tmp, 0755);
  snprintf(path, sizeof path, "%s/rank_00000.lz4", tmp);
  lt_ckpt_job *j = NULL;
  CHECK_OK(lt_ckpt_job_new(&j, path, 0, 0));
  CHECK_OK(lt_ckpt_job_commit(j, tmp, fin, "{\"m\": 2}", 1, NULL, NULL, 5));
  CHECK_OK(lt_ckpt_job_run(j));
  lt_ckpt_job_free(j);
  snprintf(path, sizeof path, "%s/manifest.json", fin);
  s = read_all(path, &n);
  CHECK(s && strcmp(s, "{\"m\": 2}") == 0, "the same step saved again");
  free(s);
  /* rank 2's file never comes: rank 0's commit times out, nothing committed */
  snprintf(tmp, sizeof tmp, "%s/step_000009.tmp", root);
  snprintf(fin, sizeof fin, "%s/step_000009", root);
  mkdir(tmp, 0755);
  snprintf(path, sizeof path, "%s/rank_00000.lz4", tmp);
  CHECK_OK(lt_ckpt_job_new(&j, path, 0, 0));
  CHECK_OK(lt_ckpt_job_commit(j, tmp, fin, "{}", 3, latest, "step_000009\n", 0.2));
  CHECK_OK(lt_ckpt_job_start(j));
  CHECK_ERR(lt_ckpt_job_wait(j), "rank_00001.lz4 did not appear");
  lt_ckpt_job_free(j);
  CHECK(access(fin, F_OK) != 0, "no step_000009");
  s = read_all(latest, &n);
  CHECK(s && strcmp(s, "step_000007\n") == 0, "latest unchanged");
  free(s);
  /* the commit alone, once the files are there (a synchronous group save) */
  snprintf(path, sizeof path, "%s/rank_00001.lz4", tmp);
  write_all_file(path, "x", 1);
  snprintf(path, sizeof path, "%s/rank_00002.lz4", tmp);
  write_all_file(path, "x", 1);
  CHECK_ERR(lt_ckpt_commit(tmp, fin, NULL, 3, NULL, NULL, 1), "bad arguments");
  CHECK_OK(lt_ckpt_commit(tmp, fin, "{\"m\": 9}", 3, latest, "step_000009\n", 1));
  s = read_all(latest, &n);
  CHECK(s && strcmp(s, "step_000009\n") == 0, "latest names the committed step");
  free(s);
  CHECK(access(tmp, F_OK) != 0 && access(fin, F_OK) == 0, "renamed into place");
  CHECK_OK(lt_ckpt_remove_tree(fin));
  CHECK(access(fin, F_OK) != 0, "remove_tree");
  CHECK_OK(lt_ckpt_remove_tree(tmp)); /* nothing there: fine */
  /* bad arguments */
  CHECK_ERR(lt_ckpt_job_new(&j, "", 0, 0), "path is empty");
  CHECK_ERR(lt_ckpt_job_new(&j, "x", 0, 13), "level 13");
  CHECK_ERR(lt_ckpt_job_new(NULL, "x", 0, 0), "out is NULL");
  CHECK_ERR(lt_ckpt_job_wait(NULL), "NULL");
  CHECK_OK(lt_ckpt_job_free(NULL));
  CHECK_OK(lt_ckpt_job_new(&j, "/nonexistent/dir/rank.lz4", 0, 0));
  CHECK_ERR(lt_ckpt_job_add(j, NULL, 5, 0, 0), "bad arguments");
  CHECK_ERR(lt_ckpt_job_add(j, piece_data[2], 10, 3, 0), "shuffle 3 must be");
  CHECK_ERR(lt_ckpt_job_add(j, piece_data[2], 6, 4, 0), "divide the 6 bytes");
  CHECK_ERR(lt_ckpt_job_wait(j), "never started");
  CHECK_ERR(lt_ckpt_job_commit(j, "a", "b", "{}", 0, NULL, NULL, 1), "world must be");
  CHECK_ERR(lt_ckpt_job_run(j), "ckpt: cannot write /nonexistent/dir/rank.lz4: cannot create a temporary file in "
                                "/nonexistent/dir: no such file or directory");
  lt_ckpt_job_free(j);
  CHECK_OK(lt_ckpt_wait_all());
  CHECK_OK(lt_ckpt_fault("save:never")); /* LUTRA_FAULT unset or another point: returns */
  setenv("LUTRA_FAULT", "save:x@3", 1);
  setenv("LUTRA_RANK", "2", 1);
  CHECK_OK(lt_ckpt_fault("save:x"));  /* another rank's fault */
  CHECK_OK(lt_ckpt_fault("save:xy")); /* not a prefix match */
  unsetenv("LUTRA_FAULT");
}

static int check_manifest(const char *text, int64_t *nt, int64_t *np) {
  return lt_ckpt_manifest_check(text, (int64_t)strlen(text), "m.json", nt, np);
}

static void test_manifest(void) {
  const char *good = "{\"format\":\"lutra-checkpoint\",\"version\":1,\"step\":3,\"files\":[\"rank_00000.lz4\","
                     "\"rank_00001.lz4\"],\"tensors\":[{\"name\":\"w\",\"dtype\":\"bf16\",\"shape\":[4,6],\"pieces\":"
                     "[{\"file\":0,\"index\":0,\"offset\":[0,0],\"shape\":[2,6],\"bytes\":24},{\"file\":1,\"index\":0,"
                     "\"offset\":[2,0],\"shape\":[2,6],\"bytes\":24}]},{\"name\":\"s\",\"dtype\":\"f32\",\"shape\":[],"
                     "\"pieces\":[{\"file\":1,\"index\":1,\"offset\":[],\"shape\":[],\"bytes\":4}]}]}";
  int64_t nt = 0, np = 0;
  CHECK_OK(check_manifest(good, &nt, &np));
  CHECK(nt == 2 && np == 3, "counts %lld %lld", (long long)nt, (long long)np);
  struct {
    const char *from, *to, *needle;
  } bad[] = {
      {"lutra-checkpoint", "lutra-x", "not a lutra checkpoint"},
      {"\"version\":1", "\"version\":2", "version must be 1"},
      {"\"step\":3", "\"step\":-3", "step must be"},
      {"\"rank_00001.lz4\"", "\"../etc/passwd\"", "plain file names"},
      {"\"dtype\":\"bf16\"", "\"dtype\":\"f8\"", "'w': unknown dtype"},
      {"\"offset\":[2,0]", "\"offset\":[3,0]", "'w': piece 1: dim 0: [3, +2) outside the global size 4"},
      {"\"bytes\":24}]", "\"bytes\":48}]", "'w': piece 1: bytes must be 24"},
      {"\"file\":1,\"index\":0", "\"file\":2,\"index\":0", "file must index the 2 files"},
      {"\"name\":\"s\"", "\"name\":\"w\"", "'w' is listed twice"},
      {"\"shape\":[4,6]", "\"shape\":[4,6,1,1,1,1,1,1,1]", "at most 8"},
      {"\"offset\":[0,0]", "\"offset\":[0]", "must be 2 integers"},
      {"\"tensors\":[", "\"tensors\":{\"a\":[", "not valid JSON"},
      {"\"step\":3", "\"step\":3,\"extra\":[\"../x.json\",\"e1\"]", "extra[0] = '../x.json': entries must be plain"},
      {"\"step\":3", "\"step\":3,\"extra\":[\"e0\"]", "extra lists 1 files, one per rank's file (2)"},
      {"\"step\":3", "\"step\":3,\"copied\":[\"/etc/passwd\"]", "copied[0] = '/etc/passwd'"},
      {"\"step\":3", "\"step\":3,\"world\":3", "world must be the number of rank files (2)"},
      {"\"step\":3", "\"step\":3,\"kind\":7", "kind must be a string"},
      {"\"name\":\"s\"", "\"name\":\"s\\u0000x\"", "the string \"s\\u0000x\" holds a NUL character"},
      {"\"rank_00001.lz4\"", "\"rank_00001.lz4\\u0000/../x\"", "holds a NUL character"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char text[2048];
    const char *at = strstr(good, bad[i].from);
    CHECK(at != NULL, "case %zu: '%s' in the good manifest", i, bad[i].from);
    if (!at) continue;
    snprintf(text, sizeof text, "%.*s%s%s", (int)(at - good), good, bad[i].to, at + strlen(bad[i].from));
    CHECK_ERR(check_manifest(text, NULL, NULL), bad[i].needle);
    CHECK(strstr(lt_last_error(), "m.json") != NULL, "the source is named: %s", lt_last_error());
  }
  { /* an escaped backslash before u0000 is no NUL; extra, copied, world and kind as lutra writes them */
    char text[2048];
    const char *at = strstr(good, "\"name\":\"s\"");
    snprintf(text, sizeof text, "%.*s\"name\":\"s\\\\u0000\"%s", (int)(at - good), good, at + strlen("\"name\":\"s\""));
    CHECK_OK(check_manifest(text, NULL, NULL));
    at = strstr(good, "\"step\":3");
    snprintf(text, sizeof text, "%.*s\"step\":3,\"extra\":[\"e0\",\"e1\"],\"copied\":[\"tokenizer.json\"],\"world\":2,"
             "\"kind\":\"train\"%s", (int)(at - good), good, at + strlen("\"step\":3"));
    CHECK_OK(check_manifest(text, NULL, NULL));
  }
  CHECK_ERR(lt_ckpt_manifest_check(NULL, 0, NULL, NULL, NULL), "no manifest");
  CHECK_ERR(check_manifest("[1,2]", NULL, NULL), "not a JSON object");
}

int main(void) {
  snprintf(root, sizeof root, "/tmp/lutra_test_ckpt_io_%d", (int)getpid());
  mkdir(root, 0755);
  unsetenv("LUTRA_FAULT");
  make_pieces();
  test_shuffle();
  test_round_trip();
  test_every_flip();
  test_truncated_and_lying();
  test_files_and_commit();
  test_manifest();
  lt_ckpt_remove_tree(root);
  for (int i = 0; i < NPIECES; i++) free(piece_data[i]);
  return check_summary();
}
