/* map.c — containers of the tokenizers: open-addressing hash maps of byte strings -> int64
 * (words, token bytes, the encode cache) and id pairs -> int32 (merge ranks, pair counts), and
 * growable lists of byte ranges (offsets). */
#include "tok/tokenizer.h"
#include <stdlib.h>

// 64-bit hash of a byte string: 8 bytes at a time, multiply-xorshift mixing.
uint64_t lt_tok_hash(const uint8_t *s, int64_t n) {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ (uint64_t)n * 0xC2B2AE3D27D4EB4Full;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    memcpy(&w, s + i, 8);
    h = (h ^ w) * 0xFF51AFD7ED558CCDull;
    h ^= h >> 32;
  }
  if (i < n) {
    uint64_t w = 0;
    memcpy(&w, s + i, (size_t)(n - i));
    h = (h ^ w) * 0xFF51AFD7ED558CCDull;
    h ^= h >> 32;
  }
  h *= 0xC4CEB9FE1A85EC53ull;
  return h ^ (h >> 29);
}

// ---- byte strings -> int64 ----------------------------------------------------------

int64_t lt_tok_strmap_find(const lt_tok_strmap *m, const uint8_t *key, int64_t len, uint64_t h) {
  if (!m->slots) return -1;
  for (int64_t i = (int64_t)(h & (uint64_t)m->mask);; i = (i + 1) & m->mask) {
    int32_t e = m->slots[i] - 1;
    if (e < 0) return -1;
    if (m->hash[e] == h && m->key_len[e] == len && memcmp(m->arena + m->key_off[e], key, (size_t)len) == 0) return e;
  }
}

static int strmap_rehash(lt_tok_strmap *m, int64_t capacity) {
  int32_t *slots = calloc((size_t)capacity, sizeof(int32_t));
  if (!slots) return -1;
  int64_t mask = capacity - 1;
  for (int64_t e = 0; e < m->n; e++) {
    int64_t i = (int64_t)(m->hash[e] & (uint64_t)mask);
    while (slots[i]) i = (i + 1) & mask;
    slots[i] = (int32_t)(e + 1);
  }
  free(m->slots);
  m->slots = slots;
  m->mask = mask;
  return 0;
}

static int grow(void **p, int64_t *cap, int64_t need, size_t elem) {
  if (need <= *cap) return 0;
  int64_t c = *cap ? *cap : 64;
  while (c < need) c *= 2;
  void *q = realloc(*p, (size_t)c * elem);
  if (!q) return -1;
  *p = q;
  *cap = c;
  return 0;
}

int64_t lt_tok_strmap_add(lt_tok_strmap *m, const uint8_t *key, int64_t len, uint64_t h, int64_t value) {
  if (m->n >= INT32_MAX - 1) return -1;
  if (!m->slots || (m->n + 1) * 2 > m->mask + 1) {
    if (strmap_rehash(m, m->slots ? 2 * (m->mask + 1) : 256)) return -1;
  }
  if (m->n == m->cap) {
    int64_t c = m->cap ? 2 * m->cap : 256;
    uint64_t *hash = realloc(m->hash, (size_t)c * sizeof *hash);
    if (hash) m->hash = hash;
    int64_t *off = realloc(m->key_off, (size_t)c * sizeof *off);
    if (off) m->key_off = off;
    int64_t *val = realloc(m->value, (size_t)c * sizeof *val);
    if (val) m->value = val;
    int32_t *kl = realloc(m->key_len, (size_t)c * sizeof *kl);
    if (kl) m->key_len = kl;
    if (!hash || !off || !val || !kl) return -1;
    m->cap = c;
  }
  if (grow((void **)&m->arena, &m->arena_cap, m->arena_len + len + 1, 1)) return -1;
  int64_t e = m->n++;
  if (len) memcpy(m->arena + m->arena_len, key, (size_t)len);
  m->key_off[e] = m->arena_len;
  m->key_len[e] = (int32_t)len;
  m->hash[e] = h;
  m->value[e] = value;
  m->arena_len += len;
  int64_t i = (int64_t)(h & (uint64_t)m->mask);
  while (m->slots[i]) i = (i + 1) & m->mask;
  m->slots[i] = (int32_t)(e + 1);
  return e;
}

