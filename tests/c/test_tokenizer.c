/* test_tokenizer.c — byte-level BPE: UTF-8 and the GPT-2 pre-tokenizer against hand-written
 * splits, training against a brute-force BPE (full recount every merge), encoding against a
 * naive merge loop, round trips of arbitrary bytes, special tokens, the char tokenizer and
 * bad arguments. JSON load/save and the Hugging Face fixtures: test_tokenizer_json.c. */
#include "check.h"
#include "tok/tokenizer.h"
#include <stdlib.h>

// ---- UTF-8, byte <-> unicode, pre-tokenizer ------------------------------------------------

static void test_utf8(void) {
  static const struct {
    const char *s;
    int len;
    uint32_t cp;
  } cases[] = {
      {"A", 1, 'A'},
      {"\xC3\xA9", 2, 0xE9},
      {"\xE4\xB8\xAD", 3, 0x4E2D},
      {"\xF0\x9F\x99\x82", 4, 0x1F642},
      {"\xC0\x80", 1, LT_TOK_RAW_BYTE + 0xC0},         // overlong NUL
      {"\xE0\x80\xAF", 1, LT_TOK_RAW_BYTE + 0xE0},     // overlong '/'
      {"\xED\xA0\x80", 1, LT_TOK_RAW_BYTE + 0xED},     // surrogate
      {"\xF4\x90\x80\x80", 1, LT_TOK_RAW_BYTE + 0xF4}, // > U+10FFFF
      {"\xE2\x82", 1, LT_TOK_RAW_BYTE + 0xE2},         // truncated
      {"\x80", 1, LT_TOK_RAW_BYTE + 0x80},             // lone continuation
      {"\xFF", 1, LT_TOK_RAW_BYTE + 0xFF},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    uint32_t cp;
    int len = lt_tok_utf8_decode((const uint8_t *)cases[i].s, (int64_t)strlen(cases[i].s), &cp);
    CHECK(len == cases[i].len && cp == cases[i].cp, "case %zu: len %d cp %X", i, len, cp);
    uint8_t buf[4];
    int n = lt_tok_utf8_encode(cp, buf);
    CHECK(n == len && memcmp(buf, cases[i].s, (size_t)n) == 0, "encode case %zu", i);
  }
  // byte <-> unicode: a bijection onto printable characters, as GPT-2's (space is U+0120 'Ġ')
  int seen[512] = {0}, ok = 1;
  for (int b = 0; b < 256; b++) {
    uint32_t cp = lt_tok_byte_to_unicode((uint8_t)b);
    ok &= cp < 512 && !seen[cp] && lt_tok_unicode_to_byte(cp) == b;
    if (cp < 512) seen[cp] = 1;
  }
  CHECK(ok, "byte_to_unicode is not a bijection");
  CHECK(lt_tok_byte_to_unicode(' ') == 0x120 && lt_tok_byte_to_unicode('\n') == 0x10A &&
            lt_tok_byte_to_unicode('A') == 'A' && lt_tok_byte_to_unicode(0xAD) == 0x143,
        "GPT-2's mapping");
  CHECK(lt_tok_unicode_to_byte(' ') == -1 && lt_tok_unicode_to_byte(0x144) == -1, "outside the image");
}

// Splits text with the pre-tokenizer into "|"-separated words.
static void split_words(const char *text, char *out) {
  int64_t n = (int64_t)strlen(text), m = 0;
  for (int64_t pos = 0, end; pos < n; pos = end) {
    end = lt_tok_gpt2_next((const uint8_t *)text, n, pos);
    if (end <= pos) {
      strcpy(out + m, "<stuck>");
      return;
    }
    if (pos) out[m++] = '|';
    memcpy(out + m, text + pos, (size_t)(end - pos));
    m += end - pos;
  }
  out[m] = 0;
}

