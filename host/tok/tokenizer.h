/* tokenizer.h — internals of the tokenizers (host/tokenizer_*.c), never seen by Lua.
 *
 * A token is a byte string. Byte-level BPE (as GPT-2's) starts from the 256 one-byte
 * tokens; merge r joins tokens (merge_a[r], merge_b[r]) into merge_out[r], and a lower
 * rank merges first. Added tokens (special or not) are matched in the text before
 * pre-tokenization (tokenizer.json: see the pipeline below) and are never produced by merges,
 * unless the vocab holds them too. A sentencepiece-style tokenizer.json (not byte-level) starts
 * from characters instead of bytes, with <0xXX> byte tokens for the others (byte_fallback). The char-level tokenizer has one
 * token per code point of its corpus (sorted), and one per byte that is not valid UTF-8. */
#ifndef LUTRA_TOKENIZER_H
#define LUTRA_TOKENIZER_H
#include "core/internal.h"
#include <stdint.h>

enum { LT_TOK_BPE = 0, LT_TOK_CHAR = 1 };
/* How a segment of text (between added tokens) splits into words before BPE. */
enum { LT_PRETOK_GPT2 = 0, LT_PRETOK_NONE = 1, LT_PRETOK_CL100K = 2, LT_PRETOK_QWEN2 = 3, LT_TOK_NUM_PATTERNS = 4 };
enum { LT_CLASS_OTHER = 0, LT_CLASS_LETTER = 1, LT_CLASS_NUMBER = 2, LT_CLASS_SPACE = 3 };
/* Token flags. */
enum { LT_TOKF_ADDED = 1, LT_TOKF_SPECIAL = 2, LT_TOKF_UNUSED = 4 };
/* A byte that is not part of valid UTF-8 decodes to this + byte. */
enum { LT_TOK_RAW_BYTE = 0x110000 };
/* Words longer than this are not cached, and merge with a heap rather than by scans. */
enum { LT_TOK_CACHE_MAX_WORD = 128 };

/* ---- unicode and pre-tokenization (tok/pretok.c, tok/unicode.c) ----- */

int lt_tok_unicode_class(uint32_t cp); /* cp >= 0x80 */
/* Decodes the code point at s[0..n), n >= 1: returns its length (1..4). Invalid or
 * truncated UTF-8 (overlongs and surrogates included) gives 1 and LT_TOK_RAW_BYTE + s[0]. */
int lt_tok_utf8_decode(const uint8_t *s, int64_t n, uint32_t *cp);
/* Writes cp as UTF-8 (a raw byte as itself); returns the length. */
int lt_tok_utf8_encode(uint32_t cp, uint8_t *out);
/* End of the GPT-2 pre-token that starts at s[pos], pos < n. */
int64_t lt_tok_gpt2_next(const uint8_t *s, int64_t n, int64_t pos);
/* The same for the Llama 3 / cl100k pattern (max_digits 3) and Qwen2's (max_digits 1). */
int64_t lt_tok_cl100k_next(const uint8_t *s, int64_t n, int64_t pos, int max_digits);
/* The regex of each mode as tokenizer.json writes it (NULL for NONE). */
extern const char *const lt_tok_patterns[LT_TOK_NUM_PATTERNS];
/* The same for the tokenizer's pre-tokenizer mode (LT_PRETOK_*, not NONE). */
static inline int64_t lt_tok_next_word(int pretok, const uint8_t *s, int64_t n, int64_t pos) {
  return pretok == LT_PRETOK_GPT2 ? lt_tok_gpt2_next(s, n, pos)
                                  : lt_tok_cl100k_next(s, n, pos, pretok == LT_PRETOK_CL100K ? 3 : 1);
}
/* GPT-2's byte <-> unicode mapping that makes every byte a printable character. */
uint32_t lt_tok_byte_to_unicode(uint8_t b);
int lt_tok_unicode_to_byte(uint32_t cp); /* -1 if cp is not in the image */

/* ---- hash maps (tok/map.c) ----------------------------------------------- */

uint64_t lt_tok_hash(const uint8_t *s, int64_t n);

