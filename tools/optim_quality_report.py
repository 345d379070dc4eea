#!/usr/bin/env python3
"""Tables and a loss-curve plot for tools/optim_quality_text.sh.

    optim_quality_report.py OUT_DIR [--short 0|1]

Reads OUT_DIR/manifest.tsv (group, name, lr, seed, run dir) and each run's metrics.jsonl; prints
Markdown: the sweep, the best rate over seeds (final validation loss, tokens to reach AdamW's
final validation loss, mean optimizer step time), the variants; writes
OUT_DIR/loss_curves.svg (validation loss against tokens, mean over seeds at the best rate).
"""
import argparse
import json
import os
import statistics
import sys


def read_run(d):
    """None: diverged or no result; "running": not finished (the report can run mid-benchmark)."""
    recs = []
    p = os.path.join(d, "metrics.jsonl")
    try:
        with open(d + ".log") as f:
            if "done: step" not in f.read():
                return "running" if os.path.exists(p) else None
    except OSError:
        pass  # a run made without the script's log
    if not os.path.exists(p):
        return None
    with open(p) as f:
        for line in f:
            line = line.strip()
            if line:
                try:
                    recs.append(json.loads(line))
                except json.JSONDecodeError:
                    pass
    val = [(r["tokens"], r["val_loss"]) for r in recs if "val_loss" in r]
    if not val:
        return None
    # Mean, not median: PRMuon's refreshes are one step in K. The first steps (allocation, SOAP's
    # eigendecompositions) are left out.
    opt = [r["opt_ms"] for r in recs if "opt_ms" in r][3:]
    return {"val": val, "final": val[-1][1], "opt_ms": statistics.mean(opt) if opt else float("nan"),
            "train": [(r["tokens"], r["loss"]) for r in recs if "tokens" in r and "loss" in r]}


def mean_curve(runs):
    n = min(len(r["val"]) for r in runs)
    return [(runs[0]["val"][i][0], sum(r["val"][i][1] for r in runs) / len(runs)) for i in range(n)]


def tokens_to(curve, target):
    """First token count at which the curve reaches target (linear between evaluations)."""
    prev = None
    for t, v in curve:
        if v <= target:
            if prev is None or prev[1] == v:
                return t
            t0, v0 = prev
            return t0 + (t - t0) * (v0 - target) / (v0 - v)
        prev = (t, v)
    return None


COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#7f7f7f", "#17becf",
          "#bcbd22"]