static void test_pretokenize(void) {
  static const char *const cases[][2] = {
      {"Hello world", "Hello| world"},
      {"we're sure it's 'S 'll'd", "we|'re| sure| it|'s| '|S| '|ll|'d"},
      {"a  b   c", "a| | b|  | c"},
      {"end   ", "end|   "},
      {"x\n\ny", "x|\n|\n|y"}, // \s+(?!\S) backs off one character, then \s+ takes it
      {"x \n y", "x| \n| y"},
      {"  \nz", "  |\n|z"},
      {"tab\tx", "tab|\t|x"},
      {"abc123 456def", "abc|123| 456|def"},
      {"hi!!! ?? (x)", "hi|!!!| ??| (|x|)"},
      {"caf\xC3\xA9 na\xC3\xAFve", "caf\xC3\xA9| na\xC3\xAFve"},                                   // é, ï are letters
      {"\xE4\xB8\xAD\xE6\x96\x87 \xD9\xA1\xD9\xA2", "\xE4\xB8\xAD\xE6\x96\x87| \xD9\xA1\xD9\xA2"}, // CJK, Arabic digits
      {"a\xC2\xA0"
       "b",
       "a|\xC2\xA0|b"}, // NBSP is whitespace
      {"a\xE3\x80\x80\xE3\x80\x80"
       "b",
       "a|\xE3\x80\x80|\xE3\x80\x80|b"},          // U+3000: backs off a whole char
      {"x\xFF\xFEy", "x|\xFF\xFE|y"},             // invalid bytes: "other"
      {"\xC2\xBD\xC2\xB2", "\xC2\xBD\xC2\xB2"},   // ½ ² are numbers
      {"\xF0\x9F\x99\x82!", "\xF0\x9F\x99\x82!"}, // emoji + punct: other
  };
  char out[256];
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    split_words(cases[i][0], out);
    CHECK(strcmp(out, cases[i][1]) == 0, "case %zu: got '%s' want '%s'", i, out, cases[i][1]);
  }
  // Llama 3's pattern (cl100k): case-insensitive contractions, one non-letter joins letters, numbers by
  // threes, punctuation takes the newlines after it, whitespace up to its last newline
  static const char *const cl100k[][2] = {
      {"a 1234567", "a| |123|456|7"},
      {"WE'RE x'Ve", "WE|'RE| x|'Ve"},
      {"(word) ((x))", "(word|)| ((|x|))"},
      {"x\n\n  y", "x|\n\n| | y"},
      {" \r\n\r\n  y", " \r\n\r\n| | y"},
      {"hi!\n\nok", "hi|!\n\n|ok"},
      {"\tab", "\tab"},
      {"a'\xC5\xBF"
       "b",
       "a|'\xC5\xBF|b"}, // long s folds to s
  };
  for (size_t i = 0; i < sizeof cl100k / sizeof *cl100k; i++) {
    const char *text = cl100k[i][0];
    int64_t n = (int64_t)strlen(text), m = 0;
    for (int64_t pos = 0, end; pos < n; pos = end) {
      end = lt_tok_cl100k_next((const uint8_t *)text, n, pos, 3);
      if (pos) out[m++] = '|';
      memcpy(out + m, text + pos, (size_t)(end - pos));
      m += end - pos;
    }
    out[m] = 0;
    CHECK(strcmp(out, cl100k[i][1]) == 0, "cl100k case %zu: got '%s' want '%s'", i, out, cl100k[i][1]);
  }
  // any bytes split into words that cover the text exactly
  uint8_t text[2000];
  for (int rep = 0; rep < 20; rep++) {
    int64_t n = check_randint(1, 2000), pos = 0, words = 0, ok = 1;
    for (int64_t i = 0; i < n; i++) text[i] = (uint8_t)check_randint(0, 256);
    while (pos < n && ok) {
      int64_t end = rep % 2 ? lt_tok_gpt2_next(text, n, pos) : lt_tok_cl100k_next(text, n, pos, 1 + rep % 3);
      ok = end > pos && end <= n;
      pos = end, words++;
    }
    CHECK(ok && pos == n, "random bytes rep %d: words do not tile the text", rep);
  }
}

// ---- training against a brute-force BPE ------------------------------------------------------

typedef struct ref_merges {
  int32_t a[1024], b[1024], out[1024];
  int n;
} ref_merges;

