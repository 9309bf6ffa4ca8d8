/* safetensors.c — parsing and validating a safetensors header, defensively: every length,
 * shape and offset is checked before anything trusts it, and a bad header is an error
 * naming the source, the tensor and the problem, never a crash. Names and metadata must be
 * valid UTF-8 without NUL (io/names.h). Depends on lt_errorf and
 * cJSON only (the fuzz harness compiles this file alone). File IO is in io/safetensors_file.c. */
#include "io/safetensors.h"
#include "core/internal.h"
#include "io/names.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

static const struct {
  const char *name;
  int dtype;
} st_dtypes[] = {{"F32", LT_F32}, {"F64", LT_F64}, {"BF16", LT_BF16}, {"F16", LT_F16},
                 {"I32", LT_I32}, {"I64", LT_I64}, {"U8", LT_U8},     {"BOOL", LT_BOOL}};
static const int st_itemsize[LT_NUM_DTYPES] = {4, 8, 2, 2, 4, 8, 1, 1};
/* In the format, but not tensors lutra has. */
static const char *const st_unsupported[] = {"I8",      "I16",     "U16",     "U32",     "U64", "F8_E4M3",
                                             "F8_E5M2", "F8_E8M0", "F6_E2M3", "F6_E3M2", "F4",  "C64"};

int lt_st_dtype_from_name(const char *name, int *dtype) {
  for (size_t k = 0; k < sizeof st_dtypes / sizeof st_dtypes[0]; k++) {
    if (strcmp(name, st_dtypes[k].name) == 0) {
      *dtype = st_dtypes[k].dtype;
      return 0;
    }
  }
  return -1;
}

const char *lt_st_dtype_name(int dtype) {
  for (size_t k = 0; k < sizeof st_dtypes / sizeof st_dtypes[0]; k++) {
    if (st_dtypes[k].dtype == dtype) return st_dtypes[k].name;
  }
  return NULL;
}

void lt_st_free_parsed(lt_st_header *h) {
  if (!h) return;
  free(h->tensors);
  free(h->names);
  free(h->meta_key_block);
  free(h->meta_value_block);
  free(h->meta_keys);
  free(h->meta_values);
  free(h->path);
  free(h);
}

/* A JSON number that is an exact non-negative integer (at most 2^53, where doubles stop
 * being exact). */
static int as_index(const cJSON *x, int64_t *v) {
  if (!cJSON_IsNumber(x)) return -1;
  double d = x->valuedouble;
  if (!(d >= 0 && d <= 9007199254740992.0) || d != (double)(int64_t)d) return -1;
  *v = (int64_t)d;
  return 0;
}

static int cmp_info_name(const void *a, const void *b) {
  return strcmp(((const lt_st_info *)a)->name, ((const lt_st_info *)b)->name);
}

static int cmp_info_begin(const void *a, const void *b) {
  const lt_st_info *x = *(const lt_st_info *const *)a, *y = *(const lt_st_info *const *)b;
  return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : (x->end > y->end) - (x->end < y->end);
}

