/* bpe.c — the tokenizer handle: its tokens, merges and added tokens, and the
 * queries of the C API. Encoding is in tok/encode.c, training in tok/train.c. */
#include "tok/tokenizer.h"
#include <stdio.h>
#include <stdlib.h>

lt_tokenizer *lt_tok_alloc(int kind) {
  lt_tokenizer *tok = calloc(1, sizeof *tok);
  if (!tok) {
    lt_errorf("tokenizer: out of memory");
    return NULL;
  }
  tok->kind = kind;
  tok->tok_off = calloc(1, sizeof(int64_t));
  if (!tok->tok_off) {
    free(tok);
    lt_errorf("tokenizer: out of memory");
    return NULL;
  }
  for (int b = 0; b < 256; b++) tok->byte_id[b] = -1;
  for (int c = 0; c < 128; c++) tok->ascii_id[c] = -1;
  tok->unk_id = -1;
  tok->pretok = LT_PRETOK_GPT2;
  tok->classic = tok->byte_level = 1;
  for (int b = 0; b < 256; b++) tok->fallback_id[b] = -1;
  return tok;
}

static void free_pipeline(lt_tokenizer *tok) {
  lt_tok_step *lists[4] = {tok->norm, tok->pre, tok->dec, tok->post};
  int counts[4] = {tok->n_norm, tok->n_pre, tok->n_dec, tok->n_post};
  for (int l = 0; l < 4; l++) {
    for (int k = 0; k < counts[l]; k++) free(lists[l][k].s1), free(lists[l][k].s2);
    free(lists[l]);
  }
  lt_tok_template *t[2] = {&tok->single, &tok->pair};
  for (int k = 0; k < 2; k++) free(t[k]->seq), free(t[k]->first), free(t[k]->count);
  free(tok->template_ids);
  free(tok->norm_added_data), free(tok->norm_added_off), free(tok->norm_order), free(tok->added_of_id);
  free(tok->json_normalizer), free(tok->json_pre_tokenizer), free(tok->json_post_processor), free(tok->json_decoder);
}

int lt_tokenizer_free(lt_tokenizer *tok) {
  if (!tok) return 0;
  free(tok->tok_off);
  free(tok->tok_flags);
  free(tok->tok_data);
  lt_tok_strmap_free(&tok->tok_index);
  free(tok->merge_a);
  free(tok->merge_b);
  free(tok->merge_out);
  lt_tok_pairmap_free(&tok->merge_rank);
  free(tok->added);
  free(tok->added_order);
  free(tok->chars);
  free_pipeline(tok);
  lt_tok_strmap_free(&tok->cache);
  free(tok->cache_ids);
  free(tok);
  return 0;
}

int lt_tok_append(lt_tokenizer *tok, const uint8_t *bytes, int64_t len, int flags) {
  if (tok->vocab_size >= INT32_MAX - 1) return lt_errorf("tokenizer: too many tokens");
  if (tok->vocab_size + 1 >= tok->tok_cap) {
    int32_t cap = tok->tok_cap ? 2 * tok->tok_cap : 512;
    int64_t *off = realloc(tok->tok_off, ((size_t)cap + 1) * sizeof *off);
    if (off) tok->tok_off = off;
    uint8_t *fl = realloc(tok->tok_flags, (size_t)cap);
    if (fl) tok->tok_flags = fl;
    if (!off || !fl) return lt_errorf("tokenizer: out of memory");
    tok->tok_cap = cap;
  }
  int64_t used = tok->tok_off[tok->vocab_size];
  if (used + len > tok->data_cap) {
    int64_t cap = tok->data_cap ? tok->data_cap : 4096;
    while (cap < used + len) cap *= 2;
    uint8_t *d = realloc(tok->tok_data, (size_t)cap);
    if (!d) return lt_errorf("tokenizer: out of memory");
    tok->tok_data = d;
    tok->data_cap = cap;
  }
  int32_t id = tok->vocab_size;
  if (len) memcpy(tok->tok_data + used, bytes, (size_t)len);
  tok->tok_off[id + 1] = used + len;
  tok->tok_flags[id] = (uint8_t)flags;
  tok->vocab_size++;
  if (!(flags & (LT_TOKF_ADDED | LT_TOKF_UNUSED))) {
    if (len == 1 && tok->byte_id[bytes[0]] < 0) tok->byte_id[bytes[0]] = id;
    uint64_t h = lt_tok_hash(bytes, len);
    if (lt_tok_strmap_find(&tok->tok_index, bytes, len, h) < 0 &&
        lt_tok_strmap_add(&tok->tok_index, bytes, len, h, id) < 0)
      return lt_errorf("tokenizer: out of memory");
  }
  return 0;
}

