/* names.h — checks on the names that files carry (safetensors tensor names and metadata,
 * checkpoint manifests): valid UTF-8, and no NUL character. cJSON turns the escape \u0000
 * into a NUL byte that ends its C string, so "a\u0000b" would silently become "a": such a
 * string is found in the JSON text itself, before cJSON reads it. Header-only (static
 * inline), so that the fuzz harnesses, which compile one parser file alone, get it too. */
#ifndef LUTRA_IO_NAMES_H
#define LUTRA_IO_NAMES_H
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Whether s[0, n) is UTF-8 as RFC 3629 has it (no overlong forms, no surrogates, nothing past
 * U+10FFFF); on failure *bad is the offset of the first byte of the bad sequence. */
static inline int lt_utf8_valid(const char *str, size_t n, size_t *bad) {
  const unsigned char *s = (const unsigned char *)str;
  size_t i = 0;
  while (i < n) {
    unsigned c = s[i];
    size_t len = c < 0x80 ? 1 : (c >= 0xC2 && c <= 0xDF) ? 2 : (c >= 0xE0 && c <= 0xEF) ? 3 : (c >= 0xF0 && c <= 0xF4) ? 4 : 0;
    if (len == 0 || i + len > n) break;
    unsigned lo = 0x80, hi = 0xBF; /* the second byte's range, narrower after E0 ED F0 F4 */
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
    size_t k = 1;
    for (; k < len; k++) {
      unsigned b = s[i + k];
      if (k == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) break;
    }
    if (k < len) break;
    i += len;
  }
  if (i < n && bad) *bad = i;
  return i == n;
}

/* The first string of JSON text t[0, n) that holds the escape \u0000: the offset of its opening
 * quote, its length with the quotes in *len; -1 when there is none. The text need not be valid
 * JSON (this runs beside the parser): an unterminated string ends the search. */
static inline int64_t lt_json_nul_string(const char *t, int64_t n, int64_t *len) {
  int64_t start = -1;
  int nul = 0;
  for (int64_t i = 0; i < n; i++) {
    char c = t[i];
    if (start < 0) {
      if (c == '"') start = i, nul = 0;
    } else if (c == '\\') {
      if (i + 5 < n && t[i + 1] == 'u' && t[i + 2] == '0' && t[i + 3] == '0' && t[i + 4] == '0' && t[i + 5] == '0')
        nul = 1;
      i++; /* the escaped character */
    } else if (c == '"') {
      if (nul) {
        *len = i + 1 - start;
        return start;
      }
      start = -1;
    }
  }
  return -1;
}

/* s[0, n) for a message: printable ASCII as it is, other bytes as \xNN, at most cap - 1 bytes
 * (cap >= 8), cut with "..." when longer. */
static inline void lt_name_shown(char *buf, size_t cap, const char *str, size_t n) {
  const unsigned char *s = (const unsigned char *)str;
  size_t o = 0;
  for (size_t i = 0; i < n; i++) {
    if (o + 8 >= cap) {
      snprintf(buf + o, cap - o, "...");
      return;
    }
    if (s[i] >= 0x20 && s[i] < 0x7F)
      buf[o++] = (char)s[i];
    else
      o += (size_t)snprintf(buf + o, cap - o, "\\x%02X", s[i]);
  }
  buf[o] = 0;
}

#endif
