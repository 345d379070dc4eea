#!/usr/bin/env python3
"""Reads a run's metrics.jsonl as the trainer means it (src/train/metrics.h): the file is only
appended to; each invocation starts with a {"segment": {"start_step": S, ...}} line, and a segment
that starts at step S supersedes every earlier line of a step above S (steps a crashed attempt ran
past its last checkpoint). Lines torn by a kill are skipped.

    tools/metrics_jsonl.py RUN/metrics.jsonl [KEY]   # the current records, or one KEY per line
"""
import json
import sys


def records(path):
    """The step records in step order, without segment, superseded or torn lines."""
    out = []
    with open(path) as f:
        for line in f:
            try:
                j = json.loads(line)
            except ValueError:
                continue
            if not isinstance(j, dict):
                continue
            if "segment" in j:
                start = j["segment"].get("start_step", 0)
                while out and out[-1]["step"] > start:
                    out.pop()
            elif isinstance(j.get("step"), int):
                out.append(j)
    return out


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    for r in records(sys.argv[1]):
        if len(sys.argv) == 2:
            print(json.dumps(r))
        elif sys.argv[2] in r:
            print(r[sys.argv[2]])
