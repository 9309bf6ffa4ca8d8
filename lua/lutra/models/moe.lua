-- The "moe" architecture: Mixtral's layout (Jiang et al. 2024; Hugging Face's MixtralForCausalLM):
-- Llama's blocks (RoPE, RMSNorm, grouped-query attention, no biases) with each MLP replaced by a
-- sparse mixture of SwiGLU experts (nn.MoE): n_experts of width ffn_hidden, top_k of them per
-- token, their weights renormalised over the chosen ones. The other MoE keys (capacity_factor,
-- n_shared_experts, norm_topk_prob, aux_loss_coef, z_loss_coef) are nn.MoE's, and n_experts
-- turns any arch's MLPs into MoE layers (mlp = "gelu" gives GELU experts).
local llama = require "lutra.models.llama"

local defaults = {}
for k, v in pairs(llama.defaults) do defaults[k] = v end
defaults.n_experts, defaults.top_k = 8, 2

return {defaults = defaults}
