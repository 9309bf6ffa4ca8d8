/* fuzz_json.c — libFuzzer harness for the JSON reader (host/json.c, compiled alone with cJSON
 * and -fsanitize=fuzzer,address,undefined). Each input is a JSON text: the reader must give a
 * document whose every value can be walked (every string read to its stated length), or an
 * error with a line and column; never crash, leak or read out of bounds (the input is not
 * NUL-terminated: the length is honoured). */
#include "lutra.h"
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The reader's only dependency on the rest of the core. */
static char last_error[1024];
int lt_errorf(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_error, sizeof last_error, fmt, ap);
  va_end(ap);
  return -1;
}

static volatile unsigned sink;

static void touch(const char *s, int64_t len) {
  if (len < 0 || (len > 0 && !s)) abort();
  for (int64_t k = 0; k < len; k++) sink += (unsigned char)s[k];
}

static void walk(const lt_json_doc *doc, const lt_json_value *v, int depth) {
  if (depth > 600) abort(); /* the bound given below is 512 */
  int64_t len = -1;
  switch (lt_json_type(v)) {
  case LT_JSON_NUMBER: sink += (unsigned)(lt_json_number(v) != 0); break;
  case LT_JSON_STRING: touch(lt_json_string(doc, v, &len), len); break;
  case LT_JSON_OBJECT:
    for (const lt_json_value *m = lt_json_first(v); m; m = lt_json_next(m)) {
      touch(lt_json_key(doc, m, &len), len);
      walk(doc, m, depth + 1);
    }
    break;
  case LT_JSON_ARRAY:
    for (const lt_json_value *it = lt_json_first(v); it; it = lt_json_next(it)) walk(doc, it, depth + 1);
    break;
  default: break;
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *copy = malloc(size ? size : 1); /* exactly size bytes: ASan catches a read past the end */
  if (size) memcpy(copy, data, size);
  lt_json_doc *doc = NULL;
  int rc = lt_json_parse(&doc, copy, (int64_t)size, 512);
  if (rc != 0) {
    if (doc || !strstr(last_error, " at line ")) abort();
  } else {
    walk(doc, lt_json_root(doc), 0);
    lt_json_free(doc);
  }
  free(copy);
  return 0;
}
