/* ckpt.h — internals shared by host/ckpt_*.c: format constants, little-endian fields,
 * hashes, the footer, the byte shuffle, whole reads. */
#ifndef LUTRA_CKPT_IO_H
#define LUTRA_CKPT_IO_H
#include "lutra.h"
#include <stdint.h>

enum { CKPT_ENTRY_BYTES = 40, CKPT_TRAILER_BYTES = 24, CKPT_VERSION = 1 };
#define CKPT_MAGIC "LTCKPT1\n"
#define CKPT_DEFAULT_CHUNK ((int64_t)4 << 20)

/* Little-endian fields. */
static inline void lt_ckpt_put_u64(unsigned char *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static inline void lt_ckpt_put_u32(unsigned char *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static inline uint64_t lt_ckpt_get_u64(const unsigned char *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}
static inline uint32_t lt_ckpt_get_u32(const unsigned char *p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}
static inline int lt_ckpt_valid_shuffle(int k) { return k == 0 || k == 1 || k == 2 || k == 4 || k == 8; }

/* FNV-1a, 32 bits, continued from h (start with 2166136261u). */
uint32_t lt_ckpt_hash(uint32_t h, const void *data, size_t n);
/* A piece's checksum from its frames' content checksums. */
uint32_t lt_ckpt_piece_hash(uint32_t h, uint32_t frame_checksum);
uint32_t lt_ckpt_piece_seed(int64_t raw_bytes);
/* The footer of count pieces into buf (count * 40 + 24 bytes). */
void lt_ckpt_encode_footer(unsigned char *buf, const lt_ckpt_piece *pieces, int64_t count);
/* Reads exactly n bytes at offset; 0, or -1 with errno (0 for end of file). Writes go through
 * lt_atomic_file_* (host/io/atomic_file.c). */
int lt_ckpt_pread_all(int fd, void *dst, int64_t n, int64_t offset);
/* Byte transposition by k-byte elements of n bytes (n a multiple of k): shuffle puts byte b
 * of element i at b * (n / k) + i; unshuffle undoes it. */
void lt_ckpt_shuffle(unsigned char *dst, const unsigned char *src, int64_t n, int k);
void lt_ckpt_unshuffle(unsigned char *dst, const unsigned char *src, int64_t n, int k);
/* The last path component, for messages. */
const char *lt_ckpt_base(const char *path);
/* The fault-injection hook of the crash tests: ends the process when env LUTRA_FAULT names
 * `point`; 0 otherwise. Not in lutra.h: the checkpoint save in Lua declares it for itself. */
int lt_ckpt_fault(const char *point);
#endif
