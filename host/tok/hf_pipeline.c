/* hf_pipeline.c — reads the pipeline of a tokenizer.json around its BPE model: normalizer,
 * pre_tokenizer, decoder and post_processor, each a component or a Sequence of them. A
 * component lutra does not run is an error naming its JSON path
 * (normalizer.normalizers[1].type 'Precompiled' is not supported ...), never ignored. */
#include "tok/tokenizer.h"
#include <stdio.h>
#include <stdlib.h>
#include <cjson/cJSON.h>

#define E(...) lt_errorf("tokenizer.json: " __VA_ARGS__)
enum { PATH_CAP = 160 };

static cJSON *get(const cJSON *obj, const char *key) { return cJSON_GetObjectItemCaseSensitive(obj, key); }
static int absent(const cJSON *x) { return !x || cJSON_IsNull(x); }
static const char *type_of(const cJSON *obj) {
  const cJSON *t = get(obj, "type");
  return cJSON_IsString(t) ? t->valuestring : "?";
}
static int is(const cJSON *obj, const char *type) { return strcmp(type_of(obj), type) == 0; }

static int bool_of(const cJSON *obj, const char *key, int def, const char *path, int *out) {
  const cJSON *x = get(obj, key);
  if (absent(x)) return *out = def, 0;
  if (!cJSON_IsBool(x)) return E("%s.%s is not true or false", path, key);
  *out = cJSON_IsTrue(x);
  return 0;
}

static int string_of(const cJSON *obj, const char *key, const char *path, int allow_empty, char **out) {
  const cJSON *x = get(obj, key);
  if (!cJSON_IsString(x) || (!allow_empty && !x->valuestring[0]))
    return E("%s.%s is not a%s string", path, key, allow_empty ? "" : " non-empty");
  size_t n = strlen(x->valuestring) + 1;
  if (!(*out = malloc(n))) return E("out of memory");
  memcpy(*out, x->valuestring, n);
  return 0;
}

static int push(lt_tok_step **list, int *n, lt_tok_step st) {
  lt_tok_step *l = realloc(*list, (size_t)(*n + 1) * sizeof *l);
  if (!l) {
    free(st.s1), free(st.s2);
    return E("out of memory");
  }
  *list = l;
  l[(*n)++] = st;
  return 0;
}

static int unsupported(const char *path, const cJSON *x, const char *supported) {
  return E("%s.type '%s' is not supported (lutra supports %s)", path, type_of(x), supported);
}

// Each item of a Sequence's list key, as parse(item, "path.key[i]").
static int each(lt_tokenizer *tok, const cJSON *x, const char *key, const char *path,
                int (*parse)(lt_tokenizer *, const cJSON *, const char *)) {
  const cJSON *list = get(x, key);
  if (!cJSON_IsArray(list)) return E("%s.%s is not an array", path, key);
  int i = 0;
  for (const cJSON *item = list->child; item; item = item->next, i++) {
    char sub[PATH_CAP];
    snprintf(sub, sizeof sub, "%s.%s[%d]", path, key, i);
    LT_TRY(parse(tok, item, sub));
  }
  return 0;
}

// A Replace's pattern: {"String": s}; a {"Regex": r} only when r matches itself alone (no metacharacter).
static int pattern_of(const cJSON *x, const char *path, char **out) {
  const cJSON *p = get(x, "pattern"), *s = get(p, "String"), *r = get(p, "Regex");
  char sub[PATH_CAP];
  snprintf(sub, sizeof sub, "%s.pattern", path);
  if (cJSON_IsString(r) && !strpbrk(r->valuestring, "\\^$.|?*+()[]{}")) return string_of(p, "Regex", sub, 0, out);
  if (cJSON_IsString(r)) return E("%s.Regex '%s' is not supported (only a String pattern)", sub, r->valuestring);
  if (!cJSON_IsString(s)) return E("%s is not {\"String\": ...}", sub);
  return string_of(p, "String", sub, 0, out);
}

// ---- normalizers ----------------------------------------------------------------------------------

