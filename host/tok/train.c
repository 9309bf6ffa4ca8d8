/* train.c — byte-level BPE training.
 *
 * The corpus splits at special tokens, then into pre-token words, counted in a hash map.
 * Each distinct word is a sequence of token ids (its bytes at first) with a count. A pair
 * of adjacent ids has a count (summed over words, times the word's count) and the list of
 * words it occurs in. Each step takes the most frequent pair from a max-heap (ties: the
 * smallest (a, b)), merges it in the words that hold it, and updates the counts of the
 * pairs of those words only. Heap entries are not updated in place: an entry whose count
 * is stale is pushed back with the current count when it surfaces (counts of existing
 * pairs only decrease, and pairs that gain are pushed again after each step).
 * A merge whose bytes are already a token reuses that token (as Hugging Face's trainer). */
#include "tok/tokenizer.h"
#include <stdio.h>
#include <stdlib.h>

typedef struct heap_entry {
  int64_t count;
  int32_t a, b;
} heap_entry;

typedef struct trainer {
  int32_t *sym; // words' symbols, word w at sym[word_off[w] .. + word_len[w])
  int64_t *word_off, *word_count, n_words;
  int32_t *word_len, *word_stamp;
  lt_tok_pairmap pair_index; // (a, b) -> pair
  int32_t *pair_a, *pair_b, *pair_stamp, **where, *where_n, *where_cap;
  int64_t *pair_count, n_pairs, pair_cap;
  heap_entry *heap;
  int64_t nh, heap_cap;
  int32_t *touched; // pairs that gained in this step
  int64_t n_touched, touched_cap;
} trainer;

static int oom(void) { return lt_errorf("train_bpe: out of memory"); }

static int grow(void **p, int64_t *cap, int64_t need, size_t elem) {
  if (need <= *cap) return 0;
  int64_t c = *cap ? *cap : 256;
  while (c < need) c *= 2;
  void *q = realloc(*p, (size_t)c * elem);
  if (!q) return oom();
  *p = q;
  *cap = c;
  return 0;
}

static int resize(void **p, int64_t cap, size_t elem) {
  void *q = realloc(*p, (size_t)cap * elem);
  if (!q) return oom();
  *p = q;
  return 0;
}

static inline int better(const heap_entry *x, const heap_entry *y) {
  if (x->count != y->count) return x->count > y->count;
  return x->a != y->a ? x->a < y->a : x->b < y->b;
}

static int heap_push(trainer *T, heap_entry e) {
  LT_TRY(grow((void **)&T->heap, &T->heap_cap, T->nh + 1, sizeof e));
  int64_t i = T->nh++;
  while (i > 0 && better(&e, &T->heap[(i - 1) / 2])) T->heap[i] = T->heap[(i - 1) / 2], i = (i - 1) / 2;
  T->heap[i] = e;
  return 0;
}

static heap_entry heap_pop(trainer *T) {
  heap_entry top = T->heap[0], e = T->heap[--T->nh];
  int64_t i = 0, n = T->nh;
  for (;;) {
    int64_t c = 2 * i + 1;
    if (c >= n) break;
    if (c + 1 < n && better(&T->heap[c + 1], &T->heap[c])) c++;
    if (!better(&T->heap[c], &e)) break;
    T->heap[i] = T->heap[c], i = c;
  }
  T->heap[i] = e;
  return top;
}

