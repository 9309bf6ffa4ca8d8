/* normalize.c — the normalizers of a tokenizer.json over a string with alignments: NFC, NFD,
 * NFKC, NFKD (utf8proc), Lowercase, Prepend, Replace (a string pattern) and Strip.
 *
 * Every byte of the normalized text keeps the byte range of the original text it came from,
 * following Hugging Face's NormalizedString: a character that replaces one takes that one's
 * range; characters inserted after it (a decomposition, "İ" lowercased to "i̇") take it too; a
 * composition ("e" + U+0301 -> "é") takes the range of its first character. Bytes that are not
 * valid UTF-8 pass every normalizer unchanged. */
#include "tok/tokenizer.h"
#include <stdlib.h>
#include <utf8proc.h>

int lt_tok_nstr_reserve(lt_tok_nstr *s, int64_t cap) {
  if (cap <= s->cap) return 0;
  int64_t c = s->cap ? s->cap : 256;
  while (c < cap) c *= 2;
  uint8_t *b = realloc(s->b, (size_t)c);
  if (b) s->b = b;
  int64_t *a0 = realloc(s->a0, (size_t)c * sizeof *a0);
  if (a0) s->a0 = a0;
  int64_t *a1 = realloc(s->a1, (size_t)c * sizeof *a1);
  if (a1) s->a1 = a1;
  if (!b || !a0 || !a1) return lt_errorf("encode: out of memory");
  s->cap = c;
  return 0;
}

int lt_tok_nstr_put(lt_tok_nstr *s, const uint8_t *p, int64_t len, int64_t a0, int64_t a1) {
  if (len <= 0) return 0;
  LT_TRY(lt_tok_nstr_reserve(s, s->n + len));
  memcpy(s->b + s->n, p, (size_t)len);
  for (int64_t i = 0; i < len; i++) s->a0[s->n + i] = a0, s->a1[s->n + i] = a1;
  s->n += len;
  return 0;
}

// Appends in[i..j) with its own alignments.
static int copy_range(lt_tok_nstr *out, const lt_tok_nstr *in, int64_t i, int64_t j) {
  if (j <= i) return 0;
  LT_TRY(lt_tok_nstr_reserve(out, out->n + (j - i)));
  memcpy(out->b + out->n, in->b + i, (size_t)(j - i));
  memcpy(out->a0 + out->n, in->a0 + i, (size_t)(j - i) * sizeof *in->a0);
  memcpy(out->a1 + out->n, in->a1 + i, (size_t)(j - i) * sizeof *in->a1);
  out->n += j - i;
  return 0;
}

void lt_tok_nstr_free(lt_tok_nstr *s) {
  free(s->b), free(s->a0), free(s->a1);
  memset(s, 0, sizeof *s);
}

// Length of the character at s[i] (1 for a byte that is not valid UTF-8); *valid says which.
static int char_at(const lt_tok_nstr *s, int64_t i, int *valid) {
  uint32_t cp;
  int len = lt_tok_utf8_decode(s->b + i, s->n - i, &cp);
  *valid = cp < LT_TOK_RAW_BYTE;
  return len;
}

// ---- NFC, NFD, NFKC, NFKD --------------------------------------------------------------------

static int map_text(const uint8_t *p, int64_t len, int options, uint8_t **out, int64_t *out_len) {
  utf8proc_uint8_t *dst = NULL;
  *out = NULL, *out_len = 0;
  utf8proc_ssize_t n = utf8proc_map((const utf8proc_uint8_t *)p, (utf8proc_ssize_t)len, &dst, options);
  if (n < 0) return lt_errorf("encode: Unicode normalization failed: %s", utf8proc_errmsg(n));
  *out = dst, *out_len = (int64_t)n;
  return 0;
}

static int ccc_at(const uint8_t *p, int64_t n) {
  utf8proc_int32_t cp;
  if (utf8proc_iterate(p, (utf8proc_ssize_t)n, &cp) < 0) return 0;
  return utf8proc_get_property(cp)->combining_class;
}

// End of the run (a character and the combining marks after it) that starts at in[i], before q.
static int64_t run_end(const lt_tok_nstr *in, int64_t i, int64_t q) {
  int valid;
  i += char_at(in, i, &valid);
  while (i < q) {
    int len = char_at(in, i, &valid);
    if (ccc_at(in->b + i, q - i) == 0) break;
    i += len;
  }
  return i;
}

