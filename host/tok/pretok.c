/* pretok.c — UTF-8, the GPT-2 pre-tokenizer and GPT-2's byte <-> unicode map.
 *
 * The pre-tokenizer is GPT-2's regex, written out as a scanner:
 *   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 * A byte that is not valid UTF-8 is a character of class "other" on its own, so any
 * byte string splits, and the words concatenate back to the text. */
#include "tok/tokenizer.h"

static const uint8_t ascii_class[128] = {
    ['\t'] = LT_CLASS_SPACE,         ['\n'] = LT_CLASS_SPACE,         ['\v'] = LT_CLASS_SPACE,
    ['\f'] = LT_CLASS_SPACE,         ['\r'] = LT_CLASS_SPACE,         [' '] = LT_CLASS_SPACE,
    ['0' ... '9'] = LT_CLASS_NUMBER, ['A' ... 'Z'] = LT_CLASS_LETTER, ['a' ... 'z'] = LT_CLASS_LETTER,
};

int lt_tok_utf8_decode(const uint8_t *s, int64_t n, uint32_t *cp) {
  uint8_t b0 = s[0];
  if (b0 < 0x80) {
    *cp = b0;
    return 1;
  }
  int len;
  uint32_t c;
  uint8_t lo = 0x80, hi = 0xBF; // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    len = 2, c = b0 & 0x1F;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    len = 3, c = b0 & 0x0F;
    if (b0 == 0xE0) lo = 0xA0; // overlong
    if (b0 == 0xED) hi = 0x9F; // surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    len = 4, c = b0 & 0x07;
    if (b0 == 0xF0) lo = 0x90; // overlong
    if (b0 == 0xF4) hi = 0x8F; // above U+10FFFF
  } else {
    goto invalid;
  }
  if (n < len || s[1] < lo || s[1] > hi) goto invalid;
  c = (c << 6) | (s[1] & 0x3F);
  for (int k = 2; k < len; k++) {
    if ((s[k] & 0xC0) != 0x80) goto invalid;
    c = (c << 6) | (s[k] & 0x3F);
  }
  *cp = c;
  return len;
invalid:
  *cp = LT_TOK_RAW_BYTE + b0;
  return 1;
}

