/* decode.c — a tokenizer.json's decoders: ByteLevel, Replace, ByteFallback, Fuse, Strip and
 * Metaspace, in sequence, over the list of the tokens' texts, as Hugging Face's decode_chain;
 * the result is the texts joined (with spaces when the file has no decoder and is not
 * byte-level, as Hugging Face joins them). Byte-level tokens hold their bytes already, so a
 * ByteLevel decoder joins them. A normalized added token decodes to its normalized text, as
 * Hugging Face's does ("Hello" behind Lowercase decodes to "hello"). */
#include "tok/tokenizer.h"
#include <stdlib.h>

// A list of texts: text k is b[off[k] .. off[k + 1]).
typedef struct texts {
  uint8_t *b;
  int64_t n, cap;
  int64_t *off;
  int64_t count, ocap;
} texts;

static int put(texts *t, const void *p, int64_t len) {
  if (t->n + len > t->cap) {
    int64_t cap = t->cap ? t->cap : 256;
    while (cap < t->n + len) cap *= 2;
    uint8_t *b = realloc(t->b, (size_t)cap);
    if (!b) return lt_errorf("decode: out of memory");
    t->b = b, t->cap = cap;
  }
  if (len) memcpy(t->b + t->n, p, (size_t)len);
  t->n += len;
  return 0;
}

static int end_text(texts *t) { // closes the text being written
  if (t->count + 2 > t->ocap) {
    int64_t cap = t->ocap ? 2 * t->ocap : 256;
    int64_t *o = realloc(t->off, (size_t)cap * sizeof *o);
    if (!o) return lt_errorf("decode: out of memory");
    t->off = o, t->ocap = cap;
  }
  if (t->count == 0) t->off[0] = 0;
  t->off[++t->count] = t->n;
  return 0;
}

static void reset(texts *t) { t->n = 0, t->count = 0; }

static int byte_of(const uint8_t *p, int64_t len) { // <0xXX> -> XX, else -1
  if (len != 6 || p[0] != '<' || p[1] != '0' || p[2] != 'x' || p[5] != '>') return -1;
  int v = 0;
  for (int k = 3; k < 5; k++) {
    int c = p[k], d = c >= '0' && c <= '9' ? c - '0' : (c | 32) >= 'a' && (c | 32) <= 'f' ? (c | 32) - 'a' + 10 : -1;
    if (d < 0) return -1;
    v = v * 16 + d;
  }
  return v;
}

static int valid_utf8(const uint8_t *p, int64_t n) {
  for (int64_t i = 0; i < n;) {
    uint32_t cp;
    i += lt_tok_utf8_decode(p + i, n - i, &cp);
    if (cp >= LT_TOK_RAW_BYTE) return 0;
  }
  return 1;
}

// ByteFallback: runs of <0xXX> tokens become their bytes when valid UTF-8, else one U+FFFD per byte.
static int flush_bytes(texts *out, uint8_t *run, int64_t *nrun) {
  if (!*nrun) return 0;
  if (valid_utf8(run, *nrun)) {
    LT_TRY(put(out, run, *nrun));
    LT_TRY(end_text(out));
  } else {
    for (int64_t k = 0; k < *nrun; k++) {
      LT_TRY(put(out, "\xEF\xBF\xBD", 3));
      LT_TRY(end_text(out));
    }
  }
  *nrun = 0;
  return 0;
}