// Brute force: every word occurrence separately, all pair counts recounted for every merge.
static void ref_train(const char *text, int64_t len, int32_t vocab, ref_merges *R) {
  int64_t nwords = 0;
  int32_t *sym = malloc((size_t)len * sizeof *sym), *wlen = malloc((size_t)len * sizeof *wlen);
  int64_t *woff = malloc((size_t)len * sizeof *woff);
  for (int64_t pos = 0, end; pos < len; pos = end, nwords++) {
    end = lt_tok_gpt2_next((const uint8_t *)text, len, pos);
    woff[nwords] = pos, wlen[nwords] = (int32_t)(end - pos);
    for (int64_t i = pos; i < end; i++) sym[i] = (uint8_t)text[i];
  }
  uint8_t tokbytes[1024][64];
  int toklen[1024], ntok = 256;
  for (int b = 0; b < 256; b++) tokbytes[b][0] = (uint8_t)b, toklen[b] = 1;
  int64_t *cnt = calloc((size_t)vocab * vocab, sizeof *cnt);
  R->n = 0;
  while (ntok < vocab) {
    memset(cnt, 0, (size_t)vocab * vocab * sizeof *cnt);
    for (int64_t w = 0; w < nwords; w++)
      for (int32_t i = 0; i + 1 < wlen[w]; i++) cnt[sym[woff[w] + i] * vocab + sym[woff[w] + i + 1]]++;
    int64_t best = 0;
    int32_t ba = -1, bb = -1;
    for (int32_t a = 0; a < ntok; a++)
      for (int32_t b = 0; b < ntok; b++)
        if (cnt[a * vocab + b] > best) best = cnt[a * vocab + b], ba = a, bb = b;
    if (best == 0) break;
    uint8_t merged[64];
    int ml = toklen[ba] + toklen[bb], z = -1;
    if (ml > 64) break; // the test corpora stay far below
    memcpy(merged, tokbytes[ba], (size_t)toklen[ba]);
    memcpy(merged + toklen[ba], tokbytes[bb], (size_t)toklen[bb]);
    for (int t = 0; t < ntok && z < 0; t++)
      if (toklen[t] == ml && memcmp(tokbytes[t], merged, (size_t)ml) == 0) z = t;
    if (z < 0) z = ntok, memcpy(tokbytes[ntok], merged, (size_t)ml), toklen[ntok++] = ml;
    int dup = 0;
    for (int r = 0; r < R->n; r++) dup |= R->a[r] == ba && R->b[r] == bb;
    if (!dup) R->a[R->n] = ba, R->b[R->n] = bb, R->out[R->n] = z, R->n++;
    for (int64_t w = 0; w < nwords; w++) {
      int32_t *s = sym + woff[w], m = 0;
      for (int32_t i = 0; i < wlen[w];) {
        if (i + 1 < wlen[w] && s[i] == ba && s[i + 1] == bb)
          s[m++] = z, i += 2;
        else
          s[m++] = s[i++];
      }
      wlen[w] = m;
    }
  }
  free(sym), free(wlen), free(woff), free(cnt);
}

static char *random_corpus(int64_t len, const char *alphabet) {
  char *t = malloc((size_t)len + 1);
  int64_t na = (int64_t)strlen(alphabet);
  for (int64_t i = 0; i < len; i++) t[i] = alphabet[check_randint(0, na)];
  t[len] = 0;
  return t;
}

static void check_against_ref(const char *name, const char *text, int64_t len, int32_t vocab) {
  ref_merges *R = malloc(sizeof *R);
  ref_train(text, len, vocab, R);
  lt_tokenizer *tok = NULL;
  CHECK_OK(lt_tokenizer_train_bpe(&tok, text, len, vocab, NULL, 0));
  if (!tok) return free(R);
  int n = lt_tokenizer_num_merges(tok), same = n == R->n, first_diff = -1;
  for (int r = 0; r < n && r < R->n; r++) {
    int32_t a, b, z;
    lt_tokenizer_merge(tok, r, &a, &b, &z);
    if ((a != R->a[r] || b != R->b[r] || z != R->out[r]) && first_diff < 0) first_diff = r;
  }
  CHECK(same && first_diff < 0, "%s: %d merges vs reference %d, first difference at rank %d", name, n, R->n,
        first_diff);
  lt_tokenizer_free(tok);
  free(R);
}

static void test_train_reference(void) {
  char *t = random_corpus(3000, "aab bc  \n");
  check_against_ref("small alphabet, many ties", t, 3000, 256 + 120);
  free(t);
  t = random_corpus(4000, "aaaa a\n");
  check_against_ref("runs of one letter (overlapping pairs)", t, 4000, 256 + 80);
  free(t);
  const char *words[] = {"the ", "then ", "there ", "th\xC3\xA9 ", "caf\xC3\xA9 ", "12 ", "123 ", "'s ", "it's ", "\n"};
  char *u = malloc(20000);
  int64_t n = 0;
  while (n < 19000) {
    const char *w = words[check_randint(0, 10)];
    memcpy(u + n, w, strlen(w));
    n += (int64_t)strlen(w);
  }
  check_against_ref("words with UTF-8 and contractions", u, n, 256 + 150);
  free(u);
  check_against_ref("empty corpus", "", 0, 300);
  check_against_ref("one byte", "x", 1, 300);
}

