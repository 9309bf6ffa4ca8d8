/* fuzz_tokenizer.c — libFuzzer harness for tokenizer.json (host/tok/hf_json.c, hf_pipeline.c with
 * the tokenizer core they build on: tok/bpe.c, map.c, unicode.c, pretok.c, char.c, encode.c,
 * pipeline.c, normalize.c, decode.c, api.c, save.c; cJSON, utf8proc),
 * compiled with -fsanitize=fuzzer,address,undefined. Each input is a tokenizer.json text (not
 * NUL-terminated: the length is honoured). Loading gives either an error that starts with
 * "tokenizer.json: " and no tokenizer, or a tokenizer that
 * - encodes a few texts to ids inside its vocabulary and decodes them back to the same bytes
 *   where the file makes encoding lossless (no prefix space, no unk token, no added token that
 *   strips whitespace, no normalizer, decoder or post-processor that changes the text), and
 *   gives offsets inside the text;
 * - saves to a file that loads again with the same fingerprint (the same ids for every text).
 * Never a crash, a leak or a read out of bounds. */
#include "tok/tokenizer.h"
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The tokenizer core's dependencies on the rest of lutra: errors, files and tensors. */
static char last_error[1024];
int lt_errorf(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_error, sizeof last_error, fmt, ap);
  va_end(ap);
  return -1;
}
const char *lt_last_error(void) { return last_error; }
int lt_tok_read_file(const char *op, const char *path, char **data, int64_t *len) {
  *data = NULL, *len = 0;
  FILE *f = fopen(path, "rb");
  if (!f) return lt_errorf("%s: cannot open '%s'", op, path);
  char *buf = NULL;
  size_t n = 0, cap = 0, got;
  do {
    if (n + 4096 > cap) {
      char *b = realloc(buf, cap = 2 * cap + 4096);
      if (!b) abort();
      buf = b;
    }
    got = fread(buf + n, 1, cap - n - 1, f);
    n += got;
  } while (got > 0);
  fclose(f);
  buf[n] = 0;
  *data = buf, *len = (int64_t)n;
  return 0;
}
int lt_prepare_out(const char *op, lt_tensor *out, int ndim, const int64_t *shape, int dtype, int device) {
  (void)op, (void)out, (void)ndim, (void)shape, (void)dtype, (void)device;
  return lt_errorf("fuzz: no tensors");
}
int lt_copy_from_buffer(lt_tensor *dst, const void *src, int src_dtype, int64_t count) {
  (void)dst, (void)src, (void)src_dtype, (void)count;
  return lt_errorf("fuzz: no tensors");
}

static const char *const texts[] = {"Hello world, caf\xC3\xA9!", "  a  b\n\n12345 <|endoftext|>x", "\xFF\xFE\x00z",
                                    "ab ab abab", ""};
static const int64_t text_len[] = {18, 27, 4, 10, 0};

static int lossless(const lt_tokenizer *tok) {
  if (tok->kind != LT_TOK_BPE) return 0; /* a char tokenizer has no id for a character it never saw */
  if (tok->add_prefix_space || tok->unk_id >= 0 || !tok->classic || tok->n_dec) return 0;
  for (int32_t k = 0; k < tok->n_added; k++)
    if (tok->added[k].lstrip || tok->added[k].rstrip) return 0;
  return 1;
}

static void exercise(lt_tokenizer *tok) {
  int32_t ids[256];
  for (size_t t = 0; t < sizeof texts / sizeof *texts; t++) {
    int64_t n = 0, len = 0;
    if (lt_tokenizer_encode(tok, texts[t], text_len[t], 1, ids, 256, &n) != 0) continue; /* a byte without a token */
    if (n < 0 || n > 256) abort();
    for (int64_t i = 0; i < n; i++)
      if (ids[i] < 0 || ids[i] >= tok->vocab_size) abort();
    if (lt_tokenizer_decode(tok, ids, n, NULL, 0, &len) != 0) abort(); /* ids from encode decode */
    char *back = malloc((size_t)(len ? len : 1)); /* decoders may make more text than 4 bytes an id */
    if (!back || lt_tokenizer_decode(tok, ids, n, back, len, &len) != 0) abort();
    if (lossless(tok) && (len != text_len[t] || memcmp(back, texts[t], (size_t)len) != 0)) abort();
    free(back);
    int64_t starts[256], ends[256], m = 0;
    int32_t ids2[256];
    if (lt_tokenizer_encode_offsets(tok, texts[t], text_len[t], 1, ids2, starts, ends, 256, &m) != 0) continue;
    if (m != n || memcmp(ids, ids2, (size_t)n * sizeof *ids) != 0) abort(); /* the same ids with offsets */
    for (int64_t i = 0; i < m; i++)
      if (starts[i] < 0 || starts[i] > ends[i] || ends[i] > text_len[t]) abort();
  }
}

static char path[64];
static void remove_file(void) { remove(path); }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *copy = malloc(size ? size : 1); /* exactly size bytes: ASan catches a read past the end */
  if (size) memcpy(copy, data, size);
  lt_tokenizer *tok = (lt_tokenizer *)1;
  int rc = lt_tokenizer_load_json(&tok, copy, (int64_t)size);
  free(copy);
  if (rc != 0) {
    if (tok != NULL || strncmp(last_error, "tokenizer.json: ", 16) != 0) abort();
    return 0;
  }
  if (!tok) abort();
  exercise(tok);
  if (!path[0]) {
    snprintf(path, sizeof path, "/tmp/fuzz_tokenizer_%d.json", (int)getpid());
    atexit(remove_file);
  }
  uint64_t fp = 0, fp2 = 1;
  if (lt_tokenizer_save(tok, path) != 0 || lt_tokenizer_fingerprint(tok, &fp) != 0) abort();
  lt_tokenizer *again = NULL;
  if (lt_tokenizer_load(&again, path) != 0) {
    fprintf(stderr, "fuzz_tokenizer: a saved tokenizer does not load: %s\n", last_error);
    abort();
  }
  if (lt_tokenizer_fingerprint(again, &fp2) != 0 || fp != fp2 || again->vocab_size != tok->vocab_size) abort();
  lt_tokenizer_free(again);
  lt_tokenizer_free(tok);
  return 0;
}
