/* char.c — the char-level tokenizer: one token per distinct code point of the
 * corpus in code point order (Python's sorted(set(text))), then one per byte that is not
 * valid UTF-8 (so any corpus has a vocab), then the special tokens. */
#include "tok/tokenizer.h"
#include <stdlib.h>

int lt_tok_char_build(lt_tokenizer *tok, const uint32_t *sorted_cps, int32_t n) {
  tok->chars = malloc((size_t)(n ? n : 1) * sizeof *tok->chars);
  if (!tok->chars) return lt_errorf("char tokenizer: out of memory");
  for (int32_t i = 0; i < n; i++) {
    uint32_t cp = sorted_cps[i];
    if (cp >= LT_TOK_RAW_BYTE + 256 || (cp >= 0xD800 && cp < 0xE000) ||
        (cp >= LT_TOK_RAW_BYTE && cp < LT_TOK_RAW_BYTE + 0x80))
      return lt_errorf("char tokenizer: code point %u is not a character or a byte >= 0x80", cp);
    if (i && cp <= sorted_cps[i - 1]) return lt_errorf("char tokenizer: code points are not sorted and distinct");
    uint8_t buf[4];
    int len = lt_tok_utf8_encode(cp, buf);
    LT_TRY(lt_tok_append(tok, buf, len, 0));
    tok->chars[i] = cp;
    if (cp < 128) tok->ascii_id[cp] = tok->vocab_size - 1;
  }
  tok->n_chars = n;
  return 0;
}

static int32_t char_id(const lt_tokenizer *tok, uint32_t cp) {
  if (cp < 128) return tok->ascii_id[cp];
  int32_t lo = 0, hi = tok->n_chars - 1;
  while (lo <= hi) {
    int32_t mid = (lo + hi) / 2;
    if (tok->chars[mid] == cp) return mid;
    if (tok->chars[mid] < cp)
      lo = mid + 1;
    else
      hi = mid - 1;
  }
  return -1;
}

int lt_tok_char_encode_segment(const lt_tokenizer *tok, const uint8_t *text, int64_t len, int64_t base,
                               lt_tok_out *out) {
  for (int64_t i = 0; i < len;) {
    uint32_t cp;
    int l = lt_tok_utf8_decode(text + i, len - i, &cp);
    int32_t id = char_id(tok, cp);
    if (id < 0) {
      if (cp >= LT_TOK_RAW_BYTE)
        return lt_errorf("encode: byte 0x%02x at offset %lld (not valid UTF-8) is not in the char vocab",
                         cp - LT_TOK_RAW_BYTE, (long long)(base + i));
      return lt_errorf("encode: character U+%04X at byte offset %lld is not in the char vocab", cp,
                       (long long)(base + i));
    }
    LT_TRY(lt_tok_push(out, id));
    i += l;
  }
  return 0;
}

int lt_tokenizer_new_char(lt_tokenizer **out, const char *text, int64_t len, const char *const *special_tokens,
                          int32_t num_special) {
  if (!out) return lt_errorf("char tokenizer: out is NULL");
  *out = NULL;
  if (len < 0 || (!text && len)) return lt_errorf("char tokenizer: text is NULL or len < 0");
  enum { NBITS = LT_TOK_RAW_BYTE + 256 };
  uint64_t *seen = calloc(NBITS / 64, sizeof *seen);
  lt_tokenizer *tok = lt_tok_alloc(LT_TOK_CHAR);
  uint32_t *cps = NULL;
  int rc = -1;
  if (!seen || !tok) {
    if (tok) lt_errorf("char tokenizer: out of memory");
    goto done;
  }
  const uint8_t *s = (const uint8_t *)text;
  for (int64_t i = 0; i < len;) {
    uint32_t cp;
    i += lt_tok_utf8_decode(s + i, len - i, &cp);
    seen[cp / 64] |= 1ull << (cp % 64);
  }
  int32_t n = 0;
  for (int64_t w = 0; w < NBITS / 64; w++) n += __builtin_popcountll(seen[w]);
  if (!(cps = malloc((size_t)(n ? n : 1) * sizeof *cps))) {
    lt_errorf("char tokenizer: out of memory");
    goto done;
  }
  n = 0;
  for (int64_t w = 0; w < NBITS / 64; w++)
    for (uint64_t bits = seen[w]; bits; bits &= bits - 1) cps[n++] = (uint32_t)(w * 64 + __builtin_ctzll(bits));
  if (lt_tok_char_build(tok, cps, n) || lt_tok_add_specials("char tokenizer", tok, special_tokens, num_special))
    goto done;
  *out = tok;
  tok = NULL;
  rc = 0;
done:
  free(seen);
  free(cps);
  lt_tokenizer_free(tok);
  return rc;
}
