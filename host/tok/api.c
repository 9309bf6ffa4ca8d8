/* api.c — the C API of encoding and decoding (lutra.h): arguments checked, then lutra's own
 * fast path (tok/encode.c) or the whole pipeline of a tokenizer.json (tok/pipeline.c), and the
 * decoders (tok/decode.c). */
#include "tok/tokenizer.h"
#include <stdlib.h>

static int check_text(const char *op, const lt_tokenizer *tok, const char *text, int64_t len) {
  if (!tok) return lt_errorf("%s: tokenizer is NULL", op);
  if (len < 0) return lt_errorf("%s: len %lld is negative", op, (long long)len);
  if (!text && len) return lt_errorf("%s: text is NULL", op);
  return 0;
}

// The ids of text (and pair, when not NULL; and their offsets when offsets is not NULL) into out
// (owned or not).
static int encode_any(lt_tokenizer *tok, const char *text, int64_t len, const char *pair, int64_t pair_len, int flags,
                      lt_tok_out *out, lt_tok_spans *offsets) {
  if (tok->classic && !offsets && !pair) return lt_tok_encode_into(tok, (const uint8_t *)text, len, flags & 1, out);
  const uint8_t *a = (const uint8_t *)text, *b = (const uint8_t *)pair;
  if (out->owned) return lt_tok_encode_full(tok, a, len, b, pair_len, flags, out, offsets);
  lt_tok_out all = {NULL, 0, 0, 1}; // post-processing rewrites the ids: encode into an owned buffer
  int rc = lt_tok_encode_full(tok, a, len, b, pair_len, flags, &all, offsets);
  for (int64_t i = 0; i < all.n && !rc; i++) rc = lt_tok_push(out, all.ids[i]);
  free(all.ids);
  return rc;
}

int lt_tokenizer_encode(lt_tokenizer *tok, const char *text, int64_t len, int flags, int32_t *ids, int64_t capacity,
                        int64_t *count) {
  LT_TRY(check_text("encode", tok, text, len));
  if (!count) return lt_errorf("encode: count is NULL");
  if (capacity < 0 || (!ids && capacity)) return lt_errorf("encode: ids is NULL or capacity < 0");
  lt_tok_out out = {ids, 0, capacity, 0};
  int rc = encode_any(tok, text, len, NULL, 0, flags, &out, NULL);
  *count = out.n;
  if (rc) return rc;
  if (out.n > capacity)
    return lt_errorf("encode: ids has room for %lld ids, the text needs %lld", (long long)capacity, (long long)out.n);
  return 0;
}

int lt_tokenizer_encode_pair(lt_tokenizer *tok, const char *text, int64_t len, const char *pair, int64_t pair_len,
                             int flags, int32_t *ids, int64_t *starts, int64_t *ends, int64_t capacity, int64_t *count) {
  const char *op = pair ? "encode_pair" : "encode_offsets";
  LT_TRY(check_text(op, tok, text, len));
  if (pair && pair_len < 0) return lt_errorf("%s: pair_len %lld is negative", op, (long long)pair_len);
  if (!count) return lt_errorf("%s: count is NULL", op);
  if (capacity < 0 || (!ids && capacity) || (!starts != !ends))
    return lt_errorf("%s: ids is NULL, capacity < 0, or one of starts and ends is NULL", op);
  lt_tok_out out = {NULL, 0, 0, 1};
  lt_tok_spans offs = {0};
  int rc = encode_any(tok, text, len, pair, pair_len, flags, &out, starts ? &offs : NULL);
  *count = out.n;
  if (!rc && out.n > capacity)
    rc = lt_errorf("%s: room for %lld ids, the text needs %lld", op, (long long)capacity, (long long)out.n);
  for (int64_t i = 0; i < out.n && !rc; i++) {
    ids[i] = out.ids[i];
    if (starts) starts[i] = offs.v[2 * i], ends[i] = offs.v[2 * i + 1];
  }
  free(out.ids), free(offs.v);
  return rc;
}

