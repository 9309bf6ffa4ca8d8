/* safetensors.h — the parsed header shared by io/safetensors.c (parsing, validation) and
 * io/safetensors_file.c (files: open, load, save). Never seen by Lua. */
#ifndef LUTRA_SAFETENSORS_H
#define LUTRA_SAFETENSORS_H
#include "lutra.h"

enum { LT_ST_MAX_HEADER = 100 * 1000 * 1000 }; /* bytes of JSON, as the reference implementation bounds it */

struct lt_st_header {
  int64_t count;       /* tensors, sorted by name */
  lt_st_info *tensors; /* names point into `names` */
  char *names;         /* every name, NUL-terminated, back to back */
  int64_t n_meta;
  char **meta_keys; /* sorted by key; point into the two blocks */
  char **meta_values;
  char *meta_key_block;
  char *meta_value_block;
  int64_t header_len;  /* N */
  int64_t data_offset; /* 8 + N */
  int64_t file_size;
  int fd;     /* -1 when parsed from a buffer */
  char *path; /* NULL when parsed from a buffer */
};

/* Frees the parsed parts (not the file); h itself too. */
void lt_st_free_parsed(lt_st_header *h);
/* Maps F32 ... BOOL to lt_dtype and back ("F32"). */
int lt_st_dtype_from_name(const char *name, int *dtype);
const char *lt_st_dtype_name(int dtype);

#endif
