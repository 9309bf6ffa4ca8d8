/* json.c — the JSON reader lutra.json reaches through the FFI (lutra.h, "JSON"): cJSON builds
 * the tree; a strict RFC 8259 pass over the text comes first, because cJSON accepts what
 * JSON does not (leading zeros, "1.", raw control characters in strings, numbers past the
 * double range) and reports a failure only as a position. The strict pass names the problem
 * and its line and column, bounds the nesting, and notes what cJSON cannot carry: the length
 * of a string with a NUL byte (\u0000) and numbers longer than its 63-character buffer (the
 * text cJSON reads has those respelled, same value, in %.17g). Depends on lt_errorf and
 * cJSON only. */
#include "core/internal.h"
#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { CJSON_NUMBER_MAX = 63 }; /* the longest number text cJSON 1.7 reads whole */

typedef struct {
  int64_t ordinal, len; /* a string (keys and values, in text order) holding NUL bytes */
} nul_string;

typedef struct {
  int64_t start, len; /* a number text too long for cJSON */
} long_number;

typedef struct {
  const char *s;
  int64_t n, pos;
  int max_depth;
  int64_t strings; /* strings seen so far: the next one's ordinal */
  nul_string *nuls;
  int64_t n_nuls, cap_nuls;
  long_number *longs;
  int64_t n_longs, cap_longs;
  char what[256]; /* the first problem, and where */
  int64_t at;
} scan;

typedef struct {
  const cJSON *item; /* a string value, or the member whose key it is */
  int is_key;
  int64_t len;
} nul_entry;

struct lt_json_doc {
  cJSON *root;
  nul_entry *nuls;
  int64_t n_nuls;
};

static int push(void **items, int64_t *n, int64_t *cap, size_t size) {
  if (*n == *cap) {
    int64_t c = *cap ? 2 * *cap : 8;
    void *p = realloc(*items, (size_t)c * size);
    if (!p) return -1;
    *items = p, *cap = c;
  }
  (*n)++;
  return 0;
}

/* Records the first problem (at byte offset at) and returns -1. */
__attribute__((format(printf, 3, 4))) static int fail(scan *sc, int64_t at, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(sc->what, sizeof sc->what, fmt, ap);
  va_end(ap);
  sc->at = at;
  return -1;
}

/* The byte at pos as an error shows it. */
static void show_char(const scan *sc, int64_t pos, char *buf, size_t cap) {
  if (pos >= sc->n) {
    snprintf(buf, cap, "end of input");
    return;
  }
  unsigned char c = (unsigned char)sc->s[pos];
  if (c < 32 || c > 126)
    snprintf(buf, cap, "byte 0x%02x", c);
  else
    snprintf(buf, cap, "'%c'", c);
}

static int64_t skip_space(const scan *sc, int64_t pos) {
  while (pos < sc->n && (sc->s[pos] == ' ' || sc->s[pos] == '\t' || sc->s[pos] == '\r' || sc->s[pos] == '\n')) pos++;
  return pos;
}

static int is_digit(const scan *sc, int64_t pos) { return pos < sc->n && sc->s[pos] >= '0' && sc->s[pos] <= '9'; }

static int64_t digits_end(const scan *sc, int64_t pos) {
  while (is_digit(sc, pos)) pos++;
  return pos;
}

static int hex_digit(int c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

static int hex4(scan *sc, int64_t pos, unsigned *cp) {
  unsigned v = 0;
  for (int64_t k = pos; k < pos + 4; k++) {
    int d = k < sc->n ? hex_digit((unsigned char)sc->s[k]) : -1;
    if (d < 0) return fail(sc, pos, "bad \\u escape (four hex digits expected)");
    v = v * 16 + (unsigned)d;
  }
  *cp = v;
  return 0;
}

static int64_t utf8_length(unsigned cp) { return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4; }

/* A \u escape at j (the backslash), maybe a surrogate pair; *next is past it, *len grows by
 * its UTF-8 length and *nul is set for U+0000. */
static int unicode_escape(scan *sc, int64_t j, int64_t *next, int64_t *len, int *nul) {
  unsigned cp = 0, lo = 0;
  if (hex4(sc, j + 2, &cp)) return -1;
  int64_t i = j + 6;
  if (cp >= 0xD800 && cp <= 0xDBFF) {
    if (i + 1 >= sc->n || sc->s[i] != '\\' || sc->s[i + 1] != 'u')
      return fail(sc, j, "lone high surrogate \\u%04X", cp);
    if (hex4(sc, i + 2, &lo)) return -1;
    if (lo < 0xDC00 || lo > 0xDFFF) return fail(sc, i, "\\u%04X does not follow high surrogate \\u%04X", lo, cp);
    cp = 0x10000 + (cp - 0xD800) * 1024 + (lo - 0xDC00);
    i += 6;
  } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
    return fail(sc, j, "lone low surrogate \\u%04X", cp);
  }
  if (cp == 0) *nul = 1;
  *len += utf8_length(cp);
  *next = i;
  return 0;
}

