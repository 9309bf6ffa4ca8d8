/* test_safetensors.c — the safetensors header parser against crafted bad headers (each
 * defect is an error naming the problem, never a crash), the exact bytes of a tiny file
 * written from the format's spec, a file laid out as the reference writer does (data not
 * in name order), and save/open/load round trips of random tensors of every dtype. */
#include "check.h"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* A file image: 8-byte little-endian length of json, json, then data_size bytes of data. */
static unsigned char *image(const char *json, int64_t data_size, int64_t *len) {
  size_t n = strlen(json);
  *len = 8 + (int64_t)n + data_size;
  unsigned char *buf = calloc((size_t)*len, 1);
  for (int k = 0; k < 8; k++) buf[k] = (unsigned char)((uint64_t)n >> (8 * k));
  memcpy(buf + 8, json, n);
  return buf;
}

/* Parses json + data_size bytes of data; returns the status and frees the header. */
static int parse(const char *json, int64_t data_size) {
  int64_t len;
  unsigned char *buf = image(json, data_size, &len);
  lt_st_header *h = (lt_st_header *)0x1;
  int rc = lt_st_parse(&h, buf, len, len, "t.safetensors");
  if (rc != 0 && h != NULL) {
    fprintf(stderr, "parse failed but left a header\n");
    rc = 99;
  }
  lt_st_close(h);
  free(buf);
  return rc;
}

