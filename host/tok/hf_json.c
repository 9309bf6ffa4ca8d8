/* hf_json.c — tokenizers as JSON: Hugging Face's tokenizer.json for BPE models, and lutra's
 * own small format for char tokenizers.
 *
 * In a byte-level tokenizer.json (a ByteLevel pre-tokenizer, as GPT-2's) a token is its bytes
 * written through GPT-2's byte -> unicode map (a space is "Ġ"); otherwise (sentencepiece-style,
 * "▁hello", "<0x0A>") a token is its text. Added tokens are their text. Merges are "a b"
 * strings or, in newer files, [a, b] arrays; we read both and write strings for byte-level
 * files (every reader takes them), arrays otherwise. Ids need not be in any order; a gap in
 * the ids is a token that decodes to an error. The pipeline around the model is read by
 * tok/hf_pipeline.c. */
#include "tok/tokenizer.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <cjson/cJSON.h>

enum { MAX_ID = 1 << 28 };
#define E(...) lt_errorf("tokenizer.json: " __VA_ARGS__)

static cJSON *get(const cJSON *obj, const char *key) { return cJSON_GetObjectItemCaseSensitive(obj, key); }
static int absent(const cJSON *x) { return !x || cJSON_IsNull(x); }
static const char *type_of(const cJSON *obj) {
  const cJSON *t = get(obj, "type");
  return cJSON_IsString(t) ? t->valuestring : "?";
}
static int flag(const cJSON *obj, const char *key, int def) {
  const cJSON *x = get(obj, key);
  return cJSON_IsBool(x) ? cJSON_IsTrue(x) : def;
}
// The same, for a flag that changes the ids: anything but true, false or null is an error naming path.key.
static int strict_flag(const cJSON *obj, const char *key, int def, const char *path, int *out) {
  const cJSON *x = get(obj, key);
  if (!absent(x) && !cJSON_IsBool(x)) return E("%s.%s is not true or false", path, key);
  *out = flag(obj, key, def);
  return 0;
}
// s as an error shows it: in single quotes, with quotes, backslashes and control bytes escaped
// (invalid UTF-8 too, as \xNN), cut after 48 bytes; buf holds 256 bytes.
enum { SHOWN_CAP = 256 };
static const char *shown(const char *s, char *buf) {
  size_t n = 0, len = strlen(s);
  buf[n++] = '\'';
  for (size_t i = 0; i < len && n < SHOWN_CAP - 8; i++) {
    unsigned char c = (unsigned char)s[i];
    uint32_t cp = 0;
    int k = c < 0x80 ? 1 : lt_tok_utf8_decode((const uint8_t *)s + i, (int64_t)(len - i), &cp);
    if (i >= 48) {
      n += (size_t)snprintf(buf + n, SHOWN_CAP - n, "...");
      break;
    }
    if (c == '\'' || c == '\\') {
      buf[n++] = '\\', buf[n++] = (char)c;
    } else if (c < 0x20 || c == 0x7f || (c >= 0x80 && cp >= LT_TOK_RAW_BYTE)) {
      n += (size_t)snprintf(buf + n, SHOWN_CAP - n, "\\x%02x", c);
    } else {
      memcpy(buf + n, s + i, (size_t)k);
      n += (size_t)k, i += (size_t)k - 1;
    }
  }
  buf[n++] = '\'';
  buf[n] = 0;
  return buf;
}
static int int_of(const cJSON *x, int64_t lo, int64_t hi, int64_t *v) {
  if (!cJSON_IsNumber(x) || x->valuedouble != floor(x->valuedouble) || x->valuedouble < (double)lo ||
      x->valuedouble > (double)hi)
    return -1;
  *v = (int64_t)x->valuedouble;
  return 0;
}

// Byte-level string -> bytes into buf (room for strlen(s) bytes); -1 on a character outside the map.
static int64_t from_byte_level(const char *s, uint8_t *buf) {
  int64_t n = (int64_t)strlen(s), m = 0;
  for (int64_t i = 0; i < n;) {
    uint32_t cp;
    i += lt_tok_utf8_decode((const uint8_t *)s + i, n - i, &cp);
    int b = lt_tok_unicode_to_byte(cp);
    if (b < 0) return -1;
    buf[m++] = (uint8_t)b;
  }
  return m;
}

