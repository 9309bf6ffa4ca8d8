/* test_json.c — the JSON reader (host/json.c, lutra.h "JSON") from C: the walk (types,
 * numbers, strings with their lengths, keys, items in text order, repeated keys kept both),
 * what cJSON alone would get wrong (NUL bytes, numbers longer than 63 characters, lax
 * grammar), and errors with line and column. */
#include "check.h"
#include "lutra.h"

static lt_json_doc *parse(const char *text) {
  lt_json_doc *doc = NULL;
  CHECK(lt_json_parse(&doc, text, (int64_t)strlen(text), 512) == 0, "parse %s: %s", text, lt_last_error());
  return doc;
}

static int string_is(const lt_json_doc *doc, const lt_json_value *v, const char *want, int64_t want_len) {
  int64_t len = -1;
  const char *s = lt_json_string(doc, v, &len);
  return s && len == want_len && memcmp(s, want, (size_t)len) == 0;
}

static void test_walk(void) {
  lt_json_doc *doc = parse(" {\"b\": [1, -2.5e3, true, false, null, \"x\"], \"a\": {}, \"b\": \"again\"} ");
  const lt_json_value *root = lt_json_root(doc);
  CHECK(lt_json_type(root) == LT_JSON_OBJECT, "root type %d", lt_json_type(root));
  const lt_json_value *m = lt_json_first(root);
  int64_t len;
  CHECK(strcmp(lt_json_key(doc, m, &len), "b") == 0 && len == 1, "first key");
  const lt_json_value *it = lt_json_first(m);
  int types[] = {LT_JSON_NUMBER, LT_JSON_NUMBER, LT_JSON_TRUE, LT_JSON_FALSE, LT_JSON_NULL, LT_JSON_STRING};
  for (int k = 0; k < 6; k++, it = lt_json_next(it)) CHECK(it && lt_json_type(it) == types[k], "item %d", k);
  CHECK(it == NULL, "six items");
  CHECK(lt_json_number(lt_json_next(lt_json_first(m))) == -2500.0, "number");
  m = lt_json_next(m);
  CHECK(strcmp(lt_json_key(doc, m, &len), "a") == 0 && lt_json_first(m) == NULL, "empty object");
  m = lt_json_next(m);
  CHECK(strcmp(lt_json_key(doc, m, &len), "b") == 0 && string_is(doc, m, "again", 5), "the repeated key, kept");
  CHECK(lt_json_next(m) == NULL, "three members");
  CHECK(lt_json_string(doc, root, &len) == NULL && len == 0, "not a string");
  lt_json_free(doc);
}

static void test_what_cjson_lacks(void) {
  lt_json_doc *doc = parse("[\"a\\u0000b\", {\"\\u0000\": \"\\u0000\\u0000\"}, \"plain\", 1" /* 70 digits */
                           "000000000000000000000000000000000000000000000000000000000000000000000, \"\xEF\xBB\xBF\"]");
  const lt_json_value *it = lt_json_first(lt_json_root(doc));
  CHECK(string_is(doc, it, "a\0b", 3), "NUL inside a string");
  const lt_json_value *m = lt_json_first(lt_json_next(it));
  int64_t len;
  const char *key = lt_json_key(doc, m, &len);
  CHECK(key && len == 1 && key[0] == 0, "a key of one NUL");
  CHECK(string_is(doc, m, "\0\0", 2), "two NULs");
  it = lt_json_next(lt_json_next(it));
  CHECK(string_is(doc, it, "plain", 5), "a plain string after them");
  it = lt_json_next(it);
  CHECK(lt_json_type(it) == LT_JSON_NUMBER && lt_json_number(it) == 1e69, "a 70-digit number: %g", lt_json_number(it));
  CHECK(string_is(doc, lt_json_next(it), "\xEF\xBB\xBF", 3), "a byte order mark inside a string stays");
  lt_json_free(doc);
}

static void test_errors(void) {
  lt_json_doc *doc = (lt_json_doc *)1;
  static const struct {
    const char *text, *error;
  } bad[] = {
      {"[1, 2", "',' or ']' expected, got end of input at line 1 column 6"},
      {"{\n  \"a\": 01}", "leading zero in number at line 2 column 8"},
      {"[1.]", "digit expected after '.' at line 1 column 3"},
      {"\"a\tb\"", "control character 0x09 in string (escape it) at line 1 column 3"},
      {"1e999", "number 1e999 is out of range at line 1 column 1"},
      {"[1,]", "unexpected ']' at line 1 column 4"},
      {"{\"a\":1,}", "string key expected, got '}' at line 1 column 8"},
      {"\"\\ud800\"", "lone high surrogate \\uD800 at line 1 column 2"},
      {"[[[1]]]", "nesting deeper than 2 at line 1 column 3"},
      {"\xEF\xBB\xBF x", "unexpected 'x' at line 1 column 2"},
  };
  for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
    int depth = strcmp(bad[k].text, "[[[1]]]") == 0 ? 2 : 512;
    CHECK_ERR(lt_json_parse(&doc, bad[k].text, (int64_t)strlen(bad[k].text), depth), bad[k].error);
    CHECK(doc == NULL, "no document on error");
  }
  CHECK_ERR(lt_json_parse(&doc, NULL, 0, 512), "no text");
  lt_json_free(NULL);
}

int main(void) {
  test_walk();
  test_what_cjson_lacks();
  test_errors();
  return check_summary();
}