int32_t lt_tok_find(const lt_tokenizer *tok, const uint8_t *bytes, int64_t len) {
  int64_t e = lt_tok_strmap_find(&tok->tok_index, bytes, len, lt_tok_hash(bytes, len));
  return e < 0 ? -1 : (int32_t)tok->tok_index.value[e];
}

int lt_tok_add_merge(lt_tokenizer *tok, int32_t a, int32_t b, int32_t out) {
  if (tok->n_merges == tok->merge_cap) {
    int32_t cap = tok->merge_cap ? 2 * tok->merge_cap : 512;
    int32_t *ma = realloc(tok->merge_a, (size_t)cap * sizeof *ma);
    if (ma) tok->merge_a = ma;
    int32_t *mb = realloc(tok->merge_b, (size_t)cap * sizeof *mb);
    if (mb) tok->merge_b = mb;
    int32_t *mo = realloc(tok->merge_out, (size_t)cap * sizeof *mo);
    if (mo) tok->merge_out = mo;
    if (!ma || !mb || !mo) return lt_errorf("tokenizer: out of memory");
    tok->merge_cap = cap;
  }
  uint64_t key = lt_tok_pair(a, b);
  if (lt_tok_pairmap_get(&tok->merge_rank, key) >= 0) return 0; // a repeated merge never applies again
  int32_t r = tok->n_merges++;
  tok->merge_a[r] = a, tok->merge_b[r] = b, tok->merge_out[r] = out;
  if (lt_tok_pairmap_put(&tok->merge_rank, key, r)) return lt_errorf("tokenizer: out of memory");
  return 0;
}

// added_order: the added tokens by first byte, longest first (leftmost-longest matching).
static int added_before(const lt_tokenizer *tok, int32_t ka, int32_t kb) {
  int32_t ia = tok->added[ka].id, ib = tok->added[kb].id;
  int64_t la, lb;
  const uint8_t *a = lt_tok_bytes(tok, ia, &la), *b = lt_tok_bytes(tok, ib, &lb);
  if (a[0] != b[0]) return a[0] < b[0];
  if (la != lb) return la > lb;
  return ia < ib;
}

int lt_tok_register_added(lt_tokenizer *tok, int32_t id, const lt_tok_added *spec) {
  int64_t len;
  lt_tok_bytes(tok, id, &len);
  if (len == 0) return lt_errorf("tokenizer: added token %d is empty", id);
  if (tok->n_added == tok->added_cap) {
    int32_t cap = tok->added_cap ? 2 * tok->added_cap : 16;
    lt_tok_added *a = realloc(tok->added, (size_t)cap * sizeof *a);
    if (a) tok->added = a;
    int32_t *o = realloc(tok->added_order, (size_t)cap * sizeof *o);
    if (o) tok->added_order = o;
    if (!a || !o) return lt_errorf("tokenizer: out of memory");
    tok->added_cap = cap;
  }
  lt_tok_added a = *spec;
  a.id = id;
  tok->added[tok->n_added] = a;
  tok->tok_flags[id] = (uint8_t)(LT_TOKF_ADDED | (a.special ? LT_TOKF_SPECIAL : 0));
  tok->n_added++;
  int32_t k = tok->n_added - 1, pos = k; // insertion into the sorted order
  while (pos > 0 && added_before(tok, k, tok->added_order[pos - 1])) {
    tok->added_order[pos] = tok->added_order[pos - 1];
    pos--;
  }
  tok->added_order[pos] = k;
  memset(tok->added_first, 0, sizeof tok->added_first);
  for (int32_t k = 0; k < tok->n_added; k++) {
    int64_t l;
    tok->added_first[lt_tok_bytes(tok, tok->added[tok->added_order[k]].id, &l)[0] + 1]++;
  }
  for (int c = 0; c < 256; c++) tok->added_first[c + 1] += tok->added_first[c];
  // the encode cache stays valid: added tokens never take part in merges
  return 0;
}