def svg_plot(series, path, title):
    """series: [(label, [(x, y)], dashed)] -> a plain SVG line plot."""
    W, H, L, R, T, B = 760, 460, 70, 190, 40, 50
    xs = [x for _, c, _ in series for x, _ in c]
    ys = [y for _, c, _ in series for _, y in c]
    if not xs:
        return
    x0, x1 = 0, max(xs)
    ylo, yhi = min(ys), max(ys)
    # the early, steep part of the curves would flatten the rest: clip the top
    yhi = min(yhi, ylo + 3 * (sorted(ys)[len(ys) // 2] - ylo) + 0.05)
    pad = 0.03 * (yhi - ylo + 1e-9)
    ylo, yhi = ylo - pad, yhi + pad

    def px(x):
        return L + (W - L - R) * (x - x0) / (x1 - x0 or 1)

    def py(y):
        return T + (H - T - B) * (1 - (min(y, yhi) - ylo) / (yhi - ylo))

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
           f'<rect width="{W}" height="{H}" fill="white"/>',
           f'<text x="{L}" y="22" font-size="14">{title}</text>',
           f'<line x1="{L}" y1="{H - B}" x2="{W - R}" y2="{H - B}" stroke="black"/>',
           f'<line x1="{L}" y1="{T}" x2="{L}" y2="{H - B}" stroke="black"/>']
    for i in range(6):
        y = ylo + (yhi - ylo) * i / 5
        out.append(f'<line x1="{L - 4}" y1="{py(y):.1f}" x2="{W - R}" y2="{py(y):.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{L - 8}" y="{py(y) + 4:.1f}" text-anchor="end">{y:.3f}</text>')
        x = x0 + (x1 - x0) * i / 5
        out.append(f'<text x="{px(x):.1f}" y="{H - B + 18}" text-anchor="middle">{x / 1e6:.2f}M</text>')
    out.append(f'<text x="{(L + W - R) / 2}" y="{H - 10}" text-anchor="middle">tokens</text>')
    out.append(f'<text x="16" y="{(T + H - B) / 2}" transform="rotate(-90 16 {(T + H - B) / 2})" '
               f'text-anchor="middle">validation loss</text>')
    for k, (label, c, dashed) in enumerate(series):
        col = COLORS[k % len(COLORS)]
        pts = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in c)
        dash = ' stroke-dasharray="5,4"' if dashed else ""
        out.append(f'<polyline points="{pts}" fill="none" stroke="{col}" stroke-width="1.8"{dash}/>')
        ly = T + 16 * k + 8
        out.append(f'<line x1="{W - R + 10}" y1="{ly}" x2="{W - R + 34}" y2="{ly}" stroke="{col}" stroke-width="2"{dash}/>')
        out.append(f'<text x="{W - R + 40}" y="{ly + 4}">{label}</text>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--short", default="0")
    a = ap.parse_args()
    rows, running = [], []
    with open(os.path.join(a.out, "manifest.tsv")) as f:
        for line in f:
            g, name, lr, seed, d = line.rstrip("\n").split("\t")
            r = read_run(d)
            if r == "running":
                running.append(name)
                continue
            rows.append((g, name, lr, int(seed), d, r))
    p = print
    if a.short == "1":
        p("**SHORT pipeline check (2 layers, d = 64, 150 steps of 512 tokens): these numbers say nothing about the optimizers.**\n")
    elif a.short == "2":
        p("**MID size (4 layers, d = 128, 240 steps of 2048 tokens = 0.49M tokens): a small-scale check, not the benchmark.**\n")
    p(f"CPU: {cpu_model()}; load average at the end: {os.getloadavg()[0]:.1f}; "
      f"threads: {os.environ.get('OMP_NUM_THREADS', '?')}\n")
    p("### Sweep (seed 1): final validation loss\n")
    p("| optimizer | lr | val loss |")
    p("|---|---|---:|")
    for g, name, lr, seed, d, r in rows:
        if g == "sweep":
            p(f"| {name} | {lr} | {r['final']:.4f} |" if r else f"| {name} | {lr} | diverged |")
    best = {}
    for g, name, lr, seed, d, r in rows:
        if g == "best" and r:
            best.setdefault(name, (lr, []))[1].append((seed, r))
    target = None
    if "adamw" in best:
        target = statistics.mean(r["final"] for _, r in best["adamw"][1])
    adam_ms = statistics.mean(r["opt_ms"] for _, r in best["adamw"][1]) if "adamw" in best else None
    p("\n### Best rate, every seed\n")
    p("| optimizer | lr | val loss (mean) | per seed | tokens to AdamW's final loss | optimizer step ms (mean) | / AdamW |")
    p("|---|---|---:|---|---:|---:|---:|")
    series = []
    for name, (lr, runs) in best.items():
        rs = [r for _, r in runs]
        mean = statistics.mean(r["final"] for r in rs)
        curve = mean_curve(rs)
        tt = tokens_to(curve, target) if target is not None else None
        ms = statistics.mean(r["opt_ms"] for r in rs)
        ratio = f"{ms / adam_ms:.2f}" if adam_ms else "—"
        per = " ".join(f"{r['final']:.4f}" for r in rs)
        p(f"| {name} | {lr} | {mean:.4f} | {per} | {f'{tt / 1e6:.2f}M' if tt else 'not reached'} | {ms:.2f} | {ratio} |")
        series.append((f"{name} lr {lr}", curve, False))
    var = [(name, lr, r) for g, name, lr, seed, d, r in rows if g == "variant"]
    if var:
        p("\n### Variants at their case's best rate (seed 1)\n")
        p("| variant | lr | val loss | tokens to AdamW's final loss | optimizer step ms | / AdamW |")
        p("|---|---|---:|---:|---:|---:|")
        for name, lr, r in var:
            if not r:
                p(f"| {name} | {lr} | diverged | | | |")
                continue
            tt = tokens_to(r["val"], target) if target is not None else None
            ratio = f"{r['opt_ms'] / adam_ms:.2f}" if adam_ms else "—"
            p(f"| {name} | {lr} | {r['final']:.4f} | {f'{tt / 1e6:.2f}M' if tt else 'not reached'} | "
              f"{r['opt_ms']:.2f} | {ratio} |")
            series.append((f"{name}", r["val"], True))
    svg = os.path.join(a.out, "loss_curves.svg")
    svg_plot(series, svg, "validation loss, best rate (mean over seeds); variants dashed" +
             ({"1": " — SHORT CHECK", "2": " — MID SIZE"}.get(a.short, "")))
    if running:
        p(f"\nStill running, left out: {', '.join(running)}")
    p(f"\nPlot: {svg}")


if __name__ == "__main__":
    sys.exit(main())