static void test_train_determinism(void) {
  char *t = random_corpus(20000, "abcdefgh ij\n'.");
  lt_tokenizer *t1 = NULL, *t2 = NULL, *t3 = NULL;
  CHECK_OK(lt_tokenizer_train_bpe(&t1, t, 20000, 600, NULL, 0));
  CHECK_OK(lt_tokenizer_train_bpe(&t2, t, 20000, 600, NULL, 0));
  char path[] = "/tmp/lutra_test_tokenizer_XXXXXX";
  int fd = mkstemp(path);
  FILE *f = fd >= 0 ? fdopen(fd, "wb") : NULL;
  if (f) fwrite(t, 1, 20000, f), fclose(f);
  CHECK_OK(lt_tokenizer_train_bpe_file(&t3, path, 600, NULL, 0));
  remove(path);
  if (t1 && t2 && t3) {
    int same = lt_tokenizer_num_merges(t1) == lt_tokenizer_num_merges(t2) &&
               lt_tokenizer_num_merges(t1) == lt_tokenizer_num_merges(t3) && lt_tokenizer_vocab_size(t1) == 600;
    for (int r = 0; same && r < lt_tokenizer_num_merges(t1); r++) {
      int32_t a[3], b[3], z[3];
      lt_tokenizer_merge(t1, r, &a[0], &b[0], &z[0]);
      lt_tokenizer_merge(t2, r, &a[1], &b[1], &z[1]);
      lt_tokenizer_merge(t3, r, &a[2], &b[2], &z[2]);
      same = a[0] == a[1] && a[1] == a[2] && b[0] == b[1] && b[1] == b[2] && z[0] == z[1] && z[1] == z[2];
    }
    CHECK(same, "two trainings (buffer, buffer, file) differ");
  }
  lt_tokenizer_free(t1), lt_tokenizer_free(t2), lt_tokenizer_free(t3);
  free(t);
}

// ---- encoding -----------------------------------------------------------------------------

// Naive BPE of one word with the tokenizer's merges: merge the lowest-rank pair, leftmost first.
static int64_t ref_encode_word(const lt_tokenizer *tok, const uint8_t *w, int64_t n, int32_t *out) {
  int64_t m = n;
  for (int64_t i = 0; i < n; i++) out[i] = w[i]; // trained tokenizers have byte b at id b
  int nm = lt_tokenizer_num_merges(tok);
  for (;;) {
    int best = -1;
    int64_t at = -1;
    for (int64_t i = 0; i + 1 < m; i++)
      for (int r = 0; r < nm && (best < 0 || r < best); r++) {
        int32_t a, b, z;
        lt_tokenizer_merge(tok, r, &a, &b, &z);
        if (a == out[i] && b == out[i + 1]) best = r, at = i;
      }
    if (best < 0) return m;
    int32_t a, b, z;
    lt_tokenizer_merge(tok, best, &a, &b, &z);
    out[at] = z;
    memmove(out + at + 1, out + at + 2, (size_t)(m - at - 2) * sizeof *out);
    m--;
  }
}

static int64_t encode_all(lt_tokenizer *tok, const char *text, int64_t len, int allow, int32_t **ids) {
  *ids = malloc((size_t)(len + 1) * sizeof **ids);
  int64_t count = -1;
  if (lt_tokenizer_encode(tok, text, len, allow, *ids, len + 1, &count)) {
    fprintf(stderr, "encode: %s\n", lt_last_error());
    return -1;
  }
  return count;
}

static int round_trips(const lt_tokenizer *tok, const char *text, int64_t len, const int32_t *ids, int64_t n) {
  int64_t got = -1;
  if (lt_tokenizer_decode(tok, ids, n, NULL, 0, &got) || got != len) return 0;
  char *buf = malloc((size_t)len + 1);
  int ok = lt_tokenizer_decode(tok, ids, n, buf, len, &got) == 0 && got == len && memcmp(buf, text, (size_t)len) == 0;
  free(buf);
  return ok;
}