static int cmp_str_ptr(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* A header string (what: "tensor name", "__metadata__ key", ...) that is not UTF-8: an error
 * showing its bytes. */
static int check_utf8(const char *src, const char *what, const char *s) {
  size_t n = strlen(s), bad = 0;
  if (lt_utf8_valid(s, n, &bad)) return 0;
  char shown[256];
  lt_name_shown(shown, sizeof shown, s, n);
  return lt_errorf("safetensors: %s: %s '%s' is not valid UTF-8 (byte %zu)", src, what, shown, bad);
}

/* One tensor entry {"dtype": .., "shape": [..], "data_offsets": [b, e]} into info. */
static int parse_entry(const char *src, const cJSON *e, const char *name, int64_t data_size, lt_st_info *info) {
  if (!cJSON_IsObject(e)) return lt_errorf("safetensors: %s: tensor '%.200s': entry is not a JSON object", src, name);
  const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
  const cJSON *shape = cJSON_GetObjectItemCaseSensitive(e, "shape");
  const cJSON *offs = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
  if (!cJSON_IsString(dt))
    return lt_errorf("safetensors: %s: tensor '%.200s': dtype missing or not a string", src, name);
  int dtype;
  if (lt_st_dtype_from_name(dt->valuestring, &dtype) != 0) {
    for (size_t k = 0; k < sizeof st_unsupported / sizeof st_unsupported[0]; k++) {
      if (strcmp(dt->valuestring, st_unsupported[k]) == 0)
        return lt_errorf("safetensors: %s: tensor '%.200s': dtype %s is not supported by lutra (F32 F64 BF16 F16 "
                         "I32 I64 U8 BOOL are)",
                         src, name, dt->valuestring);
    }
    return lt_errorf("safetensors: %s: tensor '%.200s': unknown dtype '%.40s'", src, name, dt->valuestring);
  }
  if (!cJSON_IsArray(shape))
    return lt_errorf("safetensors: %s: tensor '%.200s': shape missing or not a list", src, name);
  int ndim = cJSON_GetArraySize(shape);
  if (ndim > LT_MAX_DIMS)
    return lt_errorf("safetensors: %s: tensor '%.200s': %d dims (lutra tensors have at most %d)", src, name, ndim,
                     LT_MAX_DIMS);
  int64_t nbytes = st_itemsize[dtype];
  int d = 0;
  for (const cJSON *s = shape->child; s; s = s->next, d++) {
    int64_t v;
    if (as_index(s, &v) != 0)
      return lt_errorf("safetensors: %s: tensor '%.200s': shape entry %d is not a non-negative integer", src, name, d);
    if (__builtin_mul_overflow(nbytes, v, &nbytes))
      return lt_errorf("safetensors: %s: tensor '%.200s': shape's byte size overflows 64 bits", src, name);
    info->shape[d] = v;
  }
  if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2)
    return lt_errorf("safetensors: %s: tensor '%.200s': data_offsets missing or not a list of 2", src, name);
  int64_t begin, end;
  if (as_index(offs->child, &begin) != 0 || as_index(offs->child->next, &end) != 0)
    return lt_errorf("safetensors: %s: tensor '%.200s': data_offsets are not non-negative integers", src, name);
  if (begin > end)
    return lt_errorf("safetensors: %s: tensor '%.200s': data_offsets [%lld, %lld] end before they begin", src, name,
                     (long long)begin, (long long)end);
  if (end > data_size)
    return lt_errorf("safetensors: %s: tensor '%.200s': data_offsets [%lld, %lld] run past the data section (%lld "
                     "bytes; truncated file?)",
                     src, name, (long long)begin, (long long)end, (long long)data_size);
  if (end - begin != nbytes)
    return lt_errorf("safetensors: %s: tensor '%.200s': data_offsets [%lld, %lld] hold %lld bytes but shape and "
                     "dtype %s need %lld",
                     src, name, (long long)begin, (long long)end, (long long)(end - begin), dt->valuestring,
                     (long long)nbytes);
  info->ndim = ndim;
  info->dtype = dtype;
  info->begin = begin;
  info->end = end;
  return 0;
}

/* "__metadata__": {"key": "value", ...} into h (sorted by key). */
static int parse_metadata(const char *src, const cJSON *m, lt_st_header *h) {
  if (!cJSON_IsObject(m)) return lt_errorf("safetensors: %s: __metadata__ is not a JSON object", src);
  int64_t n = 0;
  size_t key_bytes = 0, value_bytes = 0;
  for (const cJSON *x = m->child; x; x = x->next, n++) {
    if (!cJSON_IsString(x))
      return lt_errorf("safetensors: %s: __metadata__ value of '%.200s' is not a string", src, x->string);
    LT_TRY(check_utf8(src, "__metadata__ key", x->string));
    LT_TRY(check_utf8(src, "__metadata__ value", x->valuestring));
    key_bytes += strlen(x->string) + 1;
    value_bytes += strlen(x->valuestring) + 1;
  }
  if (n == 0) return 0;
  h->meta_key_block = malloc(key_bytes);
  h->meta_value_block = malloc(value_bytes);
  char **pairs = malloc((size_t)n * 2 * sizeof(char *)); /* (key, value) adjacent, sorted together */
  h->meta_keys = malloc((size_t)n * sizeof(char *));
  h->meta_values = malloc((size_t)n * sizeof(char *));
  if (!h->meta_key_block || !h->meta_value_block || !pairs || !h->meta_keys || !h->meta_values) {
    free(pairs);
    return lt_errorf("safetensors: %s: out of memory for the metadata", src);
  }
  char *kp = h->meta_key_block, *vp = h->meta_value_block;
  int64_t i = 0;
  for (const cJSON *x = m->child; x; x = x->next, i++) {
    size_t kl = strlen(x->string) + 1, vl = strlen(x->valuestring) + 1;
    memcpy(kp, x->string, kl);
    memcpy(vp, x->valuestring, vl);
    pairs[2 * i] = kp, pairs[2 * i + 1] = vp;
    kp += kl, vp += vl;
  }
  qsort(pairs, (size_t)n, 2 * sizeof(char *), cmp_str_ptr);
  for (i = 0; i < n; i++) {
    h->meta_keys[i] = pairs[2 * i];
    h->meta_values[i] = pairs[2 * i + 1];
  }
  free(pairs);
  h->n_meta = n;
  for (i = 1; i < n; i++) {
    if (strcmp(h->meta_keys[i], h->meta_keys[i - 1]) == 0)
      return lt_errorf("safetensors: %s: __metadata__ key '%.200s' appears twice", src, h->meta_keys[i]);
  }
  return 0;
}

