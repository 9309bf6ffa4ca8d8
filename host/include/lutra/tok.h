/* tok.h — the C API, part: tokenizers and token files.
 * Include lutra.h, which includes every part in order (and cmake/gen_cdef.awk follows the
 * same order into the one ffi.cdef text); the conventions are at the head of lutra.h. */
#ifndef LUTRA_TOK_H
#define LUTRA_TOK_H

/* ---- tokenizer -------------------------------------------------------------------
 * An opaque handle: byte-level BPE (as GPT-2's) or char-level. Token ids are int32,
 * 0 .. vocab_size-1. Decoding any encoding gives back the text byte for byte (any bytes:
 * NUL, invalid UTF-8). Special tokens are matched in the text before pre-tokenization
 * when allow_special != 0 and decode to their text; merges never produce them. A handle
 * is not safe for concurrent calls (encode keeps a cache of words).
 * special_tokens: num_special NUL-terminated UTF-8 strings (may be NULL when 0). */
typedef struct lt_tokenizer lt_tokenizer;

/* BPE trained on text (len bytes) to vocab_size tokens in all: the 256 bytes, the merges,
 * then the special tokens. Fewer when the corpus runs out of pairs. Deterministic: the
 * most frequent pair merges first, ties to the smallest (left id, right id). */
int lt_tokenizer_train_bpe(lt_tokenizer **out, const char *text, int64_t len, int32_t vocab_size,
                           const char *const *special_tokens, int32_t num_special);
int lt_tokenizer_train_bpe_file(lt_tokenizer **out, const char *path, int32_t vocab_size,
                                const char *const *special_tokens, int32_t num_special);
/* Char-level: one token per distinct code point of text in code point order (as Python's
 * sorted(set(text))), then one per byte that is not valid UTF-8, then the special tokens. */
int lt_tokenizer_new_char(lt_tokenizer **out, const char *text, int64_t len, const char *const *special_tokens,
                          int32_t num_special);
/* Hugging Face tokenizer.json (a BPE model and the pipeline around it: normalizers NFC, NFD,
 * NFKC, NFKD, Lowercase, Prepend, Replace, Strip; pre-tokenizers ByteLevel, Split with the
 * regexes of GPT-2, Llama 3 and Qwen2, Metaspace; byte_fallback and unk tokens; decoders
 * ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace; post-processors ByteLevel and
 * TemplateProcessing; each in a Sequence), or lutra's own JSON for char tokenizers. Truncation
 * and padding are ignored; anything else is an error naming its JSON path. */
int lt_tokenizer_load(lt_tokenizer **out, const char *path);
int lt_tokenizer_load_json(lt_tokenizer **out, const char *json, int64_t len);
int lt_tokenizer_save(const lt_tokenizer *tok, const char *path);
int lt_tokenizer_free(lt_tokenizer *tok); /* NULL is ok */

int lt_tokenizer_vocab_size(const lt_tokenizer *tok);
const char *lt_tokenizer_kind_name(const lt_tokenizer *tok); /* "bpe" or "char" */
/* Flags of encoding: LT_TOK_ALLOW_SPECIAL matches special tokens in the text (else they are
 * plain text); LT_TOK_NO_ADD_SPECIAL leaves out the special tokens a post-processor adds
 * (TemplateProcessing's BOS), which Hugging Face's encode(text) adds by default.
 * LT_TOK_SKIP_SPECIAL (decode_flags) leaves special tokens out of the text. */
enum { LT_TOK_ALLOW_SPECIAL = 1, LT_TOK_NO_ADD_SPECIAL = 2, LT_TOK_SKIP_SPECIAL = 4 };
/* Writes the ids of text into ids[0 .. capacity) and their number to *count. Fails when
 * capacity is too small (*count still gets the number needed: call again with that much).
 * Errors on a character (char) or byte (bpe, no unk token or byte fallback) not in the vocab. */