/* The string whose opening quote is at pos; *end is past its closing quote. */
static int check_string(scan *sc, int64_t pos, int64_t *end) {
  int64_t i = pos + 1, len = 0;
  int nul = 0;
  for (;;) {
    if (i >= sc->n) return fail(sc, pos, "unterminated string");
    unsigned char c = (unsigned char)sc->s[i];
    if (c == '"') break;
    if (c < 32) return fail(sc, i, "control character 0x%02x in string (escape it)", c);
    if (c != '\\') {
      i++, len++;
      continue;
    }
    int e = i + 1 < sc->n ? (unsigned char)sc->s[i + 1] : -1;
    if (e == 'u') {
      if (unicode_escape(sc, i, &i, &len, &nul)) return -1;
    } else if (e == '"' || e == '\\' || e == '/' || e == 'b' || e == 'f' || e == 'n' || e == 'r' || e == 't') {
      i += 2, len++;
    } else if (e >= 32 && e <= 126) {
      return fail(sc, i, "bad escape \\%c", e);
    } else if (e >= 0) {
      return fail(sc, i, "bad escape \\ (byte 0x%02x)", e);
    } else {
      return fail(sc, i, "bad escape \\");
    }
  }
  if (nul) {
    if (push((void **)&sc->nuls, &sc->n_nuls, &sc->cap_nuls, sizeof *sc->nuls)) return fail(sc, pos, "out of memory");
    sc->nuls[sc->n_nuls - 1] = (nul_string){sc->strings, len};
  }
  sc->strings++;
  *end = i + 1;
  return 0;
}

/* The double the number text s[0, len) stands for (strtod reads NUL-terminated text). */
static double number_value(const char *s, int64_t len) {
  char buf[CJSON_NUMBER_MAX + 1];
  char *text = len <= CJSON_NUMBER_MAX ? buf : malloc((size_t)len + 1);
  if (!text) return NAN;
  memcpy(text, s, (size_t)len);
  text[len] = 0;
  double x = strtod(text, NULL);
  if (text != buf) free(text);
  return x;
}

static int check_number(scan *sc, int64_t pos, int64_t *end) {
  char what[32];
  int64_t i = pos + (pos < sc->n && sc->s[pos] == '-');
  if (!is_digit(sc, i)) {
    show_char(sc, pos, what, sizeof what);
    return fail(sc, pos, "unexpected %s", what);
  }
  int64_t e = digits_end(sc, i);
  if (e - i > 1 && sc->s[i] == '0') return fail(sc, pos, "leading zero in number");
  if (e < sc->n && sc->s[e] == '.') {
    if (!is_digit(sc, e + 1)) return fail(sc, e, "digit expected after '.'");
    e = digits_end(sc, e + 1);
  }
  if (e < sc->n && (sc->s[e] == 'e' || sc->s[e] == 'E')) {
    int64_t d = e + 1 + (e + 1 < sc->n && (sc->s[e + 1] == '+' || sc->s[e + 1] == '-'));
    if (!is_digit(sc, d)) return fail(sc, e, "digits expected in exponent");
    e = digits_end(sc, d);
  }
  int64_t len = e - pos;
  if (!isfinite(number_value(sc->s + pos, len)))
    return fail(sc, pos, "number %.*s%s is out of range", len > 80 ? 80 : (int)len, sc->s + pos, len > 80 ? "..." : "");
  if (len > CJSON_NUMBER_MAX) {
    if (push((void **)&sc->longs, &sc->n_longs, &sc->cap_longs, sizeof *sc->longs))
      return fail(sc, pos, "out of memory");
    sc->longs[sc->n_longs - 1] = (long_number){pos, len};
  }
  *end = e;
  return 0;
}

static int check_value(scan *sc, int64_t pos, int depth, int64_t *end);

