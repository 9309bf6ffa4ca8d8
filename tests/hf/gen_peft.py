"""Writes tests/hf/fixtures/peft: tiny gpt2, llama, qwen2, qwen3 and mistral base models and one peft
adapter directory per LoraConfig option (and some combined, and the options on each family), each saved by peft's save_pretrained, with what peft computes
from them in float64: the adapted model's logits, merge_and_unload's weights of layer 0, and (DoRA)
the gradients of a loss with respect to layer 0's adapter weights.

    python gen_peft.py OUTDIR                       # the fixtures (regen.sh peft)
    python gen_peft.py --check-lutra LUTRA_BIN DIR  # lutra saves adapters of each option, peft loads them

OUTDIR/gpt2, OUTDIR/llama      base models: config.json (the keys lutra reads), model.safetensors (f32)
OUTDIR/qwen2, qwen3, mistral   base models as transformers' save_pretrained writes them (config.json of
                               Qwen2Config (q/k/v biases, tied), Qwen3Config (q_norm/k_norm, head_dim
                               16 with hidden 32 and 4 heads), MistralConfig (sliding_window 4 < T = 8))
OUTDIR/ids.json                the token ids (2 rows of 8) and the loss targets
OUTDIR/<name>/                 peft's adapter_model.safetensors + adapter_config.json
OUTDIR/<name>.ref.safetensors  logits (f64); merged.<HF weight> (f32, layer 0); grad.<key> (f64, DoRA)
OUTDIR/adapters.json           name -> {base, options}

--check-lutra: for each option, lutra (tests/hf/fixtures/peft's base) applies the adapters with that
option, gives B and the DoRA magnitudes random values, trains 3 AdamW steps (biases and saved modules
move too), writes its logits and saves the adapter; peft loads that
directory on the same base in float64 and the logits are compared (max relative difference printed).
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import torch
from safetensors.torch import load_file, save_file
from transformers import (AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM,
                          MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config,
                          Qwen3ForCausalLM)
from peft import LoraConfig, PeftModel, get_peft_model

V, T = 64, 8

GPT2_CFG = dict(model_type="gpt2", architectures=["GPT2LMHeadModel"], n_layer=2, n_head=4, n_embd=32,
                vocab_size=V, n_positions=32, n_ctx=32, n_inner=64, layer_norm_epsilon=1e-5,
                activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                tie_word_embeddings=True, initializer_range=0.02)
LLAMA_CFG = dict(model_type="llama", architectures=["LlamaForCausalLM"], num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, hidden_size=32, intermediate_size=48,
                 vocab_size=V, max_position_embeddings=32, rms_norm_eps=1e-6, rope_theta=10000.0,
                 hidden_act="silu", attention_bias=True, mlp_bias=True, tie_word_embeddings=False,
                 initializer_range=0.02)
# the families saved by transformers' own save_pretrained: (config class, model class, config kwargs, seed)
SMALL = dict(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, hidden_size=32, intermediate_size=48,
             vocab_size=V, max_position_embeddings=32, rms_norm_eps=1e-6, bos_token_id=0, eos_token_id=0)
SAVED = {
    "qwen2": (Qwen2Config, Qwen2ForCausalLM, dict(SMALL, tie_word_embeddings=True), 4),
    "qwen3": (Qwen3Config, Qwen3ForCausalLM, dict(SMALL, head_dim=16, tie_word_embeddings=False), 5),
    "mistral": (MistralConfig, MistralForCausalLM, dict(SMALL, sliding_window=4, tie_word_embeddings=False), 6),
}
ARCHS = ("gpt2", "llama") + tuple(SAVED)

# name -> (base, LoraConfig options); each a peft adapter directory
ADAPTERS = {
    "gpt2_plain": ("gpt2", dict(r=4, lora_alpha=8, target_modules=["c_attn", "c_proj", "c_fc"], fan_in_fan_out=True)),
    "gpt2_rslora": ("gpt2", dict(r=4, lora_alpha=6, target_modules=["c_attn", "c_fc"], fan_in_fan_out=True,
                                 use_rslora=True)),
    "gpt2_bias_all": ("gpt2", dict(r=4, lora_alpha=8, target_modules=["c_attn"], fan_in_fan_out=True, bias="all")),
    "gpt2_bias_lora_only": ("gpt2", dict(r=4, lora_alpha=8, target_modules=["c_attn", "mlp.c_proj"],
                                         fan_in_fan_out=True, bias="lora_only")),
    "gpt2_mts_lm_head": ("gpt2", dict(r=4, lora_alpha=8, target_modules=["c_attn"], fan_in_fan_out=True,
                                      modules_to_save=["lm_head"])),
    "gpt2_mts_wte": ("gpt2", dict(r=4, lora_alpha=8, target_modules=["c_fc"], fan_in_fan_out=True,
                                  modules_to_save=["wte"])),
    "gpt2_dora": ("gpt2", dict(r=4, lora_alpha=8, target_modules=["c_attn", "c_fc"], fan_in_fan_out=True,
                               use_dora=True)),
    "gpt2_layers": ("gpt2", dict(r=4, lora_alpha=8, target_modules=["c_attn", "c_proj"], fan_in_fan_out=True,
                                 layers_to_transform=[1], layers_pattern="h")),
    "llama_qv": ("llama", dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights="gaussian")),
    "llama_all_linear": ("llama", dict(r=4, lora_alpha=16, target_modules="all-linear")),
    "llama_patterns": ("llama", dict(r=4, lora_alpha=8, target_modules="all-linear",
                                     rank_pattern={"q_proj": 2, "model.layers.1.mlp.down_proj": 6, "layers\\.0\\.mlp\\.up_proj": 3},
                                     alpha_pattern={"v_proj": 3, "o_proj": 32, "gate_proj": 5})),
    "llama_layers": ("llama", dict(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj", "down_proj"],
                                   layers_to_transform=[1], layers_pattern="layers")),
    "llama_bias_all": ("llama", dict(r=4, lora_alpha=8, target_modules=["o_proj", "up_proj"], bias="all")),
    "llama_bias_lora_only": ("llama", dict(r=4, lora_alpha=8, target_modules=["k_proj", "gate_proj"],
                                           bias="lora_only")),
    "llama_mts": ("llama", dict(r=4, lora_alpha=8, target_modules=["q_proj"], modules_to_save=["lm_head", "embed_tokens"])),
    "llama_dora": ("llama", dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "o_proj", "gate_proj"],
                                 use_dora=True)),
    "llama_combined": ("llama", dict(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "down_proj"],
                                     use_dora=True, use_rslora=True, bias="lora_only", modules_to_save=["lm_head"],
                                     rank_pattern={"k_proj": 2}, alpha_pattern={"down_proj": 12},
                                     layers_to_transform=[0, 1], layers_pattern="layers")),
    "qwen2_all_linear": ("qwen2", dict(r=4, lora_alpha=8, target_modules="all-linear")),
    "qwen2_bias_all": ("qwen2", dict(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj"], bias="all")),
    "qwen2_bias_lora_only": ("qwen2", dict(r=4, lora_alpha=8, target_modules=["k_proj", "o_proj", "up_proj"],
                                           bias="lora_only")),
    "qwen2_mts_lm_head": ("qwen2", dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                        modules_to_save=["lm_head"])),
    "qwen3_all_linear": ("qwen3", dict(r=4, lora_alpha=8, target_modules="all-linear")),
    "qwen3_dora": ("qwen3", dict(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "down_proj"],
                                 use_dora=True)),
    "qwen3_patterns": ("qwen3", dict(r=4, lora_alpha=8, target_modules="all-linear",
                                     rank_pattern={"q_proj": 2, "model.layers.1.mlp.gate_proj": 6},
                                     alpha_pattern={"k_proj": 3, "o_proj": 32})),
    "mistral_all_linear": ("mistral", dict(r=4, lora_alpha=16, target_modules="all-linear")),
    "mistral_dora": ("mistral", dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "o_proj", "up_proj"],
                                     use_dora=True)),
}
# merge_and_unload's layer-0 weights are kept for these
MERGED = {"gpt2_plain", "gpt2_dora", "llama_patterns", "llama_dora", "llama_combined", "gpt2_bias_lora_only",
          "qwen2_bias_lora_only", "qwen3_dora", "mistral_dora"}
# the gradients of the loss with respect to layer 0's adapter weights (DoRA) are kept for these
GRADS = {"gpt2_dora", "llama_dora", "qwen3_dora", "mistral_dora"}


def base_model(arch, dtype=torch.float32):
    if arch in SAVED:
        config_class, model_class, fields, seed = SAVED[arch]
        torch.manual_seed(seed)
        model = model_class(config_class(**fields))
        return randomized_base(model).to(dtype).eval()
    torch.manual_seed(1 if arch == "gpt2" else 2)
    fields = dict(GPT2_CFG if arch == "gpt2" else LLAMA_CFG)
    for k in ("model_type", "architectures"):
        fields.pop(k)
    fields.update(bos_token_id=0, eos_token_id=0)
    if arch == "gpt2":
        model = GPT2LMHeadModel(GPT2Config(**fields))
    else:
        fields["rope_parameters"] = {"rope_type": "default", "rope_theta": fields.pop("rope_theta")}
        model = LlamaForCausalLM(LlamaConfig(**fields))
    return randomized_base(model).to(dtype).eval()


def randomized_base(model):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "ln" in name or "norm" in name:
                p.copy_(1 + 0.1 * torch.randn_like(p) if name.endswith("weight") else 0.1 * torch.randn_like(p))
            else:
                p.copy_(0.15 * torch.randn_like(p))
    return model


def load_base(outdir, arch, dtype):
    if arch in SAVED:
        return AutoModelForCausalLM.from_pretrained(os.path.join(outdir, arch), dtype=dtype).eval()
    model = base_model(arch, torch.float32)
    sd = load_file(os.path.join(outdir, arch, "model.safetensors"))
    model.load_state_dict(sd, strict=False)
    if arch == "gpt2":
        model.tie_weights()
    return model.to(dtype).eval()


def write_base(outdir, arch):
    model = base_model(arch)
    d = os.path.join(outdir, arch)
    if arch in SAVED:
        model.save_pretrained(d)
        return
    os.makedirs(d, exist_ok=True)
    sd = {k: v.contiguous() for k, v in model.state_dict().items()}
    if arch == "gpt2":
        sd.pop("lm_head.weight")
    save_file(sd, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(GPT2_CFG if arch == "gpt2" else LLAMA_CFG, f, indent=2, sort_keys=True)


def ids_and_targets():
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, V, (2, T), generator=g)
    targets = torch.randint(0, V, (2, T), generator=g)
    return ids, targets


def randomize(model, seed):
    """Adapters that are not the identity: random B, magnitudes, biases and saved-module copies."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not p.requires_grad:
                continue
            noise = torch.randn(p.shape, generator=g, dtype=p.dtype)
            if "lora_magnitude_vector" in name:
                p.mul_(1 + 0.3 * noise)
            elif "lora_B" in name:
                p.copy_(0.3 * noise)
            elif "lora_A" in name:
                p.add_(0.1 * noise)
            else:  # biases (bias="all"/"lora_only"), modules_to_save copies
                p.add_(0.2 * noise)


