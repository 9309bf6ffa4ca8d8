#!/usr/bin/env python3
"""The DPO losses in plain PyTorch, as a reference for tests/lua/test_dpo.lua.

usage: ref_dpo.py IN.json OUT.json

IN is a list of cases, each either
  {"kind": "logps", "pc": [..], "pr": [..], "rc": [..], "rr": [..], "beta", "loss", "eps"}
or
  {"kind": "logits", "logits": [flat], "shape": [N, T, V], "y": [[..]] (N x T, -100 ignored),
   "rc": [..], "rr": [..], "beta", "loss", "eps"}
(rows 0..B-1 of the logits are the chosen responses, B..2B-1 the rejected ones).
OUT is the list of results {"loss", "grad_pc", "grad_pr"} or {"loss", "grad_logits" (flat),
"pc", "pr"}, all in float64. The formulas are TRL's DPOTrainer.dpo_loss with sums of token
log-probs: h = (pc - pr) - (rc - rr);
  sigmoid: -(1 - eps) logsigmoid(beta h) - eps logsigmoid(-beta h)
  ipo:     (h - 1 / (2 beta))^2
  hinge:   relu(1 - beta h)
"""
import json
import sys

import torch
import torch.nn.functional as F


def dpo_loss(pc, pr, rc, rr, beta, kind, eps):
    h = (pc - pr) - (rc - rr)
    if kind == "sigmoid":
        losses = -F.logsigmoid(beta * h) * (1 - eps) - F.logsigmoid(-beta * h) * eps
    elif kind == "ipo":
        losses = (h - 1 / (2 * beta)) ** 2
    elif kind == "hinge":
        losses = torch.relu(1 - beta * h)
    else:
        raise ValueError(kind)
    return losses.mean()


def t64(x):
    return torch.tensor(x, dtype=torch.float64)


def run(case):
    beta, kind, eps = case["beta"], case["loss"], case.get("eps", 0.0)
    rc, rr = t64(case["rc"]), t64(case["rr"])
    if case["kind"] == "logps":
        pc = t64(case["pc"]).requires_grad_()
        pr = t64(case["pr"]).requires_grad_()
        loss = dpo_loss(pc, pr, rc, rr, beta, kind, eps)
        loss.backward()
        return {"loss": loss.item(), "grad_pc": pc.grad.tolist(), "grad_pr": pr.grad.tolist()}
    n, t, v = case["shape"]
    logits = t64(case["logits"]).reshape(n, t, v).requires_grad_()
    y = torch.tensor(case["y"], dtype=torch.int64)
    logp = torch.log_softmax(logits, dim=-1)
    mask = y != -100
    tok = torch.gather(logp, 2, y.clamp(min=0).unsqueeze(-1)).squeeze(-1) * mask
    seq = tok.sum(-1)
    b = n // 2
    pc, pr = seq[:b], seq[b:]
    loss = dpo_loss(pc, pr, rc, rr, beta, kind, eps)
    loss.backward()
    return {"loss": loss.item(), "grad_logits": logits.grad.reshape(-1).tolist(), "pc": pc.tolist(),
            "pr": pr.tolist()}


def main():
    with open(sys.argv[1]) as f:
        cases = json.load(f)
    out = [run(c) for c in cases]
    with open(sys.argv[2], "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
