#!/usr/bin/env python3
"""PyTorch reference for atoll's fused CPU kernels (tests/kernels/test_torch_reference.cpp).

usage: torch_kernel_ref.py IN.safetensors OUT.safetensors

Reads the kernel inputs the C++ test wrote, recomputes every op it finds (by name prefix) in
float64 with torch autograd, and writes the outputs and input gradients as float32. Parameters
(sizes, eps, theta) travel in the file's __metadata__. The safetensors package is not installed,
so the format (8-byte little-endian header length, JSON header, raw bytes) is handled here.
"""
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_lite  # noqa: E402

read = safetensors_lite.load
write = safetensors_lite.save


def leaf(t):
    return t.double().requires_grad_(True)


def layernorm(x, w, b, dy, eps):
    x, w, b = leaf(x), leaf(w), leaf(b)
    y = F.layer_norm(x, (x.shape[-1],), w, b, eps)
    y.backward(dy.double())
    return {"ln.y": y, "ln.dx": x.grad, "ln.dw": w.grad, "ln.db": b.grad}


def gelu(x, dy):
    x = leaf(x)
    y = F.gelu(x, approximate="tanh")
    y.backward(dy.double())
    return {"gelu.y": y, "gelu.dx": x.grad}


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def rope(x, dy, B, T, H, KV, hd, theta, offset):
    x = leaf(x)
    inv_freq = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    freqs = torch.outer(torch.arange(T, dtype=torch.float64) + offset, inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos()[None, :, None, :], emb.sin()[None, :, None, :]
    heads = x.view(B, T, H + 2 * KV, hd)
    qk, v = heads[:, :, : H + KV], heads[:, :, H + KV :]
    y = torch.cat((qk * cos + rotate_half(qk) * sin, v), dim=2).reshape(B, T, -1)
    y.backward(dy.double())
    return {"rope.y": y, "rope.dx": x.grad}


def attention(qkv, dy, B, T, H, KV, hd):
    qkv = leaf(qkv)
    heads = qkv.view(B, T, H + 2 * KV, hd).transpose(1, 2)  # [B, heads, T, hd]
    q, k, v = heads[:, :H], heads[:, H : H + KV], heads[:, H + KV :]
    k = k.repeat_interleave(H // KV, dim=1)  # query head h reads kv head h // (H/KV)
    v = v.repeat_interleave(H // KV, dim=1)
    s = q @ k.transpose(-1, -2) / hd**0.5
    s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    y = (torch.softmax(s, dim=-1) @ v).transpose(1, 2).reshape(B, T, H * hd)
    y.backward(dy.double())
    return {"attn.y": y, "attn.lse": lse, "attn.dqkv": qkv.grad}


def crossentropy(logits, targets, dl):
    logits = leaf(logits)
    t = targets.long().clone()
    t[t < 0] = -100
    loss = F.cross_entropy(logits, t, ignore_index=-100, reduction="none")
    (loss * dl.double()).sum().backward()
    return {"ce.loss": loss, "ce.lse": torch.logsumexp(logits, dim=-1), "ce.dlogits": logits.grad}


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    t, m = read(sys.argv[1])
    i = lambda k: int(m[k])
    out = {}
    if "ln.x" in t:
        out.update(layernorm(t["ln.x"], t["ln.w"], t["ln.b"], t["ln.dy"], float(m["ln.eps"])))
    if "gelu.x" in t:
        out.update(gelu(t["gelu.x"], t["gelu.dy"]))
    if "rope.x" in t:
        out.update(rope(t["rope.x"], t["rope.dy"], i("rope.B"), i("rope.T"), i("rope.H"), i("rope.KV"),
                        i("rope.hd"), float(m["rope.theta"]), i("rope.offset")))
    if "attn.qkv" in t:
        out.update(attention(t["attn.qkv"], t["attn.dy"], i("attn.B"), i("attn.T"), i("attn.H"), i("attn.KV"),
                             i("attn.hd")))
    if "ce.logits" in t:
        out.update(crossentropy(t["ce.logits"], t["ce.targets"], t["ce.dl"]))
    write(sys.argv[2], {k: v.detach().float() for k, v in out.items()})


if __name__ == "__main__":
    main()
