/* pipeline.c — encoding through a tokenizer.json's whole pipeline, with offsets.
 *
 * As Hugging Face's tokenizers: split the text at the added tokens that are not normalized;
 * normalize each piece between them; split the normalized pieces at the normalized added
 * tokens; pre-tokenize the rest into words (Split, ByteLevel, Metaspace); run BPE on each word;
 * then the post-processors (ByteLevel's offset trimming, TemplateProcessing's special tokens).
 * A token's offsets are the byte range of the original text its bytes came from: the first
 * byte's range start to the last byte's range end. */
#include "tok/tokenizer.h"
#include <stdlib.h>

typedef struct piece {
  int64_t lo, hi;
} piece;

typedef struct ctx {
  lt_tokenizer *tok;
  int allow_special, want_offsets;
  lt_tok_out *out;
  lt_tok_spans *offs;
  lt_tok_nstr str, buf[2]; // the normalized segment; pre-tokenization's texts
  piece *pieces[2];
  int64_t npieces[2], piece_cap[2];
  lt_tok_out word_ids;
  lt_tok_spans word_spans;
} ctx;

static int emit(ctx *c, int32_t id, int64_t a, int64_t b) {
  LT_TRY(lt_tok_push(c->out, id));
  return c->offs ? lt_tok_spans_push(c->offs, a, b) : 0;
}

static int add_piece(ctx *c, int w, int64_t lo, int64_t hi) {
  if (hi <= lo) return 0; // empty pieces are dropped
  if (c->npieces[w] == c->piece_cap[w]) {
    int64_t cap = c->piece_cap[w] ? 2 * c->piece_cap[w] : 256;
    piece *p = realloc(c->pieces[w], (size_t)cap * sizeof *p);
    if (!p) return lt_errorf("encode: out of memory");
    c->pieces[w] = p, c->piece_cap[w] = cap;
  }
  c->pieces[w][c->npieces[w]++] = (piece){lo, hi};
  return 0;
}

// Splits the pieces of text src (slot w) with the pre-tokenizer regex mode, into slot 1 - w.
static int split_regex(ctx *c, const lt_tok_nstr *src, int w, int mode) {
  c->npieces[1 - w] = 0;
  for (int64_t k = 0; k < c->npieces[w]; k++) {
    piece p = c->pieces[w][k];
    for (int64_t pos = p.lo, end; pos < p.hi; pos = end) {
      end = p.lo + lt_tok_next_word(mode, src->b + p.lo, p.hi - p.lo, pos - p.lo);
      LT_TRY(add_piece(c, 1 - w, pos, end));
    }
  }
  return 0;
}

// Digits: each number character (individual) or run of them is a piece of its own.
static int split_digits(ctx *c, const lt_tok_nstr *src, int w, int individual) {
  c->npieces[1 - w] = 0;
  for (int64_t k = 0; k < c->npieces[w]; k++) {
    piece p = c->pieces[w][k];
    int64_t from = p.lo, i = p.lo;
    int prev = -1;
    while (i < p.hi) {
      uint32_t cp;
      int len = lt_tok_utf8_decode(src->b + i, p.hi - i, &cp);
      int digit = cp < 0x80 ? cp - '0' < 10 : cp < LT_TOK_RAW_BYTE && lt_tok_unicode_class(cp) == LT_CLASS_NUMBER;
      if (i > from && (digit != prev || (digit && individual))) {
        LT_TRY(add_piece(c, 1 - w, from, i));
        from = i;
      }
      prev = digit, i += len;
    }
    LT_TRY(add_piece(c, 1 - w, from, p.hi));
  }
  return 0;
}

static int starts_with(const lt_tok_nstr *s, piece p, const char *x, int64_t xl) {
  return p.hi - p.lo >= xl && memcmp(s->b + p.lo, x, (size_t)xl) == 0;
}

