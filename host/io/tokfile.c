/* tokfile.c — token files: a corpus tokenized once, written by streaming, read
 * by mmap.
 *
 * The layout is in lutra.h ("token files"). Every header field is validated on
 * open (the reserved bytes must be zero), and the file size must be exactly the
 * header's, so that a truncated copy, a file of another kind or a newer format
 * is an error naming the file, never a read past the end. Verifying reads every
 * token once: the FNV-1a hash must match the header's and every id must be in
 * the vocabulary, so that damaged tokens are an error naming the file and the
 * offset of the first bad id before any batch is made. Batches copy windows of
 * tokens out of the mapping, widening u16/u32 to i32/i64. */
#include "io/atomic_file.h"
#include "core/internal.h"
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "token files are little-endian; this host is not"
#endif

enum { HEADER_BYTES = 128, RESERVED_FROM = 72, FORMAT_VERSION = 1, WRITE_CHUNK = 16384 };
static const char MAGIC[8] = {'L', 'U', 'T', 'R', 'A', 'T', 'O', 'K'};
static const uint64_t FNV_BASIS = 0xcbf29ce484222325ull, FNV_PRIME = 0x100000001b3ull;

static uint64_t fnv1a(const void *data, size_t n, uint64_t h) {
  const unsigned char *p = data;
  for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * FNV_PRIME;
  return h;
}

int lt_hash64(const void *data, int64_t nbytes, uint64_t *hash) {
  if (!hash) return lt_errorf("hash64: hash is NULL");
  if (nbytes < 0 || (nbytes > 0 && !data)) return lt_errorf("hash64: bad buffer (%lld bytes)", (long long)nbytes);
  *hash = fnv1a(data, (size_t)nbytes, *hash);
  return 0;
}

int lt_file_stat(const char *path, int64_t *size, int64_t *mtime_ns) {
  struct stat st;
  if (!path) return lt_errorf("file_stat: path is NULL");
  if (stat(path, &st) != 0) return lt_errorf("file_stat: '%s': %s", path, strerror(errno));
  if (size) *size = (int64_t)st.st_size;
  if (mtime_ns) *mtime_ns = (int64_t)st.st_mtim.tv_sec * 1000000000 + (int64_t)st.st_mtim.tv_nsec;
  return 0;
}

/* ---- header
 * ------------------------------------------------------------------------ */

static void put_u32(unsigned char *p, uint32_t v) { memcpy(p, &v, 4); }
static void put_u64(unsigned char *p, uint64_t v) { memcpy(p, &v, 8); }
static uint32_t get_u32(const unsigned char *p) {
  uint32_t v;
  memcpy(&v, p, 4);
  return v;
}
static uint64_t get_u64(const unsigned char *p) {
  uint64_t v;
  memcpy(&v, p, 8);
  return v;
}

static void encode_header(unsigned char h[HEADER_BYTES], const lt_tokfile_info *in) {
  memset(h, 0, HEADER_BYTES);
  memcpy(h, MAGIC, 8);
  put_u32(h + 8, in->version);
  put_u32(h + 12, in->token_bytes);
  put_u64(h + 16, (uint64_t)in->count);
  put_u64(h + 24, (uint64_t)in->vocab_size);
  put_u64(h + 32, in->tokenizer_hash);
  put_u64(h + 40, in->tokens_hash);
  put_u64(h + 48, (uint64_t)in->source_bytes);
  put_u64(h + 56, in->source_hash);
  put_u64(h + 64, (uint64_t)in->source_mtime_ns);
}