static void test_encode(void) {
  char *corpus = random_corpus(30000, "abcdeeee  fgh\n'sth");
  lt_tokenizer *tok = NULL;
  CHECK_OK(lt_tokenizer_train_bpe(&tok, corpus, 30000, 700, NULL, 0));
  if (!tok) return free(corpus);
  // words of many lengths (long ones go through the heap) against the naive merge loop
  int32_t got[600], want[600];
  for (int rep = 0; rep < 60; rep++) {
    int64_t n = rep < 50 ? check_randint(1, 40) : check_randint(129, 500);
    char *w = random_corpus(n, "abcdeeeefgh"); // letters only: one pre-token
    int64_t count = -1;
    int64_t m = ref_encode_word(tok, (const uint8_t *)w, n, want);
    CHECK(lt_tokenizer_encode(tok, w, n, 1, got, 600, &count) == 0 && count == m &&
              memcmp(got, want, (size_t)m * sizeof *got) == 0,
          "word of %lld bytes: %lld ids vs reference %lld", (long long)n, (long long)count, (long long)m);
    // the second time comes from the cache
    CHECK(lt_tokenizer_encode(tok, w, n, 1, got, 600, &count) == 0 && count == m &&
              memcmp(got, want, (size_t)m * sizeof *got) == 0,
          "cached word of %lld bytes", (long long)n);
    free(w);
  }
  // any bytes round-trip: random bytes, NULs, invalid UTF-8, the corpus itself
  for (int rep = 0; rep < 30; rep++) {
    int64_t n = check_randint(0, 5000);
    char *t = malloc((size_t)n + 1);
    for (int64_t i = 0; i < n; i++)
      t[i] = (char)(rep % 3 == 0   ? check_randint(0, 256)
                    : rep % 3 == 1 ? "\0\xFF\xC3\xA9 a\n"[check_randint(0, 8)]
                                   : corpus[check_randint(0, 30000)]);
    int32_t *ids;
    int64_t m = encode_all(tok, t, n, 1, &ids);
    CHECK(m >= 0 && m <= n && round_trips(tok, t, n, ids, m), "round trip rep %d (%lld bytes)", rep, (long long)n);
    free(ids), free(t);
  }
  // the whole corpus compresses (merges apply) and round-trips
  int32_t *ids;
  int64_t m = encode_all(tok, corpus, 30000, 1, &ids);
  CHECK(m > 0 && m < 18000 && round_trips(tok, corpus, 30000, ids, m), "corpus: %lld ids", (long long)m);
  free(ids);
  // encode_tensor gives the same ids
  lt_tensor *out = lt_tensor_new();
  int32_t small[64];
  int64_t count;
  CHECK_OK(lt_tokenizer_encode(tok, corpus, 100, 1, small, 64, &count));
  CHECK_OK(lt_tokenizer_encode_tensor(out, tok, corpus, 100, 1));
  CHECK(out->ndim == 1 && out->shape[0] == count && out->dtype == LT_I32 &&
            memcmp(lt_data_ptr(out), small, (size_t)count * 4) == 0,
        "encode_tensor");
  CHECK_ERR(lt_tokenizer_encode_tensor(out, tok, corpus, 300, 1), "encode_tensor"); // defined out of another length
  lt_release(out);
  // too small a buffer: an error that says how many are needed
  CHECK_ERR(lt_tokenizer_encode(tok, corpus, 100, 1, small, 3, &count), "needs");
  CHECK(count > 3, "count is the number needed");
  lt_tokenizer_free(tok);
  free(corpus);
}

