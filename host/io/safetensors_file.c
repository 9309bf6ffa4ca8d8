/* safetensors_file.c — safetensors files: open (read and validate the header, keep the file
 * open), load a tensor (pread straight into its storage), save (header built with cJSON,
 * padded with spaces to 8 bytes, data in name order, written to a temporary file that is
 * fsync'ed and renamed: io/atomic_file.c). Parsing is in io/safetensors.c. */
#define _GNU_SOURCE
#include "io/ckpt.h" /* lt_ckpt_pread_all */
#include "io/atomic_file.h"
#include "core/internal.h"
#include "io/names.h"
#include "io/safetensors.h"
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

int lt_st_open(lt_st_header **out, const char *path) {
  if (!out) return lt_errorf("safetensors: open: out is NULL");
  *out = NULL;
  if (!path) return lt_errorf("safetensors: open: path is NULL");
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return lt_errorf("safetensors: cannot open %s: %s", path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return lt_errorf("safetensors: %s is not a regular file", path);
  }
  int64_t size = (int64_t)st.st_size;
  unsigned char len8[8] = {0};
  if (size < 8 || lt_ckpt_pread_all(fd, len8, 8, 0) != 0) {
    close(fd);
    return lt_errorf("safetensors: %s: too short (%lld bytes) to hold the 8-byte header length", path, (long long)size);
  }
  uint64_t n = 0;
  for (int k = 7; k >= 0; k--) n = (n << 8) | len8[k];
  /* bound the length before allocating for it (lt_st_parse says which bound failed) */
  int64_t want = n <= LT_ST_MAX_HEADER && (int64_t)n <= size - 8 ? 8 + (int64_t)n : 8;
  unsigned char *buf = malloc((size_t)want);
  if (!buf) {
    close(fd);
    return lt_errorf("safetensors: %s: out of memory for a %lld-byte header", path, (long long)want);
  }
  if (lt_ckpt_pread_all(fd, buf, want, 0) != 0) {
    free(buf);
    close(fd);
    return lt_errorf("safetensors: %s: read failed: %s", path, errno ? strerror(errno) : "unexpected end of file");
  }
  lt_st_header *h;
  int rc = lt_st_parse(&h, buf, want, size, path);
  free(buf);
  if (rc != 0) {
    close(fd);
    return -1;
  }
  h->path = strdup(path);
  if (!h->path) {
    close(fd);
    lt_st_free_parsed(h);
    return lt_errorf("safetensors: %s: out of memory", path);
  }
  h->fd = fd;
  *out = h;
  return 0;
}

int lt_st_close(lt_st_header *h) {
  if (!h) return 0;
  if (h->fd >= 0) close(h->fd);
  lt_st_free_parsed(h);
  return 0;
}

int lt_st_load(lt_tensor *out, const lt_st_header *h, int64_t i) {
  if (!h || !out) return lt_errorf("safetensors: load: header or out is NULL");
  if (h->fd < 0) return lt_errorf("safetensors: load: the header was parsed from a buffer, not opened from a file");
  if (i < 0 || i >= h->count)
    return lt_errorf("safetensors: %s: tensor index %lld out of range [0, %lld)", h->path, (long long)i,
                     (long long)h->count);
  const lt_st_info *t = &h->tensors[i];
  char op[64];
  snprintf(op, sizeof op, "safetensors load '%.40s'", t->name);
  LT_TRY(lt_prepare_out(op, out, t->ndim, t->shape, t->dtype, LT_DEVICE_CPU));
  if (!lt_is_contiguous(out))
    return lt_errorf("safetensors: %s: tensor '%.200s': out must be contiguous", h->path, t->name);
  if (lt_ckpt_pread_all(h->fd, lt_data_ptr(out), t->end - t->begin, h->data_offset + t->begin) != 0)
    return lt_errorf("safetensors: %s: tensor '%.200s': read of bytes [%lld, %lld) failed: %s", h->path, t->name,
                     (long long)(h->data_offset + t->begin), (long long)(h->data_offset + t->end),
                     errno ? strerror(errno) : "the file ends early (truncated?)");
  return 0;
}

static _Thread_local const char *const *tls_names; /* the names qsort's comparator sees */
static int cmp_index_by_name(const void *a, const void *b) {
  return strcmp(tls_names[*(const int64_t *)a], tls_names[*(const int64_t *)b]);
}

/* The header JSON (tensors in the order `order`), padded with spaces so that 8 + its
 * length is a multiple of 8. Returns a malloc'ed string, NULL with the error set. */
