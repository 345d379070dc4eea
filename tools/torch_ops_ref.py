#!/usr/bin/env python3
"""PyTorch reference for atoll's op set beyond the GPT block (tests/autograd/test_ops_torch.cpp).

usage: torch_ops_ref.py IN.safetensors OUT.safetensors

Reads the inputs and upstream gradients the C++ test wrote ("<case>.<name>"), recomputes each case
it finds in float64 with torch autograd, and writes the forward outputs and input gradients as
float32 ("<case>.y", "<case>.d<input>"). Sizes and options travel in the file's __metadata__.
"""
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_lite  # noqa: E402


def leaf(t):
    return t.double().requires_grad_(True)


def run(case, fn, t, grads, dy_names=("dy",)):
    """fn(inputs) -> output(s); backward with the case's dy tensors; returns outputs and grads."""
    ins = {n: leaf(t[f"{case}.{n}"]) for n in grads}
    outs = fn(ins)
    outs = outs if isinstance(outs, tuple) else (outs,)
    total = sum((o * t[f"{case}.{d}"].double()).sum() for o, d in zip(outs, dy_names))
    total.backward()
    res = {f"{case}.y" if i == 0 else f"{case}.y{i}": o for i, o in enumerate(outs)}
    res.update({f"{case}.d{n}": ins[n].grad for n in grads})
    return res


def attention(qkv, H, KV, hd, causal, doc):
    B, T, _ = qkv.shape
    heads = qkv.view(B, T, H + 2 * KV, hd).transpose(1, 2)
    q, k, v = heads[:, :H], heads[:, H:H + KV], heads[:, H + KV:]
    k = k.repeat_interleave(H // KV, dim=1)
    v = v.repeat_interleave(H // KV, dim=1)
    s = q @ k.transpose(-1, -2) / hd**0.5
    allowed = torch.ones(B, T, T, dtype=torch.bool)
    if doc is not None:
        # A document is a maximal run of equal ids.
        run_id = torch.cat([torch.zeros(B, 1, dtype=torch.long), (doc[:, 1:] != doc[:, :-1]).long()], 1).cumsum(1)
        allowed &= run_id[:, :, None] == run_id[:, None, :]
    if causal:
        allowed &= torch.ones(T, T, dtype=torch.bool).tril()
    s = s.masked_fill(~allowed[:, None], float("-inf"))
    return (torch.softmax(s, dim=-1) @ v).transpose(1, 2).reshape(B, T, H * hd)


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    t, m = safetensors_lite.load(sys.argv[1])
    i = lambda k: int(m[k])
    out = {}
    out.update(run("bmm", lambda x: x["a"] @ x["b"], t, ["a", "b"]))
    out.update(run("softmax", lambda x: torch.softmax(x["x"], -1), t, ["x"]))
    out.update(run("logsoftmax", lambda x: torch.log_softmax(x["x"], -1), t, ["x"]))
    out.update(run("silu", lambda x: F.silu(x["x"]), t, ["x"]))
    out.update(run("mul1", lambda x: x["a"] * x["b"], t, ["a", "b"]))
    out.update(run("mul2", lambda x: x["a"] * x["b"], t, ["a", "b"]))
    out.update(run("isel", lambda x: x["x"].index_select(i("isel.dim"), t["isel.idx"].long()), t, ["x"]))
    out.update(run("gather", lambda x: x["x"].gather(i("gather.dim"), t["gather.idx"].long()), t, ["x"]))
    out.update(run("scatter", lambda x: x["base"].scatter_add(i("scatter.dim"), t["scatter.idx"].long(), x["src"]),
                   t, ["base", "src"]))
    out.update(run("segsum", lambda x: torch.zeros((i("segsum.S"),) + tuple(x["x"].shape[1:]), dtype=torch.float64)
                   .index_add(0, t["segsum.ids"].long(), x["x"]), t, ["x"]))
    tk = run("topk", lambda x: torch.topk(x["x"], i("topk.k"), dim=-1).values, t, ["x"])
    tk["topk.indices"] = torch.topk(t["topk.x"].double(), i("topk.k"), dim=-1).indices.int()
    out.update(tk)
    out.update(run("concat", lambda x: torch.cat([x["a"], x["b"], x["c"]], i("concat.dim")), t, ["a", "b", "c"]))
    sizes = [int(s) for s in m["split.sizes"].split(",")]
    out.update(run("split", lambda x: tuple(torch.split(x["x"], sizes, i("split.dim"))), t, ["x"],
                   tuple(f"dy{k}" for k in range(len(sizes)))))
    out.update(run("mse", lambda x: F.mse_loss(x["p"], x["t"]), t, ["p", "t"]))

    def wce(x):
        tg = t["wce.targets"].long()
        keep = (tg >= 0) & (t["wce.mask"] != 0)
        w = t["wce.w"].double() * keep
        losses = F.cross_entropy(x["logits"], tg.clamp(min=0), reduction="none")
        return (losses * w).sum() / w.sum()
    out.update(run("wce", wce, t, ["logits"]))
    A = lambda c: (i(f"{c}.H"), i(f"{c}.KV"), i(f"{c}.hd"))
    out.update(run("attn_full", lambda x: attention(x["qkv"], *A("attn_full"), False, None), t, ["qkv"]))
    for c in ("attn_doc_causal", "attn_doc_full"):
        out.update(run(c, lambda x, c=c: attention(x["qkv"], *A(c), c.endswith("causal"), t[f"{c}.doc"]), t, ["qkv"]))
    # Dropout: torch's generator differs, so the mask is atoll's (kept elements nonzero) and the
    # check is the op around it: inverted scaling and the gradient routed through the kept ones.
    p = float(m["dropout.p"])
    keep = t["dropout.kept"].double()
    out.update(run("dropout", lambda x: x["x"] * keep / (1 - p), t, ["x"]))
    safetensors_lite.save(sys.argv[2], {k: v.detach().float() if v.is_floating_point() else v for k, v in out.items()})


if __name__ == "__main__":
    main()
