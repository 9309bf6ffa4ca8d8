/* ckpt_manifest.c — validates a checkpoint's manifest.json before Lua trusts any of it
 * (lutra.h, "checkpoint io"). Every path it names (files, extra, copied) is a plain file name
 * inside the checkpoint directory, and no string holds a NUL character (io/names.h: cJSON
 * would cut "rank_00000.lz4\u0000/../x" short where Lua keeps it whole). Depends on lt_errorf
 * and cJSON only, so that the fuzz harness (tests/fuzz/fuzz_manifest.c) compiles this file alone. */
#include "core/internal.h"
#include "io/names.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

enum { MAX_MANIFEST = 256 << 20, MAX_NAME = 1024 };

static const struct {
  const char *name;
  int size;
} dtypes[] = {{"f32", 4}, {"f64", 8}, {"bf16", 2}, {"f16", 2}, {"i32", 4}, {"i64", 8}, {"u8", 1}, {"bool", 1}};

/* An exact integer in [0, 2^53]. */
static int as_int(const cJSON *x, int64_t *v) {
  if (!cJSON_IsNumber(x)) return -1;
  double d = x->valuedouble;
  if (!(d >= 0 && d <= 9007199254740992.0) || d != (double)(int64_t)d) return -1;
  *v = (int64_t)d;
  return 0;
}

/* A list of at most 8 integers into v; its length, or -1. */
static int int_list(const cJSON *a, int64_t *v) {
  if (!cJSON_IsArray(a)) return -1;
  int n = cJSON_GetArraySize(a);
  if (n > LT_MAX_DIMS) return -1;
  int i = 0;
  for (const cJSON *x = a->child; x; x = x->next, i++)
    if (as_int(x, &v[i]) != 0) return -1;
  return n;
}

/* A file name: plain (no '/', not "." or ".."), printable, bounded. */
static int plain_name(const char *s) {
  size_t n = strlen(s);
  if (n == 0 || n > 255 || strcmp(s, ".") == 0 || strcmp(s, "..") == 0) return 0;
  for (size_t i = 0; i < n; i++)
    if (s[i] == '/' || (unsigned char)s[i] < 32) return 0;
  return 1;
}

/* root[key], when present (required: when absent too), a list of plain file names: the shard
 * files, each rank's extra state, the files copied in. Its length into *count. */