// The pair (a, b), created with count 0 if new; -1 on OOM.
static int32_t pair_of(trainer *T, int32_t a, int32_t b) {
  uint64_t key = lt_tok_pair(a, b);
  int32_t p = lt_tok_pairmap_get(&T->pair_index, key);
  if (p >= 0) return p;
  if (T->n_pairs == T->pair_cap) {
    int64_t cap = T->pair_cap ? 2 * T->pair_cap : 4096;
    if (resize((void **)&T->pair_a, cap, sizeof(int32_t)) || resize((void **)&T->pair_b, cap, sizeof(int32_t)) ||
        resize((void **)&T->pair_stamp, cap, sizeof(int32_t)) || resize((void **)&T->where, cap, sizeof(int32_t *)) ||
        resize((void **)&T->where_n, cap, sizeof(int32_t)) || resize((void **)&T->where_cap, cap, sizeof(int32_t)) ||
        resize((void **)&T->pair_count, cap, sizeof(int64_t)))
      return -1;
    T->pair_cap = cap;
  }
  if (T->n_pairs >= INT32_MAX - 1) return oom();
  p = (int32_t)T->n_pairs++;
  T->pair_a[p] = a, T->pair_b[p] = b, T->pair_stamp[p] = -1, T->pair_count[p] = 0;
  T->where[p] = NULL, T->where_n[p] = 0, T->where_cap[p] = 0;
  if (lt_tok_pairmap_put(&T->pair_index, key, p)) return oom();
  return p;
}

static int where_add(trainer *T, int32_t p, int32_t w) {
  if (T->where_n[p] && T->where[p][T->where_n[p] - 1] == w) return 0;
  if (T->where_n[p] == T->where_cap[p]) {
    int32_t cap = T->where_cap[p] ? 2 * T->where_cap[p] : 4;
    int32_t *q = realloc(T->where[p], (size_t)cap * sizeof *q);
    if (!q) return oom();
    T->where[p] = q, T->where_cap[p] = cap;
  }
  T->where[p][T->where_n[p]++] = w;
  return 0;
}

// Counts the words of text (split at the special tokens of `specials`) into `words`.
static int count_words(const lt_tokenizer *specials, const uint8_t *text, int64_t len, lt_tok_strmap *words) {
  int64_t pos = 0;
  while (pos < len) {
    int64_t start = len, end = len;
    int32_t id;
    lt_tok_match_added(specials, text, pos, len, 1, &start, &end, &id);
    for (int64_t p = pos, e; p < start; p = e) {
      e = lt_tok_gpt2_next(text, start, p);
      uint64_t h = lt_tok_hash(text + p, e - p);
      int64_t k = lt_tok_strmap_find(words, text + p, e - p, h);
      if (k >= 0)
        words->value[k]++;
      else if (lt_tok_strmap_add(words, text + p, e - p, h, 1) < 0)
        return oom();
    }
    pos = end;
  }
  return 0;
}

static int init_words(trainer *T, const lt_tok_strmap *words) {
  T->n_words = words->n;
  int64_t n = words->n ? words->n : 1;
  T->word_off = malloc((size_t)n * sizeof(int64_t));
  T->word_count = malloc((size_t)n * sizeof(int64_t));
  T->word_len = malloc((size_t)n * sizeof(int32_t));
  T->word_stamp = malloc((size_t)n * sizeof(int32_t));
  T->sym = malloc((size_t)(words->arena_len ? words->arena_len : 1) * sizeof(int32_t));
  if (!T->word_off || !T->word_count || !T->word_len || !T->word_stamp || !T->sym) return oom();
  for (int64_t w = 0; w < words->n; w++) { // words in order of first occurrence: deterministic
    const uint8_t *bytes = lt_tok_strmap_key(words, w);
    int32_t len = words->key_len[w];
    int64_t off = words->key_off[w];
    T->word_off[w] = off, T->word_len[w] = len, T->word_count[w] = words->value[w], T->word_stamp[w] = -1;
    for (int32_t i = 0; i < len; i++) T->sym[off + i] = bytes[i];
    for (int32_t i = 0; i + 1 < len; i++) {
      int32_t p = pair_of(T, bytes[i], bytes[i + 1]);
      if (p < 0 || where_add(T, p, (int32_t)w)) return -1;
      T->pair_count[p] += words->value[w];
    }
  }
  for (int64_t p = 0; p < T->n_pairs; p++)
    LT_TRY(heap_push(T, (heap_entry){T->pair_count[p], T->pair_a[p], T->pair_b[p]}));
  return 0;
}