def layer0_weights(model, arch):
    prefix = "transformer.h.0." if arch == "gpt2" else "model.layers.0."
    return {k: v for k, v in model.state_dict().items() if k.startswith(prefix) and k.endswith("weight")
            and ("attn" in k or "mlp" in k)}


def references(outdir, name, arch, ids, targets):
    d = os.path.join(outdir, name)
    out = {}
    pm = PeftModel.from_pretrained(load_base(outdir, arch, torch.float64), d, is_trainable=name in GRADS).eval()
    with torch.no_grad():
        out["logits"] = pm(ids).logits.contiguous()
    if name in GRADS:
        pm.train()
        logits = pm(ids).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, V), targets.reshape(-1))
        loss.backward()
        out["loss"] = loss.detach().reshape(1)
        layer0 = ".h.0." if arch == "gpt2" else ".layers.0."
        for k, p in pm.named_parameters():
            if p.requires_grad and layer0 in k:
                key = k.removeprefix("base_model.model.").replace(".default", "")
                out["grad." + key] = p.grad.detach().contiguous()
        pm.eval()
    if name in MERGED:
        merged = pm.merge_and_unload()
        for k, v in layer0_weights(merged, arch).items():
            out["merged." + k] = v.to(torch.float32).contiguous()
    save_file(out, os.path.join(outdir, name + ".ref.safetensors"))
    return out