static int parse_root(const char *src, const cJSON *root, lt_st_header *h) {
  int64_t data_size = h->file_size - h->data_offset;
  const cJSON *meta = NULL;
  int64_t n = 0;
  size_t name_bytes = 0;
  for (const cJSON *x = root->child; x; x = x->next) {
    if (!x->string) return lt_errorf("safetensors: %s: header entry without a name", src);
    if (strcmp(x->string, "__metadata__") == 0) {
      if (meta) return lt_errorf("safetensors: %s: __metadata__ appears twice", src);
      meta = x;
      continue;
    }
    LT_TRY(check_utf8(src, "tensor name", x->string));
    n++;
    name_bytes += strlen(x->string) + 1;
  }
  if (meta) LT_TRY(parse_metadata(src, meta, h));
  h->tensors = calloc(n ? (size_t)n : 1, sizeof(lt_st_info));
  h->names = malloc(name_bytes ? name_bytes : 1);
  if (!h->tensors || !h->names) return lt_errorf("safetensors: %s: out of memory for %lld entries", src, (long long)n);
  char *np = h->names;
  int64_t i = 0;
  for (const cJSON *x = root->child; x; x = x->next) {
    if (x == meta) continue;
    size_t len = strlen(x->string) + 1;
    memcpy(np, x->string, len);
    h->tensors[i].name = np;
    np += len;
    LT_TRY(parse_entry(src, x, h->tensors[i].name, data_size, &h->tensors[i]));
    i++;
  }
  h->count = n;
  qsort(h->tensors, (size_t)n, sizeof(lt_st_info), cmp_info_name);
  for (i = 1; i < n; i++) {
    if (strcmp(h->tensors[i].name, h->tensors[i - 1].name) == 0)
      return lt_errorf("safetensors: %s: tensor '%.200s' appears twice", src, h->tensors[i].name);
  }
  /* overlaps: sorted by begin, each non-empty range must start at or after the end of the previous ones */
  const lt_st_info **by_begin = malloc((n ? (size_t)n : 1) * sizeof(*by_begin));
  if (!by_begin) return lt_errorf("safetensors: %s: out of memory", src);
  for (i = 0; i < n; i++) by_begin[i] = &h->tensors[i];
  qsort(by_begin, (size_t)n, sizeof(*by_begin), cmp_info_begin);
  const lt_st_info *last = NULL;
  for (i = 0; i < n; i++) {
    const lt_st_info *t = by_begin[i];
    if (t->begin == t->end) continue;
    if (last && t->begin < last->end) {
      int rc =
          lt_errorf("safetensors: %s: tensors '%.200s' [%lld, %lld] and '%.200s' [%lld, %lld] overlap", src, last->name,
                    (long long)last->begin, (long long)last->end, t->name, (long long)t->begin, (long long)t->end);
      free(by_begin);
      return rc;
    }
    last = t;
  }
  free(by_begin);
  return 0;
}