static char *build_header(const char *path, int64_t n, const char *const *names, const lt_tensor *const *tensors,
                          const int64_t *order, int64_t n_meta, const char *const *meta_keys,
                          const char *const *meta_values, int64_t *header_len) {
  cJSON *root = cJSON_CreateObject();
  if (!root) return lt_errorf("safetensors: %s: out of memory", path), NULL;
  if (n_meta > 0) {
    cJSON *meta = cJSON_AddObjectToObject(root, "__metadata__");
    for (int64_t k = 0; meta && k < n_meta; k++) {
      if (!meta_keys[k] || !meta_values[k]) {
        cJSON_Delete(root);
        return lt_errorf("safetensors: %s: metadata key or value %lld is NULL", path, (long long)k), NULL;
      }
      if (cJSON_GetObjectItemCaseSensitive(meta, meta_keys[k])) {
        cJSON_Delete(root);
        return lt_errorf("safetensors: %s: metadata key '%.200s' given twice", path, meta_keys[k]), NULL;
      }
      cJSON_AddStringToObject(meta, meta_keys[k], meta_values[k]);
    }
  }
  int64_t offset = 0;
  for (int64_t k = 0; k < n; k++) {
    const lt_tensor *t = tensors[order[k]];
    int64_t nbytes = lt_numel(t) * lt_dtype_size(t->dtype);
    cJSON *e = cJSON_AddObjectToObject(root, names[order[k]]); /* keys in the reference writer's order */
    cJSON *dtype = e ? cJSON_AddStringToObject(e, "dtype", lt_st_dtype_name(t->dtype)) : NULL;
    cJSON *shape = dtype ? cJSON_AddArrayToObject(e, "shape") : NULL;
    cJSON *offs = shape ? cJSON_AddArrayToObject(e, "data_offsets") : NULL;
    if (!offs) break;
    for (int d = 0; d < t->ndim; d++) cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)t->shape[d]));
    cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)offset));
    cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)(offset + nbytes)));
    offset += nbytes;
  }
  char *json = cJSON_PrintUnformatted(root);
  cJSON_Delete(root);
  if (!json) return lt_errorf("safetensors: %s: out of memory for the header", path), NULL;
  size_t len = strlen(json), padded = (len + 7) / 8 * 8;
  char *out = realloc(json, padded + 1);
  if (!out) {
    free(json);
    return lt_errorf("safetensors: %s: out of memory for the header", path), NULL;
  }
  memset(out + len, ' ', padded - len);
  out[padded] = 0;
  *header_len = (int64_t)padded;
  return out;
}

int lt_st_save(const char *path, int64_t n, const char *const *names, const lt_tensor *const *tensors, int64_t n_meta,
               const char *const *meta_keys, const char *const *meta_values) {
  if (!path) return lt_errorf("safetensors: save: path is NULL");
  if (n < 0 || (n > 0 && (!names || !tensors)) || n_meta < 0 || (n_meta > 0 && (!meta_keys || !meta_values)))
    return lt_errorf("safetensors: save %s: bad counts or NULL lists", path);
  for (int64_t k = 0; k < n; k++) {
    const lt_tensor *t = tensors[k];
    if (!names[k]) return lt_errorf("safetensors: save %s: name %lld is NULL", path, (long long)k);
    if (strcmp(names[k], "__metadata__") == 0)
      return lt_errorf("safetensors: save %s: a tensor may not be named __metadata__", path);
    if (!lt_utf8_valid(names[k], strlen(names[k]), NULL)) { /* the reader refuses it */
      char shown[256];
      lt_name_shown(shown, sizeof shown, names[k], strlen(names[k]));
      return lt_errorf("safetensors: save %s: tensor name '%s' is not valid UTF-8", path, shown);
    }
    char what[96];
    snprintf(what, sizeof what, "tensor '%.60s'", names[k]);
    LT_TRY(lt_check_defined("safetensors save", what, t));
    if (t->device != LT_DEVICE_CPU || !lt_is_contiguous(t))
      return lt_errorf("safetensors: save %s: tensor '%.200s' must be contiguous on the cpu", path, names[k]);
    if (!lt_st_dtype_name(t->dtype))
      return lt_errorf("safetensors: save %s: tensor '%.200s' has dtype %s, which safetensors has no name for", path,
                       names[k], lt_dtype_name(t->dtype));
  }
  for (int64_t k = 0; k < n_meta; k++) {
    if (meta_keys[k] && meta_values[k] && (!lt_utf8_valid(meta_keys[k], strlen(meta_keys[k]), NULL) ||
                                           !lt_utf8_valid(meta_values[k], strlen(meta_values[k]), NULL)))
      return lt_errorf("safetensors: save %s: metadata '%.200s' is not valid UTF-8", path, meta_keys[k]);
  }
  int64_t *order = malloc((n ? (size_t)n : 1) * sizeof(int64_t));
  if (!order) return lt_errorf("safetensors: save %s: out of memory", path);
  for (int64_t k = 0; k < n; k++) order[k] = k;
  tls_names = names;
  qsort(order, (size_t)n, sizeof(int64_t), cmp_index_by_name);
  for (int64_t k = 1; k < n; k++) {
    if (strcmp(names[order[k]], names[order[k - 1]]) == 0) {
      int rc = lt_errorf("safetensors: save %s: tensor name '%.200s' given twice", path, names[order[k]]);
      free(order);
      return rc;
    }
  }
  int64_t header_len = 0;
  char *header = build_header(path, n, names, tensors, order, n_meta, meta_keys, meta_values, &header_len);
  if (!header) {
    free(order);
    return -1;
  }
  lt_atomic_file *f = NULL;
  int rc = 0;
  if (lt_atomic_file_open(&f, path) != 0) {
    rc = lt_io_error_prefix("safetensors: ");
  } else {
    unsigned char len8[8];
    for (int k = 0; k < 8; k++) len8[k] = (unsigned char)((uint64_t)header_len >> (8 * k));
    int bad = lt_atomic_file_write(f, len8, 8) || lt_atomic_file_write(f, header, header_len);
    for (int64_t k = 0; k < n && !bad; k++) {
      const lt_tensor *t = tensors[order[k]];
      bad = lt_atomic_file_write(f, lt_data_ptr(t), lt_numel(t) * lt_dtype_size(t->dtype));
    }
    if (bad) {
      rc = lt_io_error_prefix("safetensors: ");
      lt_atomic_file_abort(f);
    } else if (lt_atomic_file_commit(f, 0) != 0) {
      rc = lt_io_error_prefix("safetensors: ");
    }
  }
  free(order), free(header);
  return rc;
}