int lt_tokenizer_encode(lt_tokenizer *tok, const char *text, int64_t len, int flags, int32_t *ids,
                        int64_t capacity, int64_t *count);
/* The same, with each id's offsets: the half-open byte range [starts[i], ends[i]) of text it
 * came from (0-based), as Hugging Face's encoding offsets in bytes. A token that covers part of
 * a UTF-8 character (a byte-level token, a <0xXX> byte fallback) gets the whole character; a
 * token whose text a normalizer made (NFC's "é" from "e" + U+0301) gets the range of the first
 * original character it replaced; an added token in the text gets its match with the spaces
 * lstrip/rstrip took; a special token added by a post-processor gets [0, 0). ByteLevel's
 * trim_offsets leaves a token's leading and trailing spaces out. */
int lt_tokenizer_encode_offsets(lt_tokenizer *tok, const char *text, int64_t len, int flags, int32_t *ids,
                                int64_t *starts, int64_t *ends, int64_t capacity, int64_t *count);
/* A pair of sequences (Hugging Face's encode(text, pair)): text's ids, then pair's, with the
 * post-processor's special tokens around them (TemplateProcessing's pair template). starts and
 * ends may both be NULL; each id's offsets index its own text (text's or pair's). */
int lt_tokenizer_encode_pair(lt_tokenizer *tok, const char *text, int64_t len, const char *pair, int64_t pair_len,
                             int flags, int32_t *ids, int64_t *starts, int64_t *ends, int64_t capacity, int64_t *count);
/* The same into out: a 1-d i32 tensor of the ids (the `out` convention applies). */
int lt_tokenizer_encode_tensor(lt_tensor *out, lt_tokenizer *tok, const char *text, int64_t len, int flags);
/* Writes the text of ids into buf[0 .. capacity) and their number to *len. buf may be
 * NULL with capacity 0 to get the length only; otherwise a short buf is an error. A
 * byte-level tokenizer gives the tokens' bytes (whatever they are); one with decoders runs
 * them as Hugging Face's decode(ids, skip_special_tokens=False). */
int lt_tokenizer_decode(const lt_tokenizer *tok, const int32_t *ids, int64_t n, char *buf, int64_t capacity,
                        int64_t *len);
/* The same with flags: LT_TOK_SKIP_SPECIAL as Hugging Face's decode(ids, skip_special_tokens=True). */
int lt_tokenizer_decode_flags(const lt_tokenizer *tok, const int32_t *ids, int64_t n, int flags, char *buf,
                              int64_t capacity, int64_t *len);
/* The bytes of one token (valid while tok lives and no token is added). */
int lt_tokenizer_token(const lt_tokenizer *tok, int32_t id, const char **bytes, int64_t *len);
/* The id of the token with exactly these bytes (special tokens included), -1 if none. */
int lt_tokenizer_token_id(const lt_tokenizer *tok, const char *bytes, int64_t len, int32_t *id);
int lt_tokenizer_is_special(const lt_tokenizer *tok, int32_t id); /* 1 or 0 (also for bad ids) */
/* Adds a special token (or returns the id of the one with this text). */
int lt_tokenizer_add_special(lt_tokenizer *tok, const char *text, int32_t *id);
int lt_tokenizer_num_merges(const lt_tokenizer *tok);
/* Merge `rank`: tokens a and b join into token out. */
int lt_tokenizer_merge(const lt_tokenizer *tok, int32_t rank, int32_t *a, int32_t *b, int32_t *out);
/* A hash of everything that decides the ids (tokens, merges, added tokens, options). */
int lt_tokenizer_fingerprint(const lt_tokenizer *tok, uint64_t *out);

