/* fuzz_safetensors.c — libFuzzer harness for the safetensors header parser (host/io/safetensors.c,
 * compiled alone with -fsanitize=fuzzer,address,undefined). Each input is a whole file image:
 * the parser must return an error or a header whose every entry lies inside the data section
 * with the byte size its dtype and shape imply and whose names and metadata are UTF-8, never
 * crash, leak or read out of bounds. */
#include "io/names.h"
#include "io/safetensors.h"
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The parser's only dependency on the rest of the core. */
static char last_error[1024];
int lt_errorf(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_error, sizeof last_error, fmt, ap);
  va_end(ap);
  return -1;
}

static const int itemsize[LT_NUM_DTYPES] = {4, 8, 2, 2, 4, 8, 1, 1};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  lt_st_header *h = NULL;
  if (lt_st_parse(&h, data, (int64_t)size, (int64_t)size, "fuzz") != 0) {
    if (h != NULL || strncmp(last_error, "safetensors: fuzz: ", 19) != 0) abort();
    return 0;
  }
  int64_t n = 0, off = 0;
  lt_st_count(h, &n);
  lt_st_data_offset(h, &off);
  if (off < 8 || off > (int64_t)size) abort();
  for (int64_t i = 0; i < n; i++) {
    lt_st_info info;
    if (lt_st_tensor(h, i, &info) != 0) abort();
    if (info.dtype < 0 || info.dtype >= LT_NUM_DTYPES || info.ndim < 0 || info.ndim > LT_MAX_DIMS) abort();
    if (!lt_utf8_valid(info.name, strlen(info.name), NULL)) abort(); /* names are UTF-8 */
    int64_t bytes = itemsize[info.dtype];
    for (int d = 0; d < info.ndim; d++) bytes *= info.shape[d]; /* checked for overflow by the parser */
    if (info.begin < 0 || info.end - info.begin != bytes || off + info.end > (int64_t)size) abort();
    if (i > 0) {
      lt_st_info prev;
      lt_st_tensor(h, i - 1, &prev);
      if (strcmp(prev.name, info.name) >= 0) abort(); /* sorted, unique */
    }
    int64_t found = -2;
    if (lt_st_find(h, info.name, &found) != 0 || found != i) abort();
  }
  int64_t m = 0;
  lt_st_metadata_count(h, &m);
  for (int64_t i = 0; i < m; i++) {
    const char *k, *v;
    if (lt_st_metadata(h, i, &k, &v) != 0 || strlen(k) + strlen(v) > size) abort();
    if (!lt_utf8_valid(k, strlen(k), NULL) || !lt_utf8_valid(v, strlen(v), NULL)) abort();
  }
  lt_st_close(h);
  return 0;
}

/* lt_st_close lives in io/safetensors_file.c (file IO), not compiled here: a parsed-only header
 * has no file to close. */
int lt_st_close(lt_st_header *h) {
  lt_st_free_parsed(h);
  return 0;
}
