"""Tiny models of each family lutra reads, written by transformers itself, with their logits.

    python gen_models.py OUTDIR                      write the fixtures (fixed seeds)
    python gen_models.py --only NAME [--only ...] OUTDIR   write just those models (the rest untouched)
    python gen_models.py --check-lutra LUTRA OUTDIR  the other direction: lutra (the binary LUTRA)
        saves each fixture model again (hf.save_pretrained) and converts it both ways (lutra
        convert: Hugging Face -> lutra checkpoint -> Hugging Face); transformers loads what lutra
        wrote and its logits are compared with the fixture's. Prints one line per model and
        exits 1 when a difference passes 1e-5 (relative to the largest logit). --only limits it too.

OUTDIR/<name>/ holds what save_pretrained wrote (config.json of transformers 5: dtype,
rope_parameters; one directory keeps the 4.x keys rope_theta, rope_scaling, torch_dtype) and
expected.safetensors: ids (B, T) i64 and logits (B, T, V) f64 that transformers computes from
the saved weights upcast to float64 (sdpa attention; eager, whose softmax is float32, must agree
to 1e-6; transformers computes RoPE's cos and sin in float32 whatever the model's dtype). Models whose RoPE depends
on the sequence length also hold ids_short / logits_short (a prefix within the pretraining
length). OUTDIR/rope.json: transformers' inverse frequencies and attention scaling for each RoPE
type (its float32 arrays, and the same functions run in float64).
"""
import argparse
import contextlib
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile

import torch
import transformers as tf
from safetensors.torch import load_file, save_file
from transformers import modeling_rope_utils as mru

B, T, T_SHORT = 2, 12, 6

BASE = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=128, max_position_embeddings=32, rms_norm_eps=1e-5, tie_word_embeddings=False)


def llama(**kw):
    return ("llama", {**BASE, **kw})


def llama1(**kw):
    """One layer: the RoPE variants differ in their frequencies only."""
    return llama(num_hidden_layers=1, **kw)