static void test_special(void) {
  // the corpus is full of the special token: it must not leak into merges
  const char *eot = "<|endoftext|>", *specials[] = {"<|endoftext|>", "<|pad|>"};
  char *corpus = malloc(40000);
  int64_t n = 0;
  while (n < 39000) {
    const char *piece = check_randint(0, 3) ? " hello world" : eot;
    memcpy(corpus + n, piece, strlen(piece));
    n += (int64_t)strlen(piece);
  }
  lt_tokenizer *tok = NULL;
  CHECK_OK(lt_tokenizer_train_bpe(&tok, corpus, n, 300, specials, 2));
  if (!tok) return free(corpus);
  int32_t id_eot, id_pad, id_none;
  CHECK_OK(lt_tokenizer_token_id(tok, eot, 13, &id_eot));
  CHECK_OK(lt_tokenizer_token_id(tok, "<|pad|>", 7, &id_pad));
  CHECK_OK(lt_tokenizer_token_id(tok, "<|nope|>", 8, &id_none));
  int32_t V = lt_tokenizer_vocab_size(tok);
  CHECK(V > 262 && V < 300 && id_eot == V - 2 && id_pad == V - 1 && id_none == -1, "special ids %d %d %d of %d", id_eot,
        id_pad, id_none, V);
  CHECK(lt_tokenizer_is_special(tok, id_eot) && !lt_tokenizer_is_special(tok, 5) && !lt_tokenizer_is_special(tok, -1),
        "is_special");
  for (int r = 0; r < lt_tokenizer_num_merges(tok); r++) {
    int32_t a, b, z;
    const char *bytes;
    int64_t len;
    lt_tokenizer_merge(tok, r, &a, &b, &z);
    lt_tokenizer_token(tok, z, &bytes, &len);
    CHECK(!lt_tokenizer_is_special(tok, z) && !memchr(bytes, '|', (size_t)len), "merge %d makes a special token", r);
  }
  const char *text = "x<|endoftext|>y <|pad|><|endoftext|>";
  int64_t len = (int64_t)strlen(text);
  int32_t *ids;
  int64_t m = encode_all(tok, text, len, 1, &ids);
  int n_eot = 0, n_pad = 0;
  for (int64_t i = 0; i < m; i++) n_eot += ids[i] == id_eot, n_pad += ids[i] == id_pad;
  CHECK(m == 6 && ids[1] == id_eot && ids[4] == id_pad && ids[5] == id_eot && n_eot == 2 && n_pad == 1,
        "allowed specials: %lld ids", (long long)m);
  CHECK(round_trips(tok, text, len, ids, m), "special round trip");
  free(ids);
  m = encode_all(tok, text, len, 0, &ids); // not allowed: plain text
  n_eot = 0;
  for (int64_t i = 0; i < m; i++) n_eot += lt_tokenizer_is_special(tok, ids[i]);
  CHECK(m > 6 && n_eot == 0 && round_trips(tok, text, len, ids, m), "disallowed specials: %lld ids", (long long)m);
  free(ids);
  // add_special: a new id at the end, or the existing one
  int32_t id;
  CHECK_OK(lt_tokenizer_add_special(tok, "<|im_start|>", &id));
  CHECK(id == V && lt_tokenizer_vocab_size(tok) == V + 1, "add_special id %d", id);
  CHECK_OK(lt_tokenizer_add_special(tok, "<|pad|>", &id));
  CHECK(id == id_pad, "add_special of an existing special");
  m = encode_all(tok, "a<|im_start|>", 13, 1, &ids);
  CHECK(m == 2 && ids[1] == V, "the added special is matched");
  free(ids);
  CHECK_ERR(lt_tokenizer_add_special(tok, "", &id), "empty");
  CHECK_ERR(lt_tokenizer_add_special(tok, "\xFF", &id), "UTF-8");
  lt_tokenizer_free(tok);
  free(corpus);
  // leftmost-longest matching among specials that overlap
  const char *nested[] = {"<a>", "<a><b>"};
  CHECK_OK(lt_tokenizer_train_bpe(&tok, "abc", 3, 258, nested, 2));
  if (tok) {
    m = encode_all(tok, "x<a><b><a>", 10, 1, &ids);
    CHECK(m == 3 && ids[1] == 257 && ids[2] == 256, "leftmost-longest: %lld ids", (long long)m);
    free(ids);
    lt_tokenizer_free(tok);
  }
}

