#!/usr/bin/env python3
"""The WAN test bed's link emulator (this kernel has no netem): runs in the router namespace of
scripts/wan_testbed.sh between two TUN devices. The router's policy routing sends every packet
arriving from an island into TUN `--in`; the relay holds it for the one-way latency (plus a
uniform jitter, never reordering), drops it with probability `--loss`, and writes it into TUN
`--out`, from where the kernel routes it to the destination island. Bandwidth is tc tbf's job
on the veth links; this only adds delay and loss.

usage: wan_relay.py --in TUN --out TUN [--latency-ms X] [--jitter-ms X] [--loss P] [--seed N]
On SIGTERM it prints what it forwarded and dropped, and exits."""
import argparse
import collections
import fcntl
import os
import random
import select
import signal
import struct
import sys
import time

TUNSETIFF = 0x400454CA
IFF_TUN, IFF_NO_PI = 0x0001, 0x1000


def open_tun(name):
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TUN | IFF_NO_PI))
    return fd


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--in", dest="tin", required=True)
    ap.add_argument("--out", dest="tout", required=True)
    ap.add_argument("--latency-ms", type=float, default=0.0)
    ap.add_argument("--jitter-ms", type=float, default=0.0)
    ap.add_argument("--loss", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    fin, fout = open_tun(a.tin), open_tun(a.tout)
    queue = collections.deque()  # (due time, packet), due times non-decreasing
    last_due = 0.0
    stats = {"packets": 0, "bytes": 0, "dropped": 0}
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    signal.signal(signal.SIGINT, lambda *_: stop.append(1))
    print(f"wan_relay: {a.tin} -> {a.tout}, latency {a.latency_ms} ms +- {a.jitter_ms} ms, loss {a.loss}",
          file=sys.stderr, flush=True)
    while not stop:
        now = time.monotonic()
        while queue and queue[0][0] <= now:
            _, pkt = queue.popleft()
            try:
                os.write(fout, pkt)
            except BlockingIOError:
                stats["dropped"] += 1  # the kernel's queue is full: a real link would drop it too
        timeout = max(0.0, queue[0][0] - now) if queue else 0.2
        try:
            r, _, _ = select.select([fin], [], [], timeout)
        except InterruptedError:
            continue
        if not r:
            continue
        for _ in range(256):  # drain what is there
            try:
                pkt = os.read(fin, 65536)
            except BlockingIOError:
                break
            if a.loss > 0 and rng.random() < a.loss:
                stats["dropped"] += 1
                continue
            delay = (a.latency_ms + rng.uniform(-a.jitter_ms, a.jitter_ms)) / 1000.0
            last_due = max(last_due, time.monotonic() + max(0.0, delay))
            queue.append((last_due, pkt))
            stats["packets"] += 1
            stats["bytes"] += len(pkt)
    print(f"wan_relay: forwarded {stats['packets']} packets ({stats['bytes']} bytes), dropped {stats['dropped']}",
          file=sys.stderr, flush=True)


main()