// Merges (a, b) into z in every word that holds it, updating the pair counts.
static int apply_merge(trainer *T, int32_t pab, int32_t a, int32_t b, int32_t z, int32_t step) {
  T->n_touched = 0;
  for (int32_t k = 0; k < T->where_n[pab]; k++) {
    int32_t w = T->where[pab][k];
    if (T->word_stamp[w] == step) continue;
    T->word_stamp[w] = step;
    int32_t *s = T->sym + T->word_off[w], n = T->word_len[w], found = 0;
    for (int32_t i = 0; i + 1 < n && !found; i++) found = s[i] == a && s[i + 1] == b;
    if (!found) continue; // stale entry: merged away by an earlier step
    int64_t c = T->word_count[w];
    for (int32_t i = 0; i + 1 < n; i++)
      T->pair_count[lt_tok_pairmap_get(&T->pair_index, lt_tok_pair(s[i], s[i + 1]))] -= c;
    int32_t m = 0;
    for (int32_t i = 0; i < n;) {
      if (i + 1 < n && s[i] == a && s[i + 1] == b)
        s[m++] = z, i += 2;
      else
        s[m++] = s[i++];
    }
    T->word_len[w] = m;
    for (int32_t i = 0; i + 1 < m; i++) {
      int32_t p = pair_of(T, s[i], s[i + 1]);
      if (p < 0) return -1;
      T->pair_count[p] += c;
      if (s[i] != z && s[i + 1] != z) continue;
      if (where_add(T, p, w)) return -1;
      if (T->pair_stamp[p] != step) {
        T->pair_stamp[p] = step;
        LT_TRY(grow((void **)&T->touched, &T->touched_cap, T->n_touched + 1, sizeof(int32_t)));
        T->touched[T->n_touched++] = p;
      }
    }
  }
  free(T->where[pab]);
  T->where[pab] = NULL, T->where_n[pab] = T->where_cap[pab] = 0;
  for (int64_t k = 0; k < T->n_touched; k++) {
    int32_t p = T->touched[k];
    if (T->pair_count[p] > 0) LT_TRY(heap_push(T, (heap_entry){T->pair_count[p], T->pair_a[p], T->pair_b[p]}));
  }
  return 0;
}

static int merge_loop(trainer *T, lt_tokenizer *tok, int32_t target) {
  uint8_t *buf = NULL;
  int64_t buf_cap = 0;
  int rc = 0;
  for (int32_t step = 0; tok->vocab_size < target && T->nh > 0 && !rc;) {
    heap_entry top = heap_pop(T);
    int32_t p = lt_tok_pairmap_get(&T->pair_index, lt_tok_pair(top.a, top.b));
    int64_t now = T->pair_count[p];
    if (now != top.count) { // stale: back in with its current count
      if (now > 0) rc = heap_push(T, (heap_entry){now, top.a, top.b});
      continue;
    }
    int64_t la, lb;
    const uint8_t *ba = lt_tok_bytes(tok, top.a, &la), *bb = lt_tok_bytes(tok, top.b, &lb);
    if ((rc = grow((void **)&buf, &buf_cap, la + lb, 1))) break;
    memcpy(buf, ba, (size_t)la);
    memcpy(buf + la, bb, (size_t)lb);
    int32_t z = lt_tok_find(tok, buf, la + lb);
    if (z < 0) {
      if ((rc = lt_tok_append(tok, buf, la + lb, 0))) break;
      z = tok->vocab_size - 1;
    }
    if ((rc = lt_tok_add_merge(tok, top.a, top.b, z))) break;
    rc = apply_merge(T, p, top.a, top.b, z, step++);
  }
  free(buf);
  return rc;
}

