/* ckpt_format.c — the pieces of the shard format both sides use: hashes (file footer, piece
 * checksums), the footer's encoding, the byte shuffle of frames (lutra.h, "checkpoint io"). */
#include "io/ckpt.h"
#include <string.h>

uint32_t lt_ckpt_hash(uint32_t h, const void *data, size_t n) {
  const unsigned char *p = data;
  for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 16777619u;
  return h;
}

uint32_t lt_ckpt_piece_seed(int64_t raw_bytes) { return lt_ckpt_hash(2166136261u, &raw_bytes, sizeof raw_bytes); }
uint32_t lt_ckpt_piece_hash(uint32_t h, uint32_t frame_checksum) {
  return lt_ckpt_hash(h, &frame_checksum, sizeof frame_checksum);
}

const char *lt_ckpt_base(const char *path) {
  const char *s = strrchr(path, '/');
  return s ? s + 1 : path;
}

/* Specialised for 2, 4 and 8 bytes: one load of an element, one store per plane (vectorises). */
void lt_ckpt_shuffle(unsigned char *dst, const unsigned char *src, int64_t n, int k) {
  int64_t m = n / k;
  if (k == 4) {
    unsigned char *d0 = dst, *d1 = dst + m, *d2 = dst + 2 * m, *d3 = dst + 3 * m;
    for (int64_t i = 0; i < m; i++) {
      uint32_t v;
      memcpy(&v, src + 4 * i, 4);
      d0[i] = (unsigned char)v, d1[i] = (unsigned char)(v >> 8), d2[i] = (unsigned char)(v >> 16);
      d3[i] = (unsigned char)(v >> 24);
    }
  } else if (k == 2) {
    unsigned char *d0 = dst, *d1 = dst + m;
    for (int64_t i = 0; i < m; i++) {
      uint16_t v;
      memcpy(&v, src + 2 * i, 2);
      d0[i] = (unsigned char)v, d1[i] = (unsigned char)(v >> 8);
    }
  } else if (k == 8) {
    for (int64_t i = 0; i < m; i++) {
      uint64_t v;
      memcpy(&v, src + 8 * i, 8);
      for (int b = 0; b < 8; b++) dst[(int64_t)b * m + i] = (unsigned char)(v >> (8 * b));
    }
  } else {
    for (int b = 0; b < k; b++) {
      unsigned char *d = dst + (int64_t)b * m;
      const unsigned char *s = src + b;
      for (int64_t i = 0; i < m; i++) d[i] = s[i * k];
    }
  }
}

void lt_ckpt_unshuffle(unsigned char *dst, const unsigned char *src, int64_t n, int k) {
  int64_t m = n / k;
  if (k == 4) {
    const unsigned char *s0 = src, *s1 = src + m, *s2 = src + 2 * m, *s3 = src + 3 * m;
    for (int64_t i = 0; i < m; i++) {
      uint32_t v = (uint32_t)s0[i] | (uint32_t)s1[i] << 8 | (uint32_t)s2[i] << 16 | (uint32_t)s3[i] << 24;
      memcpy(dst + 4 * i, &v, 4);
    }
  } else if (k == 2) {
    const unsigned char *s0 = src, *s1 = src + m;
    for (int64_t i = 0; i < m; i++) {
      uint16_t v = (uint16_t)(s0[i] | s1[i] << 8);
      memcpy(dst + 2 * i, &v, 2);
    }
  } else if (k == 8) {
    for (int64_t i = 0; i < m; i++) {
      uint64_t v = 0;
      for (int b = 0; b < 8; b++) v |= (uint64_t)src[(int64_t)b * m + i] << (8 * b);
      memcpy(dst + 8 * i, &v, 8);
    }
  } else {
    for (int b = 0; b < k; b++) {
      const unsigned char *s = src + (int64_t)b * m;
      unsigned char *d = dst + b;
      for (int64_t i = 0; i < m; i++) d[i * k] = s[i];
    }
  }
}

void lt_ckpt_encode_footer(unsigned char *buf, const lt_ckpt_piece *pieces, int64_t count) {
  unsigned char *e = buf;
  for (int64_t i = 0; i < count; i++, e += CKPT_ENTRY_BYTES) {
    lt_ckpt_put_u64(e, (uint64_t)pieces[i].offset);
    lt_ckpt_put_u64(e + 8, (uint64_t)pieces[i].csize);
    lt_ckpt_put_u64(e + 16, (uint64_t)pieces[i].raw_bytes);
    lt_ckpt_put_u32(e + 24, (uint32_t)pieces[i].nframes);
    lt_ckpt_put_u32(e + 28, pieces[i].checksum);
    lt_ckpt_put_u32(e + 32, (uint32_t)pieces[i].shuffle);
    memset(e + 36, 0, 4);
  }
  lt_ckpt_put_u64(e, (uint64_t)count);
  lt_ckpt_put_u32(e + 8, lt_ckpt_hash(2166136261u, buf, (size_t)(count * CKPT_ENTRY_BYTES)));
  lt_ckpt_put_u32(e + 12, CKPT_VERSION);
  memcpy(e + 16, CKPT_MAGIC, 8);
}
