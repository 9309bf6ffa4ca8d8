"""gen_attn.py — fixtures for the attention-level ops of lutra (area attn), written by transformers.

    python gen_attn.py OUTDIR      (tests/hf/regen.sh passes tests/hf/fixtures/attn)

Writes OUTDIR/rope.safetensors and OUTDIR/window.safetensors (float64, fixed seeds):
- rope: for each rope type transformers 5 has for Llama-style models (default, linear, dynamic,
  llama3, yarn, longrope), the inverse frequencies and attention_scaling that transformers'
  ROPE_INIT_FUNCTIONS compute for a tiny config, x (B, T, H, D), positions (B, T), and x rotated
  by transformers' own apply_rotary_pos_emb (modeling_llama) with cos and sin of
  positions * inv_freq in float64, times attention_scaling, as LlamaRotaryEmbedding makes them
  (there in float32): `<type>.inv_freq`, `<type>.x`, `<type>.positions`, `<type>.out`, and
  `<type>.scale` (1 element).
- window: sliding-window causal attention, the mask from transformers' masking_utils
  (sliding_window_causal_mask_function, and_masks with packed_sequence_mask_function for packed
  rows), evaluated on the (query, key) grid with queries at their absolute positions after a cache,
  then torch's scaled_dot_product_attention in float64 with that boolean mask (GQA by repeating kv
  heads): `<case>.q`, `.k`, `.v`, `.out`, `.window` (1 element), and `.segments` for packed rows.
(No safetensors metadata: its order in the header is not fixed.)
"""
import os
import sys
from types import SimpleNamespace

import torch
from safetensors.torch import save_file
from transformers import LlamaConfig
from transformers.masking_utils import and_masks, packed_sequence_mask_function, sliding_window_causal_mask_function
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

HEAD_DIM = 16


def rope_fixtures(tensors):
    params = {
        "default": {"rope_type": "default", "rope_theta": 10000.0},
        "linear": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
        "dynamic": {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0},
        "llama3": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                   "high_freq_factor": 4.0, "original_max_position_embeddings": 16},
        "yarn": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 16},
        "longrope": {"rope_type": "longrope", "rope_theta": 10000.0, "original_max_position_embeddings": 16,
                     "short_factor": [1.0 + 0.1 * i for i in range(HEAD_DIM // 2)],
                     "long_factor": [2.0 + 0.25 * i for i in range(HEAD_DIM // 2)]},
    }
    for i, (name, rp) in enumerate(params.items()):
        config = LlamaConfig(hidden_size=4 * HEAD_DIM, num_attention_heads=4, num_key_value_heads=2, head_dim=HEAD_DIM,
                             max_position_embeddings=64, rope_parameters=rp)
        seq_len = 100 if name in ("dynamic", "longrope") else None  # past the trained length: the scaled tables
        if name == "default":  # transformers 5 keeps the default computation in the rotary embedding class
            inv_freq, scale = LlamaRotaryEmbedding.compute_default_rope_parameters(config, device="cpu")
        else:
            inv_freq, scale = ROPE_INIT_FUNCTIONS[rp["rope_type"]](config, "cpu", seq_len=seq_len)
        inv_freq = inv_freq.to(torch.float64)
        g = torch.Generator().manual_seed(100 + i)
        B, T, H = 2, 7, 3
        x = torch.randn(B, T, H, HEAD_DIM, generator=g, dtype=torch.float64)
        positions = torch.randint(0, 90, (B, T), generator=g, dtype=torch.int64)
        freqs = positions.to(torch.float64)[..., None] * inv_freq[None, None, :]  # (B, T, D/2)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos() * scale, emb.sin() * scale
        # apply_rotary_pos_emb takes (B, heads, T, D) and unsqueezes cos/sin at dim 1
        xt = x.transpose(1, 2)
        out, _ = apply_rotary_pos_emb(xt, xt, cos, sin)
        tensors[f"{name}.inv_freq"] = inv_freq.contiguous()
        tensors[f"{name}.x"] = x.contiguous()
        tensors[f"{name}.positions"] = positions.contiguous()
        tensors[f"{name}.out"] = out.transpose(1, 2).contiguous()
        tensors[f"{name}.scale"] = torch.tensor([float(scale)], dtype=torch.float64)


def mask_grid(fn, B, T, S):
    """The boolean (B, T, S) mask of a masking_utils mask function; query t at absolute position t + S - T."""
    off = S - T
    m = torch.zeros(B, T, S, dtype=torch.bool)
    for b in range(B):
        for t in range(T):
            for s in range(S):
                m[b, t, s] = bool(fn(torch.tensor(b), torch.tensor(0), torch.tensor(t + off), torch.tensor(s)))
    return m


def window_fixtures(tensors):
    cases = [  # name, B, T, S, H, Hkv, D, window, packed
        ("row", 2, 12, 12, 4, 2, 8, 4, False),
        ("cached", 1, 3, 13, 2, 1, 8, 5, False),
        ("decode", 2, 1, 20, 2, 2, 8, 6, False),
        ("packed", 2, 14, 14, 2, 1, 8, 3, True),
        ("wide", 1, 6, 6, 2, 2, 8, 50, False),
    ]
    for i, (name, B, T, S, H, Hkv, D, window, packed) in enumerate(cases):
        g = torch.Generator().manual_seed(200 + i)
        q = torch.randn(B, T, H, D, generator=g, dtype=torch.float64)
        k = torch.randn(B, S, Hkv, D, generator=g, dtype=torch.float64)
        v = torch.randn(B, S, Hkv, D, generator=g, dtype=torch.float64)
        fn = sliding_window_causal_mask_function(window)
        if packed:
            seg = torch.zeros(B, T, dtype=torch.int64)
            for b in range(B):
                cuts = sorted(torch.randperm(T - 1, generator=g)[:2].tolist())
                for c in cuts:
                    seg[b, c + 1:] += 1
            fn = and_masks(fn, packed_sequence_mask_function(seg))
            tensors[f"{name}.segments"] = seg.contiguous()
        mask = mask_grid(fn, B, T, S)[:, None]  # (B, 1, T, S)
        rep = H // Hkv
        kt = k.transpose(1, 2).repeat_interleave(rep, dim=1)
        vt = v.transpose(1, 2).repeat_interleave(rep, dim=1)
        out = torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), kt, vt, attn_mask=mask)
        tensors[f"{name}.q"], tensors[f"{name}.k"], tensors[f"{name}.v"] = q, k, v
        tensors[f"{name}.out"] = out.transpose(1, 2).contiguous()
        tensors[f"{name}.window"] = torch.tensor([window], dtype=torch.int64)


def main():
    outdir = sys.argv[1]
    os.makedirs(outdir, exist_ok=True)
    torch.manual_seed(0)
    tensors = {}
    rope_fixtures(tensors)
    save_file(tensors, os.path.join(outdir, "rope.safetensors"))
    tensors = {}
    window_fixtures(tensors)
    save_file(tensors, os.path.join(outdir, "window.safetensors"))


if __name__ == "__main__":
    main()