// Checks the model's options lutra does not run: they must not change the ids.
static int check_model(lt_tokenizer *tok, const cJSON *model) {
  const cJSON *dropout = get(model, "dropout");
  if (!absent(dropout) && !(cJSON_IsNumber(dropout) && dropout->valuedouble == 0))
    return E("model.dropout is not supported (must be null)");
  static const char *const empty_strings[] = {"continuing_subword_prefix", "end_of_word_suffix"};
  for (int i = 0; i < 2; i++) {
    const cJSON *x = get(model, empty_strings[i]);
    if (!absent(x) && !(cJSON_IsString(x) && x->valuestring[0] == 0))
      return E("model.%s is not supported (must be null or empty)", empty_strings[i]);
  }
  LT_TRY(strict_flag(model, "byte_fallback", 0, "model", &tok->byte_fallback));
  return strict_flag(model, "fuse_unk", 0, "model", &tok->fuse_unk);
}

// added_tokens: validates and returns their count; entries stay in the JSON.
static int check_added(const cJSON *added, int64_t *max_id) {
  if (absent(added)) return 0;
  if (!cJSON_IsArray(added)) return E("added_tokens is not an array");
  if (cJSON_GetArraySize(added) >= MAX_ID) return E("added_tokens: more than %d tokens", MAX_ID);
  int k = 0;
  for (const cJSON *a = added->child; a; a = a->next, k++) {
    int64_t id;
    const cJSON *content = get(a, "content");
    if (int_of(get(a, "id"), 0, MAX_ID - 1, &id))
      return E("added_tokens[%d].id is not an integer in [0, %d)", k, MAX_ID);
    if (!cJSON_IsString(content) || !content->valuestring[0])
      return E("added_tokens[%d].content is not a non-empty string", k);
    static const char *const flags[] = {"special", "lstrip", "rstrip", "normalized", "single_word"};
    char path[48];
    snprintf(path, sizeof path, "added_tokens[%d]", k);
    for (size_t i = 0; i < sizeof flags / sizeof *flags; i++) {
      int unused = 0;
      LT_TRY(strict_flag(a, flags[i], 0, path, &unused));
    }
    if (id > *max_id) *max_id = id;
  }
  return k;
}

static int register_added(lt_tokenizer *tok, const cJSON *added) {
  for (const cJSON *a = added ? added->child : NULL; a; a = a->next) {
    int64_t id = 0;
    int_of(get(a, "id"), 0, MAX_ID - 1, &id);
    lt_tok_added spec = {.special = (uint8_t)flag(a, "special", 0),
                         .lstrip = (uint8_t)flag(a, "lstrip", 0),
                         .rstrip = (uint8_t)flag(a, "rstrip", 0),
                         .normalized = (uint8_t)flag(a, "normalized", 0),
                         .single_word = (uint8_t)flag(a, "single_word", 0)};
    LT_TRY(lt_tok_register_added(tok, (int32_t)id, &spec));
  }
  return 0;
}

// A vocab key's bytes into buf: a byte-level string's bytes, else the key itself; -1 when not byte-level.
static int64_t key_bytes(const lt_tokenizer *tok, const char *s, uint8_t *buf) {
  if (tok->byte_level) return from_byte_level(s, buf);
  int64_t n = (int64_t)strlen(s);
  memcpy(buf, s, (size_t)n);
  return n;
}

// Token id of a merge part, or -1.
static int32_t part_id(const lt_tokenizer *tok, const char *s, uint8_t *buf) {
  int64_t n = key_bytes(tok, s, buf);
  return n < 0 ? -1 : lt_tok_find(tok, buf, n);
}

