"""peft adapter directories (tests/hf/fixtures/peft, written by peft 0.21): every adapter_config.json
field that changes the math in a way lutra does not implement is refused by name, as are unknown
fields, mistyped values, patterns lutra cannot read, and tensors the config does not explain. Each
error names the file and the field (or tensor)."""
import shutil

from badinput import ROOT, case, edit_json, rewrite_safetensors

FIXTURES = ROOT / "tests/hf/fixtures/peft"

LOAD_SCRIPT = """
local hf, lora = require "lutra.hf", require "lutra.lora"
local model = hf.load_pretrained("base")
lora.load("adapter", model)
print("adapter loaded")
"""

CONFIG = r"adapter/adapter_config\.json: "


def peft_case(title, adapter, changes, expect, exit=1, edit_tensors=None):
    """Copies the fixture adapter and its base, applies changes to adapter_config.json, loads it."""
    @case("peft adapter (%s) %s" % (adapter, title), expect=expect, exit=exit)
    def _(fx, tmp):
        base = "gpt2" if adapter.startswith("gpt2") else "llama"
        shutil.copytree(FIXTURES / base, tmp / "base")
        shutil.copytree(FIXTURES / adapter, tmp / "adapter")
        edit_json(tmp / "adapter/adapter_config.json", lambda c: c.update(changes))
        if edit_tensors:
            rewrite_safetensors(tmp / "adapter/adapter_model.safetensors", edit_tensors)
        return fx.lutra_cmd("-e", LOAD_SCRIPT)


# ---- features lutra does not implement: refused by their field ----------------------------------
NOT = CONFIG + r"%s = %s: lutra does not implement "
peft_case("lora_bias = true", "llama_qv", {"lora_bias": True}, NOT % ("lora_bias", "true") + "a trainable bias on lora_B")
peft_case("use_qalora = true", "llama_qv", {"use_qalora": True}, NOT % ("use_qalora", "true") + "QALoRA")
peft_case("target_parameters", "llama_qv", {"target_parameters": ["mlp.experts.gate_up_proj"]},
          NOT % ("target_parameters", r'\["mlp\.experts\.gate_up_proj"\]') + "adapters on parameters")
peft_case("megatron_config", "llama_qv", {"megatron_config": {"tensor_model_parallel_size": 2}},
          NOT % ("megatron_config", r'\{"tensor_model_parallel_size":2\}') + "Megatron-LM")
peft_case("trainable_token_indices", "gpt2_plain", {"trainable_token_indices": [1, 2]},
          NOT % ("trainable_token_indices", r"\[1,2\]") + "trainable token embeddings")
peft_case("layer_replication", "llama_qv", {"layer_replication": [[0, 2], [1, 2]]},
          NOT % ("layer_replication", r"\[\[0,2\],\[1,2\]\]") + "replicated layers")
peft_case("alora_invocation_tokens", "llama_qv", {"alora_invocation_tokens": [5, 6]},
          NOT % ("alora_invocation_tokens", r"\[5,6\]") + r"activated LoRA \(aLoRA\)")
peft_case("use_bdlora", "llama_qv", {"use_bdlora": {"lora_a_is_blockdiagonal": ["q_proj"]}},
          NOT % ("use_bdlora", r"\{.*\}") + r"block-diagonal LoRA")
peft_case("arrow_config", "llama_qv", {"arrow_config": {"top_k": 3}}, NOT % ("arrow_config", r"\{.*\}") + "Arrow routing")
peft_case("kasa_config", "llama_qv", {"kasa_config": {"x": 1}}, NOT % ("kasa_config", r"\{.*\}") + "KaSA")
peft_case("velora_config", "llama_qv", {"velora_config": {"x": 1}}, NOT % ("velora_config", r"\{.*\}") + "VeLoRA")
peft_case("monteclora_config", "llama_qv", {"monteclora_config": {"x": 1}},
          NOT % ("monteclora_config", r"\{.*\}") + "MonteCLoRA")
peft_case("ensure_weight_tying with modules_to_save", "gpt2_mts_lm_head", {"ensure_weight_tying": True},
          CONFIG + r"ensure_weight_tying = true: lutra needs false \(lutra unties an embedding saved by modules_to_save")
peft_case("an unknown field", "llama_qv", {"lora_frobnicate": 3},
          CONFIG + r"unknown field 'lora_frobnicate' \(lutra cannot tell whether it changes the model\)")

# ---- values ----------------------------------------------------------------------------------------
peft_case("peft_type LOHA", "llama_qv", {"peft_type": "LOHA"}, CONFIG + r'peft_type = "LOHA": lutra needs "LORA"')
peft_case("task_type SEQ_CLS", "llama_qv", {"task_type": "SEQ_CLS"},
          CONFIG + r'task_type = "SEQ_CLS": lutra needs "CAUSAL_LM" or null')