/* Byte string -> int64 value. Keys are copied into an arena. */
typedef struct lt_tok_strmap {
  int32_t *slots; /* entry + 1, 0 = empty; capacity mask + 1 */
  int64_t mask;
  uint64_t *hash; /* per entry */
  int64_t *key_off, *value;
  int32_t *key_len;
  int64_t n, cap;
  uint8_t *arena;
  int64_t arena_len, arena_cap;
} lt_tok_strmap;
int64_t lt_tok_strmap_find(const lt_tok_strmap *m, const uint8_t *key, int64_t len, uint64_t h); /* entry or -1 */
int64_t lt_tok_strmap_add(lt_tok_strmap *m, const uint8_t *key, int64_t len, uint64_t h, int64_t value); /* -1: OOM */
void lt_tok_strmap_clear(lt_tok_strmap *m);
void lt_tok_strmap_free(lt_tok_strmap *m);
static inline const uint8_t *lt_tok_strmap_key(const lt_tok_strmap *m, int64_t e) { return m->arena + m->key_off[e]; }

/* (a, b) id pair -> int32 value. */
typedef struct lt_tok_pairmap {
  uint64_t *keys; /* UINT64_MAX = empty */
  int32_t *vals;
  int64_t mask, n;
} lt_tok_pairmap;
static inline uint64_t lt_tok_pair(int32_t a, int32_t b) { return ((uint64_t)(uint32_t)a << 32) | (uint32_t)b; }
int32_t lt_tok_pairmap_get(const lt_tok_pairmap *m, uint64_t key);    /* -1 if absent */
int lt_tok_pairmap_put(lt_tok_pairmap *m, uint64_t key, int32_t val); /* 0, -1: OOM */
void lt_tok_pairmap_free(lt_tok_pairmap *m);

/* ---- the tokenizer ----------------------------------------------------------------- */

typedef struct lt_tok_added {
  int32_t id;
  uint8_t special, lstrip, rstrip, normalized, single_word;
} lt_tok_added;

/* ---- the pipeline of a tokenizer.json (tok/pipeline.c, tok/normalize.c, tok/decode.c) --------
 * Text passes: added tokens (those not normalized, in the raw text) -> normalizers -> added
 * tokens (normalized ones, in the normalized text) -> pre-tokenizers -> the BPE model -> the
 * post-processors. Each stage keeps, for every byte of its text, the byte range of the original
 * text it came from (Hugging Face's alignments), which gives each token its offsets. */
enum { LT_NORM_NFC, LT_NORM_NFD, LT_NORM_NFKC, LT_NORM_NFKD, LT_NORM_LOWERCASE, LT_NORM_PREPEND, LT_NORM_REPLACE,
       LT_NORM_STRIP };
enum { LT_PRE_SPLIT, LT_PRE_BYTELEVEL, LT_PRE_METASPACE, LT_PRE_DIGITS };
enum { LT_DEC_BYTELEVEL, LT_DEC_REPLACE, LT_DEC_BYTEFALLBACK, LT_DEC_FUSE, LT_DEC_STRIP, LT_DEC_METASPACE };
enum { LT_POST_BYTELEVEL, LT_POST_TEMPLATE };
enum { LT_PREPEND_ALWAYS, LT_PREPEND_FIRST, LT_PREPEND_NEVER };
/* One step of a stage. Strings are owned (malloc'ed, NUL-terminated UTF-8).
 *   NORM: PREPEND s1; REPLACE s1 -> s2; STRIP a = left, b = right.
 *   PRE: SPLIT a = LT_PRETOK_* mode; BYTELEVEL a = add_prefix_space, b = use_regex; DIGITS a = individual;
 *        METASPACE s1 = replacement, a = prepend scheme, b = split.
 *   DEC: REPLACE s1 -> s2; STRIP s1 = content, a = start, b = stop; METASPACE s1, a = scheme.
 *   POST: BYTELEVEL a = trim_offsets, b = add_prefix_space; TEMPLATE: tok->single/pair. */
typedef struct lt_tok_step {
  int kind, a, b;
  char *s1, *s2;
} lt_tok_step;
/* A template: items in order; an item is the sequence A (-1), B (-2) or a run of special ids
 * ids[first .. first + count). */
typedef struct lt_tok_template {
  int32_t n, *seq, *first, *count;
} lt_tok_template;

