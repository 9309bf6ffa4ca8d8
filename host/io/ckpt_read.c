/* ckpt_read.c — reading checkpoint shard files: the footer, whole pieces (lz4 frames verified as
 * they decode), byte ranges of pieces (only the frames holding them decoded), the byte
 * shuffle. Writing is in io/ckpt_write.c, file operations in io/ckpt_files.c. The format is
 * described in lutra.h ("checkpoint io"). */
#define _GNU_SOURCE
#include "io/ckpt.h"
#include "core/internal.h"
#include <errno.h>
#include <fcntl.h>
#include <lz4frame.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const uint32_t lz4_frame_magic = 0x184D2204u;

int lt_ckpt_pread_all(int fd, void *dst, int64_t n, int64_t offset) {
  char *p = dst;
  while (n > 0) {
    size_t chunk = n > (1 << 30) ? (size_t)1 << 30 : (size_t)n;
    ssize_t got = pread(fd, p, chunk, (off_t)offset);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      if (got == 0) errno = 0;
      return -1;
    }
    p += got, n -= got, offset += got;
  }
  return 0;
}

/* ---- the footer ------------------------------------------------------------------------ */

static int open_shard(const char *path, int64_t *size) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return lt_errorf("ckpt: cannot open %s: %s", path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return lt_errorf("ckpt: %s is not a regular file", path);
  }
  *size = (int64_t)st.st_size;
  return fd;
}

/* Reads and checks the footer; entries (count * 40 bytes, malloc'ed) when wanted. */
static int read_footer(int fd, const char *path, int64_t size, int64_t *count, unsigned char **entries) {
  const char *name = lt_ckpt_base(path);
  unsigned char tr[CKPT_TRAILER_BYTES];
  if (size < CKPT_TRAILER_BYTES) return lt_errorf("ckpt: %s: truncated (%lld bytes, no footer)", name, (long long)size);
  if (lt_ckpt_pread_all(fd, tr, CKPT_TRAILER_BYTES, size - CKPT_TRAILER_BYTES) != 0)
    return lt_errorf("ckpt: %s: cannot read the footer: %s", name, errno ? strerror(errno) : "truncated");
  if (memcmp(tr + 16, CKPT_MAGIC, 8) != 0)
    return lt_errorf("ckpt: %s: truncated or not a shard file (no footer magic at the end)", name);
  if (lt_ckpt_get_u32(tr + 12) != CKPT_VERSION)
    return lt_errorf("ckpt: %s: shard version %u (this lutra reads %d)", name, lt_ckpt_get_u32(tr + 12), CKPT_VERSION);
  uint64_t n = lt_ckpt_get_u64(tr);
  if (n > (uint64_t)(size - CKPT_TRAILER_BYTES) / CKPT_ENTRY_BYTES)
    return lt_errorf("ckpt: %s: footer claims %llu pieces, more than the file can hold: size mismatch", name,
                     (unsigned long long)n);
  *count = (int64_t)n;
  size_t bytes = (size_t)n * CKPT_ENTRY_BYTES;
  unsigned char *e = malloc(bytes ? bytes : 1);
  if (!e) return lt_errorf("ckpt: %s: out of memory for a footer of %llu pieces", name, (unsigned long long)n);
  if (lt_ckpt_pread_all(fd, e, (int64_t)bytes, size - CKPT_TRAILER_BYTES - (int64_t)bytes) != 0) {
    free(e);
    return lt_errorf("ckpt: %s: cannot read the footer entries", name);
  }
  if (lt_ckpt_hash(2166136261u, e, bytes) != lt_ckpt_get_u32(tr + 8)) {
    free(e);
    return lt_errorf("ckpt: %s: footer checksum mismatch (the piece index is corrupt)", name);
  }
  int64_t data_end = size - CKPT_TRAILER_BYTES - (int64_t)bytes;
  for (uint64_t i = 0; i < n; i++) {
    const unsigned char *p = e + i * CKPT_ENTRY_BYTES;
    uint64_t off = lt_ckpt_get_u64(p), cs = lt_ckpt_get_u64(p + 8), raw = lt_ckpt_get_u64(p + 16);
    if (off > (uint64_t)data_end || cs > (uint64_t)data_end - off || raw > (uint64_t)INT64_MAX / 2 ||
        lt_ckpt_get_u32(p + 24) == 0 || lt_ckpt_get_u32(p + 32) > 8 ||
        !lt_ckpt_valid_shuffle((int)lt_ckpt_get_u32(p + 32))) {
      free(e);
      return lt_errorf("ckpt: %s: piece %llu: footer entry out of the file's range: size mismatch", name,
                       (unsigned long long)i);
    }
  }
  if (entries)
    *entries = e;
  else
    free(e);
  return 0;
}