/* An array or object opening at pos, its items at depth. */
static int check_container(scan *sc, int64_t pos, int depth, int64_t *end) {
  char close = sc->s[pos] == '[' ? ']' : '}', what[32];
  pos = skip_space(sc, pos + 1);
  if (pos < sc->n && sc->s[pos] == close) {
    *end = pos + 1;
    return 0;
  }
  for (;;) {
    if (close == '}') {
      show_char(sc, pos, what, sizeof what);
      if (pos >= sc->n || sc->s[pos] != '"') return fail(sc, pos, "string key expected, got %s", what);
      if (check_string(sc, pos, &pos)) return -1;
      pos = skip_space(sc, pos);
      show_char(sc, pos, what, sizeof what);
      if (pos >= sc->n || sc->s[pos] != ':') return fail(sc, pos, "':' expected, got %s", what);
      pos = skip_space(sc, pos + 1);
    }
    if (check_value(sc, pos, depth, &pos)) return -1;
    pos = skip_space(sc, pos);
    if (pos < sc->n && sc->s[pos] == close) {
      *end = pos + 1;
      return 0;
    }
    show_char(sc, pos, what, sizeof what);
    if (pos >= sc->n || sc->s[pos] != ',') return fail(sc, pos, "',' or '%c' expected, got %s", close, what);
    pos = skip_space(sc, pos + 1);
  }
}

static int check_value(scan *sc, int64_t pos, int depth, int64_t *end) {
  if (pos >= sc->n) return fail(sc, pos, "unexpected end of input");
  const char *p = sc->s + pos;
  int64_t left = sc->n - pos;
  if (*p == '{' || *p == '[') {
    if (depth >= sc->max_depth) return fail(sc, pos, "nesting deeper than %d", sc->max_depth);
    return check_container(sc, pos, depth + 1, end);
  }
  if (*p == '"') return check_string(sc, pos, end);
  static const char *const words[] = {"true", "false", "null"};
  for (int k = 0; k < 3; k++) {
    int64_t n = (int64_t)strlen(words[k]);
    if (left >= n && memcmp(p, words[k], (size_t)n) == 0) {
      *end = pos + n;
      return 0;
    }
  }
  return check_number(sc, pos, end);
}

/* lt_errorf with the problem and its line and column (1-based; columns count bytes). */
static int report(const scan *sc) {
  int64_t line = 1, line_start = 0;
  for (int64_t k = 0; k < sc->at && k < sc->n; k++)
    if (sc->s[k] == '\n') line++, line_start = k + 1;
  return lt_errorf("%s at line %lld column %lld", sc->what, (long long)line, (long long)(sc->at - line_start + 1));
}

/* The text with each long number respelled in %.17g (the same double, short enough for cJSON). */
static char *respell_numbers(const scan *sc, int64_t *len) {
  char *out = malloc((size_t)sc->n + 1), num[32];
  if (!out) return NULL;
  int64_t o = 0, from = 0;
  for (int64_t k = 0; k < sc->n_longs; k++) {
    const long_number *ln = &sc->longs[k];
    memcpy(out + o, sc->s + from, (size_t)(ln->start - from));
    o += ln->start - from;
    int w = snprintf(num, sizeof num, "%.17g", number_value(sc->s + ln->start, ln->len));
    memcpy(out + o, num, (size_t)w); /* 24 bytes at most, shorter than the text it replaces */
    o += w;
    from = ln->start + ln->len;
  }
  memcpy(out + o, sc->s + from, (size_t)(sc->n - from));
  o += sc->n - from;
  out[o] = 0;
  *len = o;
  return out;
}

/* Pairs the strings with NUL bytes with their cJSON items: a key, then its value, in text order. */
static void attach_nuls(lt_json_doc *doc, const scan *sc, const cJSON *item, int has_key, int64_t *ordinal,
                        int64_t *next) {
  for (int is_key = has_key ? 1 : 0; is_key >= 0; is_key--) {
    if (!is_key && !cJSON_IsString(item)) break;
    if (*next < sc->n_nuls && sc->nuls[*next].ordinal == *ordinal) {
      doc->nuls[doc->n_nuls++] = (nul_entry){item, is_key, sc->nuls[*next].len};
      (*next)++;
    }
    (*ordinal)++;
  }
  for (const cJSON *c = item->child; c; c = c->next) attach_nuls(doc, sc, c, cJSON_IsObject(item), ordinal, next);
}

