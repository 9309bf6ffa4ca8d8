/* test_tokenizer_json.c — tokenizer.json: the ids of files written by Hugging Face's
 * `tokenizers` (tests/data, made by gen_tokenizer_fixture.py) against the ids that library
 * gave, save/load round trips (ours and theirs), unsupported keys named in errors, and
 * truncated or corrupt files failing cleanly. */
#include "check.h"
#include <stdlib.h>
#include <unistd.h>

/* /tmp/lutra_test_tokenizer_<name>.<pid>.json: a name of this process's own, so that two runs
 * of the test at once (parallel builds) never read each other's files. */
static const char *tmp_path(const char *name) {
  static char paths[4][128];
  static int next;
  char *p = paths[next++ % 4];
  snprintf(p, 128, "/tmp/lutra_test_tokenizer_%s.%d.json", name, (int)getpid());
  return p;
}

static char data_dir[1024];

static void find_data_dir(void) { // tests/c/<this file> -> tests/data
  snprintf(data_dir, sizeof data_dir, "%s", __FILE__);
  char *slash = strrchr(data_dir, '/');
  if (slash) *slash = 0;
  slash = strrchr(data_dir, '/');
  if (slash)
    strcpy(slash, "/data");
  else
    strcpy(data_dir, "../tests/data");
}

static char *read_all(const char *path, int64_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  *len = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *buf = malloc((size_t)*len + 1);
  *len = (int64_t)fread(buf, 1, (size_t)*len, f);
  buf[*len] = 0;
  fclose(f);
  return buf;
}

static int64_t unhex(const char *hex, char *out) {
  if (strcmp(hex, "-") == 0) return 0;
  int64_t n = 0;
  for (; hex[0] && hex[1]; hex += 2) {
    unsigned v;
    sscanf(hex, "%2x", &v);
    out[n++] = (char)v;
  }
  return n;
}

static int64_t parse_ids(char *list, int32_t *ids) {
  if (strcmp(list, "-") == 0) return 0;
  int64_t n = 0;
  for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) ids[n++] = (int32_t)atoi(tok);
  return n;
}

static int decodes_to(const lt_tokenizer *tok, const int32_t *ids, int64_t n, const char *text, int64_t len) {
  char *buf = malloc((size_t)len + 1);
  int64_t got = -1;
  int ok = lt_tokenizer_decode(tok, ids, n, buf, len, &got) == 0 && got == len && memcmp(buf, text, (size_t)len) == 0;
  free(buf);
  return ok;
}

// Every (file, text, ids) line of tokenizer_hf_expected.txt; with resave, through our save and load first.
static void test_fixtures(int resave) {
  char path[1400], line[16384], file[256], hex[8192], list[8192], text[4096];
  snprintf(path, sizeof path, "%s/tokenizer_hf_expected.txt", data_dir);
  FILE *f = fopen(path, "r");
  CHECK(f != NULL, "cannot open %s", path);
  if (!f) return;
  int cases = 0;
  while (fgets(line, sizeof line, f)) {
    if (line[0] == '#' || sscanf(line, "%255s %8191s %8191s", file, hex, list) != 3) continue;
    snprintf(path, sizeof path, "%s/%s", data_dir, file);
    lt_tokenizer *tok = NULL;
    CHECK_OK(lt_tokenizer_load(&tok, path));
    if (tok && resave) {
      lt_tokenizer *again = NULL;
      CHECK_OK(lt_tokenizer_save(tok, tmp_path("resave")));
      CHECK_OK(lt_tokenizer_load(&again, tmp_path("resave")));
      lt_tokenizer_free(tok);
      tok = again;
    }
    if (!tok) continue;
    int64_t len = unhex(hex, text), count = -1;
    int32_t want[4096], got[4096];
    int64_t n = parse_ids(list, want);
    int ok = lt_tokenizer_encode(tok, text, len, 1, got, 4096, &count) == 0;
    CHECK(ok && count == n && memcmp(got, want, (size_t)n * sizeof *got) == 0, "%s%s: '%.*s': %lld ids, want %lld (%s)",
          resave ? "resaved " : "", file, (int)len, text, (long long)count, (long long)n, ok ? "" : lt_last_error());
    if (!strstr(file, "prefix")) CHECK(decodes_to(tok, want, n, text, len), "%s: decode '%.*s'", file, (int)len, text);
    lt_tokenizer_free(tok);
    cases++;
  }
  fclose(f);
  CHECK(cases >= 40, "only %d fixture cases", cases);
}

