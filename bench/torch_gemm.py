"""PyTorch's side of bench/gemm_vs_torch.sh: torch.matmul GFLOP/s in fp32 and bf16 on the shapes
`atoll bench gemm --json` measured (read from that file), same threads, median of REPEATS.
Transposed operands are transposed views, as in a training step's backward.
usage: python3 bench/torch_gemm.py ATOLL_JSON THREADS REPEATS  -> one JSON object on stdout
"""
import json
import sys
import time

import torch


def median_s(f, reps):
    f()
    t = []
    for _ in range(reps):
        a = time.perf_counter()
        f()
        t.append(time.perf_counter() - a)
    t.sort()
    return t[len(t) // 2]


def main():
    shapes = json.load(open(sys.argv[1]))["sizes"]
    torch.set_num_threads(int(sys.argv[2]))
    reps = int(sys.argv[3])
    out = []
    for s in shapes:
        M, N, K, ta, tb = s["M"], s["N"], s["K"], s["ta"], s["tb"]
        row = {"shape": s["shape"]}
        for name, dt in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
            a = torch.randn(K, M).to(dt).t() if ta else torch.randn(M, K).to(dt)
            b = torch.randn(N, K).to(dt).t() if tb else torch.randn(K, N).to(dt)
            row[name] = 2.0 * M * N * K / median_s(lambda: torch.matmul(a, b), reps) / 1e9
        out.append(row)
    print(json.dumps({"torch": torch.__version__, "sizes": out}))


if __name__ == "__main__":
    main()