void lt_tok_strmap_clear(lt_tok_strmap *m) {
  if (m->slots) memset(m->slots, 0, (size_t)(m->mask + 1) * sizeof(int32_t));
  m->n = 0;
  m->arena_len = 0;
}

void lt_tok_strmap_free(lt_tok_strmap *m) {
  free(m->slots);
  free(m->hash);
  free(m->key_off);
  free(m->value);
  free(m->key_len);
  free(m->arena);
  memset(m, 0, sizeof *m);
}

// ---- pairs of int64 (byte ranges) ------------------------------------------------------

int lt_tok_spans_push(lt_tok_spans *s, int64_t a, int64_t b) {
  if (s->n == s->cap) {
    int64_t cap = s->cap ? 2 * s->cap : 1024;
    int64_t *v = realloc(s->v, 2 * (size_t)cap * sizeof *v);
    if (!v) return lt_errorf("encode: out of memory");
    s->v = v, s->cap = cap;
  }
  s->v[2 * s->n] = a, s->v[2 * s->n + 1] = b;
  s->n++;
  return 0;
}

// ---- id pairs -> int32 -----------------------------------------------------------------

static inline uint64_t pair_slot(uint64_t key, int64_t mask) {
  key *= 0x9E3779B97F4A7C15ull;
  return (key ^ (key >> 31)) & (uint64_t)mask;
}

int32_t lt_tok_pairmap_get(const lt_tok_pairmap *m, uint64_t key) {
  if (!m->keys) return -1;
  for (int64_t i = (int64_t)pair_slot(key, m->mask);; i = (i + 1) & m->mask) {
    if (m->keys[i] == key) return m->vals[i];
    if (m->keys[i] == UINT64_MAX) return -1;
  }
}

static int pairmap_rehash(lt_tok_pairmap *m, int64_t capacity) {
  uint64_t *keys = malloc((size_t)capacity * sizeof *keys);
  int32_t *vals = malloc((size_t)capacity * sizeof *vals);
  if (!keys || !vals) {
    free(keys);
    free(vals);
    return -1;
  }
  memset(keys, 0xFF, (size_t)capacity * sizeof *keys);
  int64_t mask = capacity - 1;
  for (int64_t j = 0; m->keys && j <= m->mask; j++) {
    if (m->keys[j] == UINT64_MAX) continue;
    int64_t i = (int64_t)pair_slot(m->keys[j], mask);
    while (keys[i] != UINT64_MAX) i = (i + 1) & mask;
    keys[i] = m->keys[j];
    vals[i] = m->vals[j];
  }
  free(m->keys);
  free(m->vals);
  m->keys = keys;
  m->vals = vals;
  m->mask = mask;
  return 0;
}

int lt_tok_pairmap_put(lt_tok_pairmap *m, uint64_t key, int32_t val) {
  if (!m->keys || (m->n + 1) * 2 > m->mask + 1) {
    if (pairmap_rehash(m, m->keys ? 2 * (m->mask + 1) : 1024)) return -1;
  }
  int64_t i = (int64_t)pair_slot(key, m->mask);
  while (m->keys[i] != UINT64_MAX && m->keys[i] != key) i = (i + 1) & m->mask;
  if (m->keys[i] == UINT64_MAX) m->n++;
  m->keys[i] = key;
  m->vals[i] = val;
  return 0;
}

void lt_tok_pairmap_free(lt_tok_pairmap *m) {
  free(m->keys);
  free(m->vals);
  memset(m, 0, sizeof *m);
}
