/* backend_cuda.cu — the CUDA table (host/ops/backend.h): every kernel launcher the op fronts call. */
#include "kernels/common.cuh"
extern "C" {
#include "ops/backend.h"
}

/* lt_cuda_use_device (core/cuda.h, C++ linkage) for the host C: checks the device exists
 * and makes it current, before anything touches a CUDA tensor's memory. */
static int use_device(const char *op, int device) { return lt_cuda_use_device(op, device); }

/* in the struct's order (C++17 has no designated initializers) */
extern "C" const lt_backend lt_backend_cuda = {
    "cuda",
    use_device,
    lt_cuda_strided_copy,
    lt_cuda_convert_contig,
    lt_cuda_unary,
    lt_cuda_unary_backward,
    lt_cuda_clamp,
    lt_cuda_binary,
    lt_cuda_where,
    lt_cuda_reduce,
    lt_cuda_argreduce,
    lt_cuda_softmax,
    lt_cuda_layer_norm_forward,
    lt_cuda_layer_norm_backward,
    lt_cuda_check_indices,
    lt_cuda_cross_entropy_forward,
    lt_cuda_cross_entropy_backward,
    lt_cuda_embedding_forward,
    lt_cuda_embedding_backward,
    lt_cuda_gather,
    lt_cuda_rope,
    lt_cuda_rng_fill,
    lt_cuda_attention_fwd_uses_mma,
    lt_cuda_attention_bwd_uses_mma,
    lt_cuda_attention_forward,
    lt_cuda_attention_backward,
    lt_cuda_gemm,
    lt_cuda_linear_forward,
    lt_cuda_linear_backward_params,
    lt_cuda_adamw_multi,
    lt_cuda_lion,
    lt_cuda_sumsq_multi,
    lt_cuda_scale_multi,
    lt_cuda_clip_coef,
    lt_cuda_sort,
    lt_cuda_sort_backward,
    lt_cuda_cumsum,
    lt_cuda_tril,
    lt_cuda_adafactor,
    lt_cuda_adafactor_multi,
    lt_cuda_lamb,
    lt_cuda_lamb_multi,
};