static void test_bad_headers(void) {
  unsigned char small[7] = {0};
  lt_st_header *h;
  CHECK_ERR(lt_st_parse(&h, small, 7, 7, "t.safetensors"), "t.safetensors: too short (7 bytes)");
  unsigned char huge[16] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
  CHECK_ERR(lt_st_parse(&h, huge, 16, 16, NULL), "buffer: header length 18446744073709551615 exceeds the bound");
  unsigned char past[16] = {100, 0, 0, 0, 0, 0, 0, 0, '{', '}'};
  CHECK_ERR(lt_st_parse(&h, past, 16, 16, NULL), "header length 100 runs past the end of the file (16 bytes)");
  CHECK_ERR(lt_st_parse(&h, past, 16, 1000, NULL), "header length 100 but only 16 bytes given");
  CHECK_ERR(lt_st_parse(NULL, past, 16, 16, NULL), "out is NULL");
  CHECK_ERR(lt_st_parse(&h, NULL, 16, 16, NULL), "buffer is NULL");

  CHECK_ERR(parse("", 0), "does not start with a JSON object");
  CHECK_ERR(parse("[1, 2]", 0), "does not start with a JSON object");
  CHECK_ERR(parse("{\"a\": ", 0), "header is not well-formed JSON");
  CHECK_ERR(parse("{\"a\" 1}", 0), "header is not well-formed JSON (at byte");
  CHECK_ERR(parse("{}x  ", 0), "extra bytes after the JSON object (at byte 2");
  unsigned char nulpad[12] = {4, 0, 0, 0, 0, 0, 0, 0, '{', '}', 0, 0}; /* NUL padding is not spaces */
  CHECK_ERR(lt_st_parse(&h, nulpad, 12, 12, NULL), "extra bytes after the JSON object");
  CHECK_OK(parse("{}      ", 0));
  CHECK_OK(parse("{}", 0));
  CHECK_ERR(parse("{\"w\": 3}", 0), "tensor 'w': entry is not a JSON object");
  CHECK_ERR(parse("{\"w\": {\"shape\": [1], \"data_offsets\": [0, 4]}}", 4), "tensor 'w': dtype missing");
  CHECK_ERR(parse("{\"w\": {\"dtype\": 4, \"shape\": [1], \"data_offsets\": [0, 4]}}", 4), "dtype missing or not");
  CHECK_ERR(parse("{\"w\": {\"dtype\": \"F33\", \"shape\": [1], \"data_offsets\": [0, 4]}}", 4),
            "tensor 'w': unknown dtype 'F33'");
  CHECK_ERR(parse("{\"w\": {\"dtype\": \"I8\", \"shape\": [4], \"data_offsets\": [0, 4]}}", 4),
            "tensor 'w': dtype I8 is not supported by lutra");
  CHECK_ERR(parse("{\"w\": {\"dtype\": \"F8_E4M3\", \"shape\": [4], \"data_offsets\": [0, 4]}}", 4),
            "dtype F8_E4M3 is not supported");
  CHECK_ERR(parse("{\"w\": {\"dtype\": \"F32\", \"data_offsets\": [0, 4]}}", 4), "tensor 'w': shape missing");
  CHECK_ERR(parse("{\"w\": {\"dtype\": \"F32\", \"shape\": [-1], \"data_offsets\": [0, 4]}}", 4),
            "tensor 'w': shape entry 0 is not a non-negative integer");
  CHECK_ERR(parse("{\"w\": {\"dtype\": \"F32\", \"shape\": [2, 1.5], \"data_offsets\": [0, 4]}}", 4),
            "shape entry 1 is not a non-negative integer");
  CHECK_ERR(parse("{\"w\": {\"dtype\": \"F32\", \"shape\": [\"2\"], \"data_offsets\": [0, 8]}}", 8),
            "shape entry 0 is not");
  CHECK_ERR(parse("{\"w\": {\"dtype\": \"F32\", \"shape\": [1e300], \"data_offsets\": [0, 8]}}", 8),
            "shape entry 0 is not");
  CHECK_ERR(parse("{\"w\": {\"dtype\": \"F32\", \"shape\": [4294967296, 4294967296, 4], \"data_offsets\": [0, 8]}}", 8),
            "tensor 'w': shape's byte size overflows 64 bits");
  CHECK_ERR(parse("{\"w\": {\"dtype\": \"U8\", \"shape\": [1,1,1,1,1,1,1,1,1], \"data_offsets\": [0, 1]}}", 1),
            "tensor 'w': 9 dims (lutra tensors have at most 8)");
  CHECK_ERR(parse("{\"w\": {\"dtype\": \"F32\", \"shape\": [2]}}", 8), "data_offsets missing");
  CHECK_ERR(parse("{\"w\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 4, 8]}}", 8),
            "data_offsets missing or not a list of 2");
  CHECK_ERR(parse("{\"w\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, -8]}}", 8),
            "data_offsets are not non-negative integers");
  CHECK_ERR(parse("{\"w\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [8, 0]}}", 8),
            "data_offsets [8, 0] end before they begin");
  CHECK_ERR(parse("{\"w\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}}", 7),
            "tensor 'w': data_offsets [0, 8] run past the data section (7 bytes; truncated file?)");
  CHECK_ERR(parse("{\"w\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 4]}}", 8),
            "tensor 'w': data_offsets [0, 4] hold 4 bytes but shape and dtype F32 need 8");
  CHECK_ERR(parse("{\"w\": {\"dtype\": \"BF16\", \"shape\": [2, 3], \"data_offsets\": [0, 24]}}", 24),
            "hold 24 bytes but shape and dtype BF16 need 12");
  CHECK_ERR(parse("{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]},"
                  " \"b\": {\"dtype\": \"U8\", \"shape\": [4], \"data_offsets\": [4, 8]}}",
                  8),
            "tensors 'a' [0, 8] and 'b' [4, 8] overlap");
  CHECK_ERR(parse("{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]},"
                  " \"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 8]}}",
                  8),
            "tensor 'a' appears twice");
  CHECK_ERR(parse("{\"__metadata__\": [1]}", 0), "__metadata__ is not a JSON object");
  CHECK_ERR(parse("{\"__metadata__\": {\"format\": 1}}", 0), "__metadata__ value of 'format' is not a string");
  CHECK_ERR(parse("{\"__metadata__\": {}, \"__metadata__\": {}}", 0), "__metadata__ appears twice");
  CHECK_ERR(parse("{\"__metadata__\": {\"k\": \"1\", \"k\": \"2\"}}", 0), "__metadata__ key 'k' appears twice");

  /* valid edge cases: empty tensors anywhere, scalars, gaps between tensors */
  CHECK_OK(parse("{\"e\": {\"dtype\": \"F32\", \"shape\": [0, 3], \"data_offsets\": [4, 4]},"
                 " \"s\": {\"dtype\": \"I64\", \"shape\": [], \"data_offsets\": [0, 8]},"
                 " \"g\": {\"dtype\": \"BOOL\", \"shape\": [2], \"data_offsets\": [10, 12]}}",
                 12));

  /* nesting far past cJSON's limit fails as bad JSON, not a stack overflow */
  size_t depth = 200000;
  char *deep = malloc(depth + 16);
  strcpy(deep, "{\"a\":");
  memset(deep + 5, '[', depth);
  deep[depth + 5] = 0;
  CHECK_ERR(parse(deep, 0), "not well-formed JSON");
  free(deep);
}

