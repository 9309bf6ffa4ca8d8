/* fuzz_shard.c — libFuzzer harness for the checkpoint shard reader (host/io/ckpt_read.c with liblz4,
 * compiled with -fsanitize=fuzzer,address,undefined). Each input is a whole shard file (put in
 * a memfd, read through /proc/self/fd): reading its footer, verifying every piece and reading
 * each piece (and a byte range of it) into an exactly sized buffer must give an error naming the file or the right
 * sizes, never crash, leak or read out of bounds. */
#define _GNU_SOURCE
#include "lutra.h"
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* The reader's dependencies on the rest of the core. */
static char last_error[1024];
int lt_errorf(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_error, sizeof last_error, fmt, ap);
  va_end(ap);
  return -1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  int fd = memfd_create("shard", 0);
  if (fd < 0) return 0;
  if (size && write(fd, data, size) != (ssize_t)size) {
    close(fd);
    return 0;
  }
  char path[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  int64_t raw = -1, comp = -1;
  if (lt_ckpt_verify_file(path, &raw, &comp) != 0) {
    if (!strstr(last_error, "ckpt: ")) abort();
  } else if (raw < 0 || comp < 0 || comp > (int64_t)size) {
    abort();
  }
  lt_ckpt_piece pieces[16];
  int64_t count = 0, file_size = 0;
  if (lt_ckpt_read_index(path, pieces, 16, &count, &file_size) == 0) {
    if (file_size != (int64_t)size || count < 0) abort();
    for (int64_t i = 0; i < count && i < 16; i++) {
      if (pieces[i].offset < 0 || pieces[i].csize < 0 || pieces[i].offset + pieces[i].csize > (int64_t)size) abort();
      if (pieces[i].raw_bytes > (1 << 24)) continue; /* bounded memory, not a parser property */
      void *buf = malloc(pieces[i].raw_bytes ? (size_t)pieces[i].raw_bytes : 1);
      lt_ckpt_read_piece(path, i, &pieces[i], buf, pieces[i].raw_bytes);
      int64_t b0 = pieces[i].raw_bytes / 3, len = pieces[i].raw_bytes / 2; /* a range: frames walked, some decoded */
      lt_ckpt_read_range(path, i, &pieces[i], b0, len, buf);
      free(buf);
    }
  }
  close(fd);
  return 0;
}
