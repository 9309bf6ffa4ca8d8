/* save.c — writes a tokenizer as JSON: Hugging Face's tokenizer.json for BPE
 * (read back by the `tokenizers` library), lutra's own format for char tokenizers. The
 * file is written next to its destination and renamed over it (lt_write_file_atomic), so a
 * reader never sees half a file and a link planted there is replaced, never written through. */
#include "tok/tokenizer.h"
#include <stdio.h>
#include <stdlib.h>
#include <cjson/cJSON.h>

// Bytes -> GPT-2 byte-level string, NUL-terminated; buf has room for 2 * len + 1.
static void to_byte_level(const uint8_t *bytes, int64_t len, char *buf) {
  int64_t m = 0;
  for (int64_t i = 0; i < len; i++) m += lt_tok_utf8_encode(lt_tok_byte_to_unicode(bytes[i]), (uint8_t *)buf + m);
  buf[m] = 0;
}

// Token text as a C string (added tokens are UTF-8 without NUL); buf has room for len + 1.
static const char *text_of(const lt_tokenizer *tok, int32_t id, char *buf) {
  int64_t len;
  const uint8_t *bytes = lt_tok_bytes(tok, id, &len);
  memcpy(buf, bytes, (size_t)len);
  buf[len] = 0;
  return buf;
}

static cJSON *added_tokens(const lt_tokenizer *tok, char *buf) {
  cJSON *list = cJSON_CreateArray();
  for (int32_t k = 0; list && k < tok->n_added; k++) {
    const lt_tok_added *a = &tok->added[k];
    cJSON *t = cJSON_CreateObject();
    if (!t) goto oom;
    cJSON_AddItemToArray(list, t);
    if (!cJSON_AddNumberToObject(t, "id", a->id) || !cJSON_AddStringToObject(t, "content", text_of(tok, a->id, buf)) ||
        !cJSON_AddBoolToObject(t, "single_word", a->single_word) || !cJSON_AddBoolToObject(t, "lstrip", a->lstrip) ||
        !cJSON_AddBoolToObject(t, "rstrip", a->rstrip) || !cJSON_AddBoolToObject(t, "normalized", a->normalized) ||
        !cJSON_AddBoolToObject(t, "special", a->special))
      goto oom;
  }
  return list;
oom:
  cJSON_Delete(list);
  return NULL;
}

static cJSON *byte_level(int add_prefix_space, int use_regex) {
  cJSON *x = cJSON_CreateObject();
  if (x && (!cJSON_AddStringToObject(x, "type", "ByteLevel") ||
            !cJSON_AddBoolToObject(x, "add_prefix_space", add_prefix_space) ||
            !cJSON_AddBoolToObject(x, "trim_offsets", 1) || !cJSON_AddBoolToObject(x, "use_regex", use_regex))) {
    cJSON_Delete(x);
    return NULL;
  }
  return x;
}

static int add(cJSON *obj, const char *key, cJSON *item) {
  if (!item) return -1;
  return cJSON_AddItemToObject(obj, key, item) ? 0 : (cJSON_Delete(item), -1);
}