int lt_ckpt_read_index(const char *path, lt_ckpt_piece *pieces, int64_t max, int64_t *count, int64_t *file_size) {
  if (!path || !count) return lt_errorf("ckpt: read_index: path and count must not be NULL");
  if (max < 0 || (max > 0 && !pieces)) return lt_errorf("ckpt: read_index: bad max / pieces");
  int64_t size = 0;
  int fd = open_shard(path, &size);
  if (fd < 0) return -1;
  unsigned char *e = NULL;
  int rc = read_footer(fd, path, size, count, &e);
  close(fd);
  if (rc != 0) return -1;
  for (int64_t i = 0; i < *count && i < max; i++) {
    const unsigned char *p = e + i * CKPT_ENTRY_BYTES;
    pieces[i].offset = (int64_t)lt_ckpt_get_u64(p);
    pieces[i].csize = (int64_t)lt_ckpt_get_u64(p + 8);
    pieces[i].raw_bytes = (int64_t)lt_ckpt_get_u64(p + 16);
    pieces[i].nframes = (int32_t)lt_ckpt_get_u32(p + 24);
    pieces[i].checksum = lt_ckpt_get_u32(p + 28);
    pieces[i].shuffle = (int32_t)lt_ckpt_get_u32(p + 32);
    pieces[i].reserved = 0;
  }
  free(e);
  if (file_size) *file_size = size;
  return 0;
}

/* ---- decoding a piece ------------------------------------------------------------------- */

enum { WINDOW = 4 << 20 };