static int parse_normalizer(lt_tokenizer *tok, const cJSON *x, const char *path) {
  static const char *const forms[] = {[LT_NORM_NFC] = "NFC", [LT_NORM_NFD] = "NFD", [LT_NORM_NFKC] = "NFKC",
                                      [LT_NORM_NFKD] = "NFKD", [LT_NORM_LOWERCASE] = "Lowercase"};
  if (!cJSON_IsObject(x)) return E("%s is not an object", path);
  if (is(x, "Sequence")) return each(tok, x, "normalizers", path, parse_normalizer);
  for (int k = 0; k < (int)(sizeof forms / sizeof *forms); k++)
    if (is(x, forms[k])) return push(&tok->norm, &tok->n_norm, (lt_tok_step){k, 0, 0, NULL, NULL});
  lt_tok_step st = {0};
  int rc;
  if (is(x, "Prepend")) {
    st.kind = LT_NORM_PREPEND;
    rc = string_of(x, "prepend", path, 0, &st.s1);
  } else if (is(x, "Replace")) {
    st.kind = LT_NORM_REPLACE;
    rc = pattern_of(x, path, &st.s1);
    if (!rc) rc = string_of(x, "content", path, 1, &st.s2);
  } else if (is(x, "Strip")) {
    st.kind = LT_NORM_STRIP;
    rc = bool_of(x, "strip_left", 1, path, &st.a);
    if (!rc) rc = bool_of(x, "strip_right", 1, path, &st.b);
  } else {
    return unsupported(path, x, "NFC, NFD, NFKC, NFKD, Lowercase, Prepend, Replace, Strip and Sequence");
  }
  if (rc) {
    free(st.s1), free(st.s2);
    return rc;
  }
  return push(&tok->norm, &tok->n_norm, st);
}

// ---- pre-tokenizers ---------------------------------------------------------------------------------

static int split_mode(const char *pattern) {
  for (int mode = 0; mode < LT_TOK_NUM_PATTERNS; mode++)
    if (lt_tok_patterns[mode] && strcmp(pattern, lt_tok_patterns[mode]) == 0) return mode;
  return -1;
}

// Metaspace's prepend_scheme, or the older add_prefix_space (true: always).
static int prepend_scheme(const cJSON *x, const char *path, int *out) {
  const cJSON *s = get(x, "prepend_scheme");
  if (absent(s)) {
    int add = 1;
    LT_TRY(bool_of(x, "add_prefix_space", 1, path, &add));
    *out = add ? LT_PREPEND_ALWAYS : LT_PREPEND_NEVER;
    return 0;
  }
  static const char *const names[] = {"always", "first", "never"};
  for (int k = 0; k < 3; k++)
    if (cJSON_IsString(s) && strcmp(s->valuestring, names[k]) == 0) return *out = k, 0;
  return E("%s.prepend_scheme is not \"always\", \"first\" or \"never\"", path);
}

static int parse_pre(lt_tokenizer *tok, const cJSON *x, const char *path) {
  if (!cJSON_IsObject(x)) return E("%s is not an object", path);
  if (is(x, "Sequence")) return each(tok, x, "pretokenizers", path, parse_pre);
  lt_tok_step st = {0};
  if (is(x, "ByteLevel")) {
    st.kind = LT_PRE_BYTELEVEL;
    LT_TRY(bool_of(x, "add_prefix_space", 1, path, &st.a));
    LT_TRY(bool_of(x, "use_regex", 1, path, &st.b));
    tok->byte_level = 1;
  } else if (is(x, "Split")) {
    const cJSON *pattern = get(get(x, "pattern"), "Regex"), *behavior = get(x, "behavior");
    int invert = 0;
    st.kind = LT_PRE_SPLIT;
    st.a = cJSON_IsString(pattern) ? split_mode(pattern->valuestring) : -1;
    if (st.a < 0)
      return E("%s.pattern: only the regexes of GPT-2, Llama 3 (cl100k) and Qwen2 are supported", path);
    LT_TRY(bool_of(x, "invert", 0, path, &invert));
    if (!cJSON_IsString(behavior) || strcmp(behavior->valuestring, "Isolated") != 0 || invert)
      return E("%s: only behavior 'Isolated' without invert is supported", path);
  } else if (is(x, "Digits")) {
    st.kind = LT_PRE_DIGITS;
    LT_TRY(bool_of(x, "individual_digits", 0, path, &st.a));
  } else if (is(x, "Metaspace")) {
    st.kind = LT_PRE_METASPACE;
    LT_TRY(prepend_scheme(x, path, &st.a));
    LT_TRY(bool_of(x, "split", 1, path, &st.b));
    LT_TRY(string_of(x, "replacement", path, 0, &st.s1));
  } else {
    return unsupported(path, x, "ByteLevel, Split, Metaspace, Digits and Sequence");
  }
  return push(&tok->pre, &tok->n_pre, st);
}