static void test_round_trip(void) {
  // a trained tokenizer with special tokens: save, load, same tokens, merges and ids; saving again is identical
  char corpus[20000];
  for (int i = 0; i < 20000; i++) corpus[i] = "ab cd\n\xC3\xA9\xFF'zz"[check_randint(0, 12)];
  const char *specials[] = {"<|endoftext|>", "<|caf\xC3\xA9 sp\xC3\xA9"
                                             "cial|>"};
  lt_tokenizer *tok = NULL, *back = NULL;
  CHECK_OK(lt_tokenizer_train_bpe(&tok, corpus, 20000, 500, specials, 2));
  CHECK_OK(lt_tokenizer_save(tok, tmp_path("a")));
  CHECK_OK(lt_tokenizer_load(&back, tmp_path("a")));
  if (!tok || !back) return;
  int same = lt_tokenizer_vocab_size(tok) == lt_tokenizer_vocab_size(back) &&
             lt_tokenizer_num_merges(tok) == lt_tokenizer_num_merges(back);
  for (int32_t id = 0; same && id < lt_tokenizer_vocab_size(tok); id++) {
    const char *a, *b;
    int64_t la, lb;
    lt_tokenizer_token(tok, id, &a, &la);
    lt_tokenizer_token(back, id, &b, &lb);
    same = la == lb && memcmp(a, b, (size_t)la) == 0 &&
           lt_tokenizer_is_special(tok, id) == lt_tokenizer_is_special(back, id);
  }
  for (int r = 0; same && r < lt_tokenizer_num_merges(tok); r++) {
    int32_t a[2], b[2], z[2];
    lt_tokenizer_merge(tok, r, &a[0], &b[0], &z[0]);
    lt_tokenizer_merge(back, r, &a[1], &b[1], &z[1]);
    same = a[0] == a[1] && b[0] == b[1] && z[0] == z[1];
  }
  CHECK(same, "tokens or merges differ after save/load");
  uint64_t fp1 = 0, fp2 = 1, fp3 = 2;
  CHECK_OK(lt_tokenizer_fingerprint(tok, &fp1));
  CHECK_OK(lt_tokenizer_fingerprint(back, &fp2));
  CHECK(fp1 == fp2, "fingerprints differ after save/load");
  static const char text[] = "ab<|endoftext|>cd \xFF\xFE\x00zz<|caf\xC3\xA9 sp\xC3\xA9"
                             "cial|>";
  int64_t len = sizeof text - 1, n1, n2;
  int32_t ids1[64], ids2[64];
  CHECK_OK(lt_tokenizer_encode(tok, text, len, 1, ids1, 64, &n1));
  CHECK_OK(lt_tokenizer_encode(back, text, len, 1, ids2, 64, &n2));
  CHECK(n1 == n2 && memcmp(ids1, ids2, (size_t)n1 * 4) == 0 && decodes_to(back, ids2, n2, text, len) &&
            ids2[n2 - 1] == lt_tokenizer_vocab_size(tok) - 1,
        "ids after save/load");
  CHECK_OK(lt_tokenizer_save(back, tmp_path("b")));
  int32_t extra;
  CHECK_OK(lt_tokenizer_add_special(back, "<|extra|>", &extra));
  CHECK_OK(lt_tokenizer_fingerprint(back, &fp3));
  CHECK(fp3 != fp1, "a new special token keeps the fingerprint");
  CHECK_ERR(lt_tokenizer_fingerprint(NULL, &fp3), "tokenizer is NULL");
  int64_t la, lb;
  char *a = read_all(tmp_path("a"), &la), *b = read_all(tmp_path("b"), &lb);
  CHECK(a && b && la == lb && memcmp(a, b, (size_t)la) == 0, "saving a loaded tokenizer changes the file");
  free(a), free(b);
  lt_tokenizer_free(tok), lt_tokenizer_free(back);
  // char tokenizer
  CHECK_OK(lt_tokenizer_new_char(&tok, corpus, 20000, specials, 1));
  CHECK_OK(lt_tokenizer_save(tok, tmp_path("c")));
  CHECK_OK(lt_tokenizer_load(&back, tmp_path("c")));
  if (tok && back) {
    CHECK(strcmp(lt_tokenizer_kind_name(back), "char") == 0 &&
              lt_tokenizer_vocab_size(back) == lt_tokenizer_vocab_size(tok),
          "char tokenizer after save/load");
    CHECK_OK(lt_tokenizer_encode(tok, corpus, 60, 1, ids1, 64, &n1));
    CHECK_OK(lt_tokenizer_encode(back, corpus, 60, 1, ids2, 64, &n2));
    CHECK(n1 > 30 && n1 == n2 && memcmp(ids1, ids2, (size_t)n1 * 4) == 0 && decodes_to(back, ids2, n2, corpus, 60),
          "char ids after save/load");
  }
  lt_tokenizer_free(tok), lt_tokenizer_free(back);
  remove(tmp_path("a")), remove(tmp_path("b"));
  remove(tmp_path("c")), remove(tmp_path("resave"));
}