// ByteLevel alone (GPT-2's regex or none), or Sequence[Split(regex), ByteLevel(use_regex=false)].
static cJSON *pre_tokenizer(const lt_tokenizer *tok) {
  if (tok->pretok == LT_PRETOK_NONE || (tok->pretok == LT_PRETOK_GPT2 && tok->add_prefix_space != 2))
    return byte_level(tok->add_prefix_space, tok->pretok == LT_PRETOK_GPT2);
  // every node first; attaching with constant keys cannot fail
  cJSON *node[9] = {cJSON_CreateObject(),
                    cJSON_CreateArray(),
                    cJSON_CreateObject(),
                    cJSON_CreateObject(),
                    byte_level(tok->add_prefix_space == 2, 0),
                    cJSON_CreateString("Sequence"),
                    cJSON_CreateString("Split"),
                    cJSON_CreateString(lt_tok_patterns[tok->pretok]),
                    cJSON_CreateString("Isolated")};
  cJSON *seq = node[0], *list = node[1], *split = node[2], *pattern = node[3], *invert = cJSON_CreateFalse();
  int ok = invert != NULL;
  for (int i = 0; i < 9; i++) ok &= node[i] != NULL;
  if (!ok) {
    for (int i = 0; i < 9; i++) cJSON_Delete(node[i]);
    cJSON_Delete(invert);
    return NULL;
  }
  cJSON_AddItemToObjectCS(seq, "type", node[5]);
  cJSON_AddItemToObjectCS(seq, "pretokenizers", list);
  cJSON_AddItemToArray(list, split);
  cJSON_AddItemToArray(list, node[4]);
  cJSON_AddItemToObjectCS(split, "type", node[6]);
  cJSON_AddItemToObjectCS(split, "pattern", pattern);
  cJSON_AddItemToObjectCS(pattern, "Regex", node[7]);
  cJSON_AddItemToObjectCS(split, "behavior", node[8]);
  cJSON_AddItemToObjectCS(split, "invert", invert);
  return seq;
}

// A vocab key: the byte-level string of a byte-level tokenizer's token, else its text.
static void key_of(const lt_tokenizer *tok, const uint8_t *bytes, int64_t len, char *buf) {
  if (tok->byte_level) return to_byte_level(bytes, len, buf);
  memcpy(buf, bytes, (size_t)len);
  buf[len] = 0;
}

// A part of the pipeline as the tokenizer.json it came from had it, or made.
static cJSON *kept_or(const char *kept, cJSON *made) {
  if (!kept) return made;
  cJSON_Delete(made);
  return cJSON_Parse(kept);
}

static cJSON *bpe_model(const lt_tokenizer *tok, char *buf) {
  cJSON *model = cJSON_CreateObject(), *vocab = cJSON_CreateObject(), *merges = cJSON_CreateArray();
  if (!model || add(model, "type", cJSON_CreateString("BPE")) || add(model, "dropout", cJSON_CreateNull()) ||
      add(model, "unk_token",
          tok->unk_id >= 0 ? cJSON_CreateString(text_of(tok, tok->unk_id, buf)) : cJSON_CreateNull()) ||
      add(model, "continuing_subword_prefix", cJSON_CreateNull()) ||
      add(model, "end_of_word_suffix", cJSON_CreateNull()) || add(model, "fuse_unk", cJSON_CreateBool(tok->fuse_unk)) ||
      add(model, "byte_fallback", cJSON_CreateBool(tok->byte_fallback)) ||
      add(model, "ignore_merges", cJSON_CreateBool(tok->ignore_merges)))
    goto oom;
  for (int32_t id = 0; id < tok->vocab_size; id++) {
    uint8_t f = tok->tok_flags[id];
    if (f & LT_TOKF_UNUSED) continue;
    int64_t len;
    const uint8_t *bytes = lt_tok_bytes(tok, id, &len);
    if ((f & LT_TOKF_ADDED) && lt_tok_find(tok, bytes, len) != id) { // its text, as Hugging Face's trainer writes
      text_of(tok, id, buf);                                          // it, unless a token already has that key
      if (cJSON_GetObjectItemCaseSensitive(vocab, buf)) continue;
    } else { // a vocab token (an added token the vocab holds too takes part in merges: its vocab key)
      key_of(tok, bytes, len, buf);
    }
    if (!cJSON_AddNumberToObject(vocab, buf, id)) goto oom;
  }
  for (int32_t r = 0; r < tok->n_merges; r++) {
    int64_t la, lb;
    const uint8_t *a = lt_tok_bytes(tok, tok->merge_a[r], &la), *b = lt_tok_bytes(tok, tok->merge_b[r], &lb);
    key_of(tok, a, la, buf);
    size_t n = strlen(buf);
    key_of(tok, b, lb, buf + n + 1);
    cJSON *m;
    if (tok->byte_level) { // "a b": a byte-level string has no space
      buf[n] = ' ';
      m = cJSON_CreateString(buf);
    } else { // ["a", "b"]: a token's text may hold a space
      cJSON *ma = cJSON_CreateString(buf), *mb = cJSON_CreateString(buf + n + 1);
      m = cJSON_CreateArray();
      if (m && ma) cJSON_AddItemToArray(m, ma), ma = NULL;
      if (m && mb) cJSON_AddItemToArray(m, mb), mb = NULL;
      if (ma || mb) cJSON_Delete(m), cJSON_Delete(ma), cJSON_Delete(mb), m = NULL;
    }
    if (!m) goto oom;
    cJSON_AddItemToArray(merges, m);
  }
  if (add(model, "vocab", vocab)) {
    vocab = NULL;
    goto oom;
  }
  vocab = NULL;
  if (add(model, "merges", merges)) {
    merges = NULL;
    goto oom;
  }
  return model;
oom:
  cJSON_Delete(model), cJSON_Delete(vocab), cJSON_Delete(merges);
  return NULL;
}