/* Decodes and validates a header read from a file of file_bytes bytes. */
static int decode_header(const char *op, const char *path, const unsigned char *h, int64_t file_bytes,
                         lt_tokfile_info *out) {
  if (file_bytes < HEADER_BYTES)
    return lt_errorf("%s: '%s': %lld bytes, shorter than the %d-byte token "
                     "file header (truncated, or not a "
                     "lutra token file)",
                     op, path, (long long)file_bytes, HEADER_BYTES);
  if (memcmp(h, MAGIC, 8) != 0) {
    char shown[40];
    int n = 0;
    for (int i = 0; i < 8; i++)
      n += snprintf(shown + n, sizeof shown - (size_t)n, h[i] >= 32 && h[i] < 127 ? "%c" : "\\x%02x", h[i]);
    return lt_errorf("%s: '%s': not a lutra token file (magic \"%s\", expected "
                     "\"LUTRATOK\")",
                     op, path, shown);
  }
  lt_tokfile_info info = {.version = get_u32(h + 8),
                          .token_bytes = get_u32(h + 12),
                          .count = (int64_t)get_u64(h + 16),
                          .vocab_size = (int64_t)get_u64(h + 24),
                          .tokenizer_hash = get_u64(h + 32),
                          .tokens_hash = get_u64(h + 40),
                          .source_bytes = (int64_t)get_u64(h + 48),
                          .source_hash = get_u64(h + 56),
                          .source_mtime_ns = (int64_t)get_u64(h + 64)};
  if (info.version != FORMAT_VERSION)
    return lt_errorf("%s: '%s': token file format version %u, this build reads version %d", op, path, info.version,
                     FORMAT_VERSION);
  if (info.token_bytes != 2 && info.token_bytes != 4)
    return lt_errorf("%s: '%s': corrupt header: tokens of %u bytes (expected 2 or 4)", op, path, info.token_bytes);
  int64_t max_vocab = info.token_bytes == 2 ? (int64_t)1 << 16 : (int64_t)1 << 32;
  if (info.vocab_size <= 0 || info.vocab_size > max_vocab)
    return lt_errorf("%s: '%s': corrupt header: vocab_size %lld does not fit %u-byte tokens", op, path,
                     (long long)info.vocab_size, info.token_bytes);
  if (info.count < 0 || info.count > (INT64_MAX - HEADER_BYTES) / 4)
    return lt_errorf("%s: '%s': corrupt header: token count %lld", op, path, (long long)info.count);
  if (info.source_bytes < 0)
    return lt_errorf("%s: '%s': corrupt header: source_bytes %lld", op, path, (long long)info.source_bytes);
  for (int i = RESERVED_FROM; i < HEADER_BYTES; i++)
    if (h[i] != 0)
      return lt_errorf("%s: '%s': corrupt header: byte %d is %u, the bytes from %d on are reserved (zero)", op, path, i,
                       h[i], RESERVED_FROM);
  int64_t want = HEADER_BYTES + info.count * info.token_bytes;
  if (file_bytes < want)
    return lt_errorf("%s: '%s': truncated: the header says %lld tokens of %u "
                     "bytes (%lld bytes in all), the file "
                     "has %lld bytes",
                     op, path, (long long)info.count, info.token_bytes, (long long)want, (long long)file_bytes);
  if (file_bytes > want)
    return lt_errorf("%s: '%s': size mismatch: the header says %lld tokens of "
                     "%u bytes (%lld bytes in all), the "
                     "file has %lld bytes (%lld extra)",
                     op, path, (long long)info.count, info.token_bytes, (long long)want, (long long)file_bytes,
                     (long long)(file_bytes - want));
  *out = info;
  return 0;
}

/* Opens path and reads its header; returns the descriptor (-1 on error). */
static int open_and_read_header(const char *op, const char *path, lt_tokfile_info *info) {
  if (!path) return lt_errorf("%s: path is NULL", op);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return lt_errorf("%s: '%s': cannot open: %s", op, path, strerror(errno));
  struct stat st;
  unsigned char h[HEADER_BYTES] = {0};
  if (fstat(fd, &st) != 0) {
    lt_errorf("%s: '%s': cannot stat: %s", op, path, strerror(errno));
    close(fd);
    return -1;
  }
  if (!S_ISREG(st.st_mode)) {
    lt_errorf("%s: '%s': not a regular file", op, path);
    close(fd);
    return -1;
  }
  ssize_t got = st.st_size >= HEADER_BYTES ? pread(fd, h, HEADER_BYTES, 0) : 0;
  if (got < 0 || (st.st_size >= HEADER_BYTES && got != HEADER_BYTES)) {
    lt_errorf("%s: '%s': cannot read the header: %s", op, path, got < 0 ? strerror(errno) : "short read");
    close(fd);
    return -1;
  }
  if (decode_header(op, path, h, (int64_t)st.st_size, info)) {
    close(fd);
    return -1;
  }
  return fd;
}