# name -> (family, config kwargs, options)
MODELS = {
    "gpt2": ("gpt2", dict(n_embd=32, n_layer=2, n_head=4, n_positions=16, n_inner=64, vocab_size=128, resid_pdrop=0.0,
                          embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=None, eos_token_id=None), {}),
    "gpt2_bf16_untied": ("gpt2", dict(n_embd=32, n_layer=2, n_head=2, n_positions=16, vocab_size=160,
                                      tie_word_embeddings=False, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                      bos_token_id=None, eos_token_id=None),
                         {"dtype": torch.bfloat16}),
    "llama": (*llama(rope_theta=500000.0), {}),
    "llama_linear": (*llama1(rope_scaling={"rope_type": "linear", "factor": 2.0}), {}),
    "llama_dynamic": (*llama1(max_position_embeddings=8, rope_scaling={"rope_type": "dynamic", "factor": 2.0}),
                      {"short": True}),
    "llama_llama3": (*llama1(rope_theta=500000.0, rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                                               "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                               "original_max_position_embeddings": 8}), {}),
    "llama_yarn": (*llama1(rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8,
                                        "beta_fast": 16.0, "beta_slow": 2.0}), {}),
    "llama_longrope": (*llama1(rope_scaling={"rope_type": "longrope", "original_max_position_embeddings": 8,
                                            "short_factor": [1.0, 1.2, 1.5, 2.0], "long_factor": [1.0, 2.0, 3.0, 4.0]}),
                       {"short": True}),
    # attention_bias, mlp_bias apart, head_dim apart from hidden_size / heads; sharded
    "llama_bias_headdim_sharded": (*llama(attention_bias=True, mlp_bias=False, head_dim=16), {"shard": "40KB"}),
    "qwen2": ("qwen2", {**BASE, "tie_word_embeddings": True}, {}),
    "qwen2_sliding": ("qwen2", {**BASE, "use_sliding_window": True, "sliding_window": 4, "max_window_layers": 1}, {}),
    "qwen3": ("qwen3", {**BASE, "head_dim": 16, "attention_bias": False}, {}),
    "qwen3_bias_bf16": ("qwen3", {**BASE, "head_dim": 8, "attention_bias": True, "tie_word_embeddings": True},
                        {"dtype": torch.bfloat16}),
    "mistral_window": ("mistral", {**BASE, "sliding_window": 4, "head_dim": 8}, {}),
    # SmolLM2's layout: a llama config, tied embeddings, no GQA
    "smollm2": (*llama(num_key_value_heads=4, tie_word_embeddings=True, rope_theta=100000.0), {"dtype": torch.bfloat16}),
    # a config.json in transformers 4.x's form: torch_dtype, rope_theta beside rope_scaling with "type"
    "llama_v4_config": (*llama1(rope_theta=20000.0, rope_scaling={"rope_type": "linear", "factor": 3.0}), {"v4": True}),
    # mixtures of experts: 4 experts, top 2, every layer sparse (what lutra reads)
    "mixtral": ("mixtral", {**BASE, "num_local_experts": 4, "num_experts_per_tok": 2, "intermediate_size": 16,
                            "sliding_window": 8}, {}),
    # norm_topk_prob false (transformers' default), a shared expert of its own width behind its sigmoid gate
    "qwen2_moe": ("qwen2_moe", {**BASE, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16,
                                "shared_expert_intermediate_size": 40, "norm_topk_prob": False}, {}),
    "qwen3_moe": ("qwen3_moe", {**BASE, "head_dim": 16, "num_experts": 4, "num_experts_per_tok": 2,
                                "moe_intermediate_size": 16, "norm_topk_prob": True}, {"dtype": torch.bfloat16}),
}

CONFIG = {"gpt2": tf.GPT2Config, "llama": tf.LlamaConfig, "qwen2": tf.Qwen2Config, "qwen3": tf.Qwen3Config,
          "mistral": tf.MistralConfig, "mixtral": tf.MixtralConfig, "qwen2_moe": tf.Qwen2MoeConfig,
          "qwen3_moe": tf.Qwen3MoeConfig}
CAUSAL_LM = {"gpt2": tf.GPT2LMHeadModel, "llama": tf.LlamaForCausalLM, "qwen2": tf.Qwen2ForCausalLM,
             "qwen3": tf.Qwen3ForCausalLM, "mistral": tf.MistralForCausalLM, "mixtral": tf.MixtralForCausalLM,
             "qwen2_moe": tf.Qwen2MoeForCausalLM, "qwen3_moe": tf.Qwen3MoeForCausalLM}


def randomise(model, seed):
    """Weights away from their init (norms off 1, biases off 0), so that a mix-up shows in the logits."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            r = torch.randn(p.shape, generator=g, dtype=torch.float64)
            if p.ndim == 1:
                p.copy_((1 + 0.2 * r) if ("norm" in name or "ln_" in name) else 0.2 * r)
            else:
                p.copy_(r / math.sqrt(p.shape[-1]))


def make(family, kwargs, seed):
    config = CONFIG[family](**kwargs)
    torch.manual_seed(seed)
    model = CAUSAL_LM[family](config)
    randomise(model, seed)
    return model.eval()


MOE = ("mixtral", "qwen2_moe", "qwen3_moe")


def load64(directory, impl):
    """The saved directory in transformers, weights upcast to float64 (the experts' eager loop: grouped_mm,
    transformers 5's default, takes no float64)."""
    with open(os.path.join(directory, "config.json")) as f:
        moe = json.load(f)["model_type"] in MOE
    kw = {"experts_implementation": "eager"} if moe else {}
    return tf.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float64, attn_implementation=impl, **kw).eval()


def logits_of(directory, ids, impl):
    """transformers' logits of the saved directory, weights upcast to float64."""
    model = load64(directory, impl)
    with torch.no_grad():
        return model(ids).logits


def bf16_logits(directory, ids):
    """transformers' logits of the directory's weights rounded to bfloat16 (by torch), then upcast to float64."""
    model = load64(directory, "sdpa")
    with torch.no_grad():  # the parameters only (RoPE's inv_freq buffer stays as transformers made it)
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).to(torch.float64))
    with torch.no_grad():
        return model(ids).logits


def rel_diff(a, b):
    return ((a.double() - b.double()).abs().max() / b.double().abs().max()).item()


def write_v4_config(directory):
    """config.json as transformers 4.x writes it: torch_dtype, rope_theta and rope_scaling (with "type")."""
    path = os.path.join(directory, "config.json")
    with open(path) as f:
        c = json.load(f)
    rp = c.pop("rope_parameters")
    c["rope_theta"] = rp.pop("rope_theta")
    kind = rp.pop("rope_type")
    c["rope_scaling"] = {"type": kind, **rp}
    c["torch_dtype"] = c.pop("dtype")
    c["transformers_version"] = "4.46.0"
    with open(path, "w") as f:
        json.dump(c, f, indent=2, sort_keys=True)