static int build(lt_json_doc *doc, scan *sc) {
  const char *text = sc->s;
  int64_t len = sc->n;
  char *respelled = NULL;
  if (sc->n_longs) {
    respelled = respell_numbers(sc, &len);
    if (!respelled) return lt_errorf("json: out of memory");
    text = respelled;
  }
  const char *end = NULL;
  doc->root = cJSON_ParseWithLengthOpts(text, (size_t)len, &end, 0);
  free(respelled);
  if (!doc->root)
    return lt_errorf("json: cJSON could not read a text the strict check passed (near byte %lld)",
                     (long long)(end && end >= text ? end - text : 0));
  if (sc->n_nuls) {
    doc->nuls = malloc((size_t)sc->n_nuls * sizeof *doc->nuls);
    if (!doc->nuls) return lt_errorf("json: out of memory");
    int64_t ordinal = 0, next = 0;
    attach_nuls(doc, sc, doc->root, 0, &ordinal, &next);
  }
  return 0;
}

int lt_json_parse(lt_json_doc **out, const char *text, int64_t len, int max_depth) {
  if (!out) return lt_errorf("json: parse: NULL result pointer");
  *out = NULL;
  if (!text || len < 0) return lt_errorf("json: parse: no text");
  if (len >= 3 && memcmp(text, "\xEF\xBB\xBF", 3) == 0) text += 3, len -= 3; /* a UTF-8 byte order mark */
  scan sc = {.s = text, .n = len, .max_depth = max_depth < 0 ? 0 : max_depth};
  if (sc.max_depth > CJSON_NESTING_LIMIT) sc.max_depth = CJSON_NESTING_LIMIT;
  int64_t end = 0;
  int rc = check_value(&sc, skip_space(&sc, 0), 0, &end);
  if (rc == 0) {
    end = skip_space(&sc, end);
    if (end < sc.n) {
      char what[32];
      show_char(&sc, end, what, sizeof what);
      rc = fail(&sc, end, "extra data after the value: %s", what);
    }
  }
  lt_json_doc *doc = NULL;
  if (rc != 0) {
    report(&sc);
  } else if (!(doc = calloc(1, sizeof *doc))) {
    rc = lt_errorf("json: out of memory");
  } else if ((rc = build(doc, &sc)) != 0) {
    lt_json_free(doc), doc = NULL;
  }
  free(sc.nuls), free(sc.longs);
  *out = doc;
  return rc;
}

void lt_json_free(lt_json_doc *doc) {
  if (!doc) return;
  cJSON_Delete(doc->root);
  free(doc->nuls);
  free(doc);
}

const lt_json_value *lt_json_root(const lt_json_doc *doc) { return doc ? (const lt_json_value *)doc->root : NULL; }

int lt_json_type(const lt_json_value *value) {
  const cJSON *v = (const cJSON *)value;
  if (cJSON_IsFalse(v)) return LT_JSON_FALSE;
  if (cJSON_IsTrue(v)) return LT_JSON_TRUE;
  if (cJSON_IsNumber(v)) return LT_JSON_NUMBER;
  if (cJSON_IsString(v)) return LT_JSON_STRING;
  if (cJSON_IsArray(v)) return LT_JSON_ARRAY;
  if (cJSON_IsObject(v)) return LT_JSON_OBJECT;
  return LT_JSON_NULL;
}

double lt_json_number(const lt_json_value *value) {
  const cJSON *v = (const cJSON *)value;
  return cJSON_IsNumber(v) ? v->valuedouble : 0;
}

static const char *text_of(const lt_json_doc *doc, const cJSON *v, int is_key, int64_t *len) {
  const char *s = is_key ? v->string : v->valuestring;
  if (!s) {
    *len = 0;
    return NULL;
  }
  for (int64_t k = 0; doc && k < doc->n_nuls; k++) {
    if (doc->nuls[k].item == v && doc->nuls[k].is_key == is_key) {
      *len = doc->nuls[k].len;
      return s;
    }
  }
  *len = (int64_t)strlen(s);
  return s;
}

const char *lt_json_string(const lt_json_doc *doc, const lt_json_value *value, int64_t *len) {
  const cJSON *v = (const cJSON *)value;
  if (!cJSON_IsString(v)) {
    *len = 0;
    return NULL;
  }
  return text_of(doc, v, 0, len);
}

const char *lt_json_key(const lt_json_doc *doc, const lt_json_value *member, int64_t *len) {
  return text_of(doc, (const cJSON *)member, 1, len);
}

const lt_json_value *lt_json_first(const lt_json_value *value) {
  const cJSON *v = (const cJSON *)value;
  return v && (cJSON_IsArray(v) || cJSON_IsObject(v)) ? (const lt_json_value *)v->child : NULL;
}

const lt_json_value *lt_json_next(const lt_json_value *item) {
  return item ? (const lt_json_value *)((const cJSON *)item)->next : NULL;
}