static int load_merges(lt_tokenizer *tok, const cJSON *merges) {
  if (absent(merges)) return 0;
  if (!cJSON_IsArray(merges)) return E("model.merges is not an array");
  int k = 0;
  uint8_t *buf = NULL;
  int64_t cap = 0;
  for (const cJSON *m = merges->child; m; m = m->next, k++) {
    char *left = NULL, *right = NULL, *copy = NULL;
    if (cJSON_IsString(m)) { // "a b"
      size_t len = strlen(m->valuestring) + 1; // a copy to split at the space (strdup is not C11)
      if ((copy = malloc(len)) != NULL) memcpy(copy, m->valuestring, len);
      char *space = copy ? strchr(copy, ' ') : NULL;
      if (space && !strchr(space + 1, ' ')) *space = 0, left = copy, right = space + 1;
    } else if (cJSON_IsArray(m) && cJSON_GetArraySize(m) == 2 && cJSON_IsString(m->child) &&
               cJSON_IsString(m->child->next)) { // ["a", "b"]
      left = m->child->valuestring, right = m->child->next->valuestring;
    }
    int64_t need = left ? (int64_t)(strlen(left) + strlen(right)) + 1 : 0;
    if (need > cap) {
      uint8_t *b = realloc(buf, (size_t)need);
      if (b) buf = b, cap = need;
    }
    int rc = 0;
    if (!left) {
      rc = E("model.merges[%d] is not \"a b\" or [\"a\", \"b\"]", k);
    } else if (need > cap) {
      rc = E("out of memory");
    } else {
      int32_t a = part_id(tok, left, buf), b = part_id(tok, right, buf);
      int64_t la = 0, lb = 0, z = -1;
      if (a >= 0 && b >= 0) {
        const uint8_t *ba = lt_tok_bytes(tok, a, &la), *bb = lt_tok_bytes(tok, b, &lb);
        memcpy(buf, ba, (size_t)la);
        memcpy(buf + la, bb, (size_t)lb);
        z = lt_tok_find(tok, buf, la + lb);
      }
      char qa[SHOWN_CAP], qb[SHOWN_CAP];
      if (a < 0 || b < 0)
        rc = E("model.merges[%d]: %s is not in the vocab", k, shown(a < 0 ? left : right, qa));
      else if (z < 0)
        rc = E("model.merges[%d]: %s + %s is not in the vocab", k, shown(left, qa), shown(right, qb));
      else
        rc = lt_tok_add_merge(tok, a, b, (int32_t)z);
    }
    free(copy);
    if (rc) {
      free(buf);
      return rc;
    }
  }
  free(buf);
  return 0;
}

