"""PyTorch's side of the data-parallel benchmark (bench/ddp_vs_torch.sh): the same GPT as
tools/torch_gpt_ref.py (same operations), trained with torch.distributed DDP or FSDP over the Gloo
backend on WORLD processes started here (torchrun's environment: RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT), same batch per rank, thread count and step (forward, backward, clip, AdamW). Rank 0
prints one JSON line like bench_ddp: median step time, the job's tokens/s, the largest peak RSS of
the ranks and the largest RSS before the model existed (torch's own ~250 MB).

The model is built of modules, one per transformer block, so that FSDP can wrap each block as its
own unit (transformer_auto_wrap_policy), as atoll's ZeRO-3 does; the embeddings and the final norm
stay in the root unit (FSDP, Zhao et al., "PyTorch FSDP: Experiences on Scaling Fully Sharded Data
Parallel", VLDB 2023). torch 1.13's FSDP needs two shims here, both applied only on the fsdp path:
one to import under Python 3.11 and one to run on CPU over Gloo (see the two functions below);
with them it trains to the same loss as DDP (the JSON's last_loss).

usage: /usr/bin/python3 tools/bench_torch_ddp.py ddp|fsdp WORLD N_LAYER N_EMBD N_HEAD B T STEPS [BUCKET_MB] [THREADS]
"""
import copy
import dataclasses
import functools
import json
import math
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
from torch_gpt_ref import linear, norm  # noqa: E402

V = 257


def allow_fsdp_import_on_python311():
    """torch 1.13's torch.distributed._shard declares a dataclass field whose default is an
    instance of another (unhashable, i.e. mutable) dataclass; Python 3.11 rejects that at class
    creation ("mutable default ... for field ... is not allowed: use default_factory"), so
    torch.distributed.fsdp cannot be imported on Debian's Python. Before dataclasses inspects such
    a field, turn its default into a default_factory that hands out a deep copy, which is what
    3.11 asks for and what the field means. Lists, dicts and sets keep raising as before."""
    inspect_field = dataclasses._get_field

    def tolerant(cls, name, annotation, *more):
        declared = cls.__dict__.get(name, dataclasses.MISSING)
        default = declared.default if isinstance(declared, dataclasses.Field) else declared
        mutable_instance = (default is not dataclasses.MISSING and type(default).__hash__ is None
                            and not isinstance(default, (list, dict, set)))
        if mutable_instance:
            setattr(cls, name, dataclasses.field(default_factory=functools.partial(copy.deepcopy, default)))
        return inspect_field(cls, name, annotation, *more)

    dataclasses._get_field = tolerant


class _NoStream:
    """Stands in for a CUDA stream or event: on the CPU every operation is already ordered."""

    def __init__(self, *args, **kwargs):
        pass

    def wait_stream(self, *args):
        pass

    def record(self, *args):
        pass

    def synchronize(self):
        pass

    def query(self):
        return True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class _CpuCuda:
    """What torch 1.13's FSDP asks of torch.cuda (streams, events, the current device), answered
    for the CPU. FSDP overlaps communication through CUDA streams; here the collectives are
    synchronous Gloo calls, so the streams have nothing to order."""
    Stream = Event = _NoStream

    @staticmethod
    def is_available():
        return True

    @staticmethod
    def current_device():
        return 0

    @staticmethod
    def device_count():
        return 1

    @staticmethod
    def current_stream(*args):
        return _NoStream()

    @staticmethod
    def stream(s):
        return _NoStream()

    @staticmethod
    def synchronize(*args):
        pass


class _TorchWithCpuCuda:
    """The torch module as FSDP's own modules see it: everything real except torch.cuda."""

    def __getattr__(self, name):
        return _CpuCuda if name == "cuda" else getattr(torch, name)


def make_fsdp_run_on_cpu_gloo():
    """torch 1.13's FSDP is written for CUDA and NCCL: it takes its compute device from
    torch.cuda, orders its all-gathers and reduce-scatters with CUDA streams, and calls
    _all_gather_base / _reduce_scatter_base, which 1.13's Gloo process group does not implement
    (nor reduce_scatter at all). To run it on this CPU-only machine: FSDP's modules see a torch
    whose cuda answers for the CPU (_CpuCuda), the compute device is the CPU, _all_gather_base
    becomes Gloo's all_gather into views of the output, and the gradient reduce-scatter (FSDP's
    communication hook, a public 1.13 API) becomes an all_reduce of the flat gradient keeping this
    rank's chunk: twice the traffic of a reduce-scatter and a full-size reduction on every rank,
    so FSDP's communication here costs more than it would with a native reduce-scatter."""
    from torch.distributed.fsdp import flat_param as fsdp_flat_param
    from torch.distributed.fsdp import fully_sharded_data_parallel as fsdp_main
    for m in (fsdp_main, fsdp_flat_param):
        m.torch = _TorchWithCpuCuda()
    fsdp_main.FullyShardedDataParallel._get_compute_device = lambda self, *a: torch.device("cpu")
    torch.Tensor.record_stream = lambda self, stream: None  # CPU memory is not stream-ordered
    torch.Tensor.cuda = lambda self, *a, **k: self  # clip_grad_norm_ moves the norm "to the GPU"

    def all_gather_base(output, input, group=None, async_op=False):
        dist.all_gather(list(output.chunk(dist.get_world_size(group))), input, group=group)

    dist._all_gather_base = all_gather_base