def generate(outdir):
    if os.path.isdir(outdir):
        shutil.rmtree(outdir)
    os.makedirs(outdir)
    for arch in ARCHS:
        write_base(outdir, arch)
    ids, targets = ids_and_targets()
    # mistral's window (4 < T) must shape the logits, or its adapters would not test it
    windowed = load_base(outdir, "mistral", torch.float64)
    full = AutoModelForCausalLM.from_pretrained(os.path.join(outdir, "mistral"), dtype=torch.float64,
                                                sliding_window=None).eval()
    with torch.no_grad():
        a, b = windowed(ids).logits, full(ids).logits
    assert ((a - b).abs().max() / a.abs().max()).item() > 0.1, "mistral's sliding window changes nothing"
    with open(os.path.join(outdir, "ids.json"), "w") as f:
        json.dump({"ids": ids.tolist(), "targets": targets.tolist()}, f)
    listing = {}
    for i, (name, (arch, opts)) in enumerate(sorted(ADAPTERS.items())):
        torch.manual_seed(100 + i)
        base = load_base(outdir, arch, torch.float32)
        pm = get_peft_model(base, LoraConfig(task_type="CAUSAL_LM", **opts))
        randomize(pm, 200 + i)
        pm.save_pretrained(os.path.join(outdir, name))
        readme = os.path.join(outdir, name, "README.md")
        if os.path.exists(readme):
            os.remove(readme)
        # peft writes target_modules from a set (its order follows the hash seed): sorted, the same every run
        conf_path = os.path.join(outdir, name, "adapter_config.json")
        with open(conf_path) as f:
            conf = json.load(f)
        if isinstance(conf.get("target_modules"), list):
            conf["target_modules"] = sorted(conf["target_modules"])
        with open(conf_path, "w") as f:
            json.dump(conf, f, indent=2, sort_keys=True)
        references(outdir, name, arch, ids, targets)
        listing[name] = {"base": arch, "options": opts}
        print("peft: %s (%s)" % (name, ", ".join(sorted(opts))))
    with open(os.path.join(outdir, "adapters.json"), "w") as f:
        json.dump(listing, f, indent=1, sort_keys=True)