struct lt_tokenizer {
  int kind; /* LT_TOK_BPE or LT_TOK_CHAR */
  /* tokens 0..vocab_size-1: bytes tok_data[tok_off[i] .. tok_off[i+1]) */
  int32_t vocab_size, tok_cap;
  int64_t *tok_off;
  uint8_t *tok_flags;
  uint8_t *tok_data;
  int64_t data_cap;
  lt_tok_strmap tok_index; /* bytes -> id of the first token (not added) with them */
  int32_t byte_id[256];    /* id of each one-byte token, -1 if none */
  /* bpe */
  int32_t n_merges, merge_cap;
  int32_t *merge_a, *merge_b, *merge_out;
  lt_tok_pairmap merge_rank; /* (a, b) -> rank */
  int pretok, ignore_merges;
  int add_prefix_space; /* 1: a space before each segment that lacks one; 2: before each word */
  int32_t unk_id;       /* -1: a byte without a token is an error */
  /* added tokens, in the order added; added_order sorts them by (first byte, length desc) */
  int32_t n_added, added_cap;
  lt_tok_added *added;
  int32_t *added_order;
  int32_t added_first[257]; /* added_order[added_first[c] .. added_first[c+1]) start with byte c */
  /* char: sorted code points, token i is chars[i] */
  int32_t n_chars;
  uint32_t *chars;
  int32_t ascii_id[128];
  /* the pipeline: a classic tokenizer (byte-level, no normalizer, pretok/add_prefix_space
   * above, nothing added by post-processing) has no steps and takes the fast path */
  int classic, byte_level;  /* byte_level: vocab keys are GPT-2 byte-level strings, symbols are bytes */
  int byte_fallback, fuse_unk;
  int32_t fallback_id[256]; /* id of the token <0xXX> of each byte, -1 if none */
  int n_norm, n_pre, n_dec, n_post, has_decoder;
  lt_tok_step *norm, *pre, *dec, *post;
  lt_tok_template single, pair;
  int32_t *template_ids, n_template_ids;
  /* added tokens matched in the normalized text (normalized = true), by their normalized text */
  uint8_t *norm_added_data;
  int64_t *norm_added_off; /* n_added + 1 offsets into norm_added_data (empty: not in set 1) */
  int32_t *norm_order, norm_first[257]; /* as added_order/added_first, over the normalized texts */
  int32_t *added_of_id, n_added_of_id; /* id -> its index in added, -1 if none, for ids below n_added_of_id (set
                                          with norm_order: decode takes the normalized text) */
  /* the parts of the tokenizer.json this came from, written back by save (NULL: lutra's own) */
  char *json_normalizer, *json_pre_tokenizer, *json_post_processor, *json_decoder;
  /* encode cache: word bytes -> (offset into cache_ids) * 256 + count */
  lt_tok_strmap cache;
  int32_t *cache_ids;
  int64_t cache_len, cache_cap;
};

/* Growable id output: writes while n < cap; grows when owned, else only counts. */
typedef struct lt_tok_out {
  int32_t *ids;
  int64_t n, cap;
  int owned;
} lt_tok_out;
int lt_tok_out_grow(lt_tok_out *o);
static inline int lt_tok_push(lt_tok_out *o, int32_t id) {
  if (o->n >= o->cap && o->owned && lt_tok_out_grow(o)) return -1;
  if (o->n < o->cap) o->ids[o->n] = id;
  o->n++;
  return 0;
}

/* Growable pairs of int64 (byte ranges). */
typedef struct lt_tok_spans {
  int64_t *v; /* 2 per entry */
  int64_t n, cap;
} lt_tok_spans;
int lt_tok_spans_push(lt_tok_spans *s, int64_t a, int64_t b);

/* A string being normalized: bytes b[0..n) and, per byte, the original byte range [a0, a1). */
typedef struct lt_tok_nstr {
  uint8_t *b;
  int64_t *a0, *a1;
  int64_t n, cap;
} lt_tok_nstr;
int lt_tok_nstr_reserve(lt_tok_nstr *s, int64_t cap);
/* Appends bytes p[0..len) all aligned to [a0, a1). */
int lt_tok_nstr_put(lt_tok_nstr *s, const uint8_t *p, int64_t len, int64_t a0, int64_t a1);
void lt_tok_nstr_free(lt_tok_nstr *s);
int lt_tok_is_space_cp(uint32_t cp); /* White_Space */