def fsdp_grad_reduce_by_all_reduce(state, grad, output):
    """FSDP communication hook: the mean gradient's chunk of this rank, through all_reduce."""
    world = dist.get_world_size(state.process_group)
    grad.div_(world)
    dist.all_reduce(grad, group=state.process_group)
    output.copy_(grad.chunk(world)[dist.get_rank(state.process_group)])


class Params(torch.nn.Module):
    """Named tensors registered as parameters of this module (dots become '__', which attribute
    names cannot hold), read back as a dict under their GPT-2 names for torch_gpt_ref's helpers."""

    def __init__(self, tensors):
        super().__init__()
        self.keys = list(tensors)
        for n, v in tensors.items():
            self.register_parameter(n.replace(".", "__"), torch.nn.Parameter(v))

    def named(self, prefix=""):
        return {prefix + n: getattr(self, n.replace(".", "__")) for n in self.keys}


class Block(Params):
    def __init__(self, C):
        p = {}
        for n in ("ln_1", "ln_2"):
            p[n + ".weight"] = torch.ones(C)
            p[n + ".bias"] = torch.zeros(C)
        for n, (a, b) in {"attn.c_attn": (C, 3 * C), "attn.c_proj": (C, C), "mlp.c_fc": (C, 4 * C),
                          "mlp.c_proj": (4 * C, C)}.items():
            p[n + ".weight"] = torch.randn(a, b) * 0.02
            p[n + ".bias"] = torch.zeros(b)
        super().__init__(p)

    def forward(self, x, H, eps):
        # torch_gpt_ref.forward's block (learned positions, LayerNorm, GELU, no GQA).
        p = self.named()
        B, T, C = x.shape
        hd = C // H
        q, k, v = linear(norm(x, p, "ln_1", dict(rms_norm=False, norm_eps=eps)), p, "attn.c_attn").split(C, dim=-1)
        q, k, v = (t.view(B, T, H, hd).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hd)
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + linear(y, p, "attn.c_proj")
        h = F.gelu(linear(norm(x, p, "ln_2", dict(rms_norm=False, norm_eps=eps)), p, "mlp.c_fc"), approximate="tanh")
        return x + linear(h, p, "mlp.c_proj")


class GPT(torch.nn.Module):
    """Tied head, learned positions: atoll's gpt2 preset as bench_ddp builds it."""

    def __init__(self, L, C, H, T):
        super().__init__()
        self.H, self.eps = H, 1e-5
        self.root = Params({"wte.weight": torch.randn(V, C) * 0.02, "wpe.weight": torch.randn(T, C) * 0.02,
                            "ln_f.weight": torch.ones(C), "ln_f.bias": torch.zeros(C)})
        self.h = torch.nn.ModuleList(Block(C) for _ in range(L))

    def forward(self, tokens):
        p = self.root.named()
        x = p["wte.weight"][tokens.long()] + p["wpe.weight"][: tokens.shape[1]]
        for blk in self.h:
            x = blk(x, self.H, self.eps)
        x = norm(x, p, "ln_f", dict(rms_norm=False, norm_eps=self.eps))
        return x @ p["wte.weight"].t()


def resident_bytes():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


def rank_main(rank, a):
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(a["world"]), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(a["port"]))
    torch.set_num_threads(a["threads"])
    dist.init_process_group("gloo", init_method="env://")
    torch.manual_seed(0)
    if a["mode"] != "ddp":  # imports FSDP, so its modules are in the baseline as DDP's are
        allow_fsdp_import_on_python311()
        make_fsdp_run_on_cpu_gloo()
    base_rss = resident_bytes()  # the process before the model exists
    L, C, H, B, T = a["L"], a["C"], a["H"], a["B"], a["T"]
    model = GPT(L, C, H, T)
    if a["mode"] == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=a["bucket_mb"])
    else:
        from torch.distributed.algorithms._comm_hooks import default_hooks
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
        # One unit per block, the rest (embeddings, final norm; the head is tied) the root unit.
        model = FSDP(model, auto_wrap_policy=functools.partial(transformer_auto_wrap_policy,
                                                               transformer_layer_cls={Block}))
        model.register_comm_hook(default_hooks.DefaultState(dist.group.WORLD), fsdp_grad_reduce_by_all_reduce)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)
    g = torch.Generator().manual_seed(100 + rank)
    x = torch.randint(0, V, (B, T), dtype=torch.int32, generator=g)
    y = torch.randint(0, V, (B, T), generator=g)
    times = []
    for s in range(a["steps"] + 1):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        logits = model(x)
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
    rss = torch.tensor([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, base_rss], dtype=torch.int64)
    dist.all_reduce(rss, op=dist.ReduceOp.MAX)
    if rank == 0:
        units = sum(1 for m in model.modules() if type(m).__name__ == "FullyShardedDataParallel")
        print(json.dumps({"impl": "pytorch " + torch.__version__, "strategy": a["mode"], "world": a["world"],
                          "step_s": med, "tokens_per_s": B * T * a["world"] / med,
                          "peak_rss_bytes": int(rss[0]), "base_rss_bytes": int(rss[1]), "last_loss": loss.item(),
                          **({"fsdp_units": units} if units else {})}),
              flush=True)
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
