/* encode.c — lutra's own fast path of encoding (bytes -> ids) and BPE on one word.
 *
 * The fast path splits the text at added tokens (leftmost-longest), pre-tokenizes each
 * segment into words and runs BPE on each word: repeatedly merge the adjacent pair of
 * lowest merge rank, the leftmost one on ties (as Hugging Face's tokenizers and GPT-2).
 * Words repeat a lot in text, so their ids are cached. A tokenizer.json with more in its
 * pipeline goes through tok/pipeline.c, which uses the same BPE on words. */
#include "tok/tokenizer.h"
#include <stdlib.h>

enum { CACHE_MAX_WORDS = 1 << 18, CACHE_MAX_IDS = 1 << 22 };

int lt_tok_out_grow(lt_tok_out *o) {
  int64_t cap = o->cap ? 2 * o->cap : 1024;
  int32_t *ids = realloc(o->ids, (size_t)cap * sizeof *ids);
  if (!ids) return lt_errorf("encode: out of memory");
  o->ids = ids;
  o->cap = cap;
  return 0;
}

// The one-byte token of byte b, or the unk token, or an error.
static int byte_token(const lt_tokenizer *tok, uint8_t b, int32_t *id) {
  *id = tok->byte_id[b] >= 0 ? tok->byte_id[b] : tok->unk_id;
  if (*id < 0) return lt_errorf("encode: byte 0x%02x has no token in the vocab (and there is no unk token)", b);
  return 0;
}

static inline int32_t rank_of(const lt_tokenizer *tok, int32_t a, int32_t b) {
  int32_t r = lt_tok_pairmap_get(&tok->merge_rank, lt_tok_pair(a, b));
  return r < 0 ? INT32_MAX : r;
}

// BPE on sym[0..n) in place for short words: ranks of adjacent pairs kept in an array. Returns the new n.
static int64_t merge_short(const lt_tokenizer *tok, int32_t *sym, int32_t *first, int64_t n) {
  int32_t rank[LT_TOK_CACHE_MAX_WORD];
  for (int64_t i = 0; i + 1 < n; i++) rank[i] = rank_of(tok, sym[i], sym[i + 1]);
  while (n > 1) {
    int64_t best = 0;
    for (int64_t i = 1; i + 1 < n; i++)
      if (rank[i] < rank[best]) best = i;
    if (rank[best] == INT32_MAX) break;
    sym[best] = tok->merge_out[rank[best]];
    memmove(sym + best + 1, sym + best + 2, (size_t)(n - best - 2) * sizeof *sym);
    memmove(first + best + 1, first + best + 2, (size_t)(n - best - 2) * sizeof *first);
    memmove(rank + best, rank + best + 1, (size_t)(n - best - 2) * sizeof *rank);
    n--;
    if (best > 0) rank[best - 1] = rank_of(tok, sym[best - 1], sym[best]);
    if (best + 1 < n) rank[best] = rank_of(tok, sym[best], sym[best + 1]);
  }
  return n;
}

// Min-heap of (rank << 32 | left position).
static void heap_push(uint64_t *h, int64_t *n, uint64_t v) {
  int64_t i = (*n)++;
  while (i > 0 && h[(i - 1) / 2] > v) h[i] = h[(i - 1) / 2], i = (i - 1) / 2;
  h[i] = v;
}

static uint64_t heap_pop(uint64_t *h, int64_t *n) {
  uint64_t top = h[0], v = h[--(*n)];
  int64_t i = 0;
  for (;;) {
    int64_t c = 2 * i + 1;
    if (c >= *n) break;
    if (c + 1 < *n && h[c + 1] < h[c]) c++;
    if (h[c] >= v) break;
    h[i] = h[c], i = c;
  }
  h[i] = v;
  return top;
}

