#!/usr/bin/python3
"""PyTorch reference for lutra's model zoo (tests/lua/test_models_torch.lua).

    /usr/bin/python3 tests/py/ref_gpt.py DIR

DIR holds one sub-directory per case (listed in DIR/cases.txt), each written by the
Lua test:
  manifest.txt   "config KEY VALUE" lines (arch, n_layer, n_head, n_kv_head, d_model,
                 vocab_size, bias, norm_eps, rope_theta, pos, norm, mlp, tie_embeddings),
                 "dtype f32|f64", "batch B T", then "param NAME SIZE..." in file order
  params.bin     the parameters, raw little-endian, concatenated in manifest order
  idx.bin, targets.bin   int64 (B, T); targets may hold -100 (ignored)
This script builds the same model in plain torch ops, written from the published
architectures rather than from lutra's code: GPT-2 (learned positions, LayerNorm,
GELU with the tanh approximation, tied embeddings) and Llama (Hugging Face's
LlamaModel: RMSNorm, rotate-half RoPE, repeat_kv GQA, SwiGLU), both with the fused
qkv weight layout [q heads | k heads | v heads]. It writes, per case:
  loss.txt       the mean cross-entropy loss (%.17g)
  logits.bin     logits (B, T, V) in the case's dtype
  grads.bin      d loss / d param for every param, in manifest order, in its dtype
"""
import math
import os
import sys

import torch
import torch.nn.functional as F


def read_case(path):
    cfg, params, dtype, batch = {}, [], None, None
    with open(os.path.join(path, "manifest.txt")) as f:
        for line in f:
            parts = line.split()
            if not parts:
                continue
            if parts[0] == "config":
                cfg[parts[1]] = parts[2]
            elif parts[0] == "dtype":
                dtype = {"f32": torch.float32, "f64": torch.float64}[parts[1]]
            elif parts[0] == "batch":
                batch = (int(parts[1]), int(parts[2]))
            elif parts[0] == "param":
                params.append((parts[1], [int(s) for s in parts[2:]]))
    raw = open(os.path.join(path, "params.bin"), "rb").read()
    flat = torch.frombuffer(bytearray(raw), dtype=dtype)
    tensors, off = {}, 0
    for name, shape in params:
        n = math.prod(shape)
        tensors[name] = flat[off:off + n].clone().view(*shape).requires_grad_(True)
        off += n
    assert off == flat.numel(), "params.bin size does not match the manifest"

    def ids(name):
        raw = open(os.path.join(path, name), "rb").read()
        return torch.frombuffer(bytearray(raw), dtype=torch.int64).view(*batch).clone()

    return cfg, params, tensors, ids("idx.bin"), ids("targets.bin"), dtype


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope(x, theta):
    # x (B, H, T, D), as Hugging Face's LlamaRotaryEmbedding + apply_rotary_pos_emb
    T, D = x.shape[2], x.shape[3]
    inv_freq = 1.0 / (theta ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    freqs = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
    return x * cos + rotate_half(x) * sin


def forward(cfg, P, idx, targets):
    L, H, C = int(cfg["n_layer"]), int(cfg["n_head"]), int(cfg["d_model"])
    Hkv, V = int(cfg["n_kv_head"]), int(cfg["vocab_size"])
    eps, theta = float(cfg["norm_eps"]), float(cfg["rope_theta"])
    D = C // H
    B, T = idx.shape

    def norm(x, prefix):
        if cfg["norm"] == "rmsnorm":
            return rms_norm(x, P[prefix + ".weight"], eps)
        return F.layer_norm(x, (C,), P[prefix + ".weight"], P.get(prefix + ".bias"), eps)

    def linear(x, prefix):
        return F.linear(x, P[prefix + ".weight"], P.get(prefix + ".bias"))

    x = P["wte.weight"][idx]
    if cfg["pos"] == "learned":
        x = x + P["wpe.weight"][:T]
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    for l in range(L):
        p = "blocks.%d." % l
        h = norm(x, p + "ln_1")
        qkv = linear(h, p + "attn.qkv")
        q, k, v = qkv.split([H * D, Hkv * D, Hkv * D], dim=-1)
        q = q.view(B, T, H, D).transpose(1, 2)
        k = k.view(B, T, Hkv, D).transpose(1, 2)
        v = v.view(B, T, Hkv, D).transpose(1, 2)
        if cfg["pos"] == "rope":
            q, k = rope(q, theta), rope(k, theta)
        k = k.repeat_interleave(H // Hkv, dim=1)  # Hugging Face's repeat_kv
        v = v.repeat_interleave(H // Hkv, dim=1)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(D)
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, H * D)
        x = x + linear(y, p + "attn.proj")
        h = norm(x, p + "ln_2")
        if cfg["mlp"] == "swiglu":
            m = F.silu(linear(h, p + "mlp.gate")) * linear(h, p + "mlp.up")
        else:
            m = F.gelu(linear(h, p + "mlp.fc"), approximate="tanh")
        x = x + linear(m, p + "mlp.proj")
    x = norm(x, "ln_f")
    head = P["wte.weight"] if cfg["tie_embeddings"] == "true" else P["lm_head.weight"]
    logits = x @ head.t()
    loss = F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1), ignore_index=-100)
    return logits, loss


def main():
    torch.set_num_threads(1)
    root = sys.argv[1]
    with open(os.path.join(root, "cases.txt")) as f:
        cases = [line.strip() for line in f if line.strip()]
    for case in cases:
        path = os.path.join(root, case)
        cfg, params, P, idx, targets, dtype = read_case(path)
        logits, loss = forward(cfg, P, idx, targets)
        loss.backward()
        with open(os.path.join(path, "loss.txt"), "w") as f:
            f.write("%.17g\n" % loss.item())
        with open(os.path.join(path, "logits.bin"), "wb") as f:
            f.write(logits.detach().contiguous().numpy().tobytes())
        with open(os.path.join(path, "grads.bin"), "wb") as f:
            for name, _ in params:
                g = P[name].grad
                if g is None:
                    g = torch.zeros_like(P[name])
                f.write(g.contiguous().numpy().tobytes())
        print("%s: loss %.6f" % (case, loss.item()))


if __name__ == "__main__":
    main()