int lt_tokenizer_encode_offsets(lt_tokenizer *tok, const char *text, int64_t len, int flags, int32_t *ids,
                                int64_t *starts, int64_t *ends, int64_t capacity, int64_t *count) {
  if (capacity > 0 && (!starts || !ends)) return lt_errorf("encode_offsets: starts or ends is NULL");
  return lt_tokenizer_encode_pair(tok, text, len, NULL, 0, flags, ids, starts, ends, capacity, count);
}

int lt_tokenizer_encode_tensor(lt_tensor *out, lt_tokenizer *tok, const char *text, int64_t len, int flags) {
  LT_TRY(check_text("encode_tensor", tok, text, len));
  if (!out) return lt_errorf("encode_tensor: out is NULL");
  lt_tok_out ids = {NULL, 0, 0, 1};
  int rc = encode_any(tok, text, len, NULL, 0, flags, &ids, NULL);
  int64_t shape[1] = {ids.n};
  if (!rc) rc = lt_prepare_out("encode_tensor", out, 1, shape, LT_I32, LT_DEVICE_CPU);
  if (!rc && ids.n) rc = lt_copy_from_buffer(out, ids.ids, LT_I32, ids.n);
  free(ids.ids);
  return rc;
}

int lt_tokenizer_decode(const lt_tokenizer *tok, const int32_t *ids, int64_t n, char *buf, int64_t capacity,
                        int64_t *len) {
  return lt_tokenizer_decode_flags(tok, ids, n, 0, buf, capacity, len);
}

int lt_tokenizer_decode_flags(const lt_tokenizer *tok, const int32_t *ids, int64_t n, int flags, char *buf,
                              int64_t capacity, int64_t *len) {
  int skip_special = (flags & LT_TOK_SKIP_SPECIAL) != 0;
  if (!tok) return lt_errorf("decode: tokenizer is NULL");
  if (!len) return lt_errorf("decode: len is NULL");
  if (n < 0 || (!ids && n)) return lt_errorf("decode: ids is NULL or n < 0");
  if (capacity < 0 || (!buf && capacity)) return lt_errorf("decode: buf is NULL or capacity < 0");
  int64_t total = 0;
  for (int64_t i = 0; i < n; i++) {
    int32_t id = ids[i];
    if (id < 0 || id >= tok->vocab_size)
      return lt_errorf("decode: id %d at position %lld is out of range [0, %d)", id, (long long)i, tok->vocab_size);
    if (tok->tok_flags[id] & LT_TOKF_UNUSED)
      return lt_errorf("decode: id %d at position %lld is not a token (a gap in the vocab)", id, (long long)i);
    total += tok->tok_off[id + 1] - tok->tok_off[id];
  }
  if (tok->n_dec || (!tok->has_decoder && !tok->byte_level) || tok->added_of_id || skip_special) {
    uint8_t *text;
    int64_t n_text;
    LT_TRY(lt_tok_decode_chain(tok, ids, n, skip_special, &text, &n_text));
    *len = n_text;
    int rc = buf && n_text > capacity ? lt_errorf("decode: buf has room for %lld bytes, the ids need %lld",
                                                  (long long)capacity, (long long)n_text)
                                      : 0;
    if (!rc && buf && n_text) memcpy(buf, text, (size_t)n_text);
    free(text);
    return rc;
  }
  *len = total;
  if (!buf) return 0;
  if (total > capacity)
    return lt_errorf("decode: buf has room for %lld bytes, the ids need %lld", (long long)capacity, (long long)total);
  char *p = buf;
  for (int64_t i = 0; i < n; i++) {
    int64_t l;
    const uint8_t *b = lt_tok_bytes(tok, ids[i], &l);
    memcpy(p, b, (size_t)l);
    p += l;
  }
  return 0;
}