/* ---- writing
 * ---------------------------------------------------------------------------
 */

struct lt_tokwriter {
  lt_atomic_file *file; /* the temporary beside path (io/atomic_file.c), renamed over it by finish */
  char *path;
  lt_tokfile_info info;
  unsigned char chunk[WRITE_CHUNK * 4];
};

static void writer_free(lt_tokwriter *w) {
  if (!w) return;
  lt_atomic_file_abort(w->file);
  free(w->path);
  free(w);
}

int lt_tokwriter_open(lt_tokwriter **out, const char *path, int64_t vocab_size, uint64_t tokenizer_hash) {
  const char *op = "tokwriter_open";
  if (!out || !path) return lt_errorf("%s: out or path is NULL", op);
  *out = NULL;
  if (vocab_size <= 0 || vocab_size > ((int64_t)1 << 32))
    return lt_errorf("%s: '%s': vocab_size %lld is not in [1, 2^32]", op, path, (long long)vocab_size);
  lt_tokwriter *w = calloc(1, sizeof *w);
  if (!w || !(w->path = strdup(path))) {
    writer_free(w);
    return lt_errorf("%s: out of host memory", op);
  }
  w->info = (lt_tokfile_info){.version = FORMAT_VERSION,
                              .token_bytes = vocab_size <= ((int64_t)1 << 16) ? 2 : 4,
                              .vocab_size = vocab_size,
                              .tokenizer_hash = tokenizer_hash,
                              .tokens_hash = FNV_BASIS};
  /* a temporary of its own (a random name): several processes (ranks) may tokenize the same
   * corpus at once, and the last rename wins with a whole file */
  unsigned char h[HEADER_BYTES] = {0}; /* zeros until finish: an unfinished file has no magic */
  if (lt_atomic_file_open(&w->file, path) != 0 || lt_atomic_file_write(w->file, h, HEADER_BYTES) != 0) {
    lt_io_error_prefix("tokwriter_open: ");
    writer_free(w);
    return -1;
  }
  *out = w;
  return 0;
}

int lt_tokwriter_append(lt_tokwriter *w, const void *ids, int ids_dtype, int64_t count) {
  const char *op = "tokwriter_append";
  if (!w) return lt_errorf("%s: writer is NULL", op);
  if (ids_dtype != LT_I32 && ids_dtype != LT_I64)
    return lt_errorf("%s: '%s': ids are %s, expected i32 or i64", op, w->path, lt_dtype_name(ids_dtype));
  if (count < 0 || (count > 0 && !ids))
    return lt_errorf("%s: '%s': bad id buffer (%lld ids)", op, w->path, (long long)count);
  int64_t V = w->info.vocab_size;
  int width = (int)w->info.token_bytes;
  for (int64_t done = 0; done < count;) {
    int64_t n = count - done < WRITE_CHUNK ? count - done : WRITE_CHUNK;
    for (int64_t i = 0; i < n; i++) {
      int64_t id = ids_dtype == LT_I32 ? ((const int32_t *)ids)[done + i] : ((const int64_t *)ids)[done + i];
      if (id < 0 || id >= V)
        return lt_errorf("%s: '%s': id %lld at position %lld is out of range [0, %lld)", op, w->path, (long long)id,
                         (long long)(done + i), (long long)V);
      if (width == 2) {
        uint16_t v = (uint16_t)id;
        memcpy(w->chunk + i * 2, &v, 2);
      } else {
        uint32_t v = (uint32_t)id;
        memcpy(w->chunk + i * 4, &v, 4);
      }
    }
    size_t nbytes = (size_t)n * (size_t)width;
    if (lt_atomic_file_write(w->file, w->chunk, (int64_t)nbytes) != 0) return lt_io_error_prefix("tokwriter_append: ");
    w->info.tokens_hash = fnv1a(w->chunk, nbytes, w->info.tokens_hash);
    w->info.count += n;
    done += n;
  }
  return 0;
}