static cJSON *to_json(const lt_tokenizer *tok, char *buf) {
  cJSON *root = cJSON_CreateObject();
  if (!root) return NULL;
  int rc;
  if (tok->kind == LT_TOK_CHAR) {
    cJSON *cps = cJSON_CreateArray();
    for (int32_t i = 0; cps && i < tok->n_chars; i++) {
      cJSON *c = cJSON_CreateNumber(tok->chars[i]);
      if (!c) break;
      cJSON_AddItemToArray(cps, c);
    }
    rc = add(root, "lutra_tokenizer", cJSON_CreateNumber(1)) || add(root, "type", cJSON_CreateString("char")) ||
         (cJSON_GetArraySize(cps) != tok->n_chars) || add(root, "codepoints", cps) ||
         add(root, "added_tokens", added_tokens(tok, buf));
  } else {
    rc = add(root, "version", cJSON_CreateString("1.0")) || add(root, "truncation", cJSON_CreateNull()) ||
         add(root, "padding", cJSON_CreateNull()) || add(root, "added_tokens", added_tokens(tok, buf)) ||
         add(root, "normalizer", kept_or(tok->json_normalizer, cJSON_CreateNull())) ||
         add(root, "pre_tokenizer", kept_or(tok->json_pre_tokenizer, tok->byte_level ? pre_tokenizer(tok) : cJSON_CreateNull())) ||
         add(root, "post_processor", kept_or(tok->json_post_processor, cJSON_CreateNull())) ||
         add(root, "decoder", kept_or(tok->json_decoder, tok->byte_level ? byte_level(1, 1) : cJSON_CreateNull())) ||
         add(root, "model", bpe_model(tok, buf));
  }
  if (rc) {
    cJSON_Delete(root);
    return NULL;
  }
  return root;
}

int lt_tokenizer_save(const lt_tokenizer *tok, const char *path) {
  if (!tok || !path) return lt_errorf("save: tokenizer or path is NULL");
  int64_t longest = 0;
  for (int32_t id = 0; id < tok->vocab_size; id++) {
    int64_t len = tok->tok_off[id + 1] - tok->tok_off[id];
    if (len > longest) longest = len;
  }
  char *buf = malloc((size_t)(4 * longest + 8)); // two byte-level strings and a space
  cJSON *root = buf ? to_json(tok, buf) : NULL;
  char *text = root ? cJSON_Print(root) : NULL;
  cJSON_Delete(root);
  free(buf);
  if (!text) return lt_errorf("save: out of memory");
  /* the text and a newline, into a temporary beside path renamed over it (lutra.h: files
   * written safely) */
  size_t len = strlen(text);
  text[len] = '\n'; /* the terminator becomes the newline: the bytes are written by length */
  int rc = 0;
  if (lt_write_file_atomic(path, text, (int64_t)len + 1, 0) != 0) {
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", lt_last_error());
    rc = lt_errorf("save: %s", msg);
  }
  cJSON_free(text);
  return rc;
}
