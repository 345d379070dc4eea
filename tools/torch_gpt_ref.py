"""PyTorch reference for atoll's GPT: the same model written with plain torch ops.

Reads weights saved by atoll (safetensors, Hugging Face GPT-2 names and Conv1D [in, out] layout,
model config in the `atoll_model` metadata) and a batch, and writes the loss, logits, every
parameter gradient, the parameters after the first AdamW step, and the losses and parameters
after N AdamW steps (torch.optim.AdamW, weight
decay on >= 2-D parameters, gradient-norm clipping) for atoll's tests to compare against.

usage: /usr/bin/python3 tools/torch_gpt_ref.py WEIGHTS BATCH OUT [--steps N --lr .. --clip ..]
"""
import argparse
import json
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_lite as st  # noqa: E402


def rope(x, theta, pos_offset=0):
    # x [B, nh, T, hd], rotate-half convention (Hugging Face Llama).
    T, hd = x.shape[2], x.shape[3]
    inv = theta ** (-torch.arange(0, hd // 2, dtype=torch.float64) * 2.0 / hd)
    ang = torch.arange(pos_offset, pos_offset + T, dtype=torch.float64)[:, None] * inv[None, :]
    cos, sin = torch.cos(ang).to(x.dtype), torch.sin(ang).to(x.dtype)
    x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def norm(x, p, name, cfg):
    w = p[name + ".weight"]
    if cfg["rms_norm"]:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + cfg["norm_eps"]) * w
    return F.layer_norm(x, (x.shape[-1],), w, p.get(name + ".bias"), cfg["norm_eps"])


def linear(x, p, name):
    y = x @ p[name + ".weight"]
    b = p.get(name + ".bias")
    return y + b if b is not None else y


def forward(p, cfg, tokens):
    B, T = tokens.shape
    C, H, KV = cfg["n_embd"], cfg["n_head"], cfg["n_kv_head"]
    hd = C // H
    x = p["transformer.wte.weight"][tokens.long()]
    if not cfg["rope"]:
        x = x + p["transformer.wpe.weight"][:T]
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    for i in range(cfg["n_layer"]):
        pre = f"transformer.h.{i}."
        h = norm(x, p, pre + "ln_1", cfg)
        qkv = linear(h, p, pre + "attn.c_attn")
        q, k, v = qkv.split([H * hd, KV * hd, KV * hd], dim=-1)
        q = q.view(B, T, H, hd).transpose(1, 2)
        k = k.view(B, T, KV, hd).transpose(1, 2)
        v = v.view(B, T, KV, hd).transpose(1, 2)
        if cfg["rope"]:
            q, k = rope(q, cfg["rope_theta"]), rope(k, cfg["rope_theta"])
        k = k.repeat_interleave(H // KV, dim=1)
        v = v.repeat_interleave(H // KV, dim=1)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hd)
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, H * hd)
        x = x + linear(y, p, pre + "attn.c_proj")
        h = linear(norm(x, p, pre + "ln_2", cfg), p, pre + "mlp.c_fc")
        if cfg["swiglu"]:
            g, u = h.chunk(2, dim=-1)
            h = F.silu(g) * u
        else:
            h = F.gelu(h, approximate="tanh")
        x = x + linear(h, p, pre + "mlp.c_proj")
    x = norm(x, p, "transformer.ln_f", cfg)
    head = p["transformer.wte.weight"] if cfg["tied_head"] else p["lm_head.weight"]
    return x @ head.t()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("weights")
    ap.add_argument("batch")
    ap.add_argument("out")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--beta1", type=float, default=0.9)
    ap.add_argument("--beta2", type=float, default=0.95)
    ap.add_argument("--eps", type=float, default=1e-8)
    ap.add_argument("--wd", type=float, default=0.1)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--float64", action="store_true", help="compute in float64 (to measure fp32's own noise floor)")
    a = ap.parse_args()
    torch.set_num_threads(1)

    weights, meta = st.load(a.weights)
    cfg = json.loads(meta["atoll_model"])
    batch, _ = st.load(a.batch)
    tokens, targets = batch["tokens"], batch["targets"].long()
    dt = torch.float64 if a.float64 else torch.float32
    params = {n: t.clone().to(dt).requires_grad_(True) for n, t in weights.items()}

    out = {}
    logits = forward(params, cfg, tokens)
    loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1), ignore_index=-1)
    loss.backward()
    out["logits"] = logits.detach().float()
    out["loss"] = loss.detach().reshape(1).float()
    for n, t in params.items():
        out["grad." + n] = t.grad.detach().clone().float()

    decay = [t for t in params.values() if t.dim() >= 2]
    no_decay = [t for t in params.values() if t.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.wd}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(a.beta1, a.beta2), eps=a.eps)
    losses = []
    for step in range(a.steps):
        opt.zero_grad(set_to_none=True)
        logits = forward(params, cfg, tokens)
        loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1), ignore_index=-1)
        loss.backward()
        losses.append(loss.item())
        if a.clip > 0:
            torch.nn.utils.clip_grad_norm_(list(params.values()), a.clip)
        opt.step()
        if step == 0:
            # One step from identical weights: the tight check of the optimizer (later steps
            # follow chaotically diverging fp32 trajectories).
            for n, t in params.items():
                out["step1." + n] = t.detach().clone().float()
    out["losses"] = torch.tensor(losses, dtype=torch.float32)
    for n, t in params.items():
        out["final." + n] = t.detach().clone().float()
    st.save(a.out, out)


if __name__ == "__main__":
    main()
