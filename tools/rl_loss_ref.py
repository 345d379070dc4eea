#!/usr/bin/env python3
"""PyTorch reference for atoll's RL losses (tests/rl/test_rl_losses_torch.cpp).

usage: rl_loss_ref.py IN.safetensors OUT.safetensors

Reads one fixed batch (logits [B,T,V], targets [B,T] with -1 off the completions, the behaviour
and reference log-probs, per-sequence rewards, old values and new values), recomputes in float64
with torch autograd, independently of the C++ code, for each algorithm:
  grpo, dr_grpo: group advantages (r - mean_g) / (std_g + 1e-4) (dr_grpo: no std), per-sequence
                 token mean (dr_grpo: a constant max_new_tokens + 1), clipped ratio, k3 KL;
  reinforce_pp:  k1-penalised token rewards, return-to-go, batch whitening, token mean, no KL term;
  ppo:           the same rewards, GAE over old values, whitening, token mean; clipped value loss.
Writes "<alg>.loss", "<alg>.dlogits" and for ppo "ppo.vloss", "ppo.dvalues" as float32.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_lite  # noqa: E402


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    t, m = safetensors_lite.load(sys.argv[1])
    G, lo, hi, beta = int(m["group"]), float(m["clip_low"]), float(m["clip_high"]), float(m["kl_coef"])
    gamma, lam, max_new, vclip, vf = (float(m["gamma"]), float(m["lam"]), int(m["max_new"]), float(m["value_clip"]),
                                      float(m["vf_coef"]))
    tg = t["targets"].long()
    mask = (tg >= 0).double()
    B, T = tg.shape
    old, ref = t["old"].double(), t["ref"].double()
    r = t["rewards"].double()
    lens = mask.sum(1)
    out = {}

    def policy(alg, adv, w, kl_coef):
        logits = t["logits"].double().requires_grad_(True)
        logp = torch.log_softmax(logits, -1).gather(-1, tg.clamp(min=0)[..., None])[..., 0]
        ratio = torch.exp(logp - old)
        pg = -torch.min(ratio * adv, torch.clamp(ratio, 1 - lo, 1 + hi) * adv)
        d = ref - logp
        kl = torch.exp(d) - d - 1
        loss = (w * mask * (pg + kl_coef * kl)).sum()
        loss.backward()
        out[f"{alg}.loss"] = loss.detach().reshape(1)
        out[f"{alg}.dlogits"] = logits.grad

    gr = r.view(-1, G)
    for alg in ("grpo", "dr_grpo"):
        a = gr - gr.mean(1, keepdim=True)
        if alg == "grpo":
            a = a / (gr.std(1, keepdim=True) + 1e-4)
        adv = a.reshape(B, 1).expand(B, T)
        w = (1.0 / (B * lens)).reshape(B, 1).expand(B, T) if alg == "grpo" else torch.full((B, T), 1.0 / (B * (max_new + 1)))
        policy(alg, adv, w, beta)

    # Token rewards: -beta (old - ref) on completion tokens, the sequence reward on the last one.
    last = (torch.arange(T)[None, :] == (mask.cumsum(1).argmax(1))[:, None]).double() * mask
    tr = (-beta * (old - ref) + r[:, None] * last) * mask

    def whiten(x):
        n = mask.sum()
        mean = (x * mask).sum() / n
        var = (((x - mean) * mask) ** 2).sum() / n
        return (x - mean) / torch.sqrt(var + 1e-8) * mask

    tok_w = torch.full((B, T), 1.0 / mask.sum().item())
    ret = torch.zeros(B, T, dtype=torch.float64)
    g = torch.zeros(B, dtype=torch.float64)
    for s in reversed(range(T)):
        g = torch.where(mask[:, s] > 0, tr[:, s] + gamma * g, g)
        ret[:, s] = g * mask[:, s]
    policy("reinforce_pp", whiten(ret), tok_w, 0.0)

    V = t["old_values"].double() * mask
    adv = torch.zeros(B, T, dtype=torch.float64)
    a = torch.zeros(B, dtype=torch.float64)
    nv = torch.zeros(B, dtype=torch.float64)
    for s in reversed(range(T)):
        on = mask[:, s] > 0
        delta = tr[:, s] + gamma * nv - V[:, s]
        a = torch.where(on, delta + gamma * lam * a, a)
        nv = torch.where(on, V[:, s], nv)
        adv[:, s] = a * mask[:, s]
    returns = adv + V
    policy("ppo", whiten(adv), tok_w, 0.0)
    v = t["values"].double().requires_grad_(True)
    vc = V + torch.clamp(v - V, -vclip, vclip)
    vl = 0.5 * torch.max((v - returns) ** 2, (vc - returns) ** 2)
    vloss = (vf * tok_w * mask * vl).sum()
    vloss.backward()
    out["ppo.vloss"] = vloss.detach().reshape(1)
    out["ppo.dvalues"] = v.grad
    safetensors_lite.save(sys.argv[2], {k: x.float().contiguous() for k, x in out.items()})


if __name__ == "__main__":
    main()