// Appends r[0..m), the normalization of the run in[i..j), aligned as Hugging Face aligns it.
static int align_run(lt_tok_nstr *out, const lt_tok_nstr *in, int64_t i, int64_t j, const uint8_t *r, int64_t m,
                     int options) {
  if (m == j - i && memcmp(r, in->b + i, (size_t)m) == 0) return copy_range(out, in, i, j);
  // each character on its own: a decomposition or replacement per character
  int64_t total = 0, k = i;
  int same = 1, valid;
  while (k < j && same) {
    int len = char_at(in, k, &valid);
    uint8_t *p = NULL;
    int64_t pl = 0;
    LT_TRY(map_text(in->b + k, len, options, &p, &pl));
    same = total + pl <= m && memcmp(r + total, p, (size_t)pl) == 0;
    free(p);
    total += pl, k += len;
  }
  if (same && total == m) {
    for (k = i, total = 0; k < j;) {
      int len = char_at(in, k, &valid);
      uint8_t *p = NULL;
      int64_t pl = 0;
      LT_TRY(map_text(in->b + k, len, options, &p, &pl));
      int rc = lt_tok_nstr_put(out, p, pl, in->a0[k], in->a1[k]);
      free(p);
      LT_TRY(rc);
      k += len;
    }
    return 0;
  }
  // a composition: output character t takes input character min(t, last)'s range
  int64_t src = i;
  for (int64_t o = 0; o < m;) {
    uint32_t cp;
    int len = lt_tok_utf8_decode(r + o, m - o, &cp);
    LT_TRY(lt_tok_nstr_put(out, r + o, len, in->a0[src], in->a1[src]));
    o += len;
    int64_t next = src + char_at(in, src, &valid);
    if (next < j) src = next;
  }
  return 0;
}

// The valid UTF-8 in[p..q): the whole is normalized at once (the text is exact); its runs are
// normalized again one by one only to align the result.
static int unicode_stretch(lt_tok_nstr *out, const lt_tok_nstr *in, int64_t p, int64_t q, int options) {
  uint8_t *whole = NULL;
  int64_t w = 0;
  LT_TRY(map_text(in->b + p, q - p, options, &whole, &w));
  int rc = 0;
  if (w == q - p && memcmp(whole, in->b + p, (size_t)w) == 0) {
    rc = copy_range(out, in, p, q);
    free(whole);
    return rc;
  }
  int64_t i = p, o = 0;
  while (i < q && !rc) {
    int64_t j = run_end(in, i, q);
    if (j == i + 1 && in->b[i] < 0x80 && (j == q || in->b[j] < 0x80)) { // ASCII before ASCII: unchanged
      if (o < w && whole[o] == in->b[i]) {
        rc = copy_range(out, in, i, j);
        i = j, o++;
        continue;
      }
    }
    uint8_t *r = NULL;
    int64_t m = 0;
    for (;;) {
      if ((rc = map_text(in->b + i, j - i, options, &r, &m))) break;
      if (o + m <= w && memcmp(whole + o, r, (size_t)m) == 0) break;
      free(r);
      r = NULL;
      if (j >= q) break;
      j = run_end(in, j, q); // a composition across runs (Hangul jamo): take the next run too
    }
    if (rc) break;
    if (!r) { // no alignment found: the rest of the output takes the rest of the input
      rc = lt_tok_nstr_put(out, whole + o, w - o, in->a0[i], in->a1[q - 1]);
      o = w, i = q;
      break;
    }
    rc = align_run(out, in, i, j, r, m, options);
    free(r);
    o += m, i = j;
  }
  free(whole);
  return rc;
}

static int unicode_form(lt_tok_nstr *out, const lt_tok_nstr *in, int options) {
  for (int64_t p = 0; p < in->n;) {
    int64_t q = p;
    int valid = 1;
    while (q < in->n) {
      int len = char_at(in, q, &valid);
      if (!valid) break;
      q += len;
    }
    if (q > p) LT_TRY(unicode_stretch(out, in, p, q, options));
    if (q < in->n) LT_TRY(copy_range(out, in, q, q + 1)); // a byte that is not UTF-8
    p = q + (q < in->n);
  }
  return 0;
}