/* Decodes piece `index` from the open fd; dst has p->raw_bytes. */
static int decode_piece(int fd, const char *path, int64_t size, int64_t index, const lt_ckpt_piece *p, void *dst,
                        LZ4F_dctx *dctx, unsigned char *win, size_t win_cap, unsigned char **scratch,
                        int64_t *scratch_cap) {
  const char *name = lt_ckpt_base(path);
  int k = p->shuffle > 1 ? p->shuffle : 1;
  if (!lt_ckpt_valid_shuffle(p->shuffle) || p->raw_bytes % k != 0)
    return lt_errorf("ckpt: %s: piece %lld: shuffle %d does not fit its %lld bytes: size mismatch", name,
                     (long long)index, p->shuffle, (long long)p->raw_bytes);
  if (p->offset < 0 || p->csize <= 0 || p->offset > size || p->csize > size - p->offset)
    return lt_errorf("ckpt: %s: piece %lld: [%lld, +%lld) lies outside the file (%lld bytes): size mismatch", name,
                     (long long)index, (long long)p->offset, (long long)p->csize, (long long)size);
  int64_t file_pos = p->offset, end = p->offset + p->csize;
  size_t have = 0, pos = 0;
  unsigned char *out = dst;
  int64_t produced = 0, frame_start = 0;
  int32_t frame = 0;
  int in_frame = 0;
  uint32_t h = lt_ckpt_piece_seed(p->raw_bytes);
  unsigned char last4[4] = {0};
  LZ4F_resetDecompressionContext(dctx);
  for (;;) {
    if (have - pos < 4 && file_pos < end) { /* refill the window */
      memmove(win, win + pos, have - pos);
      have -= pos, pos = 0;
      int64_t n = end - file_pos < (int64_t)(win_cap - have) ? end - file_pos : (int64_t)(win_cap - have);
      if (lt_ckpt_pread_all(fd, win + have, n, file_pos) != 0)
        return lt_errorf("ckpt: %s: piece %lld frame %d: truncated (the file ends inside it)", name, (long long)index,
                         frame);
      have += (size_t)n, file_pos += n;
    }
    if (pos == have) break; /* the piece's bytes are used up */
    if (!in_frame) {
      if (have - pos < 4 || lt_ckpt_get_u32(win + pos) != lz4_frame_magic)
        return lt_errorf("ckpt: %s: piece %lld frame %d (at byte %lld): bad magic (not an lz4 frame)", name,
                         (long long)index, frame, (long long)(file_pos - (int64_t)(have - pos)));
      if (frame >= p->nframes)
        return lt_errorf("ckpt: %s: piece %lld: more frames than the %d the index says: size mismatch", name,
                         (long long)index, p->nframes);
      in_frame = 1;
    }
    size_t src_n = have - pos, dst_n = (size_t)(p->raw_bytes - produced);
    size_t ret = LZ4F_decompress(dctx, out + produced, &dst_n, win + pos, &src_n, NULL);
    if (LZ4F_isError(ret)) {
      const char *e = LZ4F_getErrorName(ret);
      const char *what = strstr(e, "hecksum")      ? "checksum mismatch"
                         : strstr(e, "dstMaxSize") ? "size mismatch"
                                                   : "corrupt frame";
      return lt_errorf("ckpt: %s: piece %lld frame %d: %s (lz4: %s)", name, (long long)index, frame, what, e);
    }
    if (src_n >= 4)
      memcpy(last4, win + pos + src_n - 4, 4);
    else if (src_n > 0) {
      memmove(last4, last4 + src_n, 4 - src_n);
      memcpy(last4 + 4 - src_n, win + pos, src_n);
    }
    pos += src_n, produced += (int64_t)dst_n;
    if (ret == 0) { /* end of a frame: LZ4 checked its content checksum */
      h = lt_ckpt_piece_hash(h, lt_ckpt_get_u32(last4));
      int64_t len = produced - frame_start;
      if (k > 1 && len > 0) {
        if (len % k != 0)
          return lt_errorf("ckpt: %s: piece %lld frame %d: %lld bytes, not whole %d-byte elements: size mismatch", name,
                           (long long)index, frame, (long long)len, k);
        if (len > *scratch_cap) {
          unsigned char *grown = realloc(*scratch, (size_t)len);
          if (!grown) return lt_errorf("ckpt: %s: out of memory for a frame of %lld bytes", name, (long long)len);
          *scratch = grown, *scratch_cap = len;
        }
        memcpy(*scratch, out + frame_start, (size_t)len);
        lt_ckpt_unshuffle(out + frame_start, *scratch, len, k);
      }
      frame_start = produced;
      frame++, in_frame = 0;
      continue;
    }
    if (src_n == 0 && dst_n == 0) {
      if (produced == p->raw_bytes)
        return lt_errorf("ckpt: %s: piece %lld frame %d: decodes to more than the %lld bytes expected: size mismatch",
                         name, (long long)index, frame, (long long)p->raw_bytes);
      if (file_pos >= end && pos == have) break;
      return lt_errorf("ckpt: %s: piece %lld frame %d: corrupt frame (the decoder makes no progress)", name,
                       (long long)index, frame);
    }
  }
  if (in_frame)
    return lt_errorf("ckpt: %s: piece %lld frame %d: truncated (the piece's %lld bytes end inside the frame)", name,
                     (long long)index, frame, (long long)p->csize);
  if (produced != p->raw_bytes || frame != p->nframes)
    return lt_errorf("ckpt: %s: piece %lld: decoded %lld bytes in %d frames, expected %lld in %d: size mismatch", name,
                     (long long)index, (long long)produced, frame, (long long)p->raw_bytes, p->nframes);
  if (h != p->checksum)
    return lt_errorf("ckpt: %s: piece %lld: checksum mismatch (the frames are not the ones the index recorded)", name,
                     (long long)index);
  return 0;
}

typedef struct {
  LZ4F_dctx *dctx;
  unsigned char *win, *scratch;
  size_t win_cap;
  int64_t scratch_cap;
} decoder;