// Rewrites each piece of src (slot w) into dst (slot 1 - w): ByteLevel's prefix space, or
// Metaspace's replacement of spaces, its prefix and its split.
static int rewrite(ctx *c, const lt_tok_step *st, const lt_tok_nstr *src, lt_tok_nstr *dst, int w) {
  dst->n = 0;
  c->npieces[1 - w] = 0;
  const char *rep = st->kind == LT_PRE_METASPACE ? st->s1 : " ";
  int64_t rl = (int64_t)strlen(rep);
  for (int64_t k = 0; k < c->npieces[w]; k++) {
    piece p = c->pieces[w][k];
    int64_t start = dst->n;
    int prefix;
    if (st->kind == LT_PRE_BYTELEVEL) {
      prefix = st->a && src->b[p.lo] != ' ';
    } else {
      prefix = st->a == LT_PREPEND_ALWAYS || (st->a == LT_PREPEND_FIRST && src->a0[p.lo] == 0);
      prefix = prefix && src->b[p.lo] != ' ' && !starts_with(src, p, rep, rl); // spaces become rep below
    }
    if (prefix) LT_TRY(lt_tok_nstr_put(dst, (const uint8_t *)rep, rl, src->a0[p.lo], src->a1[p.lo]));
    for (int64_t i = p.lo; i < p.hi; i++) {
      if (st->kind == LT_PRE_METASPACE && src->b[i] == ' ') {
        LT_TRY(lt_tok_nstr_put(dst, (const uint8_t *)rep, rl, src->a0[i], src->a1[i]));
      } else {
        LT_TRY(lt_tok_nstr_put(dst, src->b + i, 1, src->a0[i], src->a1[i]));
      }
    }
    if (st->kind == LT_PRE_METASPACE && st->b) { // split before each replacement (merged with what follows)
      int64_t from = start;
      for (int64_t i = start + 1; i + rl <= dst->n; i++) {
        if (memcmp(dst->b + i, rep, (size_t)rl) != 0) continue;
        LT_TRY(add_piece(c, 1 - w, from, i));
        from = i;
      }
      LT_TRY(add_piece(c, 1 - w, from, dst->n));
    } else {
      LT_TRY(add_piece(c, 1 - w, start, dst->n));
    }
  }
  return 0;
}

// Pre-tokenizes and encodes the normalized text s[lo..hi).
static int encode_words(ctx *c, const lt_tok_nstr *s, int64_t lo, int64_t hi) {
  lt_tokenizer *tok = c->tok;
  lt_tok_step classic[2];
  const lt_tok_step *steps = tok->pre;
  int nsteps = tok->n_pre;
  if (!tok->n_pre && tok->byte_level) { // lutra's own: the steps its pretok and add_prefix_space stand for
    if (tok->pretok == LT_PRETOK_NONE) {
      classic[0] = (lt_tok_step){LT_PRE_BYTELEVEL, tok->add_prefix_space == 1, 0, NULL, NULL}, nsteps = 1;
    } else if (tok->pretok == LT_PRETOK_GPT2 && tok->add_prefix_space != 2) {
      classic[0] = (lt_tok_step){LT_PRE_BYTELEVEL, tok->add_prefix_space == 1, 1, NULL, NULL}, nsteps = 1;
    } else {
      classic[0] = (lt_tok_step){LT_PRE_SPLIT, tok->pretok, 0, NULL, NULL};
      classic[1] = (lt_tok_step){LT_PRE_BYTELEVEL, tok->add_prefix_space == 2, 0, NULL, NULL}, nsteps = 2;
    }
    steps = classic;
  }
  const lt_tok_nstr *cur = s;
  int w = 0, which = 0;
  c->npieces[0] = 0;
  LT_TRY(add_piece(c, 0, lo, hi));
  for (int k = 0; k < nsteps; k++) {
    const lt_tok_step *st = &steps[k];
    if (st->kind == LT_PRE_SPLIT || st->kind == LT_PRE_DIGITS) {
      LT_TRY(st->kind == LT_PRE_SPLIT ? split_regex(c, cur, w, st->a) : split_digits(c, cur, w, st->a));
      w = 1 - w;
      continue;
    }
    lt_tok_nstr *dst = &c->buf[which];
    LT_TRY(rewrite(c, st, cur, dst, w));
    cur = dst, which = 1 - which, w = 1 - w;
    if (st->kind == LT_PRE_BYTELEVEL && st->b) {
      LT_TRY(split_regex(c, cur, w, LT_PRETOK_GPT2));
      w = 1 - w;
    }
  }
  for (int64_t k = 0; k < c->npieces[w]; k++) {
    piece p = c->pieces[w][k];
    c->word_ids.n = 0, c->word_spans.n = 0;
    LT_TRY(lt_tok_encode_word(tok, cur->b + p.lo, p.hi - p.lo, &c->word_ids, c->want_offsets ? &c->word_spans : NULL));
    for (int64_t t = 0; t < c->word_ids.n; t++) {
      int64_t a = 0, b = 0;
      if (c->want_offsets) {
        int64_t s0 = p.lo + c->word_spans.v[2 * t], s1 = p.lo + c->word_spans.v[2 * t + 1];
        a = cur->a0[s0], b = cur->a1[s1 - 1];
      }
      LT_TRY(emit(c, c->word_ids.ids[t], a, b));
    }
  }
  return 0;
}