// The steps lutra's own fields stand for ([ByteLevel] or [Split, ByteLevel(use_regex=false)]) become those fields.
static void classic_pre(lt_tokenizer *tok) {
  const lt_tok_step *p = tok->pre;
  if (tok->n_pre == 1 && p[0].kind == LT_PRE_BYTELEVEL) {
    tok->pretok = p[0].b ? LT_PRETOK_GPT2 : LT_PRETOK_NONE, tok->add_prefix_space = p[0].a;
  } else if (tok->n_pre == 2 && p[0].kind == LT_PRE_SPLIT && p[1].kind == LT_PRE_BYTELEVEL && !p[1].b) {
    tok->pretok = p[0].a, tok->add_prefix_space = p[1].a ? 2 : 0;
  } else {
    return;
  }
  tok->n_pre = 0;
}

// ---- decoders ---------------------------------------------------------------------------------------

static int parse_decoder(lt_tokenizer *tok, const cJSON *x, const char *path) {
  if (!cJSON_IsObject(x)) return E("%s is not an object", path);
  if (is(x, "Sequence")) return each(tok, x, "decoders", path, parse_decoder);
  lt_tok_step st = {0};
  int rc = 0;
  if (is(x, "ByteLevel")) {
    if (!tok->byte_level) return E("%s: a ByteLevel decoder needs a ByteLevel pre_tokenizer", path);
    st.kind = LT_DEC_BYTELEVEL;
  } else if (is(x, "ByteFallback")) {
    st.kind = LT_DEC_BYTEFALLBACK;
  } else if (is(x, "Fuse")) {
    st.kind = LT_DEC_FUSE;
  } else if (is(x, "Replace")) {
    st.kind = LT_DEC_REPLACE;
    rc = pattern_of(x, path, &st.s1);
    if (!rc) rc = string_of(x, "content", path, 1, &st.s2);
  } else if (is(x, "Strip")) {
    const cJSON *start = get(x, "start"), *stop = get(x, "stop");
    st.kind = LT_DEC_STRIP;
    if (!cJSON_IsNumber(start) || !cJSON_IsNumber(stop) || start->valuedouble < 0 || stop->valuedouble < 0 ||
        start->valuedouble > 1e6 || stop->valuedouble > 1e6)
      return E("%s: start and stop are not counts", path);
    st.a = (int)start->valuedouble, st.b = (int)stop->valuedouble;
    rc = string_of(x, "content", path, 0, &st.s1);
  } else if (is(x, "Metaspace")) {
    st.kind = LT_DEC_METASPACE;
    rc = prepend_scheme(x, path, &st.a);
    if (!rc) rc = string_of(x, "replacement", path, 0, &st.s1);
  } else {
    return unsupported(path, x, "ByteLevel, ByteFallback, Fuse, Replace, Strip, Metaspace and Sequence");
  }
  if (rc) {
    free(st.s1), free(st.s2);
    return rc;
  }
  return push(&tok->dec, &tok->n_dec, st);
}

// ---- post-processors ---------------------------------------------------------------------------------