def write_model(out, name, seed):
    family, kwargs, opts = MODELS[name]
    model = make(family, kwargs, seed)
    directory = os.path.join(out, name)
    dtype = opts.get("dtype", torch.float32)
    model.to(dtype).save_pretrained(directory, max_shard_size=opts.get("shard", "50GB"))
    if opts.get("v4"):
        write_v4_config(directory)
    g = torch.Generator().manual_seed(seed + 1)
    ids = torch.randint(0, model.config.vocab_size, (B, T), generator=g)
    expected = {"ids": ids, "logits": logits_of(directory, ids, "sdpa")}
    # eager attention takes its softmax in float32: it agrees to float32's precision
    eager = rel_diff(logits_of(directory, ids, "eager"), expected["logits"])
    assert eager < 1e-6, (name, eager)
    if opts.get("short"):
        expected["ids_short"] = ids[:, :T_SHORT].contiguous()
        expected["logits_short"] = logits_of(directory, expected["ids_short"], "sdpa")
    save_file(expected, os.path.join(directory, "expected.safetensors"))
    files = sorted(os.listdir(directory))
    print("%-28s %-8s %-9s eager-sdpa %.2g  %s" % (name, family, str(dtype).replace("torch.", ""), eager,
                                                   " ".join(files)))


@contextlib.contextmanager
def float64_rope():
    """transformers' RoPE functions compute in float32 (torch.float); these run them in float64."""
    saved = torch.float, torch.float32
    torch.float = torch.float32 = torch.float64
    try:
        yield
    finally:
        torch.float, torch.float32 = saved