int lt_tokwriter_finish(lt_tokwriter *w, int64_t source_bytes, uint64_t source_hash, int64_t source_mtime_ns) {
  const char *op = "tokwriter_finish";
  if (!w) return lt_errorf("%s: writer is NULL", op);
  w->info.source_bytes = source_bytes;
  w->info.source_hash = source_hash;
  w->info.source_mtime_ns = source_mtime_ns;
  unsigned char h[HEADER_BYTES];
  encode_header(h, &w->info);
  if (pwrite(lt_atomic_file_fd(w->file), h, HEADER_BYTES, 0) != HEADER_BYTES) {
    lt_errorf("%s: cannot write %s: %s", op, w->path, strerror(errno));
    writer_free(w);
    return -1;
  }
  lt_atomic_file *f = w->file;
  w->file = NULL;
  int rc = lt_atomic_file_commit(f, 0);
  if (rc != 0) lt_io_error_prefix("tokwriter_finish: ");
  writer_free(w);
  return rc;
}

int lt_tokwriter_abort(lt_tokwriter *w) {
  writer_free(w);
  return 0;
}

/* ---- reading
 * ----------------------------------------------------------------------------
 */

struct lt_tokfile {
  char *path;
  lt_tokfile_info info;
  void *map; /* the whole file */
  size_t map_bytes;
  const unsigned char *tokens; /* map + HEADER_BYTES */
};

int lt_tokfile_read_header(const char *path, lt_tokfile_info *info) {
  if (!info) return lt_errorf("tokfile_read_header: info is NULL");
  int fd = open_and_read_header("tokfile_read_header", path, info);
  if (fd < 0) return -1;
  close(fd);
  return 0;
}

int lt_tokfile_open(lt_tokfile **out, const char *path) {
  const char *op = "tokfile_open";
  if (!out) return lt_errorf("%s: out is NULL", op);
  *out = NULL;
  lt_tokfile_info info;
  int fd = open_and_read_header(op, path, &info);
  if (fd < 0) return -1;
  lt_tokfile *f = calloc(1, sizeof *f);
  if (!f || !(f->path = strdup(path))) {
    free(f);
    close(fd);
    return lt_errorf("%s: out of host memory", op);
  }
  f->info = info;
  f->map_bytes = (size_t)(HEADER_BYTES + info.count * info.token_bytes);
  f->map = mmap(NULL, f->map_bytes, PROT_READ, MAP_SHARED, fd, 0);
  int err = errno;
  close(fd);
  if (f->map == MAP_FAILED) {
    free(f->path);
    free(f);
    return lt_errorf("%s: '%s': cannot map %zu bytes: %s", op, path,
                     (size_t)(HEADER_BYTES + info.count * info.token_bytes), strerror(err));
  }
  f->tokens = (const unsigned char *)f->map + HEADER_BYTES;
  *out = f;
  return 0;
}

int lt_tokfile_close(lt_tokfile *f) {
  if (!f) return 0;
  munmap(f->map, f->map_bytes);
  free(f->path);
  free(f);
  return 0;
}

int lt_tokfile_get_info(const lt_tokfile *f, lt_tokfile_info *info) {
  if (!f || !info) return lt_errorf("tokfile_info: file or info is NULL");
  *info = f->info;
  return 0;
}