// BPE on sym[0..n) for long words: a linked list of symbols and a heap of candidate pairs,
// O(n log n). Entries go stale when a neighbour merges; they are checked when popped.
static int64_t merge_long(const lt_tokenizer *tok, int32_t *sym, int32_t *first, int64_t n) {
  int64_t *next = malloc((size_t)n * sizeof *next), *prev = malloc((size_t)n * sizeof *prev), nh = 0;
  uint64_t *heap = malloc((size_t)(3 * n + 1) * sizeof *heap);
  if (!next || !prev || !heap) {
    free(next), free(prev), free(heap);
    return lt_errorf("encode: out of memory");
  }
  for (int64_t i = 0; i < n; i++) next[i] = i + 1 < n ? i + 1 : -1, prev[i] = i - 1;
  for (int64_t i = 0; i + 1 < n; i++) {
    int32_t r = rank_of(tok, sym[i], sym[i + 1]);
    if (r != INT32_MAX) heap_push(heap, &nh, (uint64_t)r << 32 | (uint64_t)i);
  }
  while (nh > 0) {
    uint64_t top = heap_pop(heap, &nh);
    int32_t r = (int32_t)(top >> 32);
    int64_t i = (int64_t)(top & 0xFFFFFFFFu), j = next[i];
    if (sym[i] < 0 || j < 0 || sym[i] != tok->merge_a[r] || sym[j] != tok->merge_b[r]) continue; // stale
    sym[i] = tok->merge_out[r];
    sym[j] = -1;
    next[i] = next[j];
    if (next[j] >= 0) prev[next[j]] = i;
    if (prev[i] >= 0 && (r = rank_of(tok, sym[prev[i]], sym[i])) != INT32_MAX)
      heap_push(heap, &nh, (uint64_t)r << 32 | (uint64_t)prev[i]);
    if (next[i] >= 0 && (r = rank_of(tok, sym[i], sym[next[i]])) != INT32_MAX)
      heap_push(heap, &nh, (uint64_t)r << 32 | (uint64_t)i);
  }
  int64_t m = 0;
  for (int64_t i = 0; i >= 0 && i < n; i = next[i]) first[m] = first[i], sym[m++] = sym[i];
  free(next), free(prev), free(heap);
  return m;
}

static int cache_put(lt_tokenizer *tok, const uint8_t *w, int64_t n, uint64_t h, const int32_t *ids, int64_t m) {
  if (tok->cache.n >= CACHE_MAX_WORDS || tok->cache_len + m > CACHE_MAX_IDS) { // full: start over
    lt_tok_strmap_clear(&tok->cache);
    tok->cache_len = 0;
  }
  if (tok->cache_len + m > tok->cache_cap) {
    int64_t cap = tok->cache_cap ? 2 * tok->cache_cap : 1 << 14;
    int32_t *c = realloc(tok->cache_ids, (size_t)cap * sizeof *c);
    if (!c) return 0; // no cache is fine
    tok->cache_ids = c, tok->cache_cap = cap;
  }
  if (lt_tok_strmap_add(&tok->cache, w, n, h, tok->cache_len * 256 + m) < 0) return 0;
  memcpy(tok->cache_ids + tok->cache_len, ids, (size_t)m * sizeof *ids);
  tok->cache_len += m;
  return 0;
}

// The initial symbols of word w[0..n): its bytes (byte-level), else its characters, a
// character without a token as its bytes' <0xXX> tokens (byte_fallback) or the unk token (fused
// with an unk before it when fuse_unk). sym and st (each symbol's start in w) have room for n.
static int64_t initial_symbols(const lt_tokenizer *tok, const uint8_t *w, int64_t n, int32_t *sym, int32_t *st,
                               int *has_unk) {
  int64_t m = 0, unk_at = -1; // unk_at: the open unk symbol's index
  for (int64_t i = 0; i < n;) {
    if (tok->byte_level) {
      if (byte_token(tok, w[i], &sym[m])) return -1;
      *has_unk |= tok->byte_id[w[i]] < 0;
      st[m++] = (int32_t)i++;
      continue;
    }
    uint32_t cp;
    int len = lt_tok_utf8_decode(w + i, n - i, &cp);
    int32_t id = lt_tok_find(tok, w + i, len);
    if (id >= 0) {
      sym[m] = id, st[m++] = (int32_t)i, unk_at = -1;
    } else {
      int k = 0;
      while (tok->byte_fallback && k < len && tok->fallback_id[w[i + k]] >= 0) k++;
      if (tok->byte_fallback && k == len) {
        for (k = 0; k < len; k++) sym[m] = tok->fallback_id[w[i + k]], st[m++] = (int32_t)(i + k);
        unk_at = -1;
      } else if (tok->unk_id >= 0) {
        *has_unk = 1;
        if (!(tok->fuse_unk && unk_at >= 0)) unk_at = m, sym[m] = tok->unk_id, st[m++] = (int32_t)i;
      } else if (cp >= LT_TOK_RAW_BYTE) {
        return lt_errorf("encode: byte 0x%02x (not valid UTF-8) has no token (and there is no unk token)", w[i]);
      } else {
        return lt_errorf("encode: character U+%04X has no token (and no byte fallback or unk token)", cp);
      }
    }
    i += len;
  }
  return m;
}

