#!/usr/bin/env python3
"""Reference mixture-of-experts layers in PyTorch (f64), for tests/lua/test_moe_torch.lua.

  /usr/bin/python3 tests/py/ref_moe.py OUT_FILE

Each case is Hugging Face's MixtralSparseMoeBlock.forward, written out here with its formulas
(softmax over the router logits, topk, renormalised when norm_topk_prob, a one-hot expert mask,
a loop over the experts gathering their tokens with torch.where, index_add_ of the weighted
outputs), with Mixtral's load_balancing_loss_func for one layer and ST-MoE's router z-loss, plus
what lutra's nn.MoE adds: a GELU expert, a shared expert added densely (DeepSeek-MoE) and a
capacity (Switch: each expert keeps its first `capacity` slots in token order, counted with a
cumsum over the (token, choice) slots). Writes text lines (values exact, %.17g):
  case NAME E TOP_K NORM ACT N_SHARED CAPACITY AUX_COEF Z_COEF   (CAPACITY 0: dropless)
  tensor KEY DTYPE NDIM SHAPE... VALUES...
  end
KEYs: x, router, w_gate, w_up, w_down (stacked (E, out, in)), shared_gate, shared_up, shared_proj,
gout, y, balance (Mixtral's loss / top_k, lutra's normalisation), z, and d_KEY: the gradients of
sum(y * gout) + AUX_COEF * balance + Z_COEF * z. Exits 3 when torch is missing.
"""
import math
import sys

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    print("ref_moe.py: torch is not importable", file=sys.stderr)
    sys.exit(3)

torch.manual_seed(6)
torch.set_num_threads(1)
D = torch.float64


def emit(f, key, t):
    t = t.detach().contiguous()
    vals = t.reshape(-1).tolist()
    shape = list(t.shape)
    f.write("tensor %s f64 %d %s %s\n" % (key, len(shape), " ".join(map(str, shape)),
                                          " ".join("%.17g" % v for v in vals)))


def act_fn(name):
    return F.silu if name == "swiglu" else (lambda v: F.gelu(v, approximate="tanh"))


def expert(name, v, w_gate, w_up, w_down):
    if name == "swiglu":  # Mixtral's w2(act(w1 x) * w3 x)
        return (F.silu(v @ w_gate.T) * (v @ w_up.T)) @ w_down.T
    return act_fn(name)(v @ w_up.T) @ w_down.T


def moe(p, E, top_k, norm, act, n_shared, capacity):
    x = p["x"]
    N = x.shape[0]
    router_logits = x @ p["router"].T
    probs = F.softmax(router_logits, dim=1, dtype=D)
    routing_weights, selected_experts = torch.topk(probs, top_k, dim=-1)
    if norm:
        routing_weights = routing_weights / routing_weights.sum(dim=-1, keepdim=True)
    expert_mask = F.one_hot(selected_experts, num_classes=E)  # (N, k, E)
    if capacity:
        # the slot (n, j)'s place in its expert's queue, in order of (token, choice)
        cap = max(1, math.ceil(capacity * N * top_k / E))
        place = torch.cumsum(expert_mask.reshape(N * top_k, E), dim=0).reshape(N, top_k, E)
        expert_mask = expert_mask * (place <= cap)
    expert_mask = expert_mask.permute(2, 1, 0)  # (E, k, N)
    final = torch.zeros_like(x)
    for e in range(E):
        idx, top_x = torch.where(expert_mask[e])
        if top_x.numel() == 0:
            continue
        current = x[top_x]
        w_gate = p["w_gate"][e] if act == "swiglu" else None
        y = expert(act, current, w_gate, p["w_up"][e], p["w_down"][e]) * routing_weights[top_x, idx, None]
        final = final.index_add(0, top_x, y)
    if n_shared:
        final = final + expert(act, x, p.get("shared_gate"), p["shared_up"], p["shared_proj"])
    # load_balancing_loss_func (one layer, no attention mask), divided by top_k
    mask_all = F.one_hot(selected_experts, E)
    tokens_per_expert = torch.mean(mask_all.to(D), dim=0)
    router_prob_per_expert = torch.mean(probs, dim=0)
    balance = torch.sum(tokens_per_expert * router_prob_per_expert.unsqueeze(0)) * E / top_k
    z = torch.mean(torch.logsumexp(router_logits, dim=-1) ** 2)
    return final, balance, z


def case(f, name, N, C, H, E, top_k, norm, act, n_shared=0, capacity=0, aux=0.3, zc=0.7, scale=1.0):
    p = {"x": torch.randn(N, C, dtype=D), "router": torch.randn(E, C, dtype=D) * scale,
         "w_up": torch.randn(E, H, C, dtype=D) * 0.5, "w_down": torch.randn(E, C, H, dtype=D) * 0.5}
    if act == "swiglu":
        p["w_gate"] = torch.randn(E, H, C, dtype=D) * 0.5
    if n_shared:
        S = n_shared * H
        if act == "swiglu":
            p["shared_gate"] = torch.randn(S, C, dtype=D) * 0.5
        p["shared_up"] = torch.randn(S, C, dtype=D) * 0.5
        p["shared_proj"] = torch.randn(C, S, dtype=D) * 0.5
    for t in p.values():
        t.requires_grad_()
    y, balance, z = moe(p, E, top_k, norm, act, n_shared, capacity)
    gout = torch.randn(y.shape, dtype=D)
    loss = (y * gout).sum() + aux * balance + zc * z
    loss.backward()
    f.write("case %s %d %d %d %s %d %.17g %.17g %.17g\n" % (name, E, top_k, 1 if norm else 0, act, n_shared, capacity,
                                                            aux, zc))
    for k, t in p.items():
        emit(f, k, t)
        emit(f, "d_" + k, t.grad)
    emit(f, "gout", gout)
    emit(f, "y", y)
    emit(f, "balance", balance)
    emit(f, "z", z)
    f.write("end\n")


def main():
    with open(sys.argv[1], "w") as f:
        case(f, "mixtral", 13, 6, 5, 8, 2, True, "swiglu")
        case(f, "qwen_norm_off", 11, 6, 4, 6, 3, False, "swiglu")
        case(f, "top1_gelu", 9, 5, 7, 4, 1, True, "gelu")
        case(f, "shared", 10, 6, 5, 4, 2, True, "swiglu", n_shared=2)
        case(f, "capacity", 16, 6, 5, 4, 2, True, "swiglu", capacity=0.75, scale=3.0)
        case(f, "capacity_gelu_shared", 12, 5, 4, 3, 2, False, "gelu", n_shared=1, capacity=0.5, scale=3.0)
        case(f, "all_experts", 7, 4, 3, 3, 3, True, "swiglu")


main()