/* One pass over the tokens: the checksum, and the first id at or above `limit`. */
int lt_tokfile_verify_ids(const lt_tokfile *f, int64_t vocab_size) {
  const char *op = "tokfile_verify";
  if (!f) return lt_errorf("%s: file is NULL", op);
  int64_t limit = vocab_size > 0 && vocab_size < f->info.vocab_size ? vocab_size : f->info.vocab_size;
  int64_t n = f->info.count, bad = -1, bad_id = 0;
  int w = (int)f->info.token_bytes;
  uint64_t h = FNV_BASIS;
  uint32_t buf[256];
  for (int64_t i0 = 0; i0 < n; i0 += 256) { /* through an aligned buffer, as copy_tokens */
    int64_t m = n - i0 < 256 ? n - i0 : 256;
    const unsigned char *src = f->tokens + i0 * w;
    h = fnv1a(src, (size_t)(m * w), h);
    if (bad >= 0) continue;
    if (w == 2) {
      uint16_t half[256];
      memcpy(half, src, (size_t)m * 2);
      for (int64_t i = 0; i < m; i++) buf[i] = half[i];
    } else {
      memcpy(buf, src, (size_t)m * 4);
    }
    for (int64_t i = 0; i < m; i++)
      if ((int64_t)buf[i] >= limit) {
        bad = i0 + i, bad_id = buf[i];
        break;
      }
  }
  const char *sum = h == f->info.tokens_hash ? "matches the header's" : "differs from the header's too";
  if (bad >= 0)
    return lt_errorf("%s: '%s': token %lld (byte offset %lld) is %lld, outside the vocabulary [0, %lld)%s; the "
                     "tokens checksum %s: the file is corrupt or was made for another tokenizer",
                     op, f->path, (long long)bad, (long long)(HEADER_BYTES + bad * w), (long long)bad_id,
                     (long long)limit, limit < f->info.vocab_size ? " of the tokenizer" : " of the header", sum);
  if (h != f->info.tokens_hash)
    return lt_errorf("%s: '%s': the tokens checksum is %016llx, the header says %016llx: the file is corrupt", op,
                     f->path, (unsigned long long)h, (unsigned long long)f->info.tokens_hash);
  return 0;
}

int lt_tokfile_verify(const lt_tokfile *f) { return lt_tokfile_verify_ids(f, 0); }

/* Copies n tokens of `width` bytes (2 or 4) from src to dst (I32 or I64) at an element
 * stride, through an aligned buffer: src may be odd-aligned in the mapped file. */
static void copy_tokens(void *dst, int dtype, int64_t stride, const unsigned char *src, int width, int64_t n) {
  uint32_t buf[256];
  for (int64_t i0 = 0; i0 < n; i0 += 256) {
    int64_t m = n - i0 < 256 ? n - i0 : 256;
    if (width == 2) {
      uint16_t half[256];
      memcpy(half, src + i0 * 2, (size_t)m * 2);
      for (int64_t i = 0; i < m; i++) buf[i] = half[i];
    } else {
      memcpy(buf, src + i0 * 4, (size_t)m * 4);
    }
    if (dtype == LT_I64) {
      int64_t *d = (int64_t *)dst + i0 * stride;
      for (int64_t i = 0; i < m; i++) d[i * stride] = buf[i];
    } else {
      int32_t *d = (int32_t *)dst + i0 * stride;
      for (int64_t i = 0; i < m; i++) d[i * stride] = (int32_t)buf[i];
    }
  }
}

/* Prepares an I32/I64 output of the given shape (undefined: allocated I64). */
static int prepare_ids_out(const char *op, const char *what, lt_tensor *out, const lt_tokfile *f, int ndim,
                           const int64_t *shape) {
  char d[LT_DESC_STR];
  if (!out) return lt_errorf("%s: %s is NULL", op, what);
  if (!lt_is_defined(out)) return lt_prepare_out(op, out, ndim, shape, LT_I64, LT_DEVICE_CPU);
  if (out->device != LT_DEVICE_CPU)
    return lt_errorf("%s: %s is %s: not implemented on cuda yet", op, what, lt_desc(d, out));
  if (out->dtype != LT_I32 && out->dtype != LT_I64)
    return lt_errorf("%s: %s is %s, expected i32 or i64", op, what, lt_desc(d, out));
  if (out->dtype == LT_I32 && f->info.vocab_size > ((int64_t)1 << 31))
    return lt_errorf("%s: %s is i32 but '%s' has vocab_size %lld: ids need i64", op, what, f->path,
                     (long long)f->info.vocab_size);
  for (int k = 0; k < out->ndim; k++)
    if (out->stride[k] == 0 && out->shape[k] > 1)
      return lt_errorf("%s: %s is an expanded view (its elements overlap)", op, what);
  return lt_prepare_out(op, out, ndim, shape, out->dtype, LT_DEVICE_CPU);
}