static int load_bpe(lt_tokenizer *tok, const cJSON *root) {
  const cJSON *model = get(root, "model"), *added = get(root, "added_tokens");
  if (!cJSON_IsObject(model)) return E("no \"model\" object");
  const cJSON *type = get(model, "type"), *vocab = get(model, "vocab");
  if (cJSON_IsString(type) && strcmp(type->valuestring, "BPE") != 0)
    return E("model.type '%s' is not supported (only BPE)", type->valuestring);
  if (!cJSON_IsObject(vocab)) return E("model.vocab is missing or not an object");
  LT_TRY(check_model(tok, model));
  LT_TRY(lt_tok_parse_pipeline(tok, root));
  LT_TRY(strict_flag(model, "ignore_merges", 0, "model", &tok->ignore_merges));
  int64_t max_id = -1, id = 0;
  int n_added = check_added(added, &max_id);
  if (n_added < 0) return -1;
  int k = 0;
  char qa[SHOWN_CAP], qb[SHOWN_CAP];
  for (const cJSON *v = vocab->child; v; v = v->next, k++) {
    if (int_of(v, 0, MAX_ID - 1, &id))
      return E("model.vocab[%s] is not an integer id in [0, %d)", shown(v->string, qa), MAX_ID);
    if (id > max_id) max_id = id;
  }
  if (max_id >= 2 * ((int64_t)k + n_added) + 256) // a gap is an unused token: a few are fine, not millions
    return E("model.vocab: the ids are sparse (max id %lld for %d tokens)", (long long)max_id, k + n_added);
  // the key of each id: an added token's text, or a vocab entry's byte-level string
  const cJSON **slot = calloc((size_t)max_id + 2, sizeof *slot);
  int32_t *added_at = calloc((size_t)max_id + 2, sizeof *added_at); // 1 + the added token's index, or 0
  uint8_t *buf = NULL;
  int rc = -1;
  if (!slot || !added_at) {
    E("out of memory");
    goto done;
  }
  k = 0;
  for (const cJSON *a = added ? added->child : NULL; a; a = a->next, k++) {
    int_of(get(a, "id"), 0, MAX_ID - 1, &id);
    if (slot[id]) {
      E("added_tokens: id %lld is used twice (added_tokens[%d] and [%d])", (long long)id, added_at[id] - 1, k);
      goto done;
    }
    slot[id] = get(a, "content"), added_at[id] = k + 1;
  }
  for (const cJSON *v = vocab->child; v; v = v->next) {
    int_of(v, 0, MAX_ID - 1, &id);
    if (added_at[id]) { // the vocab may repeat an added token (its text is in added_tokens), not hold another
      const char *content = slot[id]->valuestring;
      int64_t n = (int64_t)strlen(v->string);
      if (!(buf = realloc(buf, (size_t)n + 1))) {
        E("out of memory");
        goto done;
      }
      int64_t m = key_bytes(tok, v->string, buf);
      if (strcmp(v->string, content) != 0 && (m != (int64_t)strlen(content) || memcmp(buf, content, (size_t)m) != 0)) {
        E("added_tokens[%d].id: id %lld is %s there but model.vocab[%s] has the same id (an added token takes an id "
          "of its own, or the vocab's token of that id)",
          added_at[id] - 1, (long long)id, shown(content, qa), shown(v->string, qb));
        goto done;
      }
      continue;
    }
    if (slot[id]) {
      E("model.vocab: id %lld is used by %s and %s", (long long)id, shown(slot[id]->string, qa), shown(v->string, qb));
      goto done;
    }
    slot[id] = v;
  }
  for (int64_t i = 0; i <= max_id; i++) {
    if (!slot[i]) {
      if (lt_tok_append(tok, NULL, 0, LT_TOKF_UNUSED)) goto done;
      continue;
    }
    const char *s = added_at[i] ? slot[i]->valuestring : slot[i]->string;
    int64_t n = (int64_t)strlen(s);
    if (!(buf = realloc(buf, (size_t)n + 1))) {
      E("out of memory");
      goto done;
    }
    if (added_at[i]) {
      memcpy(buf, s, (size_t)n);
    } else if ((n = key_bytes(tok, s, buf)) < 0) {
      E("model.vocab[%s] (id %lld) has a character outside the byte-level alphabet (not a byte-level BPE?)",
        shown(s, qa), (long long)i);
      goto done;
    } else if (n == 0) {
      E("model.vocab[%s] (id %lld) is an empty token", shown(s, qa), (long long)i);
      goto done;
    } else {
      int32_t first = lt_tok_find(tok, buf, n);
      if (first >= 0) {
        E("model.vocab[%s] appears twice (ids %d and %lld)", shown(s, qa), first, (long long)i);
        goto done;
      }
    }
    if (lt_tok_append(tok, buf, n, added_at[i] ? LT_TOKF_ADDED : 0)) goto done;
  }
  for (const cJSON *v = vocab->child; v; v = v->next) { // an added token the vocab holds too takes part in merges
    int_of(v, 0, MAX_ID - 1, &id);
    if (!added_at[id]) continue;
    if (!(buf = realloc(buf, strlen(v->string) + 1))) {
      E("out of memory");
      goto done;
    }
    int64_t m = key_bytes(tok, v->string, buf);
    uint64_t h = m > 0 ? lt_tok_hash(buf, m) : 0;
    if (m > 0 && lt_tok_strmap_find(&tok->tok_index, buf, m, h) < 0) {
      if (lt_tok_strmap_add(&tok->tok_index, buf, m, h, id) < 0) {
        E("out of memory");
        goto done;
      }
      if (m == 1 && tok->byte_id[buf[0]] < 0) tok->byte_id[buf[0]] = (int32_t)id;
    }
  }
  if (register_added(tok, added) || load_merges(tok, get(model, "merges"))) goto done;
  const cJSON *unk = get(model, "unk_token");
  if (cJSON_IsString(unk) &&
      lt_tokenizer_token_id(tok, unk->valuestring, (int64_t)strlen(unk->valuestring), &tok->unk_id))
    goto done;
  rc = lt_tok_finish_pipeline(tok, root);
done:
  free(slot);
  free(added_at);
  free(buf);
  return rc;
}