/* The file for {"a": f32 [1, 2], "b": i64 [[-3]]} with metadata {"format": "pt"}, byte by
 * byte from the spec: u64 LE header length, the JSON padded with spaces to a multiple of 8,
 * then the data, little-endian, in header order. */
static void test_spec_bytes(const char *dir) {
  const char *json =
      "{\"__metadata__\":{\"format\":\"pt\"},\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
      "\"b\":{\"dtype\":\"I64\",\"shape\":[1,1],\"data_offsets\":[8,16]}}";
  size_t n = strlen(json), padded = (n + 7) / 8 * 8;
  unsigned char expect[512] = {0};
  size_t len = 0;
  for (int k = 0; k < 8; k++) expect[len++] = (unsigned char)(padded >> (8 * k));
  memcpy(expect + len, json, n);
  len += n;
  while (len < 8 + padded) expect[len++] = ' ';
  const unsigned char data[16] = {0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x00, 0x40,  /* 1.0f, 2.0f */
                                  0xfd, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}; /* -3 */
  memcpy(expect + len, data, 16);
  len += 16;

  lt_tensor *a = lt_tensor_new(), *b = lt_tensor_new();
  int64_t sa[1] = {2}, sb[2] = {1, 1};
  CHECK_OK(lt_empty(a, 1, sa, LT_F32, LT_DEVICE_CPU));
  CHECK_OK(lt_empty(b, 2, sb, LT_I64, LT_DEVICE_CPU));
  ((float *)lt_data_ptr(a))[0] = 1, ((float *)lt_data_ptr(a))[1] = 2;
  ((int64_t *)lt_data_ptr(b))[0] = -3;
  char path[512];
  snprintf(path, sizeof path, "%s/spec.safetensors", dir);
  const char *names[2] = {"b", "a"}; /* given out of order: written sorted */
  const lt_tensor *ts[2] = {b, a};
  const char *mk[1] = {"format"}, *mv[1] = {"pt"};
  CHECK_OK(lt_st_save(path, 2, names, ts, 1, mk, mv));
  FILE *f = fopen(path, "rb");
  unsigned char got[512];
  size_t got_len = f ? fread(got, 1, sizeof got, f) : 0;
  if (f) fclose(f);
  CHECK(got_len == len && memcmp(got, expect, len) == 0, "file bytes differ from the spec's (%zu vs %zu bytes)",
        got_len, len);
  CHECK(len % 8 == 0 && (8 + padded) % 8 == 0, "data starts 8-byte aligned");

  /* and the hand-made bytes parse back */
  lt_st_header *h;
  CHECK_OK(lt_st_parse(&h, expect, (int64_t)len, (int64_t)len, "spec"));
  int64_t count = 0, off = 0, nm = 0, idx = 0;
  CHECK_OK(lt_st_count(h, &count));
  CHECK_OK(lt_st_data_offset(h, &off));
  CHECK_OK(lt_st_metadata_count(h, &nm));
  CHECK(count == 2 && off == (int64_t)(8 + padded) && nm == 1, "count %lld offset %lld meta %lld", (long long)count,
        (long long)off, (long long)nm);
  const char *k, *v;
  CHECK_OK(lt_st_metadata(h, 0, &k, &v));
  CHECK(strcmp(k, "format") == 0 && strcmp(v, "pt") == 0, "metadata %s=%s", k, v);
  CHECK_ERR(lt_st_metadata(h, 1, &k, &v), "metadata index 1 out of range [0, 1)");
  lt_st_info info;
  CHECK_OK(lt_st_find(h, "b", &idx));
  CHECK_OK(lt_st_tensor(h, idx, &info));
  CHECK(idx == 1 && strcmp(info.name, "b") == 0 && info.dtype == LT_I64 && info.ndim == 2 && info.shape[0] == 1 &&
            info.shape[1] == 1 && info.begin == 8 && info.end == 16,
        "entry b");
  CHECK_OK(lt_st_find(h, "zz", &idx));
  CHECK(idx == -1, "absent name");
  CHECK_ERR(lt_st_tensor(h, 2, &info), "tensor index 2 out of range [0, 2)");
  lt_tensor *t = lt_tensor_new();
  CHECK_ERR(lt_st_load(t, h, 0), "parsed from a buffer");
  lt_release(t);
  lt_st_close(h);
  lt_release(a);
  lt_release(b);
}