static void trainer_free(trainer *T) {
  free(T->sym), free(T->word_off), free(T->word_count), free(T->word_len), free(T->word_stamp);
  lt_tok_pairmap_free(&T->pair_index);
  for (int64_t p = 0; p < T->n_pairs; p++) free(T->where[p]);
  free(T->pair_a), free(T->pair_b), free(T->pair_stamp), free(T->where), free(T->where_n), free(T->where_cap);
  free(T->pair_count), free(T->heap), free(T->touched);
}

int lt_tokenizer_train_bpe(lt_tokenizer **out, const char *text, int64_t len, int32_t vocab_size,
                           const char *const *special_tokens, int32_t num_special) {
  if (!out) return lt_errorf("train_bpe: out is NULL");
  *out = NULL;
  if (len < 0 || (!text && len)) return lt_errorf("train_bpe: text is NULL or len < 0");
  if (num_special < 0 || num_special > (1 << 20))
    return lt_errorf("train_bpe: num_special %d out of range", num_special);
  if (vocab_size < 256 + num_special || vocab_size > (1 << 28))
    return lt_errorf("train_bpe: vocab_size %d out of range [%d, %d] (256 bytes + %d special tokens at least)",
                     vocab_size, 256 + num_special, 1 << 28, num_special);
  trainer T = {0};
  lt_tok_strmap words = {0};
  lt_tokenizer *tok = lt_tok_alloc(LT_TOK_BPE), *specials = lt_tok_alloc(LT_TOK_BPE);
  int rc = -1;
  if (!tok || !specials) goto done;
  if (lt_tok_add_specials("train_bpe", specials, special_tokens, num_special)) goto done;
  for (int b = 0; b < 256; b++) {
    uint8_t byte = (uint8_t)b;
    if (lt_tok_append(tok, &byte, 1, 0)) goto done;
  }
  if (count_words(specials, (const uint8_t *)text, len, &words) || init_words(&T, &words)) goto done;
  lt_tok_strmap_free(&words);
  if (merge_loop(&T, tok, vocab_size - num_special)) goto done;
  if (lt_tok_add_specials("train_bpe", tok, special_tokens, num_special)) goto done;
  *out = tok;
  tok = NULL;
  rc = 0;
done:
  trainer_free(&T);
  lt_tok_strmap_free(&words);
  lt_tokenizer_free(tok);
  lt_tokenizer_free(specials);
  return rc;
}

// Reads a whole file; *data is malloc'ed (NUL-terminated for convenience).
int lt_tok_read_file(const char *op, const char *path, char **data, int64_t *len) {
  *data = NULL;
  if (!path) return lt_errorf("%s: path is NULL", op);
  FILE *f = fopen(path, "rb");
  if (!f) return lt_errorf("%s: cannot open '%s'", op, path);
  int64_t size = -1;
  if (fseek(f, 0, SEEK_END) == 0) size = ftell(f);
  if (size < 0 || fseek(f, 0, SEEK_SET) != 0) {
    fclose(f);
    return lt_errorf("%s: cannot read '%s' (not a regular file?)", op, path);
  }
  char *buf = malloc((size_t)size + 1);
  if (!buf) {
    fclose(f);
    return lt_errorf("%s: out of memory reading '%s' (%lld bytes)", op, path, (long long)size);
  }
  size_t got = fread(buf, 1, (size_t)size, f);
  int err = ferror(f);
  fclose(f);
  if (err || (int64_t)got != size) {
    free(buf);
    return lt_errorf("%s: error reading '%s'", op, path);
  }
  buf[size] = 0;
  *data = buf;
  *len = size;
  return 0;
}

int lt_tokenizer_train_bpe_file(lt_tokenizer **out, const char *path, int32_t vocab_size,
                                const char *const *special_tokens, int32_t num_special) {
  if (!out) return lt_errorf("train_bpe: out is NULL");
  *out = NULL;
  char *text;
  int64_t len;
  LT_TRY(lt_tok_read_file("train_bpe", path, &text, &len));
  int rc = lt_tokenizer_train_bpe(out, text, len, vocab_size, special_tokens, num_special);
  free(text);
  return rc;
}
