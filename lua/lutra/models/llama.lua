-- The Llama architecture (Touvron et al. 2023; Hugging Face's layout): RoPE ("rotate
-- half"), RMSNorm, a SwiGLU MLP, grouped-query attention, no biases, separate input
-- and output embeddings. ffn_hidden defaults to 8/3 d_model rounded up to a multiple
-- of 32 (nn.SwiGLU); n_kv_head to n_head (set it lower for GQA, 1 for MQA).
return {
  defaults = {
    n_layer = 12, n_head = 12, d_model = 768, vocab_size = 32000, block_size = 2048, dropout = 0, bias = false,
    norm_eps = 1e-5, pos = "rope", norm = "rmsnorm", mlp = "swiglu", tie_embeddings = false, init_std = 0.02,
    rope_theta = 10000,
  },
}
