#!/usr/bin/python3
"""PyTorch reference for Hugging Face model directories (tests/lua/test_hf.lua).

    /usr/bin/python3 tests/py/ref_hf_models.py CASE_DIR...

Each CASE_DIR is a Hugging Face directory written by lutra.hf.save_pretrained (config.json,
model.safetensors or model.safetensors.index.json + shards) plus ids.json ([[int]], a batch of
token ids). This script reads the weights under Hugging Face's names with struct, json and
torch.frombuffer (no safetensors or transformers package), runs the model as transformers'
modeling_gpt2.py / modeling_llama.py compute it, written from those models rather than from
lutra's code:
  gpt2   GPT2LMHeadModel: wte + wpe, pre-LayerNorm blocks, Conv1D layers (y = x @ W + b with W
         (in, out)), c_attn split into q, k, v of n_embd each, causal softmax attention scaled
         by 1/sqrt(head_dim), GELU "gelu_new" (tanh), ln_f, lm_head tied to wte unless
         tie_word_embeddings is false
  llama  LlamaForCausalLM: embed_tokens, LlamaRMSNorm (variance in float32), q/k/v/o_proj
         (nn.Linear), rotate-half RoPE with inv_freq = theta^(-2i/d), repeat_kv for
         grouped-query attention, SwiGLU MLP (down(silu(gate(x)) * up(x))), norm, lm_head
and writes logits (B, T, V) in float64 to CASE_DIR/ref_logits.safetensors (tensor "logits").
"""
import json
import math
import os
import struct
import sys

import torch
import torch.nn.functional as F

DTYPES = {"F32": torch.float32, "F64": torch.float64, "BF16": torch.bfloat16, "F16": torch.float16,
          "I32": torch.int32, "I64": torch.int64, "U8": torch.uint8, "BOOL": torch.bool}


def read_safetensors(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    header.pop("__metadata__", None)
    data = bytearray(raw[8 + n:])
    out = {}
    for name, e in header.items():
        begin, end = e["data_offsets"]
        dt = DTYPES[e["dtype"]]
        t = torch.frombuffer(data[begin:end], dtype=dt) if end > begin else torch.empty(0, dtype=dt)
        out[name] = t.reshape(e["shape"]).clone()
    return out


def read_weights(d):
    single = os.path.join(d, "model.safetensors")
    if os.path.exists(single):
        return read_safetensors(single)
    index = json.load(open(os.path.join(d, "model.safetensors.index.json")))
    out = {}
    for f in sorted(set(index["weight_map"].values())):
        out.update(read_safetensors(os.path.join(d, f)))
    assert set(out) == set(index["weight_map"]), "index and shards disagree"
    return out


def write_logits(path, logits):
    b = logits.contiguous().to(torch.float64).numpy().tobytes()
    h = json.dumps({"logits": {"dtype": "F64", "shape": list(logits.shape), "data_offsets": [0, len(b)]}}).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b)


def causal_attention(q, k, v):
    # q, k, v (B, H, T, D)
    T, D = q.shape[2], q.shape[3]
    att = (q @ k.transpose(-2, -1)) / math.sqrt(D)
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    att = att.masked_fill(~mask, float("-inf")).softmax(-1)
    return att @ v


