#!/usr/bin/env python3
"""PyTorch reference for atoll's MoE layer (tests/nn/test_moe_torch.cpp; src/nn/moe.h).

usage: moe_ref.py IN.safetensors OUT.safetensors

For each case "<c>" the input file holds x [B,T,C], the router gate [E,C], the stacked experts
gate_up [E,C,2F or F] and down [E,F,C], optionally the shared FFN (shared_gu [C,2Fs], shared_down
[Fs,C], atoll's [in,out] layout) and an upstream gradient dy; the options travel in __metadata__
("<c>.E", "<c>.k", "<c>.score", ...). The layer is recomputed in float64 with autograd, written
independently of atoll's code from the definitions in moe.h: the output, the balance and z
losses, the chosen experts, and the gradients of sum(out * dy) + aux_coef*balance + z_coef*z
with respect to x and every weight.
"""
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_lite  # noqa: E402


def ffn(x, gu, down, swiglu):
    h = x @ gu
    if swiglu:
        f = h.shape[-1] // 2
        h = F.silu(h[..., :f]) * h[..., f:]
    else:
        h = F.gelu(h, approximate="tanh")
    return h @ down


def moe_case(c, t, m):
    opt = lambda k: m[f"{c}.{k}"]
    E, k = int(opt("E")), int(opt("k"))
    swiglu, norm_topk, drop = opt("swiglu") == "1", opt("norm_topk") == "1", opt("drop") == "1"
    cf, aux_coef, z_coef = float(opt("cf")), float(opt("aux_coef")), float(opt("z_coef"))
    names = ["x", "gate", "gu", "down"] + (["shared_gu", "shared_down"] if f"{c}.shared_gu" in t else [])
    p = {n: t[f"{c}.{n}"].double().requires_grad_(True) for n in names}
    x = p["x"]
    B, T, C = x.shape
    N = B * T
    x2 = x.reshape(N, C)
    logits = x2 @ p["gate"].t()
    if opt("score") == "sigmoid":
        scores = torch.sigmoid(logits)
        probs = scores / scores.sum(-1, keepdim=True)
    else:
        scores = torch.softmax(logits, -1)
        probs = scores
    top = torch.topk(scores, k, dim=-1)
    srt = torch.sort(scores.detach(), dim=-1, descending=True).values
    gap = (srt[:, k - 1] - srt[:, k]).min().item() if k < E else 1.0
    assert gap > 1e-5, f"{c}: a near tie in the router (gap {gap}) would make the test fragile; change its seed"
    w = top.values / top.values.sum(-1, keepdim=True) if norm_topk else top.values
    idx = top.indices  # [N, k]
    counts = torch.bincount(idx.reshape(-1), minlength=E)
    cap = math.ceil(cf * N * k / E) if drop else N * k
    out = torch.zeros(N, C, dtype=torch.float64)
    flat = idx.reshape(-1)
    kept = 0
    for e in range(E):
        a = (flat == e).nonzero().reshape(-1)[:cap]  # (token, slot) order, first come first served
        kept += a.numel()
        if a.numel() == 0:
            continue
        tok = a // k
        y = ffn(x2[tok], p["gu"][e], p["down"][e], swiglu)
        out = out.index_add(0, tok, y * w.reshape(-1)[a][:, None])
    if "shared_gu" in p:
        out = out + ffn(x2, p["shared_gu"], p["shared_down"], swiglu)
    balance = E / (k * N) * (counts.double() * probs.mean(0)).sum()
    z = (torch.logsumexp(logits, -1) ** 2).mean()
    total = (out.reshape(B, T, C) * t[f"{c}.dy"].double()).sum() + aux_coef * balance + z_coef * z
    total.backward()
    res = {f"{c}.y": out.reshape(B, T, C), f"{c}.balance": balance.reshape(1), f"{c}.z": z.reshape(1),
           f"{c}.experts": idx.int(), f"{c}.kept": torch.tensor([kept], dtype=torch.int32)}
    res.update({f"{c}.d{n}": p[n].grad for n in names})
    return res


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    t, m = safetensors_lite.load(sys.argv[1])
    out = {}
    for c in m["cases"].split(","):
        out.update(moe_case(c, t, m))
    safetensors_lite.save(sys.argv[2], {k: v.detach().float() if v.is_floating_point() else v for k, v in out.items()})


if __name__ == "__main__":
    main()