int lt_st_parse(lt_st_header **out, const void *buf, int64_t len, int64_t file_size, const char *source) {
  const char *src = source ? source : "buffer";
  if (!out) return lt_errorf("safetensors: %s: out is NULL", src);
  *out = NULL;
  if (!buf && len > 0) return lt_errorf("safetensors: %s: buffer is NULL", src);
  if (len < 8 || file_size < 8)
    return lt_errorf("safetensors: %s: too short (%lld bytes) to hold the 8-byte header length", src,
                     (long long)(len < file_size ? len : file_size));
  const unsigned char *p = buf;
  uint64_t n = 0;
  for (int k = 7; k >= 0; k--) n = (n << 8) | p[k]; /* little-endian */
  if (n > LT_ST_MAX_HEADER)
    return lt_errorf("safetensors: %s: header length %llu exceeds the bound of %d bytes (not a safetensors file?)", src,
                     (unsigned long long)n, LT_ST_MAX_HEADER);
  if ((int64_t)n > file_size - 8)
    return lt_errorf("safetensors: %s: header length %llu runs past the end of the file (%lld bytes)", src,
                     (unsigned long long)n, (long long)file_size);
  if ((int64_t)n > len - 8)
    return lt_errorf("safetensors: %s: header length %llu but only %lld bytes given", src, (unsigned long long)n,
                     (long long)len);
  const char *json = (const char *)p + 8;
  if (n < 2 || json[0] != '{') return lt_errorf("safetensors: %s: header does not start with a JSON object '{'", src);
  int64_t nul_len = 0, nul_at = lt_json_nul_string(json, (int64_t)n, &nul_len);
  if (nul_at >= 0) {
    char shown[256];
    lt_name_shown(shown, sizeof shown, json + nul_at, (size_t)nul_len);
    return lt_errorf("safetensors: %s: the header string %s holds a NUL character (\\u0000); names and metadata "
                     "must not",
                     src, shown);
  }
  const char *end = NULL;
  cJSON *root = cJSON_ParseWithLengthOpts(json, (size_t)n, &end, 0);
  if (!root) {
    long at = end && end >= json && end <= json + n ? (long)(end - json) : -1;
    return lt_errorf("safetensors: %s: header is not well-formed JSON (at byte %ld of %llu)", src, at,
                     (unsigned long long)n);
  }
  for (const char *q = end; q < json + n; q++) {
    if (*q != ' ' && *q != '\t' && *q != '\n' && *q != '\r') {
      cJSON_Delete(root);
      return lt_errorf("safetensors: %s: header has extra bytes after the JSON object (at byte %ld; padding must be "
                       "spaces)",
                       src, (long)(q - json));
    }
  }
  if (!cJSON_IsObject(root)) {
    cJSON_Delete(root);
    return lt_errorf("safetensors: %s: header is not a JSON object", src);
  }
  lt_st_header *h = calloc(1, sizeof *h);
  if (!h) {
    cJSON_Delete(root);
    return lt_errorf("safetensors: %s: out of memory", src);
  }
  h->fd = -1;
  h->header_len = (int64_t)n;
  h->data_offset = 8 + (int64_t)n;
  h->file_size = file_size;
  int rc = parse_root(src, root, h);
  cJSON_Delete(root);
  if (rc != 0) {
    lt_st_free_parsed(h);
    return -1;
  }
  *out = h;
  return 0;
}

int lt_st_count(const lt_st_header *h, int64_t *count) {
  if (!h || !count) return lt_errorf("safetensors: count: header or count is NULL");
  *count = h->count;
  return 0;
}

int lt_st_tensor(const lt_st_header *h, int64_t i, lt_st_info *info) {
  if (!h || !info) return lt_errorf("safetensors: tensor: header or info is NULL");
  if (i < 0 || i >= h->count)
    return lt_errorf("safetensors: tensor index %lld out of range [0, %lld)", (long long)i, (long long)h->count);
  *info = h->tensors[i];
  return 0;
}

int lt_st_find(const lt_st_header *h, const char *name, int64_t *index) {
  if (!h || !name || !index) return lt_errorf("safetensors: find: header, name or index is NULL");
  int64_t lo = 0, hi = h->count; /* binary search: tensors are sorted by name */
  while (lo < hi) {
    int64_t mid = lo + (hi - lo) / 2;
    int c = strcmp(h->tensors[mid].name, name);
    if (c == 0) {
      *index = mid;
      return 0;
    }
    if (c < 0)
      lo = mid + 1;
    else
      hi = mid;
  }
  *index = -1;
  return 0;
}

int lt_st_data_offset(const lt_st_header *h, int64_t *offset) {
  if (!h || !offset) return lt_errorf("safetensors: data_offset: header or offset is NULL");
  *offset = h->data_offset;
  return 0;
}

int lt_st_metadata_count(const lt_st_header *h, int64_t *count) {
  if (!h || !count) return lt_errorf("safetensors: metadata_count: header or count is NULL");
  *count = h->n_meta;
  return 0;
}

int lt_st_metadata(const lt_st_header *h, int64_t i, const char **key, const char **value) {
  if (!h || !key || !value) return lt_errorf("safetensors: metadata: header, key or value is NULL");
  if (i < 0 || i >= h->n_meta)
    return lt_errorf("safetensors: metadata index %lld out of range [0, %lld)", (long long)i, (long long)h->n_meta);
  *key = h->meta_keys[i];
  *value = h->meta_values[i];
  return 0;
}
