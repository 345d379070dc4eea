#!/usr/bin/env python3
"""Writes the optimizer benchmark's English corpus as '%'-separated documents (the form
`atoll data prepare` splits): the King James Bible one chapter per document (Debian's
bible-kjv, read through its `bible` program) and the GCIDE dictionary (dict-gcide) in
documents of about 2 KB of whole entries. The fortunes are read by atoll directly.

    optim_text_corpus.py OUT_DIR [--gcide-mb MB] [--sample-mb MB]

--gcide-mb caps the dictionary (0: all of it, about 40 MB); --sample-mb also writes
OUT_DIR/bpe_sample.txt, the first MB of each source interleaved, to train the tokenizer on.
"""
import argparse
import gzip
import os
import re
import subprocess
import sys

GCIDE = "/usr/share/dictd/gcide.dict.dz"


def kjv_chapters():
    try:
        text = subprocess.run(["bible", "gen1:1-rev22:21"], stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        sys.exit(f"cannot read the King James Bible through `bible` ({e}); install bible-kjv (scripts/setup.sh)")
    chapters, cur = [], []
    for line in text.splitlines():
        if re.match(r"^\S.* \d+$", line) and cur:  # "Genesis 2": a chapter heading
            chapters.append("\n".join(cur).strip())
            cur = []
        # verse numbers carry nothing a language model should learn from this corpus
        cur.append(re.sub(r"^\s+\d+ ", "", line))
    if cur:
        chapters.append("\n".join(cur).strip())
    return [c for c in chapters if c]


def gcide_docs(limit_bytes):
    if not os.path.exists(GCIDE):
        sys.exit(f"{GCIDE} is missing; install dict-gcide (scripts/setup.sh)")
    docs, cur, size, total = [], [], 0, 0
    with gzip.open(GCIDE, "rt", encoding="utf-8", errors="replace") as f:
        entry = []
        for line in f:
            if line.strip() == "" and entry:
                e = "".join(entry).strip()
                entry = []
                if e.startswith("00-database"):
                    continue
                cur.append(e)
                size += len(e)
                if size >= 2000:
                    docs.append("\n\n".join(cur))
                    total += size
                    cur, size = [], 0
                    if limit_bytes and total >= limit_bytes:
                        break
            elif line.strip() != "":
                entry.append(line)
    if cur:
        docs.append("\n\n".join(cur))
    return docs


def write_docs(path, docs):
    with open(path, "w", encoding="utf-8") as f:
        for d in docs:
            f.write(d.replace("\n%\n", "\n% \n") + "\n%\n")
    return os.path.getsize(path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--gcide-mb", type=float, default=0)
    ap.add_argument("--sample-mb", type=float, default=0)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    kjv = kjv_chapters()
    gc = gcide_docs(int(a.gcide_mb * 1e6))
    nk = write_docs(os.path.join(a.out, "kjv.txt"), kjv)
    ng = write_docs(os.path.join(a.out, "gcide.txt"), gc)
    print(f"kjv.txt: {len(kjv)} chapters, {nk} bytes; gcide.txt: {len(gc)} documents, {ng} bytes")
    if a.sample_mb > 0:
        cap = int(a.sample_mb * 1e6)
        sample, got = [], 0
        for d in [x for pair in zip(kjv, gc) for x in pair]:
            if got >= cap:
                break
            sample.append(d)
            got += len(d)
        n = write_docs(os.path.join(a.out, "bpe_sample.txt"), sample)
        print(f"bpe_sample.txt: {len(sample)} documents, {n} bytes")


if __name__ == "__main__":
    main()
