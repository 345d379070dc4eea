#!/usr/bin/env python3
"""An SVG picture of an RL run from its metrics.jsonl (train task "rl", docs/rl.md): four panels
over the steps — mean reward and exact-answer rate, held-out accuracy, KL to the reference and
entropy, and the time split per step (generate / score / train / sync, stacked). Plain SVG, no
plotting library.

    tools/rl_plot.py RUN/metrics.jsonl OUT.svg [TITLE]
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from metrics_jsonl import records  # noqa: E402

W, H, PAD = 460, 230, 46
COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd"]


def panel(x0, y0, title, series, stacked=False):
    """series: [(label, [(x, y)...])]; returns SVG elements for one panel at (x0, y0)."""
    pts = [p for _, s in series for p in s]
    if not pts:
        return [f'<text x="{x0 + PAD}" y="{y0 + H / 2}" font-size="12">{title}: no data</text>']
    xs = [p[0] for p in pts]
    if stacked:
        by_x = {}
        for _, s in series:
            for x, y in s:
                by_x[x] = by_x.get(x, 0) + y
        ymax = max(by_x.values())
    else:
        ymax = max(p[1] for p in pts)
    xmin, xmax, ymin = min(xs), max(xs), 0.0
    ymax = ymax if ymax > ymin else ymin + 1
    xmax = xmax if xmax > xmin else xmin + 1
    sx = lambda x: x0 + PAD + (x - xmin) / (xmax - xmin) * (W - 1.5 * PAD)
    sy = lambda y: y0 + H - PAD + -(y - ymin) / (ymax - ymin) * (H - 1.7 * PAD)
    el = [f'<rect x="{x0 + PAD}" y="{y0 + 0.7 * PAD}" width="{W - 1.5 * PAD}" height="{H - 1.7 * PAD}" fill="none" stroke="#999"/>',
          f'<text x="{x0 + PAD}" y="{y0 + 0.55 * PAD}" font-size="13" font-weight="bold">{title}</text>',
          f'<text x="{x0 + PAD - 4}" y="{sy(ymax) + 4}" font-size="10" text-anchor="end">{ymax:.3g}</text>',
          f'<text x="{x0 + PAD - 4}" y="{sy(ymin) + 4}" font-size="10" text-anchor="end">{ymin:.3g}</text>',
          f'<text x="{sx(xmin)}" y="{y0 + H - PAD + 14}" font-size="10">{xmin}</text>',
          f'<text x="{sx(xmax)}" y="{y0 + H - PAD + 14}" font-size="10" text-anchor="end">{xmax} (step)</text>']
    base = {}
    for i, (label, s) in enumerate(series):
        c = COLORS[i % len(COLORS)]
        if stacked:
            s = [(x, y + base.get(x, 0)) for x, y in s]
            for x, y in s:
                base[x] = y
        if s:
            d = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in s)
            el.append(f'<polyline points="{d}" fill="none" stroke="{c}" stroke-width="1.5"/>')
        el.append(f'<text x="{x0 + W - PAD}" y="{y0 + 0.7 * PAD + 14 + 13 * i}" font-size="11" fill="{c}" '
                  f'text-anchor="end">{label}</text>')
    return el


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    recs = [r for r in records(sys.argv[1]) if r.get("phase") == "rl"]
    get = lambda k: [(r["step"], r[k]) for r in recs if k in r]
    title = sys.argv[3] if len(sys.argv) > 3 else os.path.dirname(os.path.abspath(sys.argv[1]))
    el = [f'<text x="10" y="20" font-size="15">{title}</text>']
    el += panel(0, 30, "reward", [("mean reward", get("reward")), ("exact", get("exact")), ("format", get("format"))])
    el += panel(W, 30, "held-out accuracy", [("greedy exact", get("heldout_acc"))])
    el += panel(0, 30 + H, "KL to reference / entropy", [("KL (k3)", get("kl")), ("entropy", get("entropy"))])
    el += panel(W, 30 + H, "time per step (ms, stacked)",
                [("generate", get("gen_ms")), ("score", get("score_ms")), ("train", get("train_ms")),
                 ("sync", get("sync_ms"))], stacked=True)
    with open(sys.argv[2], "w") as f:
        f.write(f'<svg xmlns="http://www.w3.org/2000/svg" width="{2 * W}" height="{2 * H + 40}" font-family="sans-serif">\n')
        f.write('<rect width="100%" height="100%" fill="white"/>\n')
        f.write("\n".join(el) + "\n</svg>\n")


if __name__ == "__main__":
    main()
