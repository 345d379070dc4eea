#!/usr/bin/python3
"""Reference for atoll's GPT-2 pre-tokenizer (src/train/bpe_pretokenize.cpp).

Runs GPT-2's pre-tokenization regex (Radford et al. 2019, OpenAI encoder.py)
    's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
through Python's `re`, which lacks \p{..}: the L and N classes are built from unicodedata
(categories L* and N*) over the Basic Multilingual Plane and the emoji planes.
Usage: gpt2_pretokenize_ref.py IN_UTF8_FILE OUT_JSON_FILE  -> JSON list of the pieces.
"""
import json
import re
import sys
import unicodedata


def char_class(prefix):
    ranges, start, prev = [], None, None
    for cp in list(range(0x80, 0x10000)) + list(range(0x10000, 0x20000)):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        ok = unicodedata.category(chr(cp)).startswith(prefix)
        if ok and start is None:
            start = cp
        if not ok and start is not None:
            ranges.append((start, prev))
            start = None
        prev = cp
    if start is not None:
        ranges.append((start, prev))
    ascii_part = "a-zA-Z" if prefix == "L" else "0-9"
    return ascii_part + "".join(
        re.escape(chr(a)) if a == b else re.escape(chr(a)) + "-" + re.escape(chr(b)) for a, b in ranges)


L, N = char_class("L"), char_class("N")
PAT = re.compile(r"'s|'t|'re|'ve|'m|'ll|'d| ?[" + L + r"]+| ?[" + N + r"]+| ?[^\s" + L + N +
                 r"]+|\s+(?!\S)|\s+")

if __name__ == "__main__":
    text = open(sys.argv[1], encoding="utf-8", newline="").read()
    with open(sys.argv[2], "w", encoding="utf-8") as f:
        json.dump(PAT.findall(text), f)