static int load_str(lt_tokenizer **tok, const char *json) {
  return lt_tokenizer_load_json(tok, json, (int64_t)strlen(json));
}

#define PT "\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false}"
#define VOCAB "\"vocab\":{\"a\":0,\"b\":1,\"ab\":2,\"\xC4\xA0\":3}"

static void test_minimal_and_unsupported(void) {
  lt_tokenizer *tok = NULL;
  int32_t ids[8];
  int64_t n;
  // the smallest file of the family; merges in both forms; a missing byte is an error without unk
  CHECK_OK(load_str(&tok, "{\"model\":{\"type\":\"BPE\"," VOCAB ",\"merges\":[\"a b\"]}," PT "}"));
  if (tok) {
    CHECK(lt_tokenizer_encode(tok, "ab a", 4, 1, ids, 8, &n) == 0 && n == 3 && ids[0] == 2 && ids[1] == 3 &&
              ids[2] == 0,
          "minimal file: %lld ids", (long long)n);
    CHECK_ERR(lt_tokenizer_encode(tok, "abc", 3, 1, ids, 8, &n), "byte 0x63 has no token");
    lt_tokenizer_free(tok);
  }
  CHECK_OK(load_str(&tok, "{\"model\":{" VOCAB ",\"merges\":[[\"a\",\"b\"]],\"unk_token\":\"b\"}," PT "}"));
  if (tok) {
    CHECK(lt_tokenizer_encode(tok, "abc", 3, 1, ids, 8, &n) == 0 && n == 2 && ids[0] == 2 && ids[1] == 1,
          "array merges and unk: %lld ids", (long long)n);
    lt_tokenizer_free(tok);
  }
  CHECK_OK(load_str(&tok, "{\"model\":{\"vocab\":{\"a\":0,\"b\":2}}," PT "}")); // id 1 is a gap
  if (tok) {
    int64_t len;
    ids[0] = 2, ids[1] = 1;
    CHECK_ERR(lt_tokenizer_decode(tok, ids, 2, NULL, 0, &len), "id 1 at position 1 is not a token (a gap");
    CHECK(lt_tokenizer_encode(tok, "ba", 2, 1, ids, 8, &n) == 0 && n == 2 && ids[0] == 2 && ids[1] == 0, "gap vocab");
    lt_tokenizer_free(tok);
  }
  // an added token may repeat the vocab's token of its id: the same text, or its byte-level spelling
  CHECK_OK(load_str(&tok, "{\"model\":{\"vocab\":{\"a\":0,\"\xC4\xA0" "a\":1}},\"added_tokens\":[{\"id\":1,"
                          "\"content\":\" a\"},{\"id\":0,\"content\":\"a\"}]," PT "}"));
  lt_tokenizer_free(tok);
  static const char *const bad[][2] = {
      {"{\"model\":{\"type\":\"WordPiece\"," VOCAB "}," PT "}", "model.type 'WordPiece'"},
      {"{\"model\":{" VOCAB "},\"normalizer\":{\"type\":\"BertNormalizer\"}," PT "}",
       "normalizer.type 'BertNormalizer' is not supported"},
      {"{\"model\":{" VOCAB "},\"pre_tokenizer\":{\"type\":\"Whitespace\"}}", "pre_tokenizer.type 'Whitespace'"},
      {"{\"model\":{" VOCAB "},\"pre_tokenizer\":{\"type\":\"Metaspace\",\"replacement\":\"_\",\"prepend_scheme\":\"x\"}}",
       "pre_tokenizer.prepend_scheme is not"},
      {"{\"model\":{" VOCAB "},\"decoder\":{\"type\":\"ByteLevel\"}}", "decoder: a ByteLevel decoder needs a ByteLevel pre_tokenizer"},
      {"{\"model\":{" VOCAB "},\"decoder\":{\"type\":\"WordPiece\"}," PT "}", "decoder.type 'WordPiece'"},
      {"{\"model\":{" VOCAB "},\"post_processor\":{\"type\":\"Mystery\"}," PT "}", "post_processor.type 'Mystery'"},
      {"{\"model\":{" VOCAB ",\"dropout\":0.1}," PT "}", "model.dropout"},
      {"{\"model\":{" VOCAB ",\"continuing_subword_prefix\":\"##\"}," PT "}", "model.continuing_subword_prefix"},
      {"{\"model\":{" VOCAB ",\"byte_fallback\":1}," PT "}", "model.byte_fallback is not true or false"},
      {"{\"model\":{" VOCAB ",\"merges\":[\"a c\"]}," PT "}", "model.merges[0]: 'c' is not in the vocab"},
      {"{\"model\":{" VOCAB ",\"merges\":[\"a b\",\"b a\"]}," PT "}", "model.merges[1]: 'b' + 'a'"},
      {"{\"model\":{" VOCAB ",\"merges\":[\"a b c\"]}," PT "}", "model.merges[0] is not"},
      {"{\"model\":{" VOCAB ",\"merges\":[7]}," PT "}", "model.merges[0] is not"},
      {"{\"model\":{" VOCAB ",\"merges\":{}}," PT "}", "model.merges is not an array"},
      {"{\"model\":{\"vocab\":{\"a\":\"x\"}}," PT "}", "model.vocab['a'] is not an integer"},
      {"{\"model\":{\"vocab\":{\"a\":-1}}," PT "}", "model.vocab['a'] is not an integer"},
      {"{\"model\":{\"vocab\":{\"a\":0,\"b\":0}}," PT "}", "id 0 is used by 'a' and 'b'"},
      {"{\"model\":{\"vocab\":{\"a\":0,\"b\":268000000}}," PT "}", "the ids are sparse"},
      {"{\"model\":{\"vocab\":{\"\xE2\x82\xAC\":0}}," PT "}", "outside the byte-level alphabet"},
      {"{\"model\":{\"vocab\":[]}," PT "}", "model.vocab is missing"},
      {"{\"model\":5}", "no \"model\" object"},
      {"[1, 2]", "the top level is not an object"},
      {"{}", "no \"model\" object"},
      {"{\"model\":{" VOCAB "},\"added_tokens\":[{\"id\":9}]," PT "}", "added_tokens[0].content"},
      {"{\"model\":{" VOCAB "},\"added_tokens\":[{\"id\":1.5,\"content\":\"x\"}]," PT "}", "added_tokens[0].id"},
      {"{\"model\":{" VOCAB "},\"added_tokens\":[{\"id\":7,\"content\":\"x\"},{\"id\":7,\"content\":\"y\"}]," PT "}",
       "id 7 is used twice"},
      {"{\"model\":{" VOCAB "},\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\","
       "\"pattern\":{\"Regex\":\"\\\\w+\"},\"behavior\":\"Isolated\"},{\"type\":\"ByteLevel\",\"use_regex\":false}]}}",
       "pretokenizers[0].pattern: only the regexes of GPT-2, Llama 3 (cl100k) and Qwen2"},
      {"{\"lutra_tokenizer\":2,\"type\":\"char\",\"codepoints\":[]}", "lutra_tokenizer: unknown version"},
      {"{\"lutra_tokenizer\":1,\"type\":\"char\",\"codepoints\":[98,97]}", "not sorted"},
      {"{\"lutra_tokenizer\":1,\"type\":\"char\",\"codepoints\":[97],\"added_tokens\":[{\"id\":5,\"content\":\"x\"}]}",
       "id 5 should be 1"},
      // an added token takes an id of its own, or the vocab's token of that id (the same text)
      {"{\"model\":{" VOCAB "},\"added_tokens\":[{\"id\":2,\"content\":\"<x>\"}]," PT "}",
       "added_tokens[0].id: id 2 is '<x>' there but model.vocab['ab'] has the same id"},
      {"{\"model\":{\"vocab\":{\"a\":0,\"b\":1,\"a\":2}}," PT "}", "model.vocab['a'] appears twice (ids 0 and 2)"},
      {"{\"model\":{\"vocab\":{\"a\":0,\"\":1}}," PT "}", "model.vocab[''] (id 1) is an empty token"},
      {"{\"model\":{\"vocab\":{\"a\":0,\"b\\u0000c\":1}}," PT "}", "a string holds \\u0000 (NUL) at byte"},
      {"{\"model\":{\"vocab\":{\"a'\\n\":\"x\"}}," PT "}", "model.vocab['a\\'\\x0a'] is not an integer"},
      {"{\"model\":{" VOCAB "},\"added_tokens\":[{\"id\":4,\"content\":\"x\",\"special\":1}]," PT "}",
       "added_tokens[0].special is not true or false"},
      {"{\"model\":{" VOCAB "},\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":\"no\"}}",
       "pre_tokenizer.add_prefix_space is not true or false"},
      {"{\"model\":{" VOCAB ",\"ignore_merges\":0}," PT "}", "model.ignore_merges is not true or false"},
      {"{\"model\":{", "not valid JSON"},
      {"", "empty"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    tok = (lt_tokenizer *)1;
    CHECK_ERR(load_str(&tok, bad[i][0]), bad[i][1]);
    CHECK(tok == NULL, "case %zu: out not NULL after an error", i);
  }
  CHECK_OK(load_str(&tok, "{\"model\":{" VOCAB ",\"merges\":[\"a b\"]}," PT "}"));
  int64_t starts[8], ends[8], count = 0;
  CHECK_OK(lt_tokenizer_encode_offsets(tok, "ab", 2, LT_TOK_ALLOW_SPECIAL, ids, starts, ends, 8, &count));
  CHECK(count == 1 && ids[0] == 2 && starts[0] == 0 && ends[0] == 2, "encode_offsets of 'ab'");
  CHECK_ERR(lt_tokenizer_encode_offsets(tok, "ab", 2, 1, ids, NULL, ends, 8, &count), "starts or ends is NULL");
  CHECK_ERR(lt_tokenizer_encode_offsets(tok, "abab", 4, 1, ids, starts, ends, 1, &count), "room for 1 ids");
  CHECK(count == 2, "encode_offsets says how many ids it needs");
  CHECK_ERR(lt_tokenizer_encode_pair(tok, "a", 1, "b", -1, 1, ids, NULL, NULL, 8, &count), "pair_len -1 is negative");
  CHECK_OK(lt_tokenizer_encode_pair(tok, "ab", 2, "ba", 2, 1, ids, starts, ends, 8, &count));
  CHECK(count == 3 && ids[0] == 2 && starts[1] == 0 && ends[2] == 2, "encode_pair: offsets index each text");
  lt_tokenizer_free(tok);
  CHECK_ERR(lt_tokenizer_load(&tok, "/nonexistent/tokenizer.json"), "cannot open");
  CHECK_ERR(lt_tokenizer_save(NULL, "/tmp/x.json"), "NULL");
}

// Truncations and random damage of a real file: clean errors or a working tokenizer, never a crash.
static void test_corrupt(void) {
  char path[1200];
  snprintf(path, sizeof path, "%s/tokenizer_hf_sequence.json", data_dir);
  int64_t len;
  char *json = read_all(path, &len);
  CHECK(json != NULL, "cannot read %s", path);
  if (!json) return;
  int64_t last = len - 1;
  while (last > 0 && json[last] != '}') last--;
  int clean = 1;
  for (int64_t cut = 0; cut < last; cut += 1 + cut / 50) {
    lt_tokenizer *tok = NULL;
    int rc = lt_tokenizer_load_json(&tok, json, cut);
    clean &= rc != 0 && tok == NULL && strstr(lt_last_error(), "tokenizer.json") != NULL;
  }
  CHECK(clean, "a truncated file loaded or failed without a tokenizer.json error");
  char *copy = malloc((size_t)len);
  int loaded = 0;
  for (int rep = 0; rep < 300; rep++) {
    memcpy(copy, json, (size_t)len);
    for (int k = 0; k < 1 + rep % 4; k++) copy[check_randint(0, len)] = "{}[]\",:0a\\ \xFF"[check_randint(0, 12)];
    lt_tokenizer *tok = NULL;
    if (lt_tokenizer_load_json(&tok, copy, len) == 0) {
      int32_t ids[64];
      int64_t n;
      if (lt_tokenizer_encode(tok, "Hello world, caf\xC3\xA9!", 18, 1, ids, 64, &n) == 0) {
        int64_t back;
        lt_tokenizer_decode(tok, ids, n, NULL, 0, &back);
      }
      loaded++;
      lt_tokenizer_free(tok);
    } else {
      CHECK(tok == NULL && strlen(lt_last_error()) > 0, "rep %d: error without a message", rep);
    }
  }
  printf("corrupt files: %d of 300 still loaded\n", loaded);
  free(copy), free(json);
}

int main(void) {
  find_data_dir();
  test_fixtures(0);
  test_fixtures(1);
  test_round_trip();
  test_minimal_and_unsupported();
  test_corrupt();
  return check_summary();
}
