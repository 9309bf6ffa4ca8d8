/* fuzz_tokfile.c — libFuzzer harness for the token file reader (host/io/tokfile.c, compiled with
 * -fsanitize=fuzzer,address,undefined). Each input is a whole token file (put in a memfd, read
 * through /proc/self/fd): reading its header, opening (mapping) it and verifying every token
 * (against the header's vocabulary and a smaller one) must give an error naming the file, or a
 * header whose count matches the file's size, never crash, leak or read out of bounds. */
#include "lutra.h" /* built with -D_GNU_SOURCE (memfd_create; tokfile.c needs it too) */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* The reader's dependencies on the rest of the core: the error, and the tensor helpers of the
 * batch functions, which this harness does not call. */
static char last_error[1024];
int lt_errorf(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_error, sizeof last_error, fmt, ap);
  va_end(ap);
  return -1;
}
const char *lt_last_error(void) { return last_error; }
void *lt_data_ptr(const lt_tensor *t) {
  (void)t;
  abort();
}
const char *lt_desc(char *buf, const lt_tensor *t) {
  (void)buf, (void)t;
  abort();
}
const char *lt_dtype_name(int dtype) {
  (void)dtype;
  return "?";
}
int lt_dtype_size(int dtype) {
  (void)dtype;
  abort();
}
int lt_is_defined(const lt_tensor *t) {
  (void)t;
  abort();
}
int lt_prepare_out(const char *op, lt_tensor *out, int ndim, const int64_t *shape, int dtype, int device) {
  (void)op, (void)out, (void)ndim, (void)shape, (void)dtype, (void)device;
  abort();
}

/* An error must name the file (its /proc/self/fd path). */
static void expect_named(const char *path) {
  if (!strstr(last_error, path)) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  int fd = memfd_create("tokfile", 0);
  if (fd < 0) return 0;
  if (size && write(fd, data, size) != (ssize_t)size) {
    close(fd);
    return 0;
  }
  char path[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  lt_tokfile_info info;
  int header_rc = lt_tokfile_read_header(path, &info);
  if (header_rc != 0) {
    expect_named(path);
  } else if (info.count < 0 || 128 + info.count * (int64_t)info.token_bytes != (int64_t)size ||
             info.vocab_size <= 0 || (info.token_bytes != 2 && info.token_bytes != 4) || info.source_bytes < 0) {
    abort();
  }
  lt_tokfile *f = NULL;
  if (lt_tokfile_open(&f, path) != 0) {
    if (header_rc == 0) abort(); /* open validates as read_header does */
    expect_named(path);
  } else {
    lt_tokfile_info got;
    if (header_rc != 0 || lt_tokfile_get_info(f, &got) != 0 || memcmp(&got, &info, sizeof got) != 0) abort();
    if (lt_tokfile_verify(f) != 0) expect_named(path);
    int64_t small = info.vocab_size > 2 ? info.vocab_size / 2 : 1;
    if (lt_tokfile_verify_ids(f, small) != 0) expect_named(path);
    lt_tokfile_close(f);
  }
  close(fd);
  return 0;
}