# ---- lutra -> peft -------------------------------------------------------------------------------

# name -> (base, lora.apply options as Lua source)
LUTRA_CASES = {
    "gpt2_plain": ("gpt2", '{targets = {"c_attn", "c_proj", "c_fc"}, r = 4, alpha = 8}'),
    "gpt2_rslora": ("gpt2", '{targets = {"c_attn"}, r = 4, alpha = 6, rslora = true}'),
    "gpt2_bias_all": ("gpt2", '{targets = {"c_attn"}, r = 4, alpha = 8, bias = "all"}'),
    "gpt2_bias_lora_only": ("gpt2", '{targets = {"c_attn", "mlp%.c_proj"}, r = 4, alpha = 8, bias = "lora_only"}'),
    "gpt2_mts_lm_head": ("gpt2", '{targets = {"c_attn"}, r = 4, alpha = 8, modules_to_save = {"lm_head"}}'),
    "gpt2_mts_wte": ("gpt2", '{targets = {"c_fc"}, r = 4, alpha = 8, modules_to_save = {"wte"}}'),
    "gpt2_dora": ("gpt2", '{targets = {"c_attn", "c_fc"}, r = 4, alpha = 8, dora = true}'),
    "gpt2_layers": ("gpt2", '{targets = {"c_attn", "c_proj"}, r = 4, alpha = 8, layers = {1}}'),
    "llama_fused": ("llama", '{targets = "all-linear", r = 4, alpha = 8}'),
    "llama_qv": ("llama", '{targets = {"q_proj", "v_proj"}, r = 4, alpha = 8}'),
    # modules no list of short names selects: target_modules is written as a regex
    "llama_regex": ("llama", '{targets = {"blocks%.0%.attn%.qkv", "blocks%.1%.mlp%.proj"}, r = 4, alpha = 8, dora = true}'),
    "gpt2_dropout_dora": ("gpt2", '{targets = "all-linear", r = 8, alpha = 4, rslora = true, dropout = 0.1, dora = true}'),
    "llama_patterns": ("llama", '{targets = "all-linear", split_fused = true, r = 4, alpha = 8, '
                                'rank_pattern = {q_proj = 2, ["model.layers.1.mlp.down_proj"] = 6}, '
                                'alpha_pattern = {v_proj = 3, o_proj = 32}}'),
    "llama_bias_all": ("llama", '{targets = {"o_proj", "up_proj"}, r = 4, alpha = 8, bias = "all"}'),
    "llama_bias_lora_only": ("llama", '{targets = {"k_proj", "gate_proj"}, r = 4, alpha = 8, bias = "lora_only"}'),
    "llama_mts": ("llama", '{targets = {"q_proj"}, r = 4, alpha = 8, modules_to_save = {"lm_head", "embed_tokens"}}'),
    "llama_dora": ("llama", '{targets = {"q_proj", "v_proj", "o_proj", "gate_proj"}, r = 4, alpha = 8, dora = true}'),
    "llama_combined": ("llama", '{targets = {"q_proj", "k_proj", "v_proj", "o_proj", "down_proj"}, r = 4, alpha = 8, '
                                'dora = true, rslora = true, bias = "lora_only", modules_to_save = {"lm_head"}, '
                                'rank_pattern = {k_proj = 2}, alpha_pattern = {down_proj = 12}, layers = {0, 1}}'),
    "qwen2_all_linear": ("qwen2", '{targets = "all-linear", split_fused = true, r = 4, alpha = 8}'),
    "qwen2_bias_all": ("qwen2", '{targets = {"q_proj", "k_proj", "v_proj"}, r = 4, alpha = 8, bias = "all"}'),
    "qwen2_bias_lora_only": ("qwen2", '{targets = {"k_proj", "o_proj", "up_proj"}, r = 4, alpha = 8, bias = "lora_only"}'),
    "qwen2_mts_lm_head": ("qwen2", '{targets = {"q_proj", "v_proj"}, r = 4, alpha = 8, modules_to_save = {"lm_head"}}'),
    "qwen3_all_linear": ("qwen3", '{targets = "all-linear", r = 4, alpha = 8}'),
    "qwen3_dora": ("qwen3", '{targets = {"q_proj", "k_proj", "v_proj", "o_proj", "down_proj"}, r = 4, alpha = 8, '
                            'dora = true}'),
    "qwen3_patterns": ("qwen3", '{targets = "all-linear", split_fused = true, r = 4, alpha = 8, '
                                'rank_pattern = {q_proj = 2, ["model.layers.1.mlp.gate_proj"] = 6}, '
                                'alpha_pattern = {k_proj = 3, o_proj = 32}}'),
    "mistral_all_linear": ("mistral", '{targets = "all-linear", r = 4, alpha = 16}'),
    "mistral_dora": ("mistral", '{targets = {"q_proj", "v_proj", "o_proj", "up_proj"}, r = 4, alpha = 8, dora = true}'),
}

