"""PyTorch's side of the training-step benchmark: the same GPT (tools/torch_gpt_ref.py's model),
batch and thread count, timed over the same full step (forward, backward, clip, AdamW).
Prints one JSON line like bench_gpt_step.

usage: /usr/bin/python3 tools/bench_torch_gpt.py PRESET B T THREADS STEPS [n_layer n_embd n_head vocab]
TORCH_BENCH_AUTOCAST=bf16 runs forward and loss under torch.autocast("cpu", torch.bfloat16)
(PyTorch's mixed precision: bf16 matmuls on oneDNN, fp32 master weights), the peer of atoll's bf16.
"""
import contextlib
import json
import os
import resource
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_gpt_ref import forward  # noqa: E402

PRESETS = {"gpt2": (12, 768, 12, 50257), "d384": (6, 384, 6, 50257), "gpt2-tiny": (2, 64, 4, 257)}


def main():
    preset, B, T, threads, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    L, C, H, V = PRESETS[preset]
    if len(sys.argv) >= 10:
        L, C, H, V = (int(a) for a in sys.argv[6:10])
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    cfg = dict(n_layer=L, n_embd=C, n_head=H, n_kv_head=H, rope=False, rms_norm=False, swiglu=False, tied_head=True,
               norm_eps=1e-5, rope_theta=10000.0)
    p = {"transformer.wte.weight": torch.randn(V, C) * 0.02, "transformer.wpe.weight": torch.randn(T, C) * 0.02,
         "transformer.ln_f.weight": torch.ones(C), "transformer.ln_f.bias": torch.zeros(C)}
    for i in range(L):
        pre = f"transformer.h.{i}."
        for n, shape in [("ln_1", None), ("ln_2", None)]:
            p[pre + n + ".weight"] = torch.ones(C)
            p[pre + n + ".bias"] = torch.zeros(C)
        for n, (a, b) in {"attn.c_attn": (C, 3 * C), "attn.c_proj": (C, C), "mlp.c_fc": (C, 4 * C),
                          "mlp.c_proj": (4 * C, C)}.items():
            p[pre + n + ".weight"] = torch.randn(a, b) * 0.02
            p[pre + n + ".bias"] = torch.zeros(b)
    params = {k: v.requires_grad_(True) for k, v in p.items()}
    opt = torch.optim.AdamW(list(params.values()), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)
    x = torch.randint(0, V, (B, T), dtype=torch.int32)
    y = torch.randint(0, V, (B, T))
    bf16 = os.environ.get("TORCH_BENCH_AUTOCAST") == "bf16"
    autocast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if bf16 else contextlib.nullcontext
    times, loss = [], 0.0
    for s in range(steps + 1):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with autocast():
            logits = forward(params, cfg, x)
            loss_t = F.cross_entropy(logits.view(-1, V), y.view(-1))
        loss_t.backward()
        torch.nn.utils.clip_grad_norm_(list(params.values()), 1.0)
        opt.step()
        loss = loss_t.item()
        if s > 0:
            times.append(time.perf_counter() - t0)
    times.sort()
    med = times[len(times) // 2]
    print(json.dumps({"impl": "pytorch " + torch.__version__ + (" bf16 autocast" if bf16 else ""), "step_s": med, "tokens_per_s": B * T / med,
                      "max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "loss": loss}))


if __name__ == "__main__":
    main()
