#!/usr/bin/env python3
"""PyTorch peer of bench_weight_sync: 2 Gloo processes; rank 0 broadcasts the same numbers of
floats in the same bucket size (one torch.distributed.broadcast per flat bucket, as atoll does).
Prints one JSON line per size: {"params", "median_ms"}.

usage: bench_torch_broadcast.py BUCKET_MB REPS PARAMS...
"""
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def worker(rank, bucket_mb, reps, sizes, port, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    cap = int(bucket_mb * 1024 * 1024 / 4)
    for n in sizes:
        flat = torch.randn(n) if rank == 0 else torch.zeros(n)
        buckets = [flat[i:i + cap] for i in range(0, n, cap)]
        sec = []
        for r in range(reps + 1):
            dist.barrier()
            t0 = time.perf_counter()
            works = [dist.broadcast(b, 0, async_op=True) for b in buckets]
            for w in works:
                w.wait()
            if r > 0:
                sec.append(time.perf_counter() - t0)
        sec.sort()
        t = torch.tensor([sec[len(sec) // 2]])
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        if rank == 0:
            out.put({"params": n, "median_ms": 1e3 * t.item(), "buckets": len(buckets)})
    dist.destroy_process_group()


def main():
    bucket_mb, reps, sizes = float(sys.argv[1]), int(sys.argv[2]), [int(a) for a in sys.argv[3:]]
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    ps = [ctx.Process(target=worker, args=(r, bucket_mb, reps, sizes, port, q)) for r in range(2)]
    for p in ps:
        p.start()
    for _ in sizes:
        print(json.dumps(q.get()))
    for p in ps:
        p.join()


if __name__ == "__main__":
    main()