int lt_tok_encode_word(lt_tokenizer *tok, const uint8_t *w, int64_t n, lt_tok_out *out, lt_tok_spans *spans) {
  int32_t id;
  if (n == 1 && tok->byte_level) {
    LT_TRY(byte_token(tok, w[0], &id));
    if (spans) LT_TRY(lt_tok_spans_push(spans, 0, 1));
    return lt_tok_push(out, id);
  }
  uint64_t h = 0;
  if (n <= LT_TOK_CACHE_MAX_WORD) {
    h = lt_tok_hash(w, n);
    int64_t e = spans ? -1 : lt_tok_strmap_find(&tok->cache, w, n, h); // the cache keeps ids, not spans
    if (e >= 0) {
      int64_t v = tok->cache.value[e], off = v / 256, m = v % 256;
      for (int64_t k = 0; k < m; k++) LT_TRY(lt_tok_push(out, tok->cache_ids[off + k]));
      return 0;
    }
  }
  int32_t small[2 * LT_TOK_CACHE_MAX_WORD], *sym = small, *st;
  if (n > LT_TOK_CACHE_MAX_WORD && !(sym = malloc(2 * (size_t)n * sizeof *sym))) return lt_errorf("encode: out of memory");
  st = sym + n;
  int64_t m = 0;
  int has_unk = 0;
  if (tok->ignore_merges && (id = lt_tok_find(tok, w, n)) >= 0) { // a whole word in the vocab wins
    sym[0] = id, st[0] = 0, m = 1;
  } else {
    m = initial_symbols(tok, w, n, sym, st, &has_unk);
    if (m > 0) m = n <= LT_TOK_CACHE_MAX_WORD ? merge_short(tok, sym, st, m) : merge_long(tok, sym, st, m);
  }
  int rc = m < 0 ? -1 : 0;
  for (int64_t k = 0; k < m && !rc; k++) {
    rc = lt_tok_push(out, sym[k]);
    if (!rc && spans) rc = lt_tok_spans_push(spans, st[k], k + 1 < m ? st[k + 1] : n);
  }
  if (!rc && n <= LT_TOK_CACHE_MAX_WORD && !has_unk) cache_put(tok, w, n, h, sym, m);
  if (sym != small) free(sym);
  return rc;
}

static int encode_word(lt_tokenizer *tok, const uint8_t *w, int64_t n, lt_tok_out *out) {
  return lt_tok_encode_word(tok, w, n, out, NULL);
}

// A ByteLevel(add_prefix_space=True) after a Split puts a space before every word that lacks one.
static int encode_spaced_word(lt_tokenizer *tok, const uint8_t *w, int64_t n, lt_tok_out *out) {
  uint8_t small[LT_TOK_CACHE_MAX_WORD + 1], *buf = n < LT_TOK_CACHE_MAX_WORD ? small : malloc((size_t)n + 1);
  if (!buf) return lt_errorf("encode: out of memory");
  buf[0] = ' ';
  memcpy(buf + 1, w, (size_t)n);
  int rc = encode_word(tok, buf, n + 1, out);
  if (buf != small) free(buf);
  return rc;
}

static int encode_segment(lt_tokenizer *tok, const uint8_t *s, int64_t n, int64_t base, lt_tok_out *out) {
  if (n == 0) return 0;
  if (tok->kind == LT_TOK_CHAR) return lt_tok_char_encode_segment(tok, s, n, base, out);
  uint8_t *spaced = NULL;
  if (tok->add_prefix_space == 1 && s[0] != ' ') { // as Hugging Face's ByteLevel(add_prefix_space=True)
    if (!(spaced = malloc((size_t)n + 1))) return lt_errorf("encode: out of memory");
    spaced[0] = ' ';
    memcpy(spaced + 1, s, (size_t)n);
    s = spaced, n++;
  }
  int rc = 0;
  if (tok->pretok == LT_PRETOK_NONE) {
    rc = encode_word(tok, s, n, out);
  } else {
    for (int64_t pos = 0, end; pos < n && !rc; pos = end) {
      end = lt_tok_next_word(tok->pretok, s, n, pos);
      rc = tok->add_prefix_space == 2 && s[pos] != ' ' ? encode_spaced_word(tok, s + pos, end - pos, out)
                                                       : encode_word(tok, s + pos, end - pos, out);
    }
  }
  free(spaced);
  return rc;
}

int lt_tok_encode_into(lt_tokenizer *tok, const uint8_t *text, int64_t len, int allow_special, lt_tok_out *out) {
  int64_t pos = 0, start, end;
  int32_t id;
  while (pos < len && lt_tok_match_added(tok, text, pos, len, allow_special, &start, &end, &id)) {
    LT_TRY(encode_segment(tok, text + pos, start - pos, pos, out));
    LT_TRY(lt_tok_push(out, id));
    pos = end;
  }
  return encode_segment(tok, text + pos, len - pos, pos, out);
}

