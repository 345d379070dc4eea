#!/usr/bin/env python3
"""Training across islands, measured (docs/islands.md): DiLoCo M=4 H=50 against DDP on 4 ranks
with equal tokens (eval loss ratio, bytes ratio), Streaming DiLoCo against DiLoCo, IsoLoCo
against DiLoCo at M=2 and 4, and, on the WAN test bed (scripts/wan_testbed.sh, 20 Mbit/s, 20 ms
one way), DiLoCo's and Streaming DiLoCo's compute utilization and the bytes the veth counters saw.
Writes OUT/results.json, OUT/loss_vs_time.svg and OUT/loss_vs_bytes.svg and prints a table.

The model is small so that every run fits this shared 2-core machine (default: GPT L=4 d=64,
0.22M parameters, byte-level fortunes corpus); --steps, --layers, --embd change it. PyTorch has
no DiLoCo to run as the peer; DDP (atoll's, the same ranks and tokens) is the baseline.

--only codecs: DDP, fp32 DiLoCo and DiLoCo with each codec exchange ([lowcomm] exchange, --codecs;
error feedback on, nvfp4 with stochastic rounding): val loss against fp32 DiLoCo and bytes
against DDP, from atoll's count and, on the WAN test bed, from the veth counters (the traffic of
the outer steps alone: the difference between a run of --steps and one of a third of them, so
start-up, rendezvous and the final checkpoint cancel).
--seeds N: every local run with seeds 1..N; ratios are of the means over seeds.
--only sweep: where DiLoCo M=4's gap to DDP comes from: DDP and DiLoCo with H = --inner, H/2,
H/5, outer SGD lr 1 without momentum (plain parameter averaging), and outer lr 0.35; val loss
ratios to DDP (per seed and of the means).

usage: bench/islands_bench.py [--out DIR] [--steps N] [--inner H] [--only local|wan|codecs] [--layers L]
       [--embd D] [--codecs int8,fp8_e4m3,nvfp4] [--seeds N] [--no-wan]
(build first: cmake --build build --target atoll)"""
import argparse
import json
import os
import platform
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ATOLL = os.path.join(ROOT, os.environ.get("BUILD", "build"), "atoll")
TESTBED = os.path.join(ROOT, "scripts", "wan_testbed.sh")


def cpu_model():
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def config(out, a):
    path = os.path.join(out, "bench.toml")
    with open(path, "w") as f:
        f.write(f"""[data]
dir = "{os.path.join(out, 'data')}"
tokenizer = "byte"
auto_prepare = true
[model]
preset = "gpt2"
vocab_size = 257
block_size = 64
n_layer = {a.layers}
n_head = 4
n_embd = {a.embd}
[train]
steps = {a.steps}
batch_size = 8
seq_len = 64
warmup_steps = 20
threads = 1
seed = 1
[optim.adamw]
lr = 3e-3
[eval]
every = {a.steps}
steps = 16
[sample]
every = 0
[checkpoint]
every = 0
keep = 1
[log]
every = 50
[hardware]
peak_gflops = 100.0
""")
    return path


def metrics(run_dir):
    rows = []
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            j = json.loads(line)
            if "loss" in j:
                rows.append(j)
    return rows


def launch_local(out, cfg, name, extra):
    run = os.path.join(out, name)
    cmd = [ATOLL, "launch", "--nproc-per-node", "4", "--timeout", "120", "--", ATOLL, "train", cfg,
           f"--run.dir={run}", "--overwrite"] + extra
    t = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"{name} failed:\n{p.stdout[-3000:]}{p.stderr[-3000:]}")
    return run, time.time() - t


def launch_wan(out, cfg, name, islands, ranks, extra, topo):
    run = os.path.join(out, name)
    stats = os.path.join(out, name + ".wan.json")
    inner = " ".join([ATOLL, "train", cfg, f"--run.dir={run}$ISLAND_INDEX", "--overwrite"] + extra)
    cmd = (f"{ATOLL} launch --nnodes $NISLANDS --node-rank $ISLAND_INDEX --nproc-per-node $RANKS_PER_ISLAND "
           f"--rdzv $HOST0_ADDR:29400 --timeout 300 -- {inner}")
    t = time.time()
    p = subprocess.run([TESTBED, topo, "--", cmd], capture_output=True, text=True, env=dict(os.environ, WAN_STATS=stats))
    if p.returncode == 77:
        return None, None, p.stderr.strip().splitlines()[-1]
    if p.returncode != 0:
        sys.exit(f"{name} failed:\n{p.stdout[-3000:]}{p.stderr[-3000:]}")
    return run + "0", json.load(open(stats)), time.time() - t