static int with_decoder(const char *path, int (*fn)(int, const char *, int64_t, decoder *, void *), void *arg) {
  int64_t size = 0;
  int fd = open_shard(path, &size);
  if (fd < 0) return -1;
  LZ4F_dctx *dctx = NULL;
  size_t win_cap = size < WINDOW ? (size_t)(size < 64 ? 64 : size) : WINDOW; /* no more than the file */
  unsigned char *win = malloc(win_cap);
  if (!win || LZ4F_isError(LZ4F_createDecompressionContext(&dctx, LZ4F_VERSION))) {
    free(win);
    close(fd);
    return lt_errorf("ckpt: %s: out of memory for the decoder", path);
  }
  decoder d = {dctx, win, NULL, win_cap, 0};
  int rc = fn(fd, path, size, &d, arg);
  LZ4F_freeDecompressionContext(dctx);
  free(d.scratch);
  free(win);
  close(fd);
  return rc;
}

struct read_arg {
  int64_t index;
  const lt_ckpt_piece *p;
  void *dst;
};
static int read_fn(int fd, const char *path, int64_t size, decoder *d, void *arg) {
  struct read_arg *a = arg;
  return decode_piece(fd, path, size, a->index, a->p, a->dst, d->dctx, d->win, d->win_cap, &d->scratch,
                      &d->scratch_cap);
}

int lt_ckpt_read_piece(const char *path, int64_t index, const lt_ckpt_piece *p, void *dst, int64_t dst_bytes) {
  if (!path || !p || (!dst && dst_bytes > 0)) return lt_errorf("ckpt: read_piece: NULL argument");
  if (dst_bytes != p->raw_bytes)
    return lt_errorf("ckpt: %s: piece %lld holds %lld bytes, the destination %lld: size mismatch", lt_ckpt_base(path),
                     (long long)index, (long long)p->raw_bytes, (long long)dst_bytes);
  struct read_arg a = {index, p, dst};
  return with_decoder(path, read_fn, &a);
}

/* ---- a byte range of a piece: only the frames that hold it are decoded ------------------- */

/* The extent of the frame at `at` (below end): its compressed length, content size and
 * content checksum, from its header and block sizes (no decoding). */
static int frame_extent(int fd, const char *name, int64_t index, int frame, int64_t at, int64_t end, int64_t *clen,
                        int64_t *content, uint32_t *checksum) {
  unsigned char h[19];
  int64_t n = end - at < 19 ? end - at : 19;
  if (n < 7 || lt_ckpt_pread_all(fd, h, n, at) != 0)
    return lt_errorf("ckpt: %s: piece %lld frame %d: truncated", name, (long long)index, frame);
  if (lt_ckpt_get_u32(h) != lz4_frame_magic)
    return lt_errorf("ckpt: %s: piece %lld frame %d (at byte %lld): bad magic (not an lz4 frame)", name,
                     (long long)index, frame, (long long)at);
  int flg = h[4], block_ck = flg & 0x10, has_size = flg & 0x08, content_ck = flg & 0x04, dict = flg & 0x01;
  if ((flg >> 6) != 1 || !has_size || !content_ck)
    return lt_errorf("ckpt: %s: piece %lld frame %d: corrupt frame (header flags 0x%02x)", name, (long long)index,
                     frame, flg);
  int64_t hlen = 4 + 2 + 8 + (dict ? 4 : 0) + 1;
  if (n < hlen) return lt_errorf("ckpt: %s: piece %lld frame %d: truncated", name, (long long)index, frame);
  uint64_t cs = lt_ckpt_get_u64(h + 6);
  if (cs > (uint64_t)INT64_MAX / 2)
    return lt_errorf("ckpt: %s: piece %lld frame %d: corrupt frame (content size)", name, (long long)index, frame);
  int64_t pos = at + hlen;
  for (;;) {
    unsigned char b[4];
    if (end - pos < 4 || lt_ckpt_pread_all(fd, b, 4, pos) != 0)
      return lt_errorf("ckpt: %s: piece %lld frame %d: truncated", name, (long long)index, frame);
    uint32_t bs = lt_ckpt_get_u32(b);
    pos += 4;
    if (bs == 0) break;
    int64_t size = (int64_t)(bs & 0x7FFFFFFFu) + (block_ck ? 4 : 0);
    if (size > end - pos) return lt_errorf("ckpt: %s: piece %lld frame %d: truncated", name, (long long)index, frame);
    pos += size;
  }
  unsigned char c[4];
  if (end - pos < 4 || lt_ckpt_pread_all(fd, c, 4, pos) != 0)
    return lt_errorf("ckpt: %s: piece %lld frame %d: truncated", name, (long long)index, frame);
  *clen = pos + 4 - at, *content = (int64_t)cs, *checksum = lt_ckpt_get_u32(c);
  return 0;
}