int lt_tokfile_tokens(lt_tensor *out, const lt_tokfile *f, int64_t start, int64_t count) {
  const char *op = "tokfile_tokens";
  if (!f) return lt_errorf("%s: file is NULL", op);
  if (start < 0 || count < 0 || start > f->info.count - count)
    return lt_errorf("%s: '%s': tokens [%lld, %lld + %lld) out of range: the file has %lld", op, f->path,
                     (long long)start, (long long)start, (long long)count, (long long)f->info.count);
  int64_t shape[1] = {count};
  LT_TRY(prepare_ids_out(op, "out", out, f, 1, shape));
  int w = (int)f->info.token_bytes;
  copy_tokens(lt_data_ptr(out), out->dtype, out->stride[0], f->tokens + start * w, w, count);
  return 0;
}

/* Row b of x (xlen tokens from src) and of y (T tokens from src + one token), when y is given. */
static inline void batch_row(const lt_tensor *x, const lt_tensor *y, const unsigned char *src, int w, int64_t b,
                             int64_t xlen, int64_t T) {
  char *xp = lt_data_ptr(x);
  copy_tokens(xp + b * x->stride[0] * lt_dtype_size(x->dtype), x->dtype, x->stride[1], src, w, xlen);
  if (y) {
    char *yp = lt_data_ptr(y);
    copy_tokens(yp + b * y->stride[0] * lt_dtype_size(y->dtype), y->dtype, y->stride[1], src + w, w, T);
  }
}

int lt_tokfile_batch(lt_tensor *x, lt_tensor *y, const lt_tokfile *f, const int64_t *starts, int64_t batch,
                     int64_t seq_len) {
  const char *op = "tokfile_batch";
  if (!f) return lt_errorf("%s: file is NULL", op);
  if (batch < 1 || seq_len < 1)
    return lt_errorf("%s: batch %lld and seq_len %lld must be >= 1", op, (long long)batch, (long long)seq_len);
  if (!starts) return lt_errorf("%s: starts is NULL", op);
  if (!x) return lt_errorf("%s: x is NULL", op);
  if (x == y) return lt_errorf("%s: x and y are the same tensor", op);
  int64_t N = f->info.count, T = seq_len;
  for (int64_t b = 0; b < batch; b++) /* all checks before any write */
    if (starts[b] < 0 || starts[b] > N - T - 1)
      return lt_errorf("%s: '%s': start %lld of row %lld out of range: a "
                       "window needs %lld tokens from it, the file "
                       "has %lld (starts must be in [0, %lld])",
                       op, f->path, (long long)starts[b], (long long)b, (long long)(T + 1), (long long)N,
                       (long long)(N - T - 1));
  int64_t xshape[2] = {batch, y ? T : T + 1}, yshape[2] = {batch, T};
  LT_TRY(prepare_ids_out(op, "x", x, f, 2, xshape));
  if (y) LT_TRY(prepare_ids_out(op, "y", y, f, 2, yshape));
  int w = (int)f->info.token_bytes;
  if (batch * T >= LT_PAR_GRAIN) { /* no omp construct for small work: see ew_execute */
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < batch; b++) batch_row(x, y, f->tokens + starts[b] * w, w, b, xshape[1], T);
  } else {
    for (int64_t b = 0; b < batch; b++) batch_row(x, y, f->tokens + starts[b] * w, w, b, xshape[1], T);
  }
  return 0;
}