def gpt2(cfg, W, idx, dtype):
    C, H, L = cfg["n_embd"], cfg["n_head"], cfg["n_layer"]
    eps = cfg.get("layer_norm_epsilon", 1e-5)
    W = {(k[len("transformer."):] if k.startswith("transformer.") else k): v.to(dtype) for k, v in W.items()}
    B, T = idx.shape
    D = C // H

    def conv1d(x, p):  # transformers.pytorch_utils.Conv1D
        return x @ W[p + ".weight"] + W[p + ".bias"]

    def ln(x, p):
        return F.layer_norm(x, (C,), W[p + ".weight"], W[p + ".bias"], eps)

    x = W["wte.weight"][idx] + W["wpe.weight"][torch.arange(T)]
    for i in range(L):
        p = "h.%d." % i
        qkv = conv1d(ln(x, p + "ln_1"), p + "attn.c_attn")
        q, k, v = qkv.split(C, dim=2)
        q, k, v = (t.view(B, T, H, D).transpose(1, 2) for t in (q, k, v))
        y = causal_attention(q, k, v).transpose(1, 2).reshape(B, T, C)
        x = x + conv1d(y, p + "attn.c_proj")
        h = F.gelu(conv1d(ln(x, p + "ln_2"), p + "mlp.c_fc"), approximate="tanh")
        x = x + conv1d(h, p + "mlp.c_proj")
    x = ln(x, "ln_f")
    head = W["wte.weight"] if cfg.get("tie_word_embeddings", True) else W["lm_head.weight"]
    return x @ head.t()


def llama(cfg, W, idx, dtype):
    C, H, L = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_hidden_layers"]
    Hkv = cfg.get("num_key_value_heads", H)
    eps, theta = cfg.get("rms_norm_eps", 1e-6), cfg.get("rope_theta", 10000.0)
    W = {k: v.to(dtype) for k, v in W.items()}
    B, T = idx.shape
    D = C // H

    def rms(x, p):  # LlamaRMSNorm
        var = x.to(torch.float32 if dtype != torch.float64 else dtype).pow(2).mean(-1, keepdim=True)
        return W[p + ".weight"] * (x * torch.rsqrt(var + eps)).to(dtype)

    def linear(x, p):
        return F.linear(x, W[p + ".weight"], W.get(p + ".bias"))

    def rotate_half(x):
        h = x.shape[-1] // 2
        return torch.cat((-x[..., h:], x[..., :h]), dim=-1)

    inv_freq = 1.0 / (theta ** (torch.arange(0, D, 2, dtype=torch.int64).double() / D))
    freqs = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos().to(dtype), emb.sin().to(dtype)

    x = W["model.embed_tokens.weight"][idx]
    for i in range(L):
        p = "model.layers.%d." % i
        h = rms(x, p + "input_layernorm")
        q = linear(h, p + "self_attn.q_proj").view(B, T, H, D).transpose(1, 2)
        k = linear(h, p + "self_attn.k_proj").view(B, T, Hkv, D).transpose(1, 2)
        v = linear(h, p + "self_attn.v_proj").view(B, T, Hkv, D).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k = k[:, :, None].expand(B, Hkv, H // Hkv, T, D).reshape(B, H, T, D)  # repeat_kv
        v = v[:, :, None].expand(B, Hkv, H // Hkv, T, D).reshape(B, H, T, D)
        y = causal_attention(q, k, v).transpose(1, 2).reshape(B, T, H * D)
        x = x + linear(y, p + "self_attn.o_proj")
        h = rms(x, p + "post_attention_layernorm")
        x = x + linear(F.silu(linear(h, p + "mlp.gate_proj")) * linear(h, p + "mlp.up_proj"), p + "mlp.down_proj")
    x = rms(x, "model.norm")
    head = W["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings", False) else W["lm_head.weight"]
    return x @ head.t()


def main():
    torch.set_num_threads(1)
    for d in sys.argv[1:]:
        cfg = json.load(open(os.path.join(d, "config.json")))
        W = read_weights(d)
        idx = torch.tensor(json.load(open(os.path.join(d, "ids.json"))), dtype=torch.int64)
        dtype = {"float64": torch.float64}.get(cfg.get("torch_dtype"), torch.float32)
        with torch.no_grad():
            logits = {"gpt2": gpt2, "llama": llama}[cfg["model_type"]](cfg, W, idx, dtype)
        write_logits(os.path.join(d, "ref_logits.safetensors"), logits)
        print("%s: %s logits %s" % (d, cfg["model_type"], list(logits.shape)))


if __name__ == "__main__":
    main()