int lt_tok_is_space_cp(uint32_t cp) {
  if (cp < 0x80) return cp == ' ' || (cp >= '\t' && cp <= '\r');
  return cp < LT_TOK_RAW_BYTE && lt_tok_unicode_class(cp) == LT_CLASS_SPACE;
}

// Start of the whitespace character that ends at t[i-1] (not before lo), or -1.
static int64_t space_before(const uint8_t *t, int64_t lo, int64_t i) {
  int64_t s = i - 1;
  while (s > lo && i - s < 4 && (t[s] & 0xC0) == 0x80) s--;
  uint32_t cp;
  if (s < lo || lt_tok_utf8_decode(t + s, i - s, &cp) != i - s || !lt_tok_is_space_cp(cp)) return -1;
  return s;
}

// End of the whitespace character that starts at t[i], or -1.
static int64_t space_at(const uint8_t *t, int64_t i, int64_t n) {
  uint32_t cp;
  int len = lt_tok_utf8_decode(t + i, n - i, &cp);
  return lt_tok_is_space_cp(cp) ? i + len : -1;
}

// A "word" character for single_word added tokens: a letter, a number or '_'.
static inline int word_cp(uint32_t cp) {
  if (cp < 0x80) return cp == '_' || (cp | 32) - 'a' < 26 || cp - '0' < 10;
  int k = cp < LT_TOK_RAW_BYTE ? lt_tok_unicode_class(cp) : LT_CLASS_OTHER;
  return k == LT_CLASS_LETTER || k == LT_CLASS_NUMBER;
}

static int word_char_before(const uint8_t *t, int64_t i) { // the character that ends at t[i-1]
  int64_t s = i - 1;
  while (s > 0 && i - s < 4 && (t[s] & 0xC0) == 0x80) s--;
  uint32_t cp;
  if (lt_tok_utf8_decode(t + s, i - s, &cp) != i - s) return 0;
  return word_cp(cp);
}

static int word_char_at(const uint8_t *t, int64_t i, int64_t n) {
  uint32_t cp;
  lt_tok_utf8_decode(t + i, n - i, &cp);
  return word_cp(cp);
}

int lt_tok_match_added(const lt_tokenizer *tok, const uint8_t *text, int64_t pos, int64_t n, int allow_special,
                       int64_t *start, int64_t *end, int32_t *id) {
  if (tok->n_added == 0) return 0;
  for (int64_t i = pos; i < n; i++) {
    int lo = tok->added_first[text[i]], hi = tok->added_first[text[i] + 1];
    for (int k = lo; k < hi; k++) {
      const lt_tok_added *a = &tok->added[tok->added_order[k]];
      if (a->special && !allow_special) continue;
      int64_t len;
      const uint8_t *bytes = lt_tok_bytes(tok, a->id, &len);
      if (len > n - i || memcmp(text + i, bytes, (size_t)len) != 0) continue;
      if (a->single_word && ((i > 0 && word_char_before(text, i)) || (i + len < n && word_char_at(text, i + len, n))))
        continue;
      int64_t s = i, e = i + len;
      for (int64_t b; a->lstrip && s > pos && (b = space_before(text, pos, s)) >= 0;) s = b; // Unicode whitespace
      for (int64_t b; a->rstrip && e < n && (b = space_at(text, e, n)) >= 0;) e = b;
      *start = s, *end = e, *id = a->id;
      return 1;
    }
  }
  return 0;
}

// The text of added token k in a set (see tokenizer.h), or NULL when it is not in the set.
static const uint8_t *set_text(const lt_tokenizer *tok, int set, int32_t k, int64_t *len) {
  if (set == 0) // without set 1 (a char tokenizer, lutra's own) every added token is matched in the raw text
    return tok->added[k].normalized && tok->norm_order ? NULL : lt_tok_bytes(tok, tok->added[k].id, len);
  *len = tok->norm_added_off[k + 1] - tok->norm_added_off[k];
  return *len ? tok->norm_added_data + tok->norm_added_off[k] : NULL;
}