struct range_arg {
  int64_t index, begin, len;
  const lt_ckpt_piece *p;
  unsigned char *dst;
};

static int range_fn(int fd, const char *path, int64_t size, decoder *d, void *arg) {
  struct range_arg *a = arg;
  const lt_ckpt_piece *p = a->p;
  const char *name = lt_ckpt_base(path);
  int k = p->shuffle > 1 ? p->shuffle : 1;
  if (p->offset < 0 || p->csize <= 0 || p->offset > size || p->csize > size - p->offset)
    return lt_errorf("ckpt: %s: piece %lld lies outside the file: size mismatch", name, (long long)a->index);
  int64_t at = p->offset, end = p->offset + p->csize, raw = 0, want_end = a->begin + a->len;
  uint32_t h = lt_ckpt_piece_seed(p->raw_bytes);
  unsigned char *comp = NULL, *plain = NULL;
  int rc = 0, frame = 0;
  for (; at < end && rc == 0; frame++) {
    int64_t clen = 0, content = 0;
    uint32_t ck = 0;
    if ((rc = frame_extent(fd, name, a->index, frame, at, end, &clen, &content, &ck)) != 0) break;
    if (frame >= p->nframes || content > p->raw_bytes - raw) {
      rc = lt_errorf("ckpt: %s: piece %lld frame %d: more frames or bytes than the index says: size mismatch", name,
                     (long long)a->index, frame);
      break;
    }
    int64_t lo = a->begin > raw ? a->begin : raw, hi = want_end < raw + content ? want_end : raw + content;
    if (lo < hi) { /* this frame holds wanted bytes: decode it (LZ4 checks its content checksum) */
      unsigned char *c2 = realloc(comp, (size_t)clen), *p2 = c2 ? realloc(plain, (size_t)content + 1) : NULL;
      if (c2) comp = c2;
      if (p2) plain = p2;
      if (!c2 || !p2) {
        rc = lt_errorf("ckpt: %s: out of memory for a frame", name);
        break;
      }
      if (lt_ckpt_pread_all(fd, comp, clen, at) != 0) {
        rc = lt_errorf("ckpt: %s: piece %lld frame %d: truncated", name, (long long)a->index, frame);
        break;
      }
      LZ4F_resetDecompressionContext(d->dctx);
      size_t src_n = (size_t)clen, dst_n = (size_t)content;
      size_t ret = LZ4F_decompress(d->dctx, plain, &dst_n, comp, &src_n, NULL);
      if (LZ4F_isError(ret) || ret != 0 || dst_n != (size_t)content || src_n != (size_t)clen) {
        const char *e = LZ4F_isError(ret) ? LZ4F_getErrorName(ret) : "the frame does not end where it should";
        rc = lt_errorf("ckpt: %s: piece %lld frame %d: %s (lz4: %s)", name, (long long)a->index, frame,
                       strstr(e, "hecksum") ? "checksum mismatch" : "corrupt frame", e);
        break;
      }
      const unsigned char *src = plain;
      if (k > 1 && content > 0) {
        if (content % k != 0 || content > d->scratch_cap) {
          unsigned char *g = content % k == 0 ? realloc(d->scratch, (size_t)content) : NULL;
          if (!g) {
            rc = lt_errorf("ckpt: %s: piece %lld frame %d: %lld bytes, not whole %d-byte elements: size mismatch", name,
                           (long long)a->index, frame, (long long)content, k);
            break;
          }
          d->scratch = g, d->scratch_cap = content;
        }
        lt_ckpt_unshuffle(d->scratch, plain, content, k);
        src = d->scratch;
      }
      memcpy(a->dst + (lo - a->begin), src + (lo - raw), (size_t)(hi - lo));
    }
    h = lt_ckpt_piece_hash(h, ck);
    raw += content, at += clen;
  }
  free(comp), free(plain);
  if (rc != 0) return rc;
  if (raw != p->raw_bytes || frame != p->nframes)
    return lt_errorf("ckpt: %s: piece %lld: %lld bytes in %d frames, expected %lld in %d: size mismatch", name,
                     (long long)a->index, (long long)raw, frame, (long long)p->raw_bytes, p->nframes);
  if (h != p->checksum)
    return lt_errorf("ckpt: %s: piece %lld: checksum mismatch (the frames are not the ones the index recorded)", name,
                     (long long)a->index);
  return 0;
}