LUA = r'''
local lt = require "lutra"
local hf, lora, st = require "lutra.hf", require "lutra.lora", require "lutra.ckpt.safetensors"
local fx, out, ids_json = ...
local fixed = require("lutra.json").read_file(ids_json)
local ids = lt.tensor(fixed.ids, {dtype = "i64"})
local targets = lt.tensor(fixed.targets, {dtype = "i64"})
local cases = {CASES}
for _, c in ipairs(cases) do
  local name, arch, opts = c[1], c[2], c[3]
  local model = hf.load_pretrained(fx .. "/" .. arch)
  lora.apply(model, opts)
  lt.manual_seed(7)
  -- random B and magnitudes, then a few AdamW steps: biases and saved modules move as training moves them
  lt.no_grad(function()
    for _, p in ipairs(lora.trainable(model)) do
      local n, t = p[1], p[2]
      local noise = lt.randn(t.shape, {dtype = t.dtype})
      if n:find("lora_B") then t:copy_(noise * 0.3)
      elseif n:find("magnitude") then t:copy_(t * (noise * 0.3 + 1)) end
    end
  end)
  local opt = lt.optim.AdamW(lora.param_groups(model, {weight_decay = 0}), {lr = 0.05})
  for _ = 1, 3 do
    local _, loss = model(ids, targets)
    loss:backward()
    opt:step()
    opt:zero_grad()
  end
  model:eval()
  local logits = lt.no_grad(function() return model(ids) end)
  lora.save(out .. "/" .. name, model)
  st.save(out .. "/" .. name .. ".lutra.safetensors", {logits = logits:contiguous()})
  print("lutra: saved " .. name)
end
'''


