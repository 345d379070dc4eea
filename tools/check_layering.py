#!/usr/bin/env python3
"""Checks that every #include "..." under src/ points down the layer order of the developers'
guide, and prints what each layer includes (what its CMake library must link):

  core -> tensor -> kernels (cpu, cuda) -> autograd -> nn -> models/<family> -> optim -> comm
  -> parallel -> lowcomm, resilience, rl -> train -> cli
  data needs only core and tensor; plan only core (train uses plan's memory model).

Besides the order: only cli may include models/ (nothing in optim, parallel, train... names a
model family), and siblings of one level (lowcomm, resilience, rl) do not include each other.

With --cmake CMakeLists.txt it also checks the layer libraries (atoll_layer(...) lines): each
layer's direct links are layers its files include (or, for train, the model families whose
registrations it must carry), and everything a layer includes is within its link closure.

usage: check_layering.py SRC_DIR [--deps] [--cmake CMAKELISTS]
exit 0 when clean, 1 listing every violation."""
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
SIDE_USERS = {"data": {"train", "cli"}, "plan": {"train", "cli"}}  # train: the start-up memory check
MODEL_USERS = {"models", "cli"}
# Above models, code sees an nn::Model: no layer but cli names the GPT family or matches its
# parameter names (roles say what a parameter is). Comments may cite GPT-2.
NAMES_GPT = re.compile(r'\bGPT(Config)?\b(?!-)|"(lm_head|wte|wpe|transformer\.)')
NO_FAMILY_NAMES = {"optim", "comm", "parallel", "lowcomm", "resilience", "rl", "train"}

INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"')
LAYER_LINE = re.compile(r'^\s*atoll_layer\((\w+)\s+([\w/]+)((?:\s+[^)\s]+)*)\s*\)', re.M)
# Links a layer needs though it includes nothing of them: train carries the model families'
# registrations (it names no family).
REGISTRATION_LINKS = {"train": {"models"}}


def check_cmake(path, deps, has_sources):
    text = open(path, encoding="utf-8").read()
    links = {}
    for m in LAYER_LINE.finditer(text):
        name = m.group(1)
        links[name] = {t[len("atoll_"):] for t in m.group(3).split() if t.startswith("atoll_")}
    bad = []

    def closure(layer, seen=None):
        seen = set() if seen is None else seen
        for d in links.get(layer, ()):
            if d not in seen:
                seen.add(d)
                closure(d, seen)
        return seen

    for layer, direct in sorted(links.items()):
        if layer not in has_sources:
            continue  # an empty layer (lowcomm today) only forwards its base
        used = deps.get(layer, set())
        for d in sorted(direct):
            # Empty layers (lowcomm today) are placeholders a layer may already link.
            if d not in used and d not in REGISTRATION_LINKS.get(layer, set()) and d in has_sources:
                bad.append(f"{path}: atoll_{layer} links atoll_{d}, which no file of src/{layer} includes")
        missing = used - closure(layer)
        for d in sorted(missing):
            bad.append(f"{path}: src/{layer} includes {d}, but atoll_{layer} does not link atoll_{d}")
    return bad


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
    bad, deps, has_sources = [], {}, set()
    for d, _, files in os.walk(root):
        for f in sorted(files):
            if not f.endswith((".h", ".cpp", ".cu", ".hpp")):
                continue
            path = os.path.join(d, f)
            rel = os.path.relpath(path, root).replace(os.sep, "/")
            src = layer_of(rel)
            if f.endswith(".cpp"):
                has_sources.add(src)
            with open(path, encoding="utf-8", errors="replace") as fh:
                for n, line in enumerate(fh, 1):
                    code = line.split("//", 1)[0]
                    if src in NO_FAMILY_NAMES and NAMES_GPT.search(code):
                        bad.append(f"{rel}:{n}: names the GPT family ({NAMES_GPT.search(code).group(0)}); "
                                   "use nn::Model and parameter roles")
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
    if "--cmake" in argv:
        bad += check_cmake(argv[argv.index("--cmake") + 1], deps, has_sources)
    for b in bad:
        print(b)
    if bad:
        print(f"{len(bad)} violation(s) of the layer order")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
