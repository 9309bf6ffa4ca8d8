/* fuzz_manifest.c — libFuzzer harness for the checkpoint manifest validator (host/io/ckpt_manifest.c,
 * compiled alone with -fsanitize=fuzzer,address,undefined). Each input is a manifest.json text:
 * the validator must return an error naming the source, or counts that are sane, never crash,
 * leak or read out of bounds (the input is not NUL-terminated: the length is honoured). */
#include "lutra.h"
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The validator's only dependency on the rest of the core. */
static char last_error[1024];
int lt_errorf(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_error, sizeof last_error, fmt, ap);
  va_end(ap);
  return -1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *copy = malloc(size ? size : 1); /* exactly size bytes: ASan catches a read past the end */
  if (size) memcpy(copy, data, size);
  int64_t nt = -1, np = -1;
  int rc = lt_ckpt_manifest_check(copy, (int64_t)size, "fuzz", &nt, &np);
  free(copy);
  if (rc != 0) {
    if (strncmp(last_error, "ckpt: fuzz: ", 12) != 0) abort();
    return 0;
  }
  if (nt < 0 || np < 0 || (int64_t)size < 2 * nt) abort();
  return 0;
}
