#!/usr/bin/env python3
"""Reads and checks a WAN test bed topology (scripts/wan_testbed.sh) and prints it as shell
assignments. A topology file is TOML:

    islands = 2              # network namespaces, one per island
    ranks_per_island = 2     # atoll ranks in each (they talk over the namespace's loopback)
    [link]                   # every island's link to the WAN router, each direction
    rate = "20mbit"          # tc tbf rate (bit, kbit, mbit, gbit), or "none"
    latency_ms = 20          # one-way delay added by the relay (scripts/wan_relay.py)
    jitter_ms = 2            # uniform +-jitter on top, packets kept in order
    loss = 0.0               # probability that the relay drops a packet (TCP retransmits it)

usage: wan_topology.py FILE   exit 0 printing KEY=VALUE lines; 2 with the reason on a bad file."""
import re
import sys
import tomllib

KEYS = {"islands", "ranks_per_island", "link"}
LINK_KEYS = {"rate", "latency_ms", "jitter_ms", "loss"}


def fail(path, msg):
    print(f"wan_testbed: topology {path}: {msg}", file=sys.stderr)
    sys.exit(2)


def number(path, key, v, lo, hi, integer=False):
    ok = isinstance(v, int) if integer else isinstance(v, (int, float))
    if isinstance(v, bool) or not ok or not (lo <= v <= hi):
        kind = "an integer" if integer else "a number"
        fail(path, f"{key} = {v!r}: must be {kind} in [{lo}, {hi}]")
    return v


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    path = sys.argv[1]
    try:
        with open(path, "rb") as f:
            t = tomllib.load(f)
    except OSError as e:
        fail(path, f"cannot read it: {e.strerror}")
    except tomllib.TOMLDecodeError as e:
        fail(path, f"not valid TOML: {e}")
    for k in t:
        if k not in KEYS:
            fail(path, f"unknown key '{k}' (valid: {', '.join(sorted(KEYS))})")
    for k in ("islands", "ranks_per_island"):
        if k not in t:
            fail(path, f"missing key '{k}'")
    islands = number(path, "islands", t["islands"], 1, 64, True)
    ranks = number(path, "ranks_per_island", t["ranks_per_island"], 1, 64, True)
    link = t.get("link", {})
    if not isinstance(link, dict):
        fail(path, "link must be a table ([link])")
    for k in link:
        if k not in LINK_KEYS:
            fail(path, f"unknown key 'link.{k}' (valid: {', '.join(sorted(LINK_KEYS))})")
    rate = link.get("rate", "none")
    if not isinstance(rate, str) or not (rate == "none" or re.fullmatch(r"\d+(\.\d+)?(bit|kbit|mbit|gbit)", rate)):
        fail(path, f"link.rate = {rate!r}: not a tc rate like \"20mbit\" (bit, kbit, mbit, gbit) or \"none\"")
    lat = number(path, "link.latency_ms", link.get("latency_ms", 0), 0, 10000)
    jit = number(path, "link.jitter_ms", link.get("jitter_ms", 0), 0, 10000)
    if jit > lat:
        fail(path, f"link.jitter_ms = {jit} exceeds link.latency_ms = {lat} (a packet cannot arrive before it is sent)")
    loss = number(path, "link.loss", link.get("loss", 0.0), 0.0, 0.5)
    print(f"ISLANDS={islands}\nRANKS_PER_ISLAND={ranks}\nRATE={rate}\nLATENCY_MS={lat}\nJITTER_MS={jit}\nLOSS={loss}")


main()