/* As the reference writer lays files out: data sorted by dtype, then name, so not in name order. */
static void test_reference_layout(const char *dir) {
  const char *json = "{\"__metadata__\":{\"format\":\"pt\"},\"z\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":"
                     "[0,8]},\"a\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[8,12]}}  ";
  int64_t len;
  unsigned char *buf = image(json, 12, &len);
  double z = -2.5;
  memcpy(buf + len - 12, &z, 8);
  buf[len - 4] = 0x00, buf[len - 3] = 0x3c; /* f16 1.0 */
  buf[len - 2] = 0x00, buf[len - 1] = 0xc0; /* f16 -2.0 */
  char path[512];
  snprintf(path, sizeof path, "%s/ref.safetensors", dir);
  FILE *f = fopen(path, "wb");
  fwrite(buf, 1, (size_t)len, f);
  fclose(f);
  lt_st_header *h;
  CHECK_OK(lt_st_open(&h, path));
  lt_tensor *ta = lt_tensor_new(), *tz = lt_tensor_new();
  CHECK_OK(lt_st_load(ta, h, 0)); /* "a" sorts first */
  CHECK_OK(lt_st_load(tz, h, 1));
  CHECK(ta->dtype == LT_F16 && check_at(ta, 0) == 1.0 && check_at(ta, 1) == -2.0, "a = %g %g", check_at(ta, 0),
        check_at(ta, 1));
  CHECK(tz->dtype == LT_F64 && check_at(tz, 0) == -2.5, "z = %g", check_at(tz, 0));
  /* a defined out must match */
  lt_tensor *wrong = lt_tensor_new();
  int64_t s3[1] = {3};
  CHECK_OK(lt_empty(wrong, 1, s3, LT_F16, LT_DEVICE_CPU));
  CHECK_ERR(lt_st_load(wrong, h, 0), "safetensors load 'a'");
  CHECK_ERR(lt_st_load(wrong, h, 5), "tensor index 5 out of range");
  lt_st_close(h);
  lt_release(ta), lt_release(tz), lt_release(wrong);

  /* truncated: the last tensor's bytes are not all there */
  f = fopen(path, "wb");
  fwrite(buf, 1, (size_t)len - 1, f);
  fclose(f);
  CHECK_ERR(lt_st_open(&h, path), "tensor 'a': data_offsets [8, 12] run past the data section (11 bytes");
  f = fopen(path, "wb");
  fwrite(buf, 1, 5, f);
  fclose(f);
  CHECK_ERR(lt_st_open(&h, path), "too short (5 bytes)");
  free(buf);
  CHECK_ERR(lt_st_open(&h, "/nonexistent/x.safetensors"), "cannot open /nonexistent/x.safetensors");
  CHECK_ERR(lt_st_open(&h, dir), "is not a regular file");
}

