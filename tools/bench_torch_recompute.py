"""PyTorch's side of the recomputation benchmark (bench/bench_recompute.cpp): the same GPT-2-style
model, batch and thread count, the full step (forward, backward, clip, AdamW) under no
recomputation, selective (torch.utils.checkpoint around the attention core: scores, softmax,
weighted sum) and full (checkpoint around each block). One JSON line per mode: the median step
time and the process's peak RSS (CPU PyTorch keeps no allocator statistics; run one MODE per
process for a per-mode figure).

usage: /usr/bin/python3 tools/bench_torch_recompute.py PRESET B T THREADS STEPS [MODE|all [n_layer n_embd n_head vocab]]
"""
import json
import math
import resource
import sys
import time

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

PRESETS = {"gpt2": (12, 768, 12, 50257), "d384": (6, 384, 6, 50257), "gpt2-tiny": (2, 64, 4, 257)}


def attention_core(qkv, H, mask):
    B, T, C3 = qkv.shape
    C = C3 // 3
    q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in qkv.split(C, dim=-1))
    att = (q @ k.transpose(-2, -1)) / math.sqrt(C // H)
    att = att.masked_fill(~mask, float("-inf")).softmax(-1)
    return (att @ v).transpose(1, 2).reshape(B, T, C)


def block(x, p, H, mask, selective):
    h = F.layer_norm(x, (x.shape[-1],), p["ln_1.w"], p["ln_1.b"])
    qkv = h @ p["attn.w"] + p["attn.b"]
    y = checkpoint(attention_core, qkv, H, mask, use_reentrant=False) if selective else attention_core(qkv, H, mask)
    x = x + y @ p["proj.w"] + p["proj.b"]
    h = F.layer_norm(x, (x.shape[-1],), p["ln_2.w"], p["ln_2.b"])
    h = F.gelu(h @ p["fc.w"] + p["fc.b"], approximate="tanh")
    return x + h @ p["fc2.w"] + p["fc2.b"]


def main():
    preset, B, T, threads, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    L, C, H, V = PRESETS[preset]
    only = sys.argv[6] if len(sys.argv) >= 7 else "all"
    if len(sys.argv) >= 11:
        L, C, H, V = (int(a) for a in sys.argv[7:11])
    torch.set_num_threads(threads)
    x = torch.randint(0, V, (B, T))
    y = torch.randint(0, V, (B, T))
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    for mode in ("none", "selective", "full"):
        if only not in ("all", mode):
            continue
        torch.manual_seed(0)
        wte, wpe = (torch.randn(V, C) * 0.02).requires_grad_(), (torch.randn(T, C) * 0.02).requires_grad_()
        lnf = (torch.ones(C).requires_grad_(), torch.zeros(C).requires_grad_())
        blocks = []
        for _ in range(L):
            shapes = {"ln_1.w": (C,), "ln_1.b": (C,), "attn.w": (C, 3 * C), "attn.b": (3 * C,), "proj.w": (C, C),
                      "proj.b": (C,), "ln_2.w": (C,), "ln_2.b": (C,), "fc.w": (C, 4 * C), "fc.b": (4 * C,),
                      "fc2.w": (4 * C, C), "fc2.b": (C,)}
            blocks.append({k: (torch.randn(*s) * 0.02 if len(s) == 2 else
                               (torch.ones(*s) if k.endswith(".w") else torch.zeros(*s))).requires_grad_()
                           for k, s in shapes.items()})
        params = [wte, wpe, *lnf] + [t for b in blocks for t in b.values()]
        opt = torch.optim.AdamW(params, lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)
        times, loss = [], 0.0
        for s in range(steps + 1):
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            h = wte[x] + wpe[:T]
            for b in blocks:
                if mode == "full":
                    h = checkpoint(block, h, b, H, mask, False, use_reentrant=False)
                else:
                    h = block(h, b, H, mask, mode == "selective")
            logits = F.layer_norm(h, (C,), *lnf) @ wte.t()
            loss_t = F.cross_entropy(logits.view(-1, V), y.view(-1))
            loss_t.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            loss = loss_t.item()
            if s > 0:
                times.append(time.perf_counter() - t0)
        times.sort()
        print(json.dumps({"impl": "pytorch " + torch.__version__, "recompute": mode, "step_s": times[len(times) // 2],
                          "max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "loss": loss}),
              flush=True)


if __name__ == "__main__":
    main()
