#!/usr/bin/env python3
"""Which connections carried the bytes on the WAN test bed (scripts/wan_testbed.sh, WAN_SOCKETS=FILE).

Reads the `ss -tinH` samples each island's namespace took every 0.2 s (FILE.<k>, samples separated
by lines "---") and attributes every TCP connection that left its island (peer address outside
the island's own 10.N.k.0/24 and not loopback) to a class by port: "store" (the rendezvous store's
port, 29400 unless --store-port) or "collectives" (gloo's pairs, every other port). Per connection
the largest counters seen count (the kernel's tcp_info: bytes_sent / bytes_received are TCP
payload, segs_out / segs_in segments); a connection that ended between two samples loses at most
its last 0.2 s. Writes JSON with, per class and per island, payload bytes sent, segments out and
connections, and prints a table.

usage: scripts/wan_sockets.py FILE ISLANDS [--store-port P] [--out JSON]"""
import argparse
import json
import re


def parse(path):
    conns = {}
    cur = None
    for line in open(path):
        if line.startswith("---"):
            cur = None
            continue
        f = line.split()
        if not f:
            continue
        if f[0] in ("ESTAB", "CLOSE-WAIT", "FIN-WAIT-1", "FIN-WAIT-2", "LAST-ACK", "CLOSING", "TIME-WAIT", "SYN-SENT",
                    "SYN-RECV"):
            cur = (f[3], f[4]) if len(f) >= 5 else None
            rest = f[5:]
        else:
            rest = f
        if cur is None:
            continue
        c = conns.setdefault(cur, {})
        for tok in rest:
            m = re.match(r"^(bytes_sent|bytes_received|segs_out|segs_in|data_segs_out|data_segs_in):(\d+)$", tok)
            if m:
                c[m.group(1)] = max(c.get(m.group(1), 0), int(m.group(2)))
    return conns


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("file")
    ap.add_argument("islands", type=int)
    ap.add_argument("--store-port", type=int, default=29400)
    ap.add_argument("--out")
    a = ap.parse_args()
    res = {"classes": {}, "islands": []}
    for k in range(a.islands):
        conns = parse(f"{a.file}.{k}")
        isl = {}
        for (local, peer), c in conns.items():
            lh, lp = local.rsplit(":", 1)
            ph, pp = peer.rsplit(":", 1)
            if ph.startswith("127.") or ph.rsplit(".", 1)[0] == lh.rsplit(".", 1)[0]:
                continue  # inside the island
            cls = "store" if int(lp) == a.store_port or int(pp) == a.store_port else "collectives"
            for d in (isl, res["classes"]):
                e = d.setdefault(cls, {"bytes_sent": 0, "segs_out": 0, "connections": 0})
                e["bytes_sent"] += c.get("bytes_sent", 0)
                e["segs_out"] += c.get("segs_out", 0)
                e["connections"] += 1
        res["islands"].append(isl)
    if a.out:
        json.dump(res, open(a.out, "w"), indent=1)
    for cls, e in sorted(res["classes"].items()):
        print(f"wan_sockets: {cls:12s} payload sent {e['bytes_sent']:>12d} bytes in {e['segs_out']:>8d} segments "
              f"over {e['connections']} connections")


main()