int lt_tok_match_added_set(const lt_tokenizer *tok, int set, const uint8_t *text, int64_t pos, int64_t n,
                           int allow_special, int64_t *start, int64_t *end, int32_t *id) {
  const int32_t *order = set ? tok->norm_order : tok->added_order, *first = set ? tok->norm_first : tok->added_first;
  if (tok->n_added == 0 || !order) return 0;
  for (int64_t i = pos; i < n; i++) {
    for (int k = first[text[i]], hi = first[text[i] + 1]; k < hi; k++) {
      const lt_tok_added *a = &tok->added[order[k]];
      int64_t len = 0;
      const uint8_t *bytes = set_text(tok, set, order[k], &len);
      if (!bytes || len > n - i || memcmp(text + i, bytes, (size_t)len) != 0) continue;
      // the leftmost-longest match: refused whole, or taken
      if ((a->special && !allow_special) ||
          (a->single_word && ((i > 0 && word_char_before(text, i)) || (i + len < n && word_char_at(text, i + len, n))))) {
        i += len - 1;
        break;
      }
      int64_t s = i, e = i + len;
      for (int64_t b; a->lstrip && s > pos && (b = space_before(text, pos, s)) >= 0;) s = b;
      for (int64_t b; a->rstrip && e < n && (b = space_at(text, e, n)) >= 0;) e = b;
      *start = s, *end = e, *id = a->id;
      return 1;
    }
  }
  return 0;
}

// ---- queries -------------------------------------------------------------------------

static int check_tok(const char *op, const lt_tokenizer *tok) {
  if (!tok) return lt_errorf("%s: tokenizer is NULL", op);
  return 0;
}

int lt_tokenizer_vocab_size(const lt_tokenizer *tok) { return tok ? tok->vocab_size : 0; }
const char *lt_tokenizer_kind_name(const lt_tokenizer *tok) {
  return !tok ? "?" : tok->kind == LT_TOK_CHAR ? "char" : "bpe";
}
int lt_tokenizer_num_merges(const lt_tokenizer *tok) { return tok ? tok->n_merges : 0; }

int lt_tokenizer_merge(const lt_tokenizer *tok, int32_t rank, int32_t *a, int32_t *b, int32_t *out) {
  LT_TRY(check_tok("merge", tok));
  if (!a || !b || !out) return lt_errorf("merge: a, b and out must not be NULL");
  if (rank < 0 || rank >= tok->n_merges) return lt_errorf("merge: rank %d out of range [0, %d)", rank, tok->n_merges);
  *a = tok->merge_a[rank], *b = tok->merge_b[rank], *out = tok->merge_out[rank];
  return 0;
}

int lt_tokenizer_token(const lt_tokenizer *tok, int32_t id, const char **bytes, int64_t *len) {
  LT_TRY(check_tok("token", tok));
  if (!bytes || !len) return lt_errorf("token: bytes and len must not be NULL");
  if (id < 0 || id >= tok->vocab_size) return lt_errorf("token: id %d out of range [0, %d)", id, tok->vocab_size);
  *bytes = (const char *)lt_tok_bytes(tok, id, len);
  return 0;
}

int lt_tokenizer_token_id(const lt_tokenizer *tok, const char *bytes, int64_t len, int32_t *id) {
  LT_TRY(check_tok("token_id", tok));
  if (!id || (!bytes && len) || len < 0) return lt_errorf("token_id: bad arguments (NULL bytes or id, or len < 0)");
  for (int32_t k = 0; k < tok->n_added; k++) { // added tokens first: their text may also be a merged token
    int64_t l;
    const uint8_t *b = lt_tok_bytes(tok, tok->added[k].id, &l);
    if (l == len && memcmp(b, bytes, (size_t)len) == 0) return *id = tok->added[k].id, 0;
  }
  *id = lt_tok_find(tok, (const uint8_t *)bytes, len);
  return 0;
}

int lt_tokenizer_is_special(const lt_tokenizer *tok, int32_t id) {
  return tok && id >= 0 && id < tok->vocab_size && (tok->tok_flags[id] & LT_TOKF_SPECIAL) != 0;
}

int lt_tokenizer_add_special(lt_tokenizer *tok, const char *text, int32_t *id) {
  LT_TRY(check_tok("add_special", tok));
  if (!text || !id) return lt_errorf("add_special: text and id must not be NULL");
  int64_t len = (int64_t)strlen(text);
  if (len == 0) return lt_errorf("add_special: the token text is empty");
  for (int64_t i = 0; i < len;) {
    uint32_t cp;
    i += lt_tok_utf8_decode((const uint8_t *)text + i, len - i, &cp);
    if (cp >= LT_TOK_RAW_BYTE) return lt_errorf("add_special: '%s' is not valid UTF-8", text);
  }
  for (int32_t k = 0; k < tok->n_added; k++) {
    int64_t l;
    const uint8_t *b = lt_tok_bytes(tok, tok->added[k].id, &l);
    if (l == len && memcmp(b, text, (size_t)len) == 0) return *id = tok->added[k].id, 0;
  }
  lt_tok_added spec = {.special = 1};
  LT_TRY(lt_tok_append(tok, (const uint8_t *)text, len, LT_TOKF_ADDED | LT_TOKF_SPECIAL));
  *id = tok->vocab_size - 1;
  return lt_tok_register_added(tok, *id, &spec);
}

