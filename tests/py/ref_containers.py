#!/usr/bin/env python3
"""PyTorch's names for nested containers, for tests/lua/test_nn_containers.lua.

  /usr/bin/python3 tests/py/ref_containers.py OUT_FILE

Builds the module tree that the Lua test builds (Sequential, ModuleDict and ModuleList nested
inside each other, parameters and buffers at several depths) and writes one line per list:
  params NAME...     named_parameters(), in order
  buffers NAME...    named_buffers(), in order
  modules NAME...    named_modules() ("" written as "-"), in order
  state NAME...      state_dict() keys, sorted
  len NAME N         len() of a container
Exits 3 when torch is missing.
"""
import sys

try:
    import torch
    from torch import nn
except ImportError:
    print("ref_containers.py: torch is not importable", file=sys.stderr)
    sys.exit(3)


class Top(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(4))
        self.body = nn.Sequential(
            nn.Linear(3, 4),
            nn.GELU(),
            nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Identity()),
            nn.ModuleDict([("b", nn.Linear(4, 2)), ("a", nn.LayerNorm(4))]),
            nn.ModuleList([nn.Linear(2, 2), nn.Sequential(nn.SiLU(), nn.Linear(2, 2, bias=False))]),
        )
        self.register_buffer("count", torch.zeros(1))
        self.heads = nn.ModuleDict([("policy", nn.Linear(2, 3)),
                                    ("value", nn.Sequential(nn.Linear(2, 1), nn.Sigmoid()))])
        self.heads["value"][0].register_buffer("steps", torch.zeros(1))
        self.heads.update([("aux", nn.ReLU())])
        self.offset = nn.Parameter(torch.zeros(2))


def main():
    m = Top()
    with open(sys.argv[1], "w") as f:
        f.write("params " + " ".join(n for n, _ in m.named_parameters()) + "\n")
        f.write("buffers " + " ".join(n for n, _ in m.named_buffers()) + "\n")
        f.write("modules " + " ".join(n or "-" for n, _ in m.named_modules()) + "\n")
        f.write("state " + " ".join(sorted(m.state_dict().keys())) + "\n")
        f.write("len body %d\n" % len(m.body))
        f.write("len heads %d\n" % len(m.heads))
        f.write("keys heads " + " ".join(m.heads.keys()) + "\n")


if __name__ == "__main__":
    main()