/* tok/bpe.c */
lt_tokenizer *lt_tok_alloc(int kind); /* empty, NULL with error on OOM */
/* Appends a token (id = vocab_size); indexes it by bytes unless flags has LT_TOKF_ADDED. */
int lt_tok_append(lt_tokenizer *tok, const uint8_t *bytes, int64_t len, int flags);
int lt_tok_add_merge(lt_tokenizer *tok, int32_t a, int32_t b, int32_t out);
/* Registers token id as added (it must exist with flags LT_TOKF_ADDED). */
int lt_tok_register_added(lt_tokenizer *tok, int32_t id, const lt_tok_added *spec);
/* Adds each special token (NULL-checked, UTF-8, non-empty); errors name op. */
int lt_tok_add_specials(const char *op, lt_tokenizer *tok, const char *const *special_tokens, int32_t num_special);
int32_t lt_tok_find(const lt_tokenizer *tok, const uint8_t *bytes, int64_t len); /* -1 if none */
static inline const uint8_t *lt_tok_bytes(const lt_tokenizer *tok, int32_t id, int64_t *len) {
  *len = tok->tok_off[id + 1] - tok->tok_off[id];
  return tok->tok_data + tok->tok_off[id];
}
/* Finds the first added token in text[pos..n) (special ones only if allow_special):
 * returns 1 with the span [*start, *end) it covers (lstrip/rstrip whitespace included)
 * and its id, or 0. */
int lt_tok_match_added(const lt_tokenizer *tok, const uint8_t *text, int64_t pos, int64_t n, int allow_special,
                       int64_t *start, int64_t *end, int32_t *id);
/* The same over one of the two sets of the pipeline: set 0 the added tokens matched in the raw
 * text (normalized = false; all for a tokenizer without set 1), set 1 the others by their
 * normalized text. As Hugging Face's (leftmost-longest), a match refused (a special token when
 * !allow_special, single_word inside a word) is skipped whole. */
int lt_tok_match_added_set(const lt_tokenizer *tok, int set, const uint8_t *text, int64_t pos, int64_t n,
                           int allow_special, int64_t *start, int64_t *end, int32_t *id);
int lt_tok_encode_into(lt_tokenizer *tok, const uint8_t *text, int64_t len, int allow_special, lt_tok_out *out);
/* Appends the ids of word w[0..n) (n >= 1, pre-tokenized) to out; with spans, also each
 * id's byte range [spans[2k], spans[2k+1]) inside the word (spans grows with out). */
int lt_tok_encode_word(lt_tokenizer *tok, const uint8_t *w, int64_t n, lt_tok_out *out, lt_tok_spans *spans);
/* tok/pipeline.c: the whole pipeline over text (and pair, when not NULL: a pair of sequences);
 * offsets (may be NULL) get each id's byte range of its own text. */
int lt_tok_encode_full(lt_tokenizer *tok, const uint8_t *text, int64_t len, const uint8_t *pair, int64_t pair_len,
                       int flags, lt_tok_out *out, lt_tok_spans *offsets);
/* tok/normalize.c: applies tok's normalizers to s in place (its alignments follow). */
int lt_tok_normalize(const lt_tokenizer *tok, lt_tok_nstr *s);
/* tok/decode.c: the decoders over the tokens of ids, into a malloc'ed buffer. */
int lt_tok_decode_chain(const lt_tokenizer *tok, const int32_t *ids, int64_t n, int skip_special, uint8_t **out,
                        int64_t *len);
/* tok/hf_pipeline.c: the normalizer, pre_tokenizer and decoder of a tokenizer.json (before
 * its vocab: they say how to read it), then its post_processor and what needs the vocab. */
struct cJSON;
int lt_tok_parse_pipeline(lt_tokenizer *tok, const struct cJSON *root);
int lt_tok_finish_pipeline(lt_tokenizer *tok, const struct cJSON *root);
/* tok/train.c: reads a whole file into *data (malloc'ed, NUL-terminated) */
int lt_tok_read_file(const char *op, const char *path, char **data, int64_t *len);
/* tok/char.c */
int lt_tok_char_encode_segment(const lt_tokenizer *tok, const uint8_t *text, int64_t len, int64_t base,
                               lt_tok_out *out);
int lt_tok_char_build(lt_tokenizer *tok, const uint32_t *sorted_cps, int32_t n);

#endif
