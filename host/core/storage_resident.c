/* storage_resident.c — releasing a storage's bytes and allocating them again, in place.
 *
 * ZeRO stage 3 (FSDP) keeps every parameter as a tensor of its full shape whose bytes
 * exist only while its module runs. Autograd's saved references (the parameter, views
 * of it) hold the storage object, not the bytes, so the storage must stay the same
 * object: these functions free and re-allocate its data, as FSDP's storage resize to 0.
 * A released storage has data NULL and nbytes 0; its views and refcounts are untouched,
 * and its final lt_storage_release frees nothing more. Reading a released tensor is the
 * caller's bug (lutra.dist.zero gathers before any module runs): check
 * lt_storage_is_resident first where unsure. */
#include "core/internal.h"
#include <stdlib.h>

int lt_storage_is_resident(const lt_tensor *t) { return t && t->storage && t->storage->data; }

int lt_storage_release_bytes(lt_tensor *t) {
  if (lt_check_defined("storage_release_bytes", "t", t)) return -1;
  lt_storage *s = t->storage;
  if (!s->data) return 0; /* already released */
  /* hand the bytes back through the allocator (statistics, the CPU block cache) under a
   * temporary header, so that lt_storage_release's accounting stays the one place */
  lt_storage *tmp = malloc(sizeof *tmp);
  if (!tmp) return lt_errorf("storage_release_bytes: out of host memory");
  *tmp = (lt_storage){.data = s->data, .nbytes = s->nbytes, .refcount = 1, .device = s->device};
  lt_storage_release(tmp);
  s->data = NULL;
  s->nbytes = 0;
  return 0;
}

/* Bytes that t's view reaches in its storage: offset + the furthest element + 1. */
static int64_t reach_bytes(const lt_tensor *t) {
  int64_t numel = lt_shape_numel(t->ndim, t->shape);
  if (numel == 0) return t->offset;
  int64_t last = 0;
  for (int d = 0; d < t->ndim; d++) last += (t->shape[d] - 1) * (t->stride[d] < 0 ? -t->stride[d] : t->stride[d]);
  return t->offset + (last + 1) * lt_dtype_size(t->dtype);
}

int lt_storage_restore_bytes(lt_tensor *t, int64_t nbytes) {
  if (lt_check_defined("storage_restore_bytes", "t", t)) return -1;
  lt_storage *s = t->storage;
  if (s->data) return 0; /* resident: nothing to do */
  int64_t need = reach_bytes(t);
  if (nbytes < need) nbytes = need;
  lt_storage *fresh = lt_storage_alloc("storage_restore_bytes", nbytes, s->device);
  if (!fresh) return -1;
  s->data = fresh->data; /* the bytes move into the old header; the new one goes */
  s->nbytes = fresh->nbytes;
  free(fresh);
  return 0;
}