static int step(const lt_tok_step *st, const texts *in, texts *out) {
  reset(out);
  int64_t nrun = 0;
  uint8_t *run = NULL;
  if (st->kind == LT_DEC_BYTEFALLBACK && !(run = malloc((size_t)(in->count ? in->count : 1))))
    return lt_errorf("decode: out of memory");
  int rc = 0;
  for (int64_t k = 0; k < in->count && !rc; k++) {
    const uint8_t *p = in->b ? in->b + in->off[k] : (const uint8_t *)""; // all texts empty so far: no buffer
    int64_t len = in->off[k + 1] - in->off[k];
    switch (st->kind) {
    case LT_DEC_BYTEFALLBACK: {
      int b = byte_of(p, len);
      if (b >= 0) {
        run[nrun++] = (uint8_t)b;
        continue;
      }
      rc = flush_bytes(out, run, &nrun);
      if (!rc) rc = put(out, p, len);
      break;
    }
    case LT_DEC_REPLACE: {
      int64_t pl = (int64_t)strlen(st->s1), cl = (int64_t)strlen(st->s2);
      for (int64_t i = 0; i < len && !rc;) {
        if (pl && i + pl <= len && memcmp(p + i, st->s1, (size_t)pl) == 0) {
          rc = put(out, st->s2, cl), i += pl;
        } else {
          rc = put(out, p + i, 1), i++;
        }
      }
      break;
    }
    case LT_DEC_STRIP: { // up to a (start) and b (stop) copies of the character s1 off each end
      int64_t cl = (int64_t)strlen(st->s1), s = 0, e = len;
      for (int i = 0; i < st->a && s + cl <= e && memcmp(p + s, st->s1, (size_t)cl) == 0; i++) s += cl;
      for (int i = 0; i < st->b && e - cl >= s && memcmp(p + e - cl, st->s1, (size_t)cl) == 0; i++) e -= cl;
      rc = put(out, p + s, e - s);
      break;
    }
    case LT_DEC_METASPACE: { // the replacement becomes a space; in the first text it goes (unless never)
      int64_t rl = (int64_t)strlen(st->s1);
      for (int64_t i = 0; i < len && !rc;) {
        if (i + rl <= len && memcmp(p + i, st->s1, (size_t)rl) == 0) {
          if (!(k == 0 && st->a != LT_PREPEND_NEVER)) rc = put(out, " ", 1);
          i += rl;
        } else {
          rc = put(out, p + i, 1), i++;
        }
      }
      break;
    }
    default: rc = put(out, p, len); break; // Fuse and ByteLevel join: one text at the end
    }
    if (!rc && st->kind != LT_DEC_FUSE && st->kind != LT_DEC_BYTELEVEL) rc = end_text(out);
  }
  if (!rc && st->kind == LT_DEC_BYTEFALLBACK) rc = flush_bytes(out, run, &nrun);
  if (!rc && (st->kind == LT_DEC_FUSE || st->kind == LT_DEC_BYTELEVEL)) rc = end_text(out);
  free(run);
  return rc;
}

int lt_tok_decode_chain(const lt_tokenizer *tok, const int32_t *ids, int64_t n, int skip_special, uint8_t **out,
                        int64_t *len) {
  texts t[2] = {{0}, {0}};
  int rc = 0, cur = 0;
  for (int64_t i = 0; i < n && !rc; i++) {
    if (skip_special && (tok->tok_flags[ids[i]] & LT_TOKF_SPECIAL)) continue;
    int64_t l;
    const uint8_t *b = lt_tok_bytes(tok, ids[i], &l);
    int32_t k = ids[i] < tok->n_added_of_id ? tok->added_of_id[ids[i]] : -1;
    if (k >= 0 && tok->norm_added_off[k + 1] > tok->norm_added_off[k]) // a normalized added token: its normalized text
      b = tok->norm_added_data + tok->norm_added_off[k], l = tok->norm_added_off[k + 1] - tok->norm_added_off[k];
    rc = put(&t[0], b, l);
    if (!rc) rc = end_text(&t[0]);
  }
  for (int k = 0; k < tok->n_dec && !rc; k++, cur = 1 - cur) rc = step(&tok->dec[k], &t[cur], &t[1 - cur]);
  texts joined = {0};
  int spaced = !tok->has_decoder && !tok->byte_level;
  for (int64_t k = 0; k < t[cur].count && !rc; k++) {
    if (spaced && k) rc = put(&joined, " ", 1);
    int64_t l = t[cur].off[k + 1] - t[cur].off[k];
    if (!rc && l) rc = put(&joined, t[cur].b + t[cur].off[k], l);
  }
  free(t[0].b), free(t[0].off), free(t[1].b), free(t[1].off), free(joined.off);
  if (rc) {
    free(joined.b);
    return rc;
  }
  *out = joined.b, *len = joined.n;
  return 0;
}
