#!/usr/bin/env python3
"""Checks that every #include "..." under src/ points down the layer order of the developers'
guide, and prints what each layer includes (what its CMake library must link):

  core -> tensor -> kernels (cpu, cuda) -> autograd -> nn -> models/<family> -> optim -> comm
  -> parallel -> lowcomm, resilience, rl -> train -> cli
  data needs only core and tensor; plan only core.

Besides the order: only cli may include models/ (nothing in optim, parallel, train... names a
model family), and siblings of one level (lowcomm, resilience, rl) do not include each other.

usage: check_layering.py SRC_DIR [--deps]   exit 0 when clean, 1 listing every violation."""
import os
import re
import sys

CHAIN = ["core", "tensor", "kernels", "autograd", "nn", "models", "optim", "comm", "parallel",
         ("lowcomm", "resilience", "rl"), "train", "cli"]
LEVEL = {}
for i, entry in enumerate(CHAIN):
    for name in (entry if isinstance(entry, tuple) else (entry,)):
        LEVEL[name] = i
SIDE = {"data": {"core", "tensor"}, "plan": {"core"}}
# Layers that may include a side layer (data, plan) besides themselves.
SIDE_USERS = {"data": {"train", "cli"}, "plan": {"cli"}}
MODEL_USERS = {"models", "cli"}

INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"')


def layer_of(rel):
    return rel.split("/", 1)[0]


def allowed(src, dst):
    if src == dst:
        return True
    if dst in SIDE:
        return src in SIDE_USERS[dst]
    if src in SIDE:
        return dst in SIDE[src]
    if dst not in LEVEL or src not in LEVEL:
        return False
    if dst == "models" and src not in MODEL_USERS:
        return False
    return LEVEL[dst] < LEVEL[src]


def main(argv):
    if len(argv) < 2:
        print(__doc__)
        return 2
    root = argv[1]
    bad, deps = [], {}
    for d, _, files in os.walk(root):
        for f in sorted(files):
            if not f.endswith((".h", ".cpp", ".cu", ".hpp")):
                continue
            path = os.path.join(d, f)
            rel = os.path.relpath(path, root).replace(os.sep, "/")
            src = layer_of(rel)
            with open(path, encoding="utf-8", errors="replace") as fh:
                for n, line in enumerate(fh, 1):
                    m = INCLUDE.match(line)
                    if not m:
                        continue
                    target = m.group(1)
                    if "/" not in target:
                        continue  # a file beside it
                    dst = layer_of(target)
                    if dst not in LEVEL and dst not in SIDE:
                        continue  # not one of ours (e.g. <nlohmann/json.hpp> written with quotes)
                    if dst != src:
                        deps.setdefault(src, set()).add(dst)
                    if src not in LEVEL and src not in SIDE:
                        bad.append(f"{rel}:{n}: folder '{src}' is not a layer of the developers' guide")
                    elif not allowed(src, dst):
                        why = ("only cli may name a model family" if dst == "models" and src not in MODEL_USERS
                               else f"'{dst}' is not below '{src}'")
                        bad.append(f"{rel}:{n}: includes \"{target}\": {why}")
    if "--deps" in argv:
        for k in sorted(deps):
            print(f"{k}: {' '.join(sorted(deps[k]))}")
    for b in bad:
        print(b)
    if bad:
        print(f"{len(bad)} include(s) point up the layer order")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