def lua_table(cases):
    rows = []
    for name, (arch, opts) in sorted(cases.items()):
        rows.append('{"%s", "%s", %s}' % (name, arch, opts))
    return ", ".join(rows)


def check_lutra(lutra, fixtures):
    ids, _ = ids_and_targets()
    tmp = tempfile.mkdtemp(prefix="peft-check-")
    script = os.path.join(tmp, "save.lua")
    with open(script, "w") as f:
        f.write(LUA.replace("{CASES}", "{" + lua_table(LUTRA_CASES) + "}"))
    subprocess.run([lutra, script, fixtures, tmp, os.path.join(fixtures, "ids.json")], check=True)
    worst = 0.0
    for name, (arch, _) in sorted(LUTRA_CASES.items()):
        pm = PeftModel.from_pretrained(load_base(fixtures, arch, torch.float64), os.path.join(tmp, name)).eval()
        with torch.no_grad():
            ref = pm(ids).logits
        got = load_file(os.path.join(tmp, name + ".lutra.safetensors"))["logits"].to(torch.float64)
        with torch.no_grad():
            base = load_base(fixtures, arch, torch.float64)(ids).logits
        rel = ((got - ref).abs().max() / ref.abs().max()).item()
        moved = ((base - ref).abs().max() / ref.abs().max()).item()
        worst = max(worst, rel)
        print("save->peft %-22s max rel diff %.3g (the adapter moves the logits by %.3g)" % (name, rel, moved))
    shutil.rmtree(tmp)
    print("save->peft: worst %.3g over %d adapters" % (worst, len(LUTRA_CASES)))
    return 0 if worst <= 1e-5 else 1


def main(argv):
    torch.use_deterministic_algorithms(True)
    if len(argv) == 4 and argv[1] == "--check-lutra":
        return check_lutra(argv[2], argv[3])
    if len(argv) != 2:
        print(__doc__)
        return 2
    generate(argv[1])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
