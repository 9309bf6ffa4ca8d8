/* tensor.h — the C API, part: tensors: lifecycle, element access, views, copies, storage residency.
 * Include lutra.h, which includes every part in order (and cmake/gen_cdef.awk follows the
 * same order into the one ffi.cdef text); the conventions are at the head of lutra.h. */
#ifndef LUTRA_TENSOR_H
#define LUTRA_TENSOR_H

/* ---- tensor lifecycle ------------------------------------------------------- */

lt_tensor *lt_tensor_new(void); /* undefined tensor, refcount 1 */
int lt_retain(lt_tensor *t);
int lt_release(lt_tensor *t);     /* frees at refcount 0 (NULL is ok) */
int lt_free_storage(lt_tensor *t); /* drop t's storage now: t becomes undefined */
int lt_is_defined(const lt_tensor *t);
int lt_is_contiguous(const lt_tensor *t);
int64_t lt_numel(const lt_tensor *t);
void *lt_data_ptr(const lt_tensor *t); /* address of element [0,...,0] */

/* Allocates fresh storage for `out` (dropping what it had). */
int lt_empty(lt_tensor *out, int ndim, const int64_t *shape, int dtype, int device);
/* Makes `out` share src's storage and geometry. */
int lt_set(lt_tensor *out, const lt_tensor *src);

/* ---- element access (CPU tensors; values as double) -------------------------- */

int lt_item(const lt_tensor *t, double *value); /* t must hold one element */
int lt_get_at(const lt_tensor *t, const int64_t *index, double *value);
int lt_set_at(lt_tensor *t, const int64_t *index, double value);
/* Contiguous host buffer <-> tensor of the same numel, converting dtypes. */
int lt_copy_from_buffer(lt_tensor *dst, const void *src, int src_dtype, int64_t count);
int lt_copy_to_buffer(const lt_tensor *src, void *dst, int dst_dtype, int64_t count);

/* ---- views (no copy: out shares src's storage) ------------------------------- */

int lt_view(lt_tensor *out, const lt_tensor *src, int ndim, const int64_t *shape); /* one dim may be -1 */
int lt_reshape(lt_tensor *out, const lt_tensor *src, int ndim, const int64_t *shape); /* copies if it must */
int lt_transpose(lt_tensor *out, const lt_tensor *src, int dim0, int dim1);
int lt_permute(lt_tensor *out, const lt_tensor *src, int ndim, const int64_t *dims);
int lt_narrow(lt_tensor *out, const lt_tensor *src, int dim, int64_t start, int64_t length);
int lt_slice(lt_tensor *out, const lt_tensor *src, int dim, int64_t start, int64_t stop, int64_t step);
int lt_select(lt_tensor *out, const lt_tensor *src, int dim, int64_t index);
int lt_expand(lt_tensor *out, const lt_tensor *src, int ndim, const int64_t *shape); /* -1 keeps a dim */
int lt_unsqueeze(lt_tensor *out, const lt_tensor *src, int dim);
int lt_squeeze(lt_tensor *out, const lt_tensor *src, int dim); /* dim must have size 1 */
int lt_squeeze_all(lt_tensor *out, const lt_tensor *src);
int lt_contiguous(lt_tensor *out, const lt_tensor *src); /* a view if src already is */
int lt_broadcast_shape(int ndim_a, const int64_t *shape_a, int ndim_b, const int64_t *shape_b, int *ndim_out,
                       int64_t *shape_out);

/* ---- copy and creation ------------------------------------------------------- */

/* dst = src converted to dst's dtype and device; src broadcasts to dst's shape. */
int lt_copy(lt_tensor *dst, const lt_tensor *src);
int lt_fill(lt_tensor *out, double value);
int lt_arange(lt_tensor *out, double start, double end, double step, int dtype, int device);
int lt_linspace(lt_tensor *out, double start, double end, int64_t steps, int dtype, int device);


/* ---- storage residency (lutra.dist.zero stage 3) ------------------------------ */

/* Frees the bytes of t's storage but keeps the storage object (its views and the
 * references autograd saved stay valid); data becomes NULL, nbytes 0. No-op when
 * already released. Reading t before restoring is a use-after-free. */
int lt_storage_release_bytes(lt_tensor *t);
/* Allocates the bytes of a released storage again (at least nbytes, and all that t
 * reaches), uninitialised; no-op when resident. */
int lt_storage_restore_bytes(lt_tensor *t, int64_t nbytes);
int lt_storage_is_resident(const lt_tensor *t); /* 1: t's storage holds its bytes */

#endif