static int name_list(const char *src, const cJSON *root, const char *key, int required, int *count) {
  const cJSON *list = cJSON_GetObjectItemCaseSensitive(root, key);
  *count = 0;
  if (!list && !required) return 0;
  if (!cJSON_IsArray(list) || (required && cJSON_GetArraySize(list) < 1) || cJSON_GetArraySize(list) > (1 << 20))
    return lt_errorf("ckpt: %s: %s must be a%s list of file names", src, key, required ? " non-empty" : "");
  int i = 0;
  for (const cJSON *f = list->child; f; f = f->next, i++) {
    if (!cJSON_IsString(f) || !plain_name(f->valuestring)) {
      char shown[128];
      if (cJSON_IsString(f))
        lt_name_shown(shown, sizeof shown, f->valuestring, strlen(f->valuestring));
      else
        snprintf(shown, sizeof shown, "(not a string)");
      return lt_errorf("ckpt: %s: %s[%d] = '%s': entries must be plain file names in the checkpoint directory (no "
                       "'/', not '.' or '..')",
                       src, key, i, shown);
    }
  }
  *count = i;
  return 0;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

static int check_piece(const char *src, const char *name, int64_t k, const cJSON *p, int nfiles, int ndim,
                       const int64_t *shape, int size) {
  if (!cJSON_IsObject(p))
    return lt_errorf("ckpt: %s: tensor '%.200s': piece %lld is not an object", src, name, (long long)k);
  int64_t file, index, bytes, off[LT_MAX_DIMS], box[LT_MAX_DIMS];
  if (as_int(cJSON_GetObjectItemCaseSensitive(p, "file"), &file) != 0 || file >= nfiles)
    return lt_errorf("ckpt: %s: tensor '%.200s': piece %lld: file must index the %d files", src, name, (long long)k,
                     nfiles);
  if (as_int(cJSON_GetObjectItemCaseSensitive(p, "index"), &index) != 0)
    return lt_errorf("ckpt: %s: tensor '%.200s': piece %lld: index must be a non-negative integer", src, name,
                     (long long)k);
  if (int_list(cJSON_GetObjectItemCaseSensitive(p, "offset"), off) != ndim ||
      int_list(cJSON_GetObjectItemCaseSensitive(p, "shape"), box) != ndim)
    return lt_errorf("ckpt: %s: tensor '%.200s': piece %lld: offset and shape must be %d integers", src, name,
                     (long long)k, ndim);
  int64_t count = 1;
  for (int d = 0; d < ndim; d++) {
    if (off[d] > shape[d] || box[d] > shape[d] - off[d])
      return lt_errorf("ckpt: %s: tensor '%.200s': piece %lld: dim %d: [%lld, +%lld) outside the global size %lld", src,
                       name, (long long)k, d, (long long)off[d], (long long)box[d], (long long)shape[d]);
    count *= box[d]; /* bounded by the global count, checked below */
  }
  if (as_int(cJSON_GetObjectItemCaseSensitive(p, "bytes"), &bytes) != 0 || bytes != count * size)
    return lt_errorf("ckpt: %s: tensor '%.200s': piece %lld: bytes must be %lld (its elements times the dtype size)",
                     src, name, (long long)k, (long long)(count * size));
  return 0;
}

static int check_tensor(const char *src, int64_t i, const cJSON *t, int nfiles, const char **name_out,
                        int64_t *pieces) {
  if (!cJSON_IsObject(t)) return lt_errorf("ckpt: %s: tensor %lld is not an object", src, (long long)i);
  const cJSON *nm = cJSON_GetObjectItemCaseSensitive(t, "name");
  if (!cJSON_IsString(nm) || !nm->valuestring[0] || strlen(nm->valuestring) > MAX_NAME)
    return lt_errorf("ckpt: %s: tensor %lld: name must be a non-empty string", src, (long long)i);
  const char *name = nm->valuestring;
  *name_out = name;
  const cJSON *dt = cJSON_GetObjectItemCaseSensitive(t, "dtype");
  int size = 0;
  for (size_t k = 0; cJSON_IsString(dt) && k < sizeof dtypes / sizeof dtypes[0]; k++)
    if (strcmp(dt->valuestring, dtypes[k].name) == 0) size = dtypes[k].size;
  if (!size) return lt_errorf("ckpt: %s: tensor '%.200s': unknown dtype", src, name);
  int64_t shape[LT_MAX_DIMS];
  int ndim = int_list(cJSON_GetObjectItemCaseSensitive(t, "shape"), shape);
  if (ndim < 0)
    return lt_errorf("ckpt: %s: tensor '%.200s': shape must be a list of at most 8 non-negative integers", src, name);
  int64_t count = 1;
  for (int d = 0; d < ndim; d++) {
    if (shape[d] != 0 && count > ((int64_t)1 << 50) / shape[d])
      return lt_errorf("ckpt: %s: tensor '%.200s': shape too large", src, name);
    count *= shape[d];
  }
  const cJSON *ps = cJSON_GetObjectItemCaseSensitive(t, "pieces");
  if (!cJSON_IsArray(ps)) return lt_errorf("ckpt: %s: tensor '%.200s': pieces must be a list", src, name);
  int64_t k = 0;
  for (const cJSON *p = ps->child; p; p = p->next, k++) LT_TRY(check_piece(src, name, k, p, nfiles, ndim, shape, size));
  *pieces += k;
  return 0;
}

static int check_root(const char *src, const cJSON *root, int64_t *n_tensors, int64_t *n_pieces) {
  if (!cJSON_IsObject(root)) return lt_errorf("ckpt: %s: the manifest is not a JSON object", src);
  const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(root, "format");
  if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, "lutra-checkpoint") != 0)
    return lt_errorf("ckpt: %s: not a lutra checkpoint manifest (format is not \"lutra-checkpoint\")", src);
  int64_t version, step;
  if (as_int(cJSON_GetObjectItemCaseSensitive(root, "version"), &version) != 0 || version != 1)
    return lt_errorf("ckpt: %s: manifest version must be 1 (this lutra reads version 1)", src);
  if (as_int(cJSON_GetObjectItemCaseSensitive(root, "step"), &step) != 0)
    return lt_errorf("ckpt: %s: step must be a non-negative integer", src);
  int nfiles = 0, nextra = 0, ncopied = 0;
  LT_TRY(name_list(src, root, "files", 1, &nfiles));
  LT_TRY(name_list(src, root, "extra", 0, &nextra));
  LT_TRY(name_list(src, root, "copied", 0, &ncopied));
  if (cJSON_GetObjectItemCaseSensitive(root, "extra") && nextra != nfiles)
    return lt_errorf("ckpt: %s: extra lists %d files, one per rank's file (%d)", src, nextra, nfiles);
  const cJSON *world = cJSON_GetObjectItemCaseSensitive(root, "world");
  int64_t w;
  if (world && (as_int(world, &w) != 0 || w != nfiles))
    return lt_errorf("ckpt: %s: world must be the number of rank files (%d)", src, nfiles);
  const cJSON *kind = cJSON_GetObjectItemCaseSensitive(root, "kind");
  if (kind && !cJSON_IsString(kind)) return lt_errorf("ckpt: %s: kind must be a string", src);
  const cJSON *ts = cJSON_GetObjectItemCaseSensitive(root, "tensors");
  if (!cJSON_IsArray(ts)) return lt_errorf("ckpt: %s: tensors must be a list", src);
  int n = cJSON_GetArraySize(ts);
  const char **names = malloc((size_t)(n ? n : 1) * sizeof *names);
  if (!names) return lt_errorf("ckpt: %s: out of memory", src);
  int64_t i = 0, pieces = 0;
  for (const cJSON *t = ts->child; t; t = t->next, i++) {
    if (check_tensor(src, i, t, nfiles, &names[i], &pieces) != 0) {
      free(names);
      return -1;
    }
  }
  qsort(names, (size_t)n, sizeof *names, cmp_str);
  for (int k = 1; k < n; k++) {
    if (strcmp(names[k - 1], names[k]) == 0) {
      lt_errorf("ckpt: %s: tensor '%.200s' is listed twice", src, names[k]);
      free(names);
      return -1;
    }
  }
  free(names);
  if (n_tensors) *n_tensors = n;
  if (n_pieces) *n_pieces = pieces;
  return 0;
}

int lt_ckpt_manifest_check(const char *text, int64_t len, const char *source, int64_t *n_tensors, int64_t *n_pieces) {
  const char *src = source ? source : "manifest";
  if (!text || len < 0) return lt_errorf("ckpt: %s: no manifest text", src);
  if (len > MAX_MANIFEST)
    return lt_errorf("ckpt: %s: manifest of %lld bytes is over the 256 MB bound", src, (long long)len);
  int64_t nul_len = 0, nul_at = lt_json_nul_string(text, len, &nul_len);
  if (nul_at >= 0) {
    char shown[256];
    lt_name_shown(shown, sizeof shown, text + nul_at, (size_t)nul_len);
    return lt_errorf("ckpt: %s: the string %s holds a NUL character (\\u0000): names and paths must not", src,
                     shown);
  }
  const char *end = NULL;
  cJSON *root = cJSON_ParseWithLengthOpts(text, (size_t)len, &end, 0);
  if (!root)
    return lt_errorf("ckpt: %s: the manifest is not valid JSON (near byte %lld)", src,
                     (long long)(end && end >= text ? end - text : 0));
  int rc = check_root(src, root, n_tensors, n_pieces);
  cJSON_Delete(root);
  return rc;
}