static void test_round_trips(const char *dir) {
  char path[512];
  snprintf(path, sizeof path, "%s/rt.safetensors", dir);
  for (int round = 0; round < 20; round++) {
    int n = (int)check_randint(0, 7);
    lt_tensor *ts[8];
    char names[8][32];
    const char *name_ptrs[8];
    for (int k = 0; k < n; k++) {
      int ndim = (int)check_randint(0, 4);
      int64_t shape[4];
      for (int d = 0; d < ndim; d++) shape[d] = check_randint(0, 5);
      int dtype = (int)check_randint(0, LT_NUM_DTYPES);
      ts[k] = lt_tensor_new();
      CHECK_OK(lt_empty(ts[k], ndim, shape, dtype, LT_DEVICE_CPU));
      unsigned char *p = lt_data_ptr(ts[k]);
      for (int64_t b = 0, nb = lt_numel(ts[k]) * lt_dtype_size(dtype); b < nb; b++)
        p[b] = (unsigned char)check_randint(0, 256);
      if (dtype == LT_BOOL)
        for (int64_t b = 0; b < lt_numel(ts[k]); b++) p[b] &= 1;
      snprintf(names[k], sizeof names[k], "layer.%d.w%d", (int)check_randint(0, 1000), k);
      name_ptrs[k] = names[k];
    }
    CHECK_OK(lt_st_save(path, n, name_ptrs, (const lt_tensor *const *)ts, 0, NULL, NULL));
    lt_st_header *h;
    CHECK_OK(lt_st_open(&h, path));
    int64_t count = -1, off = 0;
    lt_st_count(h, &count);
    lt_st_data_offset(h, &off);
    CHECK(count == n && off % 8 == 0, "round %d: count %lld of %d, data offset %lld", round, (long long)count, n,
          (long long)off);
    for (int k = 0; k < n && count == n; k++) {
      int64_t idx;
      CHECK_OK(lt_st_find(h, names[k], &idx));
      lt_tensor *back = lt_tensor_new();
      CHECK_OK(lt_st_load(back, h, idx));
      int same = back->dtype == ts[k]->dtype && back->ndim == ts[k]->ndim;
      for (int d = 0; same && d < back->ndim; d++) same = back->shape[d] == ts[k]->shape[d];
      int64_t nb = lt_numel(ts[k]) * lt_dtype_size(ts[k]->dtype);
      same = same && memcmp(lt_data_ptr(back), lt_data_ptr(ts[k]), (size_t)nb) == 0;
      CHECK(same, "round %d: tensor %s differs after the round trip", round, names[k]);
      lt_release(back);
    }
    lt_st_close(h);
    for (int k = 0; k < n; k++) lt_release(ts[k]);
  }
  /* no temporary file is left behind */
  char tmp[600];
  snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
  CHECK(access(tmp, F_OK) != 0, "temporary file left: %s", tmp);
}

static void test_save_errors(const char *dir) {
  char path[512];
  snprintf(path, sizeof path, "%s/bad.safetensors", dir);
  int64_t shape[2] = {2, 3};
  lt_tensor *a = check_random(2, shape, LT_F32, -1, 1), *at = lt_tensor_new(), *undef = lt_tensor_new();
  CHECK_OK(lt_transpose(at, a, 0, 1));
  const char *two[2] = {"x", "x"};
  const lt_tensor *aa[2] = {a, a};
  CHECK_ERR(lt_st_save(path, 2, two, aa, 0, NULL, NULL), "tensor name 'x' given twice");
  const char *meta_name[1] = {"__metadata__"};
  CHECK_ERR(lt_st_save(path, 1, meta_name, aa, 0, NULL, NULL), "may not be named __metadata__");
  const char *one[1] = {"t"};
  const lt_tensor *nc[1] = {at};
  CHECK_ERR(lt_st_save(path, 1, one, nc, 0, NULL, NULL), "tensor 't' must be contiguous on the cpu");
  const lt_tensor *un[1] = {undef};
  CHECK_ERR(lt_st_save(path, 1, one, un, 0, NULL, NULL), "tensor 't'");
  const char *nul[1] = {NULL};
  CHECK_ERR(lt_st_save(path, 1, nul, aa, 0, NULL, NULL), "name 0 is NULL");
  const char *mk[2] = {"k", "k"}, *mv[2] = {"1", "2"};
  CHECK_ERR(lt_st_save(path, 1, one, aa, 2, mk, mv), "metadata key 'k' given twice");
  CHECK_ERR(lt_st_save("/nonexistent/dir/x.safetensors", 1, one, aa, 0, NULL, NULL), "cannot create");
  CHECK(access(path, F_OK) != 0, "no file written by failed saves");
  lt_release(a), lt_release(at), lt_release(undef);
}

int main(void) {
  char dir[] = "/tmp/lutra_st_XXXXXX";
  if (!mkdtemp(dir)) return 2;
  test_bad_headers();
  test_spec_bytes(dir);
  test_reference_layout(dir);
  test_round_trips(dir);
  test_save_errors(dir);
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
  return check_summary();
}
