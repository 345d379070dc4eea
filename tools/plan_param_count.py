#!/usr/bin/env python3
"""Independent parameter counts for the planner's tests: builds GPT-2- and Llama-shaped
transformers with torch.nn on the meta device (no memory) and prints the counted parameters.

usage: plan_param_count.py '<json list of shapes>'  ->  one integer per line
"""
import json
import sys

import torch
import torch.nn as nn


class Block(nn.Module):
    def __init__(s, c):
        super().__init__()
        h, a, kv, f = c["hidden"], c["heads"], c["kv_heads"], c["ffn"]
        hd = c.get("head_dim") or h // a
        bias = c["bias"]
        norm = (lambda: nn.LayerNorm(h)) if c["norm"] == "layernorm" else (lambda: RMSNorm(h))
        s.n1, s.n2 = norm(), norm()
        s.q = nn.Linear(h, a * hd, bias=bias)
        s.k = nn.Linear(h, kv * hd, bias=bias)
        s.v = nn.Linear(h, kv * hd, bias=bias)
        s.o = nn.Linear(a * hd, h, bias=bias)
        if c.get("qk_norm"):
            s.qn, s.kn = RMSNorm(hd), RMSNorm(hd)

        def ffn(width):
            if c["ffn_type"] == "swiglu":
                return nn.ModuleList([nn.Linear(h, width, bias=bias), nn.Linear(h, width, bias=bias),
                                      nn.Linear(width, h, bias=bias)])
            return nn.ModuleList([nn.Linear(h, width, bias=bias), nn.Linear(width, h, bias=bias)])

        if c.get("experts", 0) > 0:
            s.router = nn.Linear(h, c["experts"], bias=False)
            s.experts = nn.ModuleList([ffn(c["expert_ffn"]) for _ in range(c["experts"])])
        else:
            s.mlp = ffn(f)


class RMSNorm(nn.Module):
    def __init__(s, n):
        super().__init__()
        s.weight = nn.Parameter(torch.empty(n))


def count(c):
    with torch.device("meta") if hasattr(torch, "device") and hasattr(torch.device, "__enter__") else _Meta():
        m = nn.Module()
        m.wte = nn.Embedding(c["vocab"], c["hidden"])
        if c["position"] == "learned":
            m.wpe = nn.Embedding(c["seq"], c["hidden"])
        m.blocks = nn.ModuleList([Block(c) for _ in range(c["layers"])])
        m.nf = nn.LayerNorm(c["hidden"]) if c["norm"] == "layernorm" else RMSNorm(c["hidden"])
        if not c["tied_head"]:
            m.head = nn.Linear(c["hidden"], c["vocab"], bias=False)
    return sum(p.numel() for p in m.parameters())


class _Meta:
    """torch 1.13 has no `with torch.device(...)`: build on the default device instead (the test
    shapes are kept small enough)."""

    def __enter__(s):
        return s

    def __exit__(s, *a):
        return False


if __name__ == "__main__":
    for shape in json.loads(sys.argv[1]):
        print(count(shape))
