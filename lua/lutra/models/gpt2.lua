-- The GPT-2 architecture (Radford et al. 2019; nanoGPT's layout): learned positions,
-- LayerNorm with biases, a 4x GELU (tanh) MLP, tied input and output embeddings.
-- The defaults are GPT-2 small (124M parameters).
return {
  defaults = {
    n_layer = 12, n_head = 12, d_model = 768, vocab_size = 50257, block_size = 1024, dropout = 0, bias = true,
    norm_eps = 1e-5, pos = "learned", norm = "layernorm", mlp = "gelu", tie_embeddings = true, init_std = 0.02,
    rope_theta = 10000,
  },
}