// A char tokenizer: one id per character.
static int encode_chars(ctx *c, const uint8_t *text, int64_t lo, int64_t hi) {
  for (int64_t i = lo; i < hi;) {
    uint32_t cp;
    int len = lt_tok_utf8_decode(text + i, hi - i, &cp);
    c->word_ids.n = 0;
    LT_TRY(lt_tok_char_encode_segment(c->tok, text + i, len, i, &c->word_ids));
    LT_TRY(emit(c, c->word_ids.ids[0], i, i + len));
    i += len;
  }
  return 0;
}

// The text between two added tokens of the raw text: normalized, split at the normalized added tokens.
static int encode_segment(ctx *c, const uint8_t *text, int64_t lo, int64_t hi) {
  if (lo >= hi) return 0;
  lt_tokenizer *tok = c->tok;
  if (tok->kind == LT_TOK_CHAR) return encode_chars(c, text, lo, hi);
  lt_tok_nstr *s = &c->str;
  s->n = 0;
  LT_TRY(lt_tok_nstr_reserve(s, hi - lo));
  memcpy(s->b, text + lo, (size_t)(hi - lo));
  s->n = hi - lo;
  for (int64_t i = lo; i < hi;) { // each byte's range: its character's
    uint32_t cp;
    int len = lt_tok_utf8_decode(text + i, hi - i, &cp);
    for (int k = 0; k < len; k++) s->a0[i - lo + k] = i, s->a1[i - lo + k] = i + len;
    i += len;
  }
  if (tok->n_norm) LT_TRY(lt_tok_normalize(tok, s));
  int64_t pos = 0, start, end;
  int32_t id;
  while (pos < s->n && lt_tok_match_added_set(tok, 1, s->b, pos, s->n, c->allow_special, &start, &end, &id)) {
    LT_TRY(encode_words(c, s, pos, start));
    LT_TRY(emit(c, id, s->a0[start], s->a1[end - 1]));
    pos = end;
  }
  return encode_words(c, s, pos, s->n);
}

// ByteLevel(trim_offsets): a token's offsets lose its leading and trailing spaces. Hugging Face
// trims character offsets by the number of space characters of the token: the offsets move by
// that many characters of the text (a prefix space the pre-tokenizer added is no character there).
// Tokens [from, to) of out come from text[0..n).
static void trim_offsets(const lt_tokenizer *tok, const uint8_t *text, int64_t n, const lt_tok_out *out,
                         lt_tok_spans *offs, int64_t from, int64_t to, int add_prefix_space) {
  for (int64_t i = from; i < to; i++) {
    int64_t len, lead = 0, trail = 0;
    const uint8_t *b = lt_tok_bytes(tok, out->ids[i], &len);
    int added = (tok->tok_flags[out->ids[i]] & LT_TOKF_ADDED) != 0;
    for (int64_t k = 0; k < len;) { // in characters, as Hugging Face counts them
      uint32_t cp;
      int l = lt_tok_utf8_decode(b + k, len - k, &cp);
      if (!(cp == ' ' || (added && lt_tok_is_space_cp(cp)))) break;
      lead++, k += l;
    }
    for (int64_t k = len; k > 0 && (b[k - 1] == ' ' || (added && lt_tok_is_space_cp(b[k - 1]))); k--) trail++;
    int64_t *o = offs->v + 2 * i;
    if (lead && (i == from || o[0] == 0) && add_prefix_space && lead == 1) lead = 0;
    for (; lead > 0 && o[0] < o[1]; lead--) { // one character forward
      uint32_t cp;
      o[0] += lt_tok_utf8_decode(text + o[0], n - o[0], &cp);
    }
    if (o[0] > o[1]) o[0] = o[1];
    int64_t chars = 0; // trailing: only when the end is at least that many characters in
    for (int64_t k = 0; k < o[1] && chars < trail; chars++) k += lt_tok_utf8_decode(text + k, o[1] - k, &(uint32_t){0});
    if (trail && chars >= trail) {
      for (; trail > 0 && o[1] > o[0]; trail--) { // one character back
        o[1]--;
        while (o[1] > o[0] && (text[o[1]] & 0xC0) == 0x80) o[1]--;
      }
    }
  }
}