static void test_char(void) {
  const char *text = "hello w\xC3\xB6rld\n\xE4\xB8\xAD!\xFF";
  int64_t len = (int64_t)strlen(text);
  lt_tokenizer *tok = NULL;
  const char *specials[] = {"<eot>"};
  CHECK_OK(lt_tokenizer_new_char(&tok, text, len, specials, 1));
  if (!tok) return;
  // sorted(set(text)) in code point order, then the invalid byte 0xFF, then <eot>
  const char *want[] = {"\n", " ", "!", "d", "e", "h", "l", "o", "r", "w", "\xC3\xB6", "\xE4\xB8\xAD", "\xFF", "<eot>"};
  CHECK(lt_tokenizer_vocab_size(tok) == 14, "char vocab %d", lt_tokenizer_vocab_size(tok));
  for (int i = 0; i < 14 && i < lt_tokenizer_vocab_size(tok); i++) {
    const char *b;
    int64_t l;
    lt_tokenizer_token(tok, i, &b, &l);
    CHECK(l == (int64_t)strlen(want[i]) && memcmp(b, want[i], (size_t)l) == 0, "char token %d", i);
  }
  CHECK(strcmp(lt_tokenizer_kind_name(tok), "char") == 0, "kind");
  int32_t *ids;
  const char *t2 = "world<eot>h\xFF";
  int64_t m = encode_all(tok, t2, (int64_t)strlen(t2), 1, &ids);
  int32_t expect[] = {9, 7, 8, 6, 3, 13, 5, 12};
  CHECK(m == 8 && memcmp(ids, expect, sizeof expect) == 0 && round_trips(tok, t2, (int64_t)strlen(t2), ids, m),
        "char encode");
  free(ids);
  int32_t buf[16];
  int64_t count;
  CHECK_ERR(lt_tokenizer_encode(tok, "hex", 3, 1, buf, 16, &count), "U+0078");
  CHECK_ERR(lt_tokenizer_encode(tok, "h\xFE", 2, 1, buf, 16, &count), "0xfe");
  lt_tokenizer_free(tok);
}

static void test_errors(void) {
  lt_tokenizer *tok = NULL;
  int32_t ids[4];
  int64_t count, len;
  const char *nul[] = {NULL};
  CHECK_ERR(lt_tokenizer_train_bpe(NULL, "a", 1, 300, NULL, 0), "out is NULL");
  CHECK_ERR(lt_tokenizer_train_bpe(&tok, NULL, 5, 300, NULL, 0), "text is NULL");
  CHECK_ERR(lt_tokenizer_train_bpe(&tok, "a", 1, 100, NULL, 0), "vocab_size 100 out of range");
  CHECK_ERR(lt_tokenizer_train_bpe(&tok, "a", 1, 300, nul, 1), "special token 0 is NULL");
  CHECK_ERR(lt_tokenizer_train_bpe(&tok, "a", 1, 300, NULL, 2), "special_tokens is NULL");
  CHECK_ERR(lt_tokenizer_train_bpe_file(&tok, "/nonexistent/corpus.txt", 300, NULL, 0), "cannot open");
  CHECK_ERR(lt_tokenizer_new_char(&tok, NULL, 3, NULL, 0), "text is NULL");
  CHECK(tok == NULL, "out stays NULL on errors");
  CHECK_ERR(lt_tokenizer_encode(NULL, "a", 1, 1, ids, 4, &count), "tokenizer is NULL");
  CHECK_ERR(lt_tokenizer_decode(NULL, ids, 1, NULL, 0, &len), "tokenizer is NULL");
  CHECK_OK(lt_tokenizer_train_bpe(&tok, "aaab", 4, 260, NULL, 0));
  if (!tok) return;
  // aa, then ab (tie with (aa, a): the smaller left id), then aa+ab; then no pairs are left
  CHECK(lt_tokenizer_vocab_size(tok) == 259, "the corpus runs out of pairs: %d", lt_tokenizer_vocab_size(tok));
  CHECK_ERR(lt_tokenizer_encode(tok, "a", -1, 1, ids, 4, &count), "negative");
  CHECK_ERR(lt_tokenizer_encode(tok, "a", 1, 1, NULL, 4, &count), "ids is NULL");
  ids[0] = 1, ids[1] = 259;
  CHECK_ERR(lt_tokenizer_decode(tok, ids, 2, NULL, 0, &len), "id 259 at position 1 is out of range [0, 259)");
  ids[1] = -3;
  CHECK_ERR(lt_tokenizer_decode(tok, ids, 2, NULL, 0, &len), "id -3");
  ids[0] = 256, ids[1] = 257;
  char out[4];
  CHECK_ERR(lt_tokenizer_decode(tok, ids, 2, out, 2, &len), "room for 2 bytes");
  CHECK(len == 4, "decode reports the length needed");
  const char *b;
  CHECK_ERR(lt_tokenizer_token(tok, 999, &b, &len), "out of range");
  int32_t a, bb, z;
  CHECK_ERR(lt_tokenizer_merge(tok, 5, &a, &bb, &z), "rank 5 out of range");
  CHECK_OK(lt_tokenizer_free(NULL));
  lt_tokenizer_free(tok);
}

int main(void) {
  test_utf8();
  test_pretokenize();
  test_train_reference();
  test_train_determinism();
  test_encode();
  test_special();
  test_char();
  test_errors();
  return check_summary();
}