int lt_tok_add_specials(const char *op, lt_tokenizer *tok, const char *const *special_tokens, int32_t num_special) {
  if (num_special < 0 || (num_special && !special_tokens))
    return lt_errorf("%s: special_tokens is NULL or num_special < 0", op);
  for (int32_t i = 0; i < num_special; i++) {
    int32_t id;
    if (!special_tokens[i]) return lt_errorf("%s: special token %d is NULL", op, i);
    if (lt_tokenizer_add_special(tok, special_tokens[i], &id)) {
      char why[512]; // the message buffer is the one lt_errorf writes: copy first
      snprintf(why, sizeof why, "%s", lt_last_error() + strlen("add_special: "));
      return lt_errorf("%s: special token %d: %s", op, i, why);
    }
  }
  return 0;
}

// FNV-1a over a stream of fields.
static uint64_t fnv(uint64_t h, const void *p, size_t n) {
  const uint8_t *b = p;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001B3ull;
  return h;
}

int lt_tokenizer_fingerprint(const lt_tokenizer *tok, uint64_t *out) {
  LT_TRY(check_tok("fingerprint", tok));
  if (!out) return lt_errorf("fingerprint: out is NULL");
  int32_t head[6] = {tok->kind, tok->pretok, tok->add_prefix_space, tok->ignore_merges, tok->unk_id, tok->vocab_size};
  uint64_t h = fnv(0xCBF29CE484222325ull, head, sizeof head);
  h = fnv(h, tok->tok_off, (size_t)(tok->vocab_size + 1) * sizeof *tok->tok_off);
  h = fnv(h, tok->tok_flags, (size_t)tok->vocab_size);
  h = fnv(h, tok->tok_data, (size_t)tok->tok_off[tok->vocab_size]);
  for (int32_t r = 0; r < tok->n_merges; r++) {
    int32_t m[3] = {tok->merge_a[r], tok->merge_b[r], tok->merge_out[r]};
    h = fnv(h, m, sizeof m);
  }
  for (int32_t k = 0; k < tok->n_added; k++) {
    const lt_tok_added *a = &tok->added[k];
    uint8_t spec[5] = {a->special, a->lstrip, a->rstrip, a->normalized, a->single_word};
    h = fnv(fnv(h, &a->id, sizeof a->id), spec, sizeof spec);
  }
  // the steps of a tokenizer.json's pipeline that decide ids (lutra's own have none: their
  // fingerprints stay what they were)
  const lt_tok_step *lists[3] = {tok->norm, tok->pre, tok->post};
  int counts[3] = {tok->n_norm, tok->n_pre, tok->n_post};
  for (int l = 0; l < 3; l++) {
    for (int k = 0; k < counts[l]; k++) {
      const lt_tok_step *st = &lists[l][k];
      int32_t head[4] = {l, st->kind, st->a, st->b};
      h = fnv(h, head, sizeof head);
      if (st->s1) h = fnv(h, st->s1, strlen(st->s1) + 1);
      if (st->s2) h = fnv(h, st->s2, strlen(st->s2) + 1);
    }
  }
  const lt_tok_template *tp[2] = {&tok->single, &tok->pair};
  for (int t = 0; t < 2; t++) {
    for (int32_t k = 0; k < tp[t]->n; k++) {
      int32_t item[3] = {tp[t]->seq[k], tp[t]->first[k], tp[t]->count[k]};
      h = fnv(h, item, sizeof item);
    }
  }
  if (tok->n_template_ids) h = fnv(h, tok->template_ids, (size_t)tok->n_template_ids * sizeof *tok->template_ids);
  if (!tok->byte_level || tok->byte_fallback || tok->fuse_unk) {
    int32_t model[3] = {tok->byte_level, tok->byte_fallback, tok->fuse_unk};
    h = fnv(h, model, sizeof model);
  }
  *out = h;
  return 0;
}