static int load_char(lt_tokenizer *tok, const cJSON *root) {
  int64_t version, max_id = -1;
  if (int_of(get(root, "lutra_tokenizer"), 1, 1, &version)) return E("lutra_tokenizer: unknown version (expected 1)");
  if (strcmp(type_of(root), "char") != 0) return E("type '%s' is not supported (expected 'char')", type_of(root));
  const cJSON *cps = get(root, "codepoints"), *added = get(root, "added_tokens");
  if (!cJSON_IsArray(cps)) return E("codepoints is missing or not an array");
  int n = cJSON_GetArraySize(cps), k = 0;
  uint32_t *list = malloc((size_t)(n ? n : 1) * sizeof *list);
  if (!list) return E("out of memory");
  for (const cJSON *c = cps->child; c; c = c->next, k++) {
    int64_t v;
    if (int_of(c, 0, LT_TOK_RAW_BYTE + 255, &v)) {
      free(list);
      return E("codepoints[%d] is not a code point", k);
    }
    list[k] = (uint32_t)v;
  }
  int rc = lt_tok_char_build(tok, list, n);
  free(list);
  if (rc) {
    char why[512]; // the message buffer is the one E writes: copy first
    snprintf(why, sizeof why, "%s", lt_last_error());
    return E("codepoints: %s", why);
  }
  if (check_added(added, &max_id) < 0) return -1;
  for (const cJSON *a = added ? added->child : NULL; a; a = a->next) { // ids must follow the chars densely
    int64_t id = 0;
    int_of(get(a, "id"), 0, MAX_ID - 1, &id);
    if (id != tok->vocab_size)
      return E("added_tokens: id %lld should be %d (after the chars)", (long long)id, tok->vocab_size);
    const char *s = get(a, "content")->valuestring;
    LT_TRY(lt_tok_append(tok, (const uint8_t *)s, (int64_t)strlen(s), LT_TOKF_ADDED));
  }
  return register_added(tok, added);
}

// The offset of the first \u0000 escape in a JSON text, or -1: cJSON ends a string at a NUL, so
// "a\u0000b" would read as "a" (another token's text); such a file is refused instead.
static int64_t nul_escape(const char *s, int64_t n) {
  for (int64_t i = 0; i + 5 < n; i++) {
    if (s[i] != '\\') continue;
    if (s[i + 1] == 'u' && s[i + 2] == '0' && s[i + 3] == '0' && s[i + 4] == '0' && s[i + 5] == '0') return i;
    i++; // the escaped character (a quote, a backslash) is not the start of another escape
  }
  return -1;
}

int lt_tokenizer_load_json(lt_tokenizer **out, const char *json, int64_t len) {
  if (!out) return E("out is NULL");
  *out = NULL;
  if (!json || len <= 0) return E("the text is empty");
  const char *end = NULL;
  cJSON *root = cJSON_ParseWithLengthOpts(json, (size_t)len, &end, 0);
  if (!root) {
    int64_t at = end && end >= json && end <= json + len ? (int64_t)(end - json) : -1;
    const char *err = cJSON_GetErrorPtr();
    if (at < 0 && err && err >= json && err <= json + len) at = (int64_t)(err - json);
    return E("not valid JSON (truncated or corrupt) near byte %lld of %lld", (long long)at, (long long)len);
  }
  int64_t nul = nul_escape(json, len);
  if (nul >= 0) {
    cJSON_Delete(root);
    return E("a string holds \\u0000 (NUL) at byte %lld: no token's text can hold one", (long long)nul);
  }
  int is_char = get(root, "lutra_tokenizer") != NULL;
  lt_tokenizer *tok = cJSON_IsObject(root) ? lt_tok_alloc(is_char ? LT_TOK_CHAR : LT_TOK_BPE) : NULL;
  int rc = !cJSON_IsObject(root) ? E("the top level is not an object")
           : !tok                ? -1
           : is_char             ? load_char(tok, root)
                                 : load_bpe(tok, root);
  cJSON_Delete(root);
  if (rc) {
    lt_tokenizer_free(tok);
    return -1;
  }
  *out = tok;
  return 0;
}

int lt_tokenizer_load(lt_tokenizer **out, const char *path) {
  if (!out) return E("out is NULL");
  *out = NULL;
  char *text;
  int64_t len;
  LT_TRY(lt_tok_read_file("tokenizer.json", path, &text, &len));
  int rc = lt_tokenizer_load_json(out, text, len);
  free(text);
  if (rc) {
    char why[768]; // prefix the path: copy first, the message buffer is the one lt_errorf writes
    snprintf(why, sizeof why, "%s", lt_last_error());
    return lt_errorf("%s (%s)", why, path);
  }
  return 0;
}