/* ---- token files ---------------------------------------------------------------
 * A corpus tokenized once (host/io/tokfile.c): a 128-byte little-endian header, then
 * `count` tokens of `token_bytes` each (u16 when vocab_size <= 65536, else u32):
 *   0 "LUTRATOK"  8 u32 version (1)  12 u32 token_bytes  16 u64 count  24 u64 vocab_size
 *   32 u64 tokenizer_hash  40 u64 tokens_hash (FNV-1a 64 of the token bytes)
 *   48 u64 source_bytes  56 u64 source_hash (FNV-1a 64 of the text)  64 i64 source_mtime_ns
 *   72..128 zeros (reserved: a header with other bytes there is refused). The file size
 *   is exactly 128 + count * token_bytes.
 * Writing streams (open, append any number of times, finish) into a temporary file beside
 * the path (lt_atomic_file_*: created exclusively, never through a link) that finish fsyncs
 * and renames into place, so a reader never sees a partial file. Reading maps the
 * file (read-only, MAP_SHARED) after validating the header; errors name the file. */

typedef struct lt_tokfile_info {
  uint32_t version;
  uint32_t token_bytes;
  int64_t count;
  int64_t vocab_size;
  uint64_t tokenizer_hash;
  uint64_t tokens_hash;
  int64_t source_bytes;
  uint64_t source_hash;
  int64_t source_mtime_ns;
} lt_tokfile_info;

typedef struct lt_tokwriter lt_tokwriter; /* opaque */
typedef struct lt_tokfile lt_tokfile;     /* opaque: a mapped token file */

int lt_tokwriter_open(lt_tokwriter **out, const char *path, int64_t vocab_size, uint64_t tokenizer_hash);
/* ids: count values of ids_dtype (LT_I32 or LT_I64), each in [0, vocab_size). */
int lt_tokwriter_append(lt_tokwriter *w, const void *ids, int ids_dtype, int64_t count);
/* Both end the writer and free it: finish writes the header and renames the file into
 * place; abort removes the temporary file (NULL is ok). */
int lt_tokwriter_finish(lt_tokwriter *w, int64_t source_bytes, uint64_t source_hash, int64_t source_mtime_ns);
int lt_tokwriter_abort(lt_tokwriter *w);

int lt_tokfile_open(lt_tokfile **out, const char *path);
int lt_tokfile_close(lt_tokfile *f); /* NULL is ok */
int lt_tokfile_get_info(const lt_tokfile *f, lt_tokfile_info *info);
/* Reads and validates the header of the file at path, as open does, without mapping it. */
int lt_tokfile_read_header(const char *path, lt_tokfile_info *info);
/* One pass over the tokens: every id must be below vocab_size (the header's when vocab_size
 * is 0 or larger) and the checksum must match the header's; the error names the file and the
 * index and byte offset of the first id out of range. verify is verify_ids(f, 0). */
int lt_tokfile_verify(const lt_tokfile *f);
int lt_tokfile_verify_ids(const lt_tokfile *f, int64_t vocab_size);
/* out (count) = tokens [start, start + count): I64 or I32 (undefined: allocated I64). */
int lt_tokfile_tokens(lt_tensor *out, const lt_tokfile *f, int64_t start, int64_t count);
/* Row b of a batch is the window of T + 1 tokens at starts[b], with 0 <= starts[b] and
 * starts[b] + T + 1 <= count. With y: x (B, T) = tokens[s, s + T) and y (B, T) =
 * tokens[s + 1, s + T + 1) (the next-token targets); with y NULL: x (B, T + 1) holds the
 * whole window. x and y are I64 or I32 (undefined: allocated I64). */
int lt_tokfile_batch(lt_tensor *x, lt_tensor *y, const lt_tokfile *f, const int64_t *starts, int64_t batch,
                     int64_t seq_len);

/* FNV-1a 64 of nbytes at data, continuing from *hash (start from 0xcbf29ce484222325). */
int lt_hash64(const void *data, int64_t nbytes, uint64_t *hash);
/* Size in bytes and modification time (ns since the epoch) of the file at path. */
int lt_file_stat(const char *path, int64_t *size, int64_t *mtime_ns);

#endif