static int parse_template(lt_tokenizer *tok, const cJSON *x, const char *path) {
  for (int k = 0; k < tok->n_post; k++)
    if (tok->post[k].kind == LT_POST_TEMPLATE) return E("%s: a second TemplateProcessing is not supported", path);
  const cJSON *specials = get(x, "special_tokens");
  if (!cJSON_IsObject(specials)) return E("%s.special_tokens is not an object", path);
  static const char *const keys[] = {"single", "pair"};
  for (int t = 0; t < 2; t++) {
    const cJSON *items = get(x, keys[t]);
    lt_tok_template *tp = t ? &tok->pair : &tok->single;
    int n = cJSON_GetArraySize(items), i = 0;
    if (!cJSON_IsArray(items)) return E("%s.%s is not an array", path, keys[t]);
    tp->seq = malloc((size_t)(n + 1) * sizeof *tp->seq);
    tp->first = malloc((size_t)(n + 1) * sizeof *tp->first);
    tp->count = malloc((size_t)(n + 1) * sizeof *tp->count);
    if (!tp->seq || !tp->first || !tp->count) return E("out of memory");
    for (const cJSON *item = items->child; item; item = item->next, i++) {
      const cJSON *seq = get(item, "Sequence"), *sp = get(item, "SpecialToken");
      const cJSON *id = get(seq ? seq : sp, "id");
      tp->first[i] = tp->count[i] = 0;
      if (seq && cJSON_IsString(id) && (!strcmp(id->valuestring, "A") || !strcmp(id->valuestring, "B"))) {
        tp->seq[i] = id->valuestring[0] == 'A' ? -1 : -2;
        continue;
      }
      const cJSON *entry = sp && cJSON_IsString(id) ? get(specials, id->valuestring) : NULL, *ids = get(entry, "ids");
      if (!cJSON_IsArray(ids))
        return E("%s.%s[%d] is not a Sequence A/B or a SpecialToken of special_tokens", path, keys[t], i);
      tp->seq[i] = 0, tp->first[i] = tok->n_template_ids;
      int k = 0;
      for (const cJSON *v = ids->child; v; v = v->next, k++) {
        if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble >= tok->vocab_size ||
            v->valuedouble != (double)(int32_t)v->valuedouble ||
            (tok->tok_flags[(int32_t)v->valuedouble] & LT_TOKF_UNUSED))
          return E("%s.special_tokens['%s'].ids[%d] is not an id of the vocab", path, id->valuestring, k);
        int32_t *l = realloc(tok->template_ids, (size_t)(tok->n_template_ids + 1) * sizeof *l);
        if (!l) return E("out of memory");
        tok->template_ids = l;
        l[tok->n_template_ids++] = (int32_t)v->valuedouble;
        tp->count[i]++;
      }
    }
    tp->n = n;
  }
  return push(&tok->post, &tok->n_post, (lt_tok_step){LT_POST_TEMPLATE, 0, 0, NULL, NULL});
}

static int parse_post(lt_tokenizer *tok, const cJSON *x, const char *path) {
  if (!cJSON_IsObject(x)) return E("%s is not an object", path);
  if (is(x, "Sequence")) return each(tok, x, "processors", path, parse_post);
  if (is(x, "TemplateProcessing")) return parse_template(tok, x, path);
  if (!is(x, "ByteLevel")) return unsupported(path, x, "ByteLevel, TemplateProcessing and Sequence");
  lt_tok_step st = {LT_POST_BYTELEVEL, 1, 1, NULL, NULL};
  LT_TRY(bool_of(x, "trim_offsets", 1, path, &st.a));
  LT_TRY(bool_of(x, "add_prefix_space", 1, path, &st.b));
  return push(&tok->post, &tok->n_post, st);
}

// ---- the whole ------------------------------------------------------------------------------------

static int keep_json(const cJSON *x, char **out) {
  if (absent(x)) return 0;
  if (!(*out = cJSON_PrintUnformatted(x))) return E("out of memory");
  return 0;
}

int lt_tok_parse_pipeline(lt_tokenizer *tok, const cJSON *root) {
  const cJSON *norm = get(root, "normalizer"), *pre = get(root, "pre_tokenizer"), *dec = get(root, "decoder");
  if (!absent(norm)) LT_TRY(parse_normalizer(tok, norm, "normalizer"));
  tok->byte_level = 0;
  if (!absent(pre)) LT_TRY(parse_pre(tok, pre, "pre_tokenizer"));
  if (!tok->byte_level) tok->pretok = LT_PRETOK_NONE, tok->add_prefix_space = 0;
  classic_pre(tok);
  tok->has_decoder = !absent(dec);
  if (tok->has_decoder) LT_TRY(parse_decoder(tok, dec, "decoder"));
  int only_byte_level = 1; // decoding byte-level tokens is joining their bytes
  for (int k = 0; k < tok->n_dec; k++) only_byte_level &= tok->dec[k].kind == LT_DEC_BYTELEVEL;
  if (only_byte_level && tok->byte_level) {
    for (int k = 0; k < tok->n_dec; k++) free(tok->dec[k].s1), free(tok->dec[k].s2);
    tok->n_dec = 0;
  }
  LT_TRY(keep_json(norm, &tok->json_normalizer));
  LT_TRY(keep_json(pre, &tok->json_pre_tokenizer));
  return keep_json(dec, &tok->json_decoder);
}