# (name, config kwargs, seq_lens) for the RoPE arrays
ROPE_CASES = [
    ("default", dict(rope_theta=10000.0), [None]),
    ("default_theta500k_hd64", dict(rope_theta=500000.0, head_dim=64), [None]),
    ("linear", dict(rope_scaling={"rope_type": "linear", "factor": 4.0}), [None]),
    ("dynamic", dict(max_position_embeddings=64, rope_scaling={"rope_type": "dynamic", "factor": 2.0}),
     [None, 32, 64, 65, 200]),
    ("llama3", dict(rope_theta=500000.0, head_dim=128, max_position_embeddings=131072,
                    rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                  "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}), [None]),
    ("yarn", dict(head_dim=64, max_position_embeddings=4096,
                  rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024}), [None]),
    ("yarn_beta_mscale", dict(head_dim=64, max_position_embeddings=4096,
                              rope_scaling={"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 512,
                                            "beta_fast": 24.0, "beta_slow": 2.0, "mscale": 0.707,
                                            "mscale_all_dim": 1.0}), [None]),
    ("yarn_no_truncate_attention_factor", dict(head_dim=32, max_position_embeddings=2048,
                                               rope_scaling={"rope_type": "yarn", "factor": 2.0,
                                                             "original_max_position_embeddings": 1024,
                                                             "truncate": False, "attention_factor": 1.3}), [None]),
    ("longrope", dict(head_dim=8, max_position_embeddings=256,
                      rope_scaling={"rope_type": "longrope", "original_max_position_embeddings": 64, "factor": 4.0,
                                    "short_factor": [1.0, 1.1, 1.3, 1.6], "long_factor": [1.0, 2.0, 4.0, 8.0]}),
     [None, 64, 65]),
]


def rope_arrays():
    out = []
    for name, kw, seq_lens in ROPE_CASES:
        config = tf.LlamaConfig(**{**BASE, **kw})
        rp = config.rope_parameters
        kind = rp["rope_type"]
        if kind == "default":
            fn = tf.models.llama.modeling_llama.LlamaRotaryEmbedding.compute_default_rope_parameters
        else:
            fn = mru.ROPE_INIT_FUNCTIONS[kind]
        for seq_len in seq_lens:
            args = (config, None) if kind != "default" else (config,)
            kw_seq = {"seq_len": seq_len} if kind != "default" else {}
            inv32, scale = fn(*args, **kw_seq)
            with float64_rope():
                inv64, scale64 = fn(*args, **kw_seq)
            assert inv32.dtype == torch.float32 and inv64.dtype == torch.float64, (name, inv32.dtype, inv64.dtype)
            out.append({"name": name, "config": json.loads(config.to_json_string(use_diff=False)),
                        "seq_len": seq_len, "inv_freq_f32": inv32.tolist(), "inv_freq_f64": inv64.tolist(),
                        "scale": float(scale), "scale_f64": float(scale64)})
    return out


def generate(out, only=None):
    """Every model and rope.json afresh; with only, just those models' directories (seeds unchanged)."""
    if only:
        for k, name in enumerate(MODELS):
            if name in only:
                shutil.rmtree(os.path.join(out, name), ignore_errors=True)
                write_model(out, name, 1000 + k)
        return
    if os.path.isdir(out):
        shutil.rmtree(out)
    os.makedirs(out)
    for k, name in enumerate(MODELS):
        write_model(out, name, 1000 + k)
    with open(os.path.join(out, "rope.json"), "w") as f:
        json.dump(rope_arrays(), f, indent=1)


# ---- the other direction: what lutra writes, loaded by transformers ----------------------------

SAVE_LUA = """
local hf = require "lutra.hf"
local src, dst, dtype, shard = ...
local model, tok = hf.load_pretrained(src, {allow_cast = true, dtype = "f32"})
hf.save_pretrained(dst, model, tok, {dtype = dtype ~= "" and dtype or nil,
                                     max_shard_size = shard ~= "" and tonumber(shard) or nil})
"""


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError("%s failed: %s%s" % (" ".join(cmd), r.stdout, r.stderr))


def check_lutra(lutra, fixtures, only=None):
    worst = 0.0
    tmp = tempfile.mkdtemp(prefix="lutra-models-")
    script = os.path.join(tmp, "save.lua")
    with open(script, "w") as f:
        f.write(SAVE_LUA)
    # save f32: lutra's save of the fixture against the fixture's logits; save bf16+shard: lutra's bf16
    # shards against the fixture rounded to bf16 by torch; convert x2: Hugging Face -> lutra -> Hugging Face
    print("%-28s %-8s %-14s %-14s %-14s" % ("model", "family", "save f32", "save bf16+shard", "convert x2"))
    failed = []
    for name in MODELS:
        if only and name not in only:
            continue
        try:
            worst = max(worst, check_one(lutra, script, tmp, fixtures, name))
        except RuntimeError as e:
            print("%-28s failed: %s" % (name, str(e).strip().splitlines()[-1]))
            failed.append(name)
    shutil.rmtree(tmp)
    print("worst relative logit difference (f32): %.3g%s" % (worst, "; failed: " + " ".join(failed) if failed else ""))
    return 0 if worst <= 1e-5 and not failed else 1


def check_one(lutra, script, tmp, fixtures, name):
    """lutra's saves of one fixture model, loaded by transformers: the largest f32 difference."""
    if True:
        src = os.path.join(fixtures, name)
        exp = load_file(os.path.join(src, "expected.safetensors"))
        figures = []
        for label, dtype, shard in (("f32", "", ""), ("bf16", "bf16", "4000")):
            dst = os.path.join(tmp, name + "-" + label)
            run([lutra, script, src, dst, dtype, shard])
            got = logits_of(dst, exp["ids"], "sdpa")
            ref = exp["logits"]
            if dtype == "bf16":  # against the fixture's weights rounded to bf16 by torch
                ref = bf16_logits(src, exp["ids"])
            figures.append(rel_diff(got, ref))
        ck, back = os.path.join(tmp, name + "-ckpt"), os.path.join(tmp, name + "-back")
        run([lutra, "convert", "--cast", src, ck])
        run([lutra, "convert", ck, back])
        figures.append(rel_diff(logits_of(back, exp["ids"], "sdpa"), exp["logits"]))
        if "ids_short" in exp:
            figures[0] = max(figures[0], rel_diff(logits_of(os.path.join(tmp, name + "-f32"), exp["ids_short"], "sdpa"),
                                                  exp["logits_short"]))
        with open(os.path.join(tmp, name + "-f32", "config.json")) as f:
            family = json.load(f)["model_type"]
        print("%-28s %-8s %-14.3g %-14.3g %-14.3g" % (name, family, *figures))
        return max(figures[0], figures[2])


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check-lutra", metavar="LUTRA", help="check lutra's saves in transformers (OUTDIR: the fixtures)")
    p.add_argument("--only", action="append", choices=list(MODELS), help="just this model (repeatable)")
    p.add_argument("outdir")
    a = p.parse_args()
    torch.set_num_threads(1)
    if a.check_lutra:
        sys.exit(check_lutra(a.check_lutra, a.outdir, a.only))
    generate(a.outdir, a.only)


if __name__ == "__main__":
    main()