def series(rows, n_params, ddp_ranks=0):
    """(wall seconds, bytes sent by the job, loss) per step; DDP's bytes by the ring formula."""
    t = b = 0.0
    out = []
    for r in rows:
        t += r["step_ms"] / 1e3
        if ddp_ranks > 1:
            b += 2 * (ddp_ranks - 1) / ddp_ranks * 4 * n_params * ddp_ranks
        syncs = r.get("sync")
        if syncs is not None:
            for s in (syncs if isinstance(syncs, list) else [syncs]):
                b = s["wan_bytes_job"]
        out.append((t, b, r["loss"]))
    return out


def utilization(rows):
    wall = sum(r["step_ms"] for r in rows)
    blocked = 0.0
    peak = 0
    for r in rows:
        syncs = r.get("sync")
        for s in (syncs if isinstance(syncs, list) else [syncs]) if syncs is not None else []:
            blocked += s["blocked_ms"]
            peak = max(peak, s["wan_bytes"])
    return 1 - blocked / wall, peak


def svg(path, title, xlabel, curves, xkey):
    W, H, L, B = 640, 400, 70, 50
    pts = [p for c in curves.values() for p in c]
    xs = [p[xkey] for p in pts if p[xkey] > 0] or [1]
    ys = [p[2] for p in pts]
    x0, x1 = (min(xs), max(xs)) if xkey == 0 else (max(min(xs), 1), max(xs))
    import math
    logx = xkey == 1
    fx = (lambda v: math.log10(max(v, x0))) if logx else (lambda v: v)
    lo, hi = fx(x0), fx(x1) if fx(x1) > fx(x0) else fx(x0) + 1
    y0, y1 = min(ys), max(ys)
    X = lambda v: L + (fx(v) - lo) / (hi - lo) * (W - L - 20)
    Y = lambda v: H - B - (v - y0) / (y1 - y0 + 1e-9) * (H - B - 30)
    colors = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#17becf", "#7f7f7f"]
    s = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="11">',
         f'<rect width="{W}" height="{H}" fill="white"/>',
         f'<text x="{W/2}" y="16" text-anchor="middle" font-size="13">{title}</text>',
         f'<line x1="{L}" y1="{H-B}" x2="{W-20}" y2="{H-B}" stroke="black"/>',
         f'<line x1="{L}" y1="{H-B}" x2="{L}" y2="30" stroke="black"/>',
         f'<text x="{W/2}" y="{H-12}" text-anchor="middle">{xlabel}</text>',
         f'<text x="14" y="{H/2}" transform="rotate(-90 14 {H/2})" text-anchor="middle">train loss (island 0)</text>']
    for k in range(5):
        yv = y0 + (y1 - y0) * k / 4
        s.append(f'<text x="{L-5}" y="{Y(yv)+4}" text-anchor="end">{yv:.2f}</text>')
        xv = 10 ** (lo + (hi - lo) * k / 4) if logx else lo + (hi - lo) * k / 4
        s.append(f'<text x="{X(xv)}" y="{H-B+15}" text-anchor="middle">{xv:.3g}</text>')
    for i, (name, c) in enumerate(curves.items()):
        col = colors[i % len(colors)]
        d = " ".join(f"{X(p[xkey]):.1f},{Y(p[2]):.1f}" for p in c if not logx or p[xkey] > 0)
        s.append(f'<polyline fill="none" stroke="{col}" stroke-width="1.5" points="{d}"/>')
        s.append(f'<text x="{W-200}" y="{40+14*i}" fill="{col}">{name}</text>')
    s.append("</svg>")
    open(path, "w").write("\n".join(s))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(ROOT, "runs", "islands_bench"))
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--inner", type=int, default=50)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--embd", type=int, default=64)
    ap.add_argument("--only", choices=["local", "wan", "codecs", "sweep"], default=None)
    ap.add_argument("--codecs", default="int8,fp8_e4m3,nvfp4")
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--no-wan", action="store_true", help="--only codecs: the local runs only (no WAN test bed)")
    a = ap.parse_args()
    if a.only == "codecs":
        return codecs_main(a)
    if a.only == "sweep":
        return sweep_main(a)
    os.makedirs(a.out, exist_ok=True)
    cfg = config(a.out, a)
    H = a.inner
    dl = ["--lowcomm.method=diloco", f"--lowcomm.inner_steps={H}"]
    st = ["--lowcomm.method=streaming", f"--lowcomm.inner_steps={H}", f"--lowcomm.fragments={min(4, a.layers)}",
          "--lowcomm.overlap_steps=1", "--lowcomm.mixing=0.5"]
    iso = ["--lowcomm.method=isoloco", f"--lowcomm.inner_steps={H}"]
    res = {"cpu": cpu_model(), "load_before": os.getloadavg()[0], "steps": a.steps, "inner_steps": H,
           "model": f"GPT L={a.layers} d={a.embd} heads=4 V=257 T=64", "tokens_per_step": 4 * 8 * 64, "runs": {}}
    curves_t, curves_b = {}, {}
    n_params = None
    local = [("DDP 4 ranks", "ddp", []),
             (f"DiLoCo M=4 H={H}", "diloco4", ["--parallel.islands=4"] + dl),
             (f"Streaming M=4 H={H}", "stream4", ["--parallel.islands=4"] + st),
             (f"IsoLoCo M=4 H={H}", "iso4", ["--parallel.islands=4"] + iso),
             (f"DiLoCo M=2 H={H}", "diloco2", ["--parallel.islands=2"] + dl),
             (f"IsoLoCo M=2 H={H}", "iso2", ["--parallel.islands=2"] + iso)]
    if a.only != "wan":
        for label, name, extra in local:
            run, secs = launch_local(a.out, cfg, name, extra)
            rows = metrics(run)
            if n_params is None:
                log = open(os.path.join(run, "metrics.jsonl")).read()
            val = next((r["val_loss"] for r in reversed(rows) if "val_loss" in r), None)
            res["runs"][name] = {"label": label, "val_loss": val, "final_loss": rows[-1]["loss"], "seconds": secs,
                                 "job_bytes_atoll": series(rows, 0)[-1][1]}
            print(f"{label:24s} val loss {val:.4f}  ({secs:.0f} s)", flush=True)
    # Parameters, for DDP's byte count: from the model line of a log-free source, the checkpoint.
    if a.only != "wan":
        from_ckpt = subprocess.run([sys.executable, "-c", f"""
import json,struct,glob
p=sorted(glob.glob('{a.out}/ddp/checkpoints/step_*/model.safetensors'))[-1]
b=open(p,'rb').read(); n=struct.unpack('<Q',b[:8])[0]; h=json.loads(b[8:8+n])
print(sum((v['data_offsets'][1]-v['data_offsets'][0])//4 for k,v in h.items() if k!='__metadata__'))"""],
                                   capture_output=True, text=True)
        n_params = int(from_ckpt.stdout.strip())
        res["parameters"] = n_params
        for label, name, _ in local:
            rows = metrics(os.path.join(a.out, name))
            s = series(rows, n_params, 4 if name == "ddp" else 0)
            res["runs"][name]["job_bytes_atoll"] = s[-1][1]
            curves_t[label] = s
            curves_b[label] = s
    if a.only != "local":
        topo = os.path.join(a.out, "wan.toml")
        open(topo, "w").write('islands = 4\nranks_per_island = 1\n[link]\nrate = "20mbit"\nlatency_ms = 20\njitter_ms = 2\n')
        for label, name, extra in [(f"DiLoCo M=4 H={H}, WAN", "wan_diloco4", ["--parallel.islands=4"] + dl),
                                   (f"Streaming M=4 H={H}, WAN", "wan_stream4", ["--parallel.islands=4"] + st),
                                   (f"Streaming M=4 H={H} tau=5, WAN", "wan_stream4_tau5",
                                    ["--parallel.islands=4"] + st[:-2] + ["--lowcomm.overlap_steps=5", "--lowcomm.mixing=0.5"])]:
            run, stats, secs = launch_wan(a.out, cfg, name, 4, 1, extra, topo)
            if run is None:
                res["wan_skipped"] = secs
                print("WAN runs skipped:", secs)
                break
            rows = metrics(run)
            util, peak = utilization(rows)
            res["runs"][name] = {"label": label, "val_loss": next((r["val_loss"] for r in reversed(rows) if "val_loss" in r), None),
                                 "compute_util": util, "peak_sync_bytes_per_rank": peak, "veth_bytes": stats["total_bytes"],
                                 "seconds": secs, "job_bytes_atoll": series(rows, 0)[-1][1]}
            curves_t[label] = series(rows, 0)
            print(f"{label:24s} compute utilization {util:.3f}, veth {stats['total_bytes']} bytes ({secs:.0f} s)", flush=True)
        if "wan_skipped" not in res:
            # What the DiLoCo runs send besides training (rendezvous, the start-up broadcast, the
            # final checkpoint's island states): a 1-step run (no outer step) of the same job.
            run, stats, secs = launch_wan(a.out, cfg, "wan_diloco4_base", 4, 1,
                                          ["--parallel.islands=4"] + dl + ["--train.steps=1", "--eval.every=0"], topo)
            res["runs"]["wan_diloco4_base"] = {"label": "DiLoCo 1 step (no sync), WAN", "veth_bytes": stats["total_bytes"]}
            for k in ("wan_diloco4", "wan_stream4", "wan_stream4_tau5"):
                R = res["runs"][k]
                R["veth_bytes_training"] = R["veth_bytes"] - stats["total_bytes"]
                R["veth_over_atoll"] = R["veth_bytes_training"] / R["job_bytes_atoll"]
            # DDP over the same links: bytes per step from the difference of a 10- and a 20-step run.
            per = []
            for n in (10, 20):
                run, stats, secs = launch_wan(a.out, cfg, f"wan_ddp{n}", 4, 1, [f"--train.steps={n}", "--eval.every=0"], topo)
                per.append((stats["total_bytes"], metrics(run)))
            ddp_step = (per[1][0] - per[0][0]) / 10
            ms = [r["step_ms"] for r in per[1][1][10:]]
            res["runs"]["wan_ddp"] = {"label": "DDP 4 ranks, WAN", "veth_bytes_per_step": ddp_step,
                                      "step_ms_median": sorted(ms)[len(ms) // 2]}
            print(f"DDP over the WAN: {ddp_step:.0f} veth bytes per step, median step {res['runs']['wan_ddp']['step_ms_median']:.0f} ms")
    res["load_after"] = os.getloadavg()[0]
    R = res["runs"]
    if "ddp" in R and "diloco4" in R:
        res["diloco4_vs_ddp_val_loss_ratio"] = R["diloco4"]["val_loss"] / R["ddp"]["val_loss"]
        res["ddp_vs_diloco4_bytes_ratio_atoll"] = R["ddp"]["job_bytes_atoll"] / R["diloco4"]["job_bytes_atoll"]
        res["stream4_vs_diloco4_val_loss_ratio"] = R["stream4"]["val_loss"] / R["diloco4"]["val_loss"]
        for m in ("2", "4"):
            res[f"iso{m}_vs_diloco{m}_val_loss_ratio"] = R[f"iso{m}"]["val_loss"] / R[f"diloco{m}"]["val_loss"]
    if "wan_diloco4" in R and "wan_ddp" in R:
        res["ddp_vs_diloco4_bytes_ratio_veth"] = (R["wan_ddp"]["veth_bytes_per_step"] * a.steps /
                                                  R["wan_diloco4"]["veth_bytes_training"])
        res["stream4_vs_diloco4_peak_sync_bytes"] = (R["wan_stream4"]["peak_sync_bytes_per_rank"] /
                                                     R["wan_diloco4"]["peak_sync_bytes_per_rank"])
    json.dump(res, open(os.path.join(a.out, "results.json"), "w"), indent=1)
    if curves_t:
        svg(os.path.join(a.out, "loss_vs_time.svg"), "train loss vs wall time (shared, loaded 2-core machine)",
            "seconds", curves_t, 0)
    if curves_b:
        svg(os.path.join(a.out, "loss_vs_bytes.svg"), "train loss vs bytes sent by the job (atoll's count, log)",
            "bytes", curves_b, 1)
    print(json.dumps({k: v for k, v in res.items() if k != "runs"}, indent=1))


def val_of(rows):
    return next((r["val_loss"] for r in reversed(rows) if "val_loss" in r), None)


def n_params_of(run):
    import glob
    import struct
    p = sorted(glob.glob(os.path.join(run, "checkpoints", "step_*", "model.safetensors")))[-1]
    b = open(p, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    return sum((v["data_offsets"][1] - v["data_offsets"][0]) // 4 for k, v in h.items() if k != "__metadata__")


def codecs_main(a):
    os.makedirs(a.out, exist_ok=True)
    cfg = config(a.out, a)
    H = a.inner
    codecs = [c for c in a.codecs.split(",") if c]
    dl = ["--parallel.islands=4", "--lowcomm.method=diloco", f"--lowcomm.inner_steps={H}"]
    rows = [("DDP 4 ranks", "ddp", []), (f"DiLoCo M=4 H={H} fp32", "diloco4", dl)]
    rows += [(f"DiLoCo M=4 H={H} {c}", f"diloco4_{c}", dl + [f"--lowcomm.exchange={c}"]) for c in codecs]
    res = {"cpu": cpu_model(), "load_before": os.getloadavg()[0], "steps": a.steps, "inner_steps": H,
           "seeds": a.seeds, "model": f"GPT L={a.layers} d={a.embd} heads=4 V=257 T=64",
           "tokens_per_step": 4 * 8 * 64, "runs": {}}
    for label, name, extra in rows:
        vals, jb = [], None
        for seed in range(1, a.seeds + 1):
            run, secs = launch_local(a.out, cfg, f"{name}_s{seed}", extra + [f"--train.seed={seed}"])
            m = metrics(run)
            vals.append(val_of(m))
            if name == "ddp":
                res["parameters"] = n_params_of(run)
                jb = 2 * 3 / 4 * 4 * res["parameters"] * 4 * len(m)  # ring all-reduce, 4 ranks, every step
            else:
                jb = series(m, 0)[-1][1]
            print(f"{label:28s} seed {seed}: val loss {vals[-1]:.4f}  ({secs:.0f} s)", flush=True)
        res["runs"][name] = {"label": label, "val_loss": vals, "val_loss_mean": sum(vals) / len(vals),
                             "job_bytes_atoll": jb}
    R = res["runs"]
    for c in ["fp32"] + codecs:
        k = "diloco4" if c == "fp32" else f"diloco4_{c}"
        res[f"{k}_vs_ddp_val_loss_ratio"] = R[k]["val_loss_mean"] / R["ddp"]["val_loss_mean"]
        res[f"ddp_vs_{k}_bytes_ratio_atoll"] = R["ddp"]["job_bytes_atoll"] / R[k]["job_bytes_atoll"]
        if c != "fp32":
            res[f"{k}_vs_diloco4_val_loss_ratio"] = R[k]["val_loss_mean"] / R["diloco4"]["val_loss_mean"]
            res[f"diloco4_vs_{k}_bytes_ratio_atoll"] = R["diloco4"]["job_bytes_atoll"] / R[k]["job_bytes_atoll"]
    if a.no_wan:
        res["wan_skipped"] = "--no-wan"
    # The WAN test bed: bytes on the wire per outer step, from the veth counters.
    topo = os.path.join(a.out, "wan.toml")
    open(topo, "w").write('islands = 4\nranks_per_island = 1\n[link]\nrate = "20mbit"\nlatency_ms = 20\njitter_ms = 2\n')
    short = max(H, (a.steps // 3) // H * H)
    outer = a.steps // H - short // H
    for c in ([] if a.no_wan else ["fp32"] + codecs):
        k = "diloco4" if c == "fp32" else f"diloco4_{c}"
        ex = dl + ([] if c == "fp32" else [f"--lowcomm.exchange={c}"]) + ["--eval.every=0"]
        got = []
        for n in (short, a.steps):
            run, stats, secs = launch_wan(a.out, cfg, f"wan_{k}_{n}", 4, 1, ex + [f"--train.steps={n}"], topo)
            if run is None:
                res["wan_skipped"] = secs
                break
            got.append((stats["total_bytes"], series(metrics(run), 0)[-1][1]))
        if "wan_skipped" in res:
            print("WAN runs skipped:", res["wan_skipped"])
            break
        veth = (got[1][0] - got[0][0]) / outer
        atoll = (got[1][1] - got[0][1]) / outer
        R[k]["veth_bytes_per_outer_step"] = veth
        R[k]["atoll_bytes_per_outer_step"] = atoll
        print(f"{k:20s} WAN: {veth:.0f} veth bytes per outer step (atoll's count {atoll:.0f}, ratio {veth / atoll:.3f})",
              flush=True)
    if "wan_skipped" not in res:
        per = []
        for n in (10, 20):
            run, stats, secs = launch_wan(a.out, cfg, f"wan_ddp{n}", 4, 1, [f"--train.steps={n}", "--eval.every=0"], topo)
            per.append(stats["total_bytes"])
        ddp_step = (per[1] - per[0]) / 10
        R["ddp"]["veth_bytes_per_step"] = ddp_step
        for c in ["fp32"] + codecs:
            k = "diloco4" if c == "fp32" else f"diloco4_{c}"
            res[f"ddp_vs_{k}_bytes_ratio_veth"] = ddp_step * H / R[k]["veth_bytes_per_outer_step"]
    res["load_after"] = os.getloadavg()[0]
    json.dump(res, open(os.path.join(a.out, "results.json"), "w"), indent=1)
    print(json.dumps({k: v for k, v in res.items() if k != "runs"}, indent=1))


def sweep_main(a):
    os.makedirs(a.out, exist_ok=True)
    cfg = config(a.out, a)
    H = a.inner
    dl = ["--parallel.islands=4", "--lowcomm.method=diloco"]
    rows = [("DDP 4 ranks", "ddp", []),
            (f"DiLoCo H={H} lr 0.7 mom 0.9", "h", dl + [f"--lowcomm.inner_steps={H}"]),
            (f"DiLoCo H={H // 2}", "h2", dl + [f"--lowcomm.inner_steps={H // 2}"]),
            (f"DiLoCo H={H // 5}", "h5", dl + [f"--lowcomm.inner_steps={H // 5}"]),
            (f"DiLoCo H={H} averaging (lr 1, mom 0)", "avg", dl + [f"--lowcomm.inner_steps={H}",
                                                               "--lowcomm.outer_lr=1", "--lowcomm.outer_momentum=0"]),
            (f"DiLoCo H={H} lr 0.35 mom 0.9", "lr035", dl + [f"--lowcomm.inner_steps={H}", "--lowcomm.outer_lr=0.35"])]
    res = {"cpu": cpu_model(), "load_before": os.getloadavg()[0], "steps": a.steps, "seeds": a.seeds,
           "model": f"GPT L={a.layers} d={a.embd} heads=4 V=257 T=64", "runs": {}}
    for label, name, extra in rows:
        vals = []
        for seed in range(1, a.seeds + 1):
            run, secs = launch_local(a.out, cfg, f"sweep_{name}_s{seed}", extra + [f"--train.seed={seed}"])
            vals.append(val_of(metrics(run)))
            print(f"{label:36s} seed {seed}: val loss {vals[-1]:.4f}  ({secs:.0f} s)", flush=True)
        res["runs"][name] = {"label": label, "val_loss": vals, "val_loss_mean": sum(vals) / len(vals)}
    d = res["runs"]["ddp"]
    for name, r in res["runs"].items():
        r["vs_ddp_of_means"] = r["val_loss_mean"] / d["val_loss_mean"]
        r["vs_ddp_per_seed"] = [v / w for v, w in zip(r["val_loss"], d["val_loss"])]
    res["load_after"] = os.getloadavg()[0]
    json.dump(res, open(os.path.join(a.out, "results.json"), "w"), indent=1)
    for name, r in res["runs"].items():
        print(f"{r['label']:36s} {r['val_loss_mean']:.4f}  {r['vs_ddp_of_means']:.4f} x DDP")


main()