int lt_tok_utf8_encode(uint32_t cp, uint8_t *out) {
  if (cp >= LT_TOK_RAW_BYTE) {
    out[0] = (uint8_t)(cp - LT_TOK_RAW_BYTE);
    return 1;
  }
  if (cp < 0x80) {
    out[0] = (uint8_t)cp;
    return 1;
  }
  if (cp < 0x800) {
    out[0] = (uint8_t)(0xC0 | (cp >> 6));
    out[1] = (uint8_t)(0x80 | (cp & 0x3F));
    return 2;
  }
  if (cp < 0x10000) {
    out[0] = (uint8_t)(0xE0 | (cp >> 12));
    out[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
    out[2] = (uint8_t)(0x80 | (cp & 0x3F));
    return 3;
  }
  out[0] = (uint8_t)(0xF0 | (cp >> 18));
  out[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
  out[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
  out[3] = (uint8_t)(0x80 | (cp & 0x3F));
  return 4;
}

// Class of the character at s[i] (i < n); *len gets its length in bytes.
static inline int class_at(const uint8_t *s, int64_t n, int64_t i, int *len) {
  if (s[i] < 0x80) {
    *len = 1;
    return ascii_class[s[i]];
  }
  uint32_t cp;
  *len = lt_tok_utf8_decode(s + i, n - i, &cp);
  return cp >= LT_TOK_RAW_BYTE ? LT_CLASS_OTHER : lt_tok_unicode_class(cp);
}

// End of the run of characters of class k that starts at i.
static int64_t run_of(const uint8_t *s, int64_t n, int64_t i, int k) {
  while (i < n) {
    if (s[i] < 0x80) { // ASCII fast path
      if (ascii_class[s[i]] != k) break;
      i++;
      continue;
    }
    int len;
    if (class_at(s, n, i, &len) != k) break;
    i += len;
  }
  return i;
}

int64_t lt_tok_gpt2_next(const uint8_t *s, int64_t n, int64_t pos) {
  uint8_t c0 = s[pos];
  if (c0 == '\'' && pos + 1 < n) { // 's 't 're 've 'm 'll 'd (case-sensitive, as GPT-2)
    uint8_t c1 = s[pos + 1];
    if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return pos + 2;
    if (pos + 2 < n) {
      uint8_t c2 = s[pos + 2];
      if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) return pos + 3;
    }
  }
  int len0, k0 = class_at(s, n, pos, &len0);
  if (c0 == ' ' && pos + 1 < n) { // ' ?X+' with a leading space
    int len1, k1 = class_at(s, n, pos + 1, &len1);
    if (k1 != LT_CLASS_SPACE) return run_of(s, n, pos + 1 + len1, k1);
  }
  if (k0 != LT_CLASS_SPACE) return run_of(s, n, pos + len0, k0);
  // whitespace: \s+(?!\S) leaves the last whitespace character to the next word; \s+ when only one
  int64_t i = pos, last = pos;
  while (i < n) {
    int len;
    if (class_at(s, n, i, &len) != LT_CLASS_SPACE) break;
    last = i;
    i += len;
  }
  if (i == n || last == pos) return i;
  return last;
}

/* The pattern of Llama 3 and GPT-4's cl100k (max_digits 3), or Qwen2 (max_digits 1):
 *   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|
 *   \s*[\r\n]+|\s+(?!\S)|\s+                                                                  */
int64_t lt_tok_cl100k_next(const uint8_t *s, int64_t n, int64_t pos, int max_digits) {
  uint8_t c0 = s[pos];
  if (c0 == '\'' && pos + 1 < n) { // contractions, ASCII case-insensitive
    uint8_t c1 = s[pos + 1] | 0x20, c2 = pos + 2 < n ? s[pos + 2] | 0x20 : 0;
    if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return pos + 2;
    if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) return pos + 3;
    if (s[pos + 1] == 0xC5 && pos + 2 < n && s[pos + 2] == 0xBF) return pos + 3; // U+017F long s folds to 's'
  }
  int len0, k0 = class_at(s, n, pos, &len0);
  if (k0 == LT_CLASS_LETTER) return run_of(s, n, pos + len0, LT_CLASS_LETTER);
  if (k0 != LT_CLASS_NUMBER && c0 != '\r' && c0 != '\n' && pos + len0 < n) { // one non-letter before letters
    int len1;
    if (class_at(s, n, pos + len0, &len1) == LT_CLASS_LETTER) return run_of(s, n, pos + len0 + len1, LT_CLASS_LETTER);
  }
  if (k0 == LT_CLASS_NUMBER) { // at most max_digits numbers
    int64_t i = pos + len0;
    for (int d = 1, len; d < max_digits && i < n && class_at(s, n, i, &len) == LT_CLASS_NUMBER; d++) i += len;
    return i;
  }
  int64_t i = pos;
  int k = k0, len = len0;
  if (c0 == ' ' && pos + 1 < n) {
    int len1, k1 = class_at(s, n, pos + 1, &len1);
    if (k1 == LT_CLASS_OTHER) i = pos + 1, k = k1, len = len1;
  }
  if (k == LT_CLASS_OTHER) { // ' ?[^\s\p{L}\p{N}]+[\r\n]*'
    i = run_of(s, n, i + len, LT_CLASS_OTHER);
    while (i < n && (s[i] == '\r' || s[i] == '\n')) i++;
    return i;
  }
  // whitespace: up to the last newline of the run, else as GPT-2
  int64_t last = pos, newline_end = -1;
  while (i < n && class_at(s, n, i, &len) == LT_CLASS_SPACE) {
    last = i;
    i += len;
    if (s[last] == '\r' || s[last] == '\n') newline_end = i;
  }
  if (newline_end > 0) return newline_end;
  if (i == n || last == pos) return i;
  return last;
}

const char *const lt_tok_patterns[LT_TOK_NUM_PATTERNS] = {
    [LT_PRETOK_GPT2] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+",
    [LT_PRETOK_CL100K] =
        "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
        "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    [LT_PRETOK_QWEN2] =
        "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
        "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
};

/* GPT-2's bytes_to_unicode: the printable bytes '!'..'~', 0xA1..0xAC and 0xAE..0xFF map to
 * themselves, the other 68 to U+0100.. in byte order. */
static inline int printable(uint32_t b) {
  return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

uint32_t lt_tok_byte_to_unicode(uint8_t b) {
  if (printable(b)) return b;
  if (b <= 0x20) return 0x100 + b;
  if (b <= 0xA0) return 0x100 + 33 + (b - 0x7F);
  return 0x100 + 67; // 0xAD
}

int lt_tok_unicode_to_byte(uint32_t cp) {
  if (cp <= 0xFF) return printable(cp) ? (int)cp : -1;
  if (cp < 0x100 + 33) return (int)(cp - 0x100);
  if (cp < 0x100 + 67) return (int)(cp - 0x100 - 33 + 0x7F);
  if (cp == 0x100 + 67) return 0xAD;
  return -1;
}
