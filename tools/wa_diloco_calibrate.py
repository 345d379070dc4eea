#!/usr/bin/env python3
"""WA-DiLoCo's calibration protocol ("Not Every Sync Is Safe: Calibrated DiLoCo Scheduling for
Shared AI Infrastructure") on atoll: does the workload-aware controller choose better sync
windows than matched random deferral (its own sync budget, random windows)?

    wa_diloco_calibrate.py [--atoll build/atoll] [--steps 300] [--inner-steps 10] [--seeds 5] [--out DIR]

For each seed s: a bursty serving-load trace (Markov on/off, Pareto burst heights; seed s) is
written to a file and replayed by atoll ([lowcomm] sync_trace); 2 islands of 1 rank train a tiny
GPT with sync_policy = workload_aware, then with matched_random (sync_budget = the controller's
count of syncs in metrics.jsonl, sync_seed = s), and fixed (every H) as a reference.
Serving cost: a sync at step t adds `--sync-load` to the fleet's load at t and t+1; a step is an
SLO violation when the load exceeds `--capacity`. Protocol:
  1. no-sync load match: the loads atoll recorded at its sync decisions must equal the trace file
     (the runs saw the load being scored), and the no-sync violation rate is the floor;
  2. matched-random envelope over the seeds (min / mean / max violation rate);
  3. effect size (Cohen's d of the paired differences MR - WA) and a one-sided exact sign-flip
     permutation p-value; verdict.
Python stdlib only (no scipy).
"""
import argparse
import itertools
import json
import math
import os
import random
import shutil
import subprocess
import sys


def bursty_trace(n, seed, base=0.35, p_start=0.06, p_end=0.3, alpha=1.5, scale=0.25, noise=0.03):
    r = random.Random(seed)
    out, on, h = [], False, 0.0
    for _ in range(n):
        if not on and r.random() < p_start:
            on, h = True, scale * (1.0 - r.random()) ** (-1.0 / alpha)
        elif on and r.random() < p_end:
            on = False
        out.append(min(1.0, max(0.0, base + (h if on else 0.0) + noise * (2 * r.random() - 1))))
    return out


def violations(trace, sync_steps, sync_load, capacity):
    extra = [0.0] * len(trace)
    for t in sync_steps:  # 0-based step indices
        for u in (t, t + 1):
            if u < len(trace):
                extra[u] = sync_load
    return sum(1 for l, e in zip(trace, extra) if l + e > capacity) / len(trace)


def read_metrics(path):
    recs = [json.loads(l) for l in open(path) if l.strip()]
    return [r for r in recs if "loss" in r]


def cohens_d(d):
    m = sum(d) / len(d)
    sd = math.sqrt(sum((x - m) ** 2 for x in d) / (len(d) - 1)) if len(d) > 1 else 0.0
    return m / sd if sd > 1e-12 else (math.inf if m > 0 else 0.0)  # identical differences: no spread


