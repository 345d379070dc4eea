"""PyTorch's side of the data-parallel benchmark (bench/ddp_vs_torch.sh): the same GPT as
tools/torch_gpt_ref.py, trained with torch.distributed DDP or FSDP over the Gloo backend on
WORLD processes started here (torchrun's environment: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT),
same batch per rank, thread count and step (forward, backward, clip, AdamW). Rank 0 prints one
JSON line like bench_ddp: median step time, the job's tokens/s, the largest peak RSS of the ranks.

usage: /usr/bin/python3 tools/bench_torch_ddp.py ddp|fsdp WORLD N_LAYER N_EMBD N_HEAD B T STEPS [BUCKET_MB] [THREADS]
"""
import json
import os
import resource
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_gpt_ref import forward  # noqa: E402

V = 257


class GPT(torch.nn.Module):
    def __init__(self, L, C, T):
        super().__init__()
        p = {"transformer.wte.weight": torch.randn(V, C) * 0.02, "transformer.wpe.weight": torch.randn(T, C) * 0.02,
             "transformer.ln_f.weight": torch.ones(C), "transformer.ln_f.bias": torch.zeros(C)}
        for i in range(L):
            pre = f"transformer.h.{i}."
            for n in ("ln_1", "ln_2"):
                p[pre + n + ".weight"] = torch.ones(C)
                p[pre + n + ".bias"] = torch.zeros(C)
            for n, (a, b) in {"attn.c_attn": (C, 3 * C), "attn.c_proj": (C, C), "mlp.c_fc": (C, 4 * C),
                              "mlp.c_proj": (4 * C, C)}.items():
                p[pre + n + ".weight"] = torch.randn(a, b) * 0.02
                p[pre + n + ".bias"] = torch.zeros(b)
        self.names = list(p)
        self.p = torch.nn.ParameterList([torch.nn.Parameter(v) for v in p.values()])

    def forward(self, x, cfg):
        return forward(dict(zip(self.names, self.p)), cfg, x)


def rank_main(rank, a):
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(a["world"]), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(a["port"]))
    torch.set_num_threads(a["threads"])
    dist.init_process_group("gloo", init_method="env://")
    torch.manual_seed(0)
    L, C, H, B, T = a["L"], a["C"], a["H"], a["B"], a["T"]
    cfg = dict(n_layer=L, n_embd=C, n_head=H, n_kv_head=H, rope=False, rms_norm=False, swiglu=False, tied_head=True,
               norm_eps=1e-5, rope_theta=10000.0)
    model = GPT(L, C, T)
    if a["mode"] == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=a["bucket_mb"])
    else:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        model = FSDP(model)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)
    g = torch.Generator().manual_seed(100 + rank)
    x = torch.randint(0, V, (B, T), dtype=torch.int32, generator=g)
    y = torch.randint(0, V, (B, T), generator=g)
    times = []
    for s in range(a["steps"] + 1):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        logits = model(x, cfg)
        loss = F.cross_entropy(logits.view(-1, V), y.view(-1))
        loss.backward()
        if a["mode"] == "ddp":
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        else:
            model.clip_grad_norm_(1.0)
        opt.step()
        if s > 0:
            times.append(time.perf_counter() - t0)
    times.sort()
    med = times[len(times) // 2]
    rss = torch.tensor([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024], dtype=torch.int64)
    dist.all_reduce(rss, op=dist.ReduceOp.MAX)
    if rank == 0:
        print(json.dumps({"impl": "pytorch " + torch.__version__, "strategy": a["mode"], "world": a["world"],
                          "step_s": med, "tokens_per_s": B * T * a["world"] / med,
                          "peak_rss_bytes": int(rss.item())}), flush=True)
    dist.destroy_process_group()


def main():
    mode, world = sys.argv[1], int(sys.argv[2])
    L, C, H, B, T, steps = (int(v) for v in sys.argv[3:9])
    bucket_mb = float(sys.argv[9]) if len(sys.argv) > 9 else 25.0
    threads = int(sys.argv[10]) if len(sys.argv) > 10 else 1
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    a = dict(mode=mode, world=world, L=L, C=C, H=H, B=B, T=T, steps=steps, bucket_mb=bucket_mb, threads=threads,
             port=port)
    mp.spawn(rank_main, args=(a,), nprocs=world, join=True)


if __name__ == "__main__":
    main()