// TemplateProcessing: the sequences A (ids [from, mid) of out) and B ([mid, end), a pair) with
// the special ids around them, which get empty offsets (0, 0).
static int apply_template(const lt_tokenizer *tok, int pair, lt_tok_out *out, lt_tok_spans *offs, int64_t from,
                          int64_t mid) {
  const lt_tok_template *t = pair ? &tok->pair : &tok->single;
  int64_t n = out->n - from;
  int32_t *ids = malloc((size_t)(n ? n : 1) * sizeof *ids);
  int64_t *o = malloc(2 * (size_t)(n ? n : 1) * sizeof *o);
  if (!ids || !o) {
    free(ids), free(o);
    return lt_errorf("encode: out of memory");
  }
  if (n) memcpy(ids, out->ids + from, (size_t)n * sizeof *ids);
  if (n && offs) memcpy(o, offs->v + 2 * from, 2 * (size_t)n * sizeof *o);
  out->n = from;
  if (offs) offs->n = from;
  int rc = 0;
  for (int32_t k = 0; k < t->n && !rc; k++) {
    if (t->seq[k] == 0) {
      for (int32_t j = 0; j < t->count[k] && !rc; j++) {
        rc = lt_tok_push(out, tok->template_ids[t->first[k] + j]);
        if (!rc && offs) rc = lt_tok_spans_push(offs, 0, 0);
      }
      continue;
    }
    int64_t lo = t->seq[k] == -1 ? 0 : mid - from, hi = t->seq[k] == -1 ? mid - from : n;
    for (int64_t j = lo; j < hi && !rc; j++) {
      rc = lt_tok_push(out, ids[j]);
      if (!rc && offs) rc = lt_tok_spans_push(offs, o[2 * j], o[2 * j + 1]);
    }
  }
  free(ids), free(o);
  return rc;
}

// Appends the ids of one sequence (no post-processing).
static int encode_sequence(ctx *c, const uint8_t *text, int64_t len) {
  int64_t pos = 0, start, end;
  int32_t id;
  while (pos < len && lt_tok_match_added_set(c->tok, 0, text, pos, len, c->allow_special, &start, &end, &id)) {
    LT_TRY(encode_segment(c, text, pos, start));
    LT_TRY(emit(c, id, start, end));
    pos = end;
  }
  return encode_segment(c, text, pos, len);
}

int lt_tok_encode_full(lt_tokenizer *tok, const uint8_t *text, int64_t len, const uint8_t *pair, int64_t pair_len,
                       int flags, lt_tok_out *out, lt_tok_spans *offsets) {
  ctx c = {.tok = tok, .allow_special = flags & 1, .want_offsets = offsets != NULL, .out = out, .offs = offsets};
  c.word_ids.owned = 1;
  int64_t from = out->n, mid;
  int rc = encode_sequence(&c, text, len);
  mid = out->n;
  if (!rc && pair) rc = encode_sequence(&c, pair, pair_len);
  for (int k = 0; k < tok->n_post && !rc; k++) {
    const lt_tok_step *st = &tok->post[k];
    if (st->kind == LT_POST_BYTELEVEL && st->a && offsets) {
      trim_offsets(tok, text, len, out, offsets, from, mid, st->b);
      if (pair) trim_offsets(tok, pair, pair_len, out, offsets, mid, out->n, st->b);
    }
    if (st->kind == LT_POST_TEMPLATE && !(flags & 2)) rc = apply_template(tok, pair != NULL, out, offsets, from, mid);
  }
  lt_tok_nstr_free(&c.str), lt_tok_nstr_free(&c.buf[0]), lt_tok_nstr_free(&c.buf[1]);
  free(c.pieces[0]), free(c.pieces[1]);
  free(c.word_ids.ids), free(c.word_spans.v);
  return rc;
}