int lt_ckpt_read_range(const char *path, int64_t index, const lt_ckpt_piece *p, int64_t begin, int64_t len, void *dst) {
  if (!path || !p || (!dst && len > 0)) return lt_errorf("ckpt: read_range: NULL argument");
  if (begin < 0 || len < 0 || begin > p->raw_bytes || len > p->raw_bytes - begin)
    return lt_errorf("ckpt: %s: piece %lld: bytes [%lld, +%lld) outside its %lld: size mismatch", lt_ckpt_base(path),
                     (long long)index, (long long)begin, (long long)len, (long long)p->raw_bytes);
  if (!lt_ckpt_valid_shuffle(p->shuffle))
    return lt_errorf("ckpt: %s: piece %lld: bad shuffle %d", path, (long long)index, p->shuffle);
  struct range_arg a = {index, begin, len, p, dst};
  return with_decoder(path, range_fn, &a);
}

enum { LZ4_MAX_EXPANSION = 255 };

struct verify_arg {
  int64_t raw, compressed;
};
static int verify_fn(int fd, const char *path, int64_t size, decoder *d, void *arg) {
  struct verify_arg *a = arg;
  int64_t count = 0;
  unsigned char *e = NULL;
  if (read_footer(fd, path, size, &count, &e) != 0) return -1;
  int rc = 0;
  for (int64_t i = 0; i < count && rc == 0; i++) {
    const unsigned char *q = e + i * CKPT_ENTRY_BYTES;
    lt_ckpt_piece p = {(int64_t)lt_ckpt_get_u64(q),
                       (int64_t)lt_ckpt_get_u64(q + 8),
                       (int64_t)lt_ckpt_get_u64(q + 16),
                       (int32_t)lt_ckpt_get_u32(q + 24),
                       lt_ckpt_get_u32(q + 28),
                       (int32_t)lt_ckpt_get_u32(q + 32),
                       0};
    /* The footer's raw size is checked before it sizes an allocation: lz4 expands a byte at
     * most LZ4_MAX_EXPANSION times, so a larger claim is damage, not a piece. */
    if (p.raw_bytes < 0 || p.csize <= 0 || p.csize > size || p.raw_bytes / LZ4_MAX_EXPANSION > p.csize) {
      rc = lt_errorf("ckpt: %s: piece %lld: %lld bytes cannot come from %lld compressed bytes (lz4 expands at most "
                     "%d times): size mismatch", lt_ckpt_base(path), (long long)i, (long long)p.raw_bytes,
                     (long long)p.csize, LZ4_MAX_EXPANSION);
      break;
    }
    void *buf = malloc(p.raw_bytes ? (size_t)p.raw_bytes : 1);
    if (!buf)
      rc = lt_errorf("ckpt: %s: piece %lld: out of memory for %lld bytes", path, (long long)i, (long long)p.raw_bytes);
    else
      rc = decode_piece(fd, path, size, i, &p, buf, d->dctx, d->win, d->win_cap, &d->scratch, &d->scratch_cap);
    free(buf);
    a->raw += p.raw_bytes, a->compressed += p.csize;
  }
  free(e);
  return rc;
}

int lt_ckpt_verify_file(const char *path, int64_t *raw, int64_t *compressed) {
  if (!path) return lt_errorf("ckpt: verify: path is NULL");
  struct verify_arg a = {0, 0};
  if (with_decoder(path, verify_fn, &a) != 0) return -1;
  if (raw) *raw = a.raw;
  if (compressed) *compressed = a.compressed;
  return 0;
}