// ---- Lowercase, Prepend, Replace, Strip ----------------------------------------------------------

static int lowercase(lt_tok_nstr *out, const lt_tok_nstr *in) {
  for (int64_t i = 0; i < in->n;) {
    uint32_t cp;
    int len = lt_tok_utf8_decode(in->b + i, in->n - i, &cp);
    uint8_t buf[8];
    int m;
    if (cp >= LT_TOK_RAW_BYTE) {
      buf[0] = in->b[i], m = 1;
    } else if (cp == 0x130) { // İ: the one full lowercase mapping of two characters (i + U+0307)
      m = lt_tok_utf8_encode('i', buf);
      m += lt_tok_utf8_encode(0x307, buf + m);
    } else {
      m = lt_tok_utf8_encode((uint32_t)utf8proc_tolower((utf8proc_int32_t)cp), buf);
    }
    LT_TRY(lt_tok_nstr_put(out, buf, m, in->a0[i], in->a1[i]));
    i += len;
  }
  return 0;
}

static int prepend(lt_tok_nstr *out, const lt_tok_nstr *in, const char *s) {
  if (in->n == 0) return 0;
  LT_TRY(lt_tok_nstr_put(out, (const uint8_t *)s, (int64_t)strlen(s), in->a0[0], in->a1[0]));
  return copy_range(out, in, 0, in->n);
}

static int replace(lt_tok_nstr *out, const lt_tok_nstr *in, const char *pattern, const char *content) {
  int64_t pl = (int64_t)strlen(pattern), cl = (int64_t)strlen(content), done = 0;
  for (int64_t i = 0; i + pl <= in->n;) {
    if (memcmp(in->b + i, pattern, (size_t)pl) != 0) {
      i++;
      continue;
    }
    LT_TRY(copy_range(out, in, done, i));
    LT_TRY(lt_tok_nstr_put(out, (const uint8_t *)content, cl, in->a0[i + pl - 1], in->a1[i + pl - 1]));
    i += pl, done = i;
  }
  return copy_range(out, in, done, in->n);
}

static int strip(lt_tok_nstr *out, const lt_tok_nstr *in, int left, int right) {
  int64_t i = 0, j = in->n;
  while (left && i < j) {
    uint32_t cp;
    int len = lt_tok_utf8_decode(in->b + i, j - i, &cp);
    if (!lt_tok_is_space_cp(cp)) break;
    i += len;
  }
  while (right && j > i) {
    int64_t s = j - 1;
    while (s > i && j - s < 4 && (in->b[s] & 0xC0) == 0x80) s--;
    uint32_t cp;
    if (lt_tok_utf8_decode(in->b + s, j - s, &cp) != j - s || !lt_tok_is_space_cp(cp)) break;
    j = s;
  }
  return copy_range(out, in, i, j);
}

int lt_tok_normalize(const lt_tokenizer *tok, lt_tok_nstr *s) {
  static const int forms[] = {
      [LT_NORM_NFC] = UTF8PROC_STABLE | UTF8PROC_COMPOSE,
      [LT_NORM_NFD] = UTF8PROC_STABLE | UTF8PROC_DECOMPOSE,
      [LT_NORM_NFKC] = UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT,
      [LT_NORM_NFKD] = UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT,
  };
  lt_tok_nstr out = {0};
  int rc = 0;
  for (int k = 0; k < tok->n_norm && !rc; k++) {
    const lt_tok_step *st = &tok->norm[k];
    out.n = 0;
    switch (st->kind) {
    case LT_NORM_NFC:
    case LT_NORM_NFD:
    case LT_NORM_NFKC:
    case LT_NORM_NFKD: rc = unicode_form(&out, s, forms[st->kind]); break;
    case LT_NORM_LOWERCASE: rc = lowercase(&out, s); break;
    case LT_NORM_PREPEND: rc = prepend(&out, s, st->s1); break;
    case LT_NORM_REPLACE: rc = replace(&out, s, st->s1, st->s2); break;
    default: rc = strip(&out, s, st->a, st->b); break;
    }
    lt_tok_nstr t = *s; // the output becomes the string; its buffers are reused next step
    *s = out, out = t;
  }
  lt_tok_nstr_free(&out);
  return rc;
}