peft_case("bias = \"some\"", "llama_qv", {"bias": "some"}, CONFIG + r'bias = "some": lutra needs "none", "all" or "lora_only"')
peft_case("r as a string", "llama_qv", {"r": "4"}, CONFIG + r'r = "4": lutra needs a positive integer')
peft_case("r = 0", "llama_qv", {"r": 0}, CONFIG + r"r = 0: lutra needs a positive integer")
peft_case("lora_alpha < 0", "llama_qv", {"lora_alpha": -8}, CONFIG + r"lora_alpha = -8: lutra needs a positive number")
peft_case("lora_dropout 1.5", "llama_qv", {"lora_dropout": 1.5}, CONFIG + r"lora_dropout = 1.5: lutra needs a number in \[0, 1\)")
peft_case("use_dora as a string", "llama_qv", {"use_dora": "yes"}, CONFIG + r'use_dora = "yes": lutra needs true or false')
peft_case("fan_in_fan_out as a number", "gpt2_plain", {"fan_in_fan_out": 1}, CONFIG + r"fan_in_fan_out = 1: lutra needs true or false")
peft_case("modules_to_save as a string", "llama_mts", {"modules_to_save": "lm_head"},
          CONFIG + r'modules_to_save = "lm_head": lutra needs a list of module names')
peft_case("modules_to_save naming no module", "llama_qv", {"modules_to_save": ["score"]},
          CONFIG + r"modules_to_save 'score' matches no module of this model")
peft_case("modules_to_save naming a part of a fused layer", "llama_all_linear", {"modules_to_save": ["q_proj"]},
          CONFIG + r"modules_to_save 'q_proj' is part of lutra's fused 'blocks\.0\.attn\.qkv'")
peft_case("rank_pattern with a fraction", "llama_patterns", {"rank_pattern": {"q_proj": 2.5}},
          CONFIG + r"rank_pattern\.q_proj = 2\.5: lutra needs a positive integer")
peft_case("rank_pattern with a regex lutra does not read", "llama_patterns", {"rank_pattern": {"q{1}_proj": 2}},
          CONFIG + r"rank_pattern: pattern 'q\{1\}_proj': the character '\{'")
peft_case("alpha_pattern as a list", "llama_patterns", {"alpha_pattern": [1, 2]},
          CONFIG + r"alpha_pattern = \[1,2\]: lutra needs an object")
peft_case("rank_pattern keys that both match with different values", "llama_patterns",
          {"rank_pattern": {"q_proj": 2, "self_attn\\.q_proj": 3}},
          CONFIG + r"rank_pattern: the keys '.*' and '.*' both match model\.layers\.\d\.self_attn\.q_proj with different values")
peft_case("rank_pattern that disagrees with the tensors' shapes", "llama_patterns", {"rank_pattern": {}},
          r"lora\.load: blocks\.\d\.attn\.qkv: shapes in the file: model\.layers\.\d\.self_attn\.q_proj A \[2, 32\]; "
          r"the model's \[4, 32\]")
peft_case("layers_to_transform that leaves out a layer the file has", "llama_layers", {"layers_to_transform": [0]},
          r"adapter/adapter_model\.safetensors: base_model\.model\.model\.layers\.1\.\S+lora_A\.weight is in layer 1, "
          r"not in layers_to_transform")
peft_case("layers_to_transform as a string", "llama_layers", {"layers_to_transform": "1"},
          CONFIG + r'layers_to_transform = "1": lutra needs a layer index or a list of them')

# ---- the config against the tensors ----------------------------------------------------------------
peft_case("use_dora = true without magnitudes", "llama_qv", {"use_dora": True},
          r"adapter/adapter_model\.safetensors: use_dora is true but there is no "
          r"base_model\.model\.model\.layers\.\d\.self_attn\.\w+\.lora_magnitude_vector")
peft_case("use_dora = false with magnitudes", "llama_dora", {"use_dora": False},
          r"adapter/adapter_model\.safetensors: tensor 'base_model\.model\.\S+\.lora_magnitude_vector' but "
          r"adapter/adapter_config\.json has use_dora false")
peft_case("bias = none with the biases of bias = all", "gpt2_bias_all", {"bias": "none"},
          r"adapter/adapter_model\.safetensors: tensor '\S+bias' is neither an adapter weight nor explained by "
          r'bias = "none" or modules_to_save')
peft_case("modules_to_save dropped while the file holds lm_head", "llama_mts", {"modules_to_save": None},
          r"adapter/adapter_model\.safetensors: tensor '(lm_head|model\.embed_tokens)\.weight' is neither an adapter weight")
peft_case("a tensor that names no parameter", "llama_qv", {},
          r"adapter/adapter_model\.safetensors: tensor 'model\.layers\.0\.mlp\.frob\.weight' names no parameter",
          edit_tensors=lambda h, d: (dict(h, **{"base_model.model.model.layers.0.mlp.frob.weight":
                                                {"dtype": "F32", "shape": [4], "data_offsets": [len(d), len(d) + 16]}}),
                                     d + bytes(16)))

# ---- accepted: fields that only change how peft initialises new adapters ---------------------------
peft_case("init_lora_weights = \"pissa\" (initialisation only: the saved adapter is what it is)", "llama_qv",
          {"init_lora_weights": "pissa"}, r"adapter loaded", exit=0)
peft_case("loftq_config and eva_config (initialisation only)", "gpt2_plain",
          {"loftq_config": {"loftq_bits": 4}, "eva_config": {"rho": 2.0}}, r"adapter loaded", exit=0)
peft_case("rank_pattern with (a|b) alternation, as the fixture's ranks", "llama_patterns",
          {"rank_pattern": {"(q)_proj": 2, "model\\.layers\\.1\\.mlp\\.down_proj": 6, "layers.0.mlp.up_proj": 3}},
          r"adapter loaded", exit=0)
