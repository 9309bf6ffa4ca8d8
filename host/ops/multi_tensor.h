/* multi_tensor.h — the checks and chunk loops that the optimizer ops (ops/adamw.c, ops/lion.c)
 * share with the multi-tensor ops (ops/multi_tensor.c, which defines them). The entry of a
 * multi-tensor call and its chunking are in kernels/multi_tensor.h. */
#ifndef LUTRA_OPS_MULTI_TENSOR_H
#define LUTRA_OPS_MULTI_TENSOR_H
#include "core/internal.h"
#include "kernels/multi_tensor.h"

/* what itself for a single-tensor op, else "what[i]" (the plural the multi op names). */
const char *lt_optim_name(char *buf, int len, const char *what, int64_t i, bool single);
/* One optimizer operand, on any device: t defined, on param's device, n elements, dtype_a or dtype_b. */
int lt_optim_check_operand(const char *op, const char *what, const lt_tensor *t, int64_t n, int dtype_a, int dtype_b,
                           const lt_tensor *param);
/* A CUDA tensor's storage must be on its device: a pointer is never handed to a kernel otherwise. */
int lt_optim_check_storage(const char *op, const char *what, const lt_tensor *t);
/* "<op>: lutra was built without CUDA" in a CPU-only build for a CUDA device, else 0. */
int lt_optim_check_build(const char *op, int device);
/* Calls fn(ctx, c) for every chunk c < chunks, over OpenMP threads when elements is large. */
void lt_optim_for_chunks(int64_t chunks, int64_t elements, void (*fn)(void *ctx, int64_t c), void *ctx);
/* Numbers the chunks of entries[0..n) (first_chunk); returns their total. */
int64_t lt_optim_number_chunks(lt_optim_entry *entries, int64_t n);

#endif