def sign_flip_p(d):
    """One-sided exact permutation p-value of mean(d) > 0 under sign symmetry."""
    obs = sum(d)
    hits = total = 0
    for signs in itertools.product((1, -1), repeat=len(d)):
        total += 1
        hits += sum(s * x for s, x in zip(signs, d)) >= obs - 1e-12
    return hits / total


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--atoll", default="build/atoll")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--inner-steps", type=int, default=10)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--sync-load", type=float, default=0.3)
    ap.add_argument("--capacity", type=float, default=0.9)
    ap.add_argument("--out", default="/tmp/wa_diloco_calibrate")
    ap.add_argument("--extra", default="", help="more atoll train overrides, space-separated")
    a = ap.parse_args()
    atoll = os.path.abspath(a.atoll)
    os.makedirs(a.out, exist_ok=True)

    # A small corpus: Genesis from the King James Bible when `bible` is installed, else generated words.
    corpus = os.path.join(a.out, "corpus.txt")
    data = os.path.join(a.out, "data")
    if not os.path.isdir(data):
        try:
            text = subprocess.run(["bible", "gen1:1-gen50:26"], capture_output=True, text=True, check=True).stdout
            what = "KJV Genesis"
        except (OSError, subprocess.CalledProcessError):
            r = random.Random(7)
            words = "an island syncs its model over a slow link rarely when the fleet is quiet".split()
            text = "\n%\n".join(" ".join(r.choice(words) for _ in range(60)) for _ in range(400))
            what = "generated words"
        open(corpus, "w").write(text.replace("\n\n", "\n%\n"))
        subprocess.run([atoll, "data", "prepare", "--input", corpus, "--out", data, "--val-fraction", "0.1"],
                       check=True, capture_output=True)
        print(f"corpus: {what}")
    cfg = os.path.join(a.out, "wa.toml")
    open(cfg, "w").write(
        f'[data]\ndir = "{data}"\nauto_prepare = false\n[model]\npreset = "gpt2-tiny"\nn_layer = 2\n'
        f"[train]\nsteps = {a.steps}\nbatch_size = 4\nseq_len = 32\nwarmup_steps = 10\nthreads = 1\n"
        "[optim.adamw]\nlr = 3e-3\n[eval]\nevery = 0\n[sample]\nevery = 0\n[checkpoint]\nevery = 0\n"
        "[log]\nevery = 50\n[hardware]\npeak_gflops = 100.0\n")

    def train(run, keys):
        rd = os.path.join(a.out, run)
        shutil.rmtree(rd, ignore_errors=True)
        argv = [atoll, "launch", "--nproc-per-node", "2", "--", atoll, "train", cfg, f"--run.dir={rd}",
                "--parallel.islands=2", "--lowcomm.method=diloco", f"--lowcomm.inner_steps={a.inner_steps}"]
        argv += keys + a.extra.split()
        p = subprocess.run(argv, capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit(f"atoll train ({run}) exited {p.returncode}:\n{p.stdout[-3000:]}{p.stderr[-3000:]}")
        m = read_metrics(os.path.join(rd, "metrics.jsonl"))
        return [i for i, r in enumerate(m) if "sync" in r], m

    fixed_steps, fixed_m = train("fixed", [])
    rows = []
    for s in range(1, a.seeds + 1):
        trace = bursty_trace(a.steps, s)
        tpath = os.path.join(a.out, f"trace_{s}.txt")
        open(tpath, "w").write("".join(f"{x!r}\n" for x in trace))
        common = [f"--lowcomm.sync_trace={tpath}"]
        wa_steps, wa_m = train(f"wa_{s}", common + ["--lowcomm.sync_policy=workload_aware"])
        # 1. load match: what the controller scored is the trace replayed.
        for i in wa_steps:
            seen = wa_m[i]["sync"]["policy"]["load"]
            if abs(seen - trace[i]) > 1e-12:
                sys.exit(f"load mismatch at step {i + 1} (seed {s}): atoll saw {seen}, the trace holds {trace[i]}")
        budget = len(wa_steps)
        mr_steps, mr_m = train(f"mr_{s}", common + ["--lowcomm.sync_policy=matched_random",
                                                    f"--lowcomm.sync_budget={budget}", f"--lowcomm.sync_seed={s}"])
        assert len(mr_steps) == budget, (len(mr_steps), budget)
        rows.append(dict(seed=s, budget=budget, floor=violations(trace, [], a.sync_load, a.capacity),
                         fixed=violations(trace, fixed_steps, a.sync_load, a.capacity),
                         wa=violations(trace, wa_steps, a.sync_load, a.capacity),
                         mr=violations(trace, mr_steps, a.sync_load, a.capacity),
                         wa_loss=wa_m[-1]["loss"], mr_loss=mr_m[-1]["loss"]))
        r = rows[-1]
        print(f"seed {s}: syncs {budget} (fixed {len(fixed_steps)}) | SLO violations: no-sync {r['floor']:.4f} "
              f"fixed {r['fixed']:.4f} WA {r['wa']:.4f} MR {r['mr']:.4f} | final loss WA {r['wa_loss']:.4f} "
              f"MR {r['mr_loss']:.4f}", flush=True)

    mr = [r["mr"] for r in rows]
    d = [r["mr"] - r["wa"] for r in rows]
    floor = sum(r["floor"] for r in rows) / len(rows)
    wins = sum(1 for x in d if x > 0)
    es, p = cohens_d(d), sign_flip_p(d)
    print(f"no-sync floor (mean) {floor:.4f}; matched-random envelope min {min(mr):.4f} mean {sum(mr)/len(mr):.4f} "
          f"max {max(mr):.4f}; WA mean {sum(r['wa'] for r in rows)/len(rows):.4f}")
    print(f"paired MR - WA: mean {sum(d)/len(d):.4f}, Cohen's d {es:.2f}, WA better on {wins} of {len(d)} seeds, "
          f"one-sided sign-flip p = {p:.4f}; final loss WA {sum(r['wa_loss'] for r in rows)/len(rows):.4f} "
          f"MR {sum(r['mr_loss'] for r in rows)/len(rows):.4f} fixed {fixed_m[-1]['loss']:.4f}")
    if sum(mr) / len(mr) - floor < 1e-9:
        verdict = "NO HEADROOM: syncs add no SLO violations over the no-sync floor; window choice cannot matter here"
    elif p < 0.05 and sum(d) > 0:
        verdict = "WA BEATS MATCHED RANDOM: the controller's window choice, not its budget, lowers SLO violations"
    elif sum(d) <= 0:
        verdict = "MATCHED RANDOM TIES OR WINS: gains over fixed cannot be credited to window choice"
    else:
        verdict = f"INCONCLUSIVE: WA ahead but p = {p:.3f} >= 0.05 over {len(d)} seeds"
    print("verdict:", verdict)


if __name__ == "__main__":
    main()