// added_order's rule over the normalized texts: by first byte, longest first.
static int norm_before(const lt_tokenizer *tok, int32_t a, int32_t b) {
  const int64_t *o = tok->norm_added_off;
  const uint8_t *d = tok->norm_added_data;
  if (d[o[a]] != d[o[b]]) return d[o[a]] < d[o[b]];
  if (o[a + 1] - o[a] != o[b + 1] - o[b]) return o[a + 1] - o[a] > o[b + 1] - o[b];
  return tok->added[a].id < tok->added[b].id;
}

// The normalized text of each added token with normalized = true (set 1 of tokenizer.h).
static int normalize_added(lt_tokenizer *tok) {
  int32_t n = tok->n_added, m = 0;
  for (int32_t k = 0; k < n; k++) m += tok->added[k].normalized;
  if (!m) return 0;
  tok->norm_added_off = calloc((size_t)n + 1, sizeof *tok->norm_added_off);
  tok->norm_order = malloc((size_t)m * sizeof *tok->norm_order);
  if (!tok->norm_added_off || !tok->norm_order) return E("out of memory");
  lt_tok_nstr s = {0}, all = {0};
  int rc = 0;
  for (int32_t k = 0; k < n && !rc; k++) {
    tok->norm_added_off[k] = all.n;
    if (!tok->added[k].normalized) continue;
    int64_t len;
    const uint8_t *b = lt_tok_bytes(tok, tok->added[k].id, &len);
    s.n = 0;
    rc = lt_tok_nstr_put(&s, b, len, 0, 0);
    if (!rc) rc = lt_tok_normalize(tok, &s);
    if (!rc) rc = lt_tok_nstr_put(&all, s.b, s.n, 0, 0);
  }
  tok->norm_added_off[n] = all.n;
  tok->norm_added_data = all.b;
  all.b = NULL;
  lt_tok_nstr_free(&s), lt_tok_nstr_free(&all);
  if (rc) return rc;
  int32_t cnt = 0;
  for (int32_t k = 0; k < n; k++) {
    if (tok->norm_added_off[k + 1] == tok->norm_added_off[k]) continue; // not normalized, or normalized to nothing
    int32_t pos = cnt++;
    while (pos > 0 && norm_before(tok, k, tok->norm_order[pos - 1])) tok->norm_order[pos] = tok->norm_order[pos - 1], pos--;
    tok->norm_order[pos] = k;
  }
  if (!(tok->added_of_id = malloc((size_t)tok->vocab_size * sizeof *tok->added_of_id))) return E("out of memory");
  tok->n_added_of_id = tok->vocab_size; // tokens added later (add_special) are not normalized ones
  for (int32_t i = 0; i < tok->vocab_size; i++) tok->added_of_id[i] = -1;
  for (int32_t k = 0; k < n; k++) tok->added_of_id[tok->added[k].id] = k;
  for (int32_t j = 0; j < cnt; j++) tok->norm_first[tok->norm_added_data[tok->norm_added_off[tok->norm_order[j]]] + 1]++;
  for (int c = 0; c < 256; c++) tok->norm_first[c + 1] += tok->norm_first[c];
  return 0;
}

int lt_tok_finish_pipeline(lt_tokenizer *tok, const cJSON *root) {
  const cJSON *post = get(root, "post_processor");
  if (!absent(post)) LT_TRY(parse_post(tok, post, "post_processor"));
  LT_TRY(keep_json(post, &tok->json_post_processor));
  for (int b = 0; b < 256 && tok->byte_fallback; b++) {
    char name[8];
    snprintf(name, sizeof name, "<0x%02X>", b);
    tok->fallback_id[b] = lt_tok_find(tok, (const uint8_t *)name, 6);
  }
  LT_TRY(normalize_added(tok));
  tok->classic = tok->byte_level && !tok->n_norm && !tok->n_pre && !tok->norm_order;
  for (int k = 0; k < tok->n_post; k++) tok->classic &= tok->post[k].kind != LT_POST_TEMPLATE;
  return 0;
}
