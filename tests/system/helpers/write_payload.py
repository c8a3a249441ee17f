#!/usr/bin/env python3
"""Compare the last RDMA WRITE message on the wire with a file (smc-rs tests/system).

Usage: write_payload.py CAPTURE SRC_IP DST_IP FILE [--count N] [--pattern SEED]

Reassembles, from the RoCEv2 packets SRC_IP -> DST_IP in CAPTURE, the payload of every
complete RDMA WRITE message (First [+ Middle...] + Last, or Only; the RETH is skipped; pad
and ICRC removed; retransmitted PSNs counted once) and compares the last one with FILE byte
for byte. --count N requires exactly N messages (a truncated capture is an error, not a
pass). --pattern SEED requires message k to be stream SEED + k of the harness data pattern
(splitmix64, tests/kernel-peer/README.md), i.e. what `smc rdma write-test` sends.
Exit 0 when everything holds, 1 otherwise. Uses scapy only to read the capture.
"""
import sys

from scapy.all import rdpcap, IP, UDP

FIRST, MIDDLE, LAST, LAST_IMM, ONLY, ONLY_IMM = 0x06, 0x07, 0x08, 0x09, 0x0A, 0x0B
BTH, RETH, IMM, ICRC = 12, 16, 4, 4


MASK = (1 << 64) - 1


def mix64(z):
    z ^= z >> 30
    z = (z * 0xBF58476D1CE4E5B9) & MASK
    z ^= z >> 27
    z = (z * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def pattern(seed, n):
    base = ((seed + 1) * 0x9E3779B97F4A7C15) & MASK
    out = bytearray()
    for w in range((n + 7) // 8):
        out += mix64((base + w) & MASK).to_bytes(8, "little")
    return bytes(out[:n])


def main():
    import argparse
    ap = argparse.ArgumentParser()
    for a in ("capture", "src", "dst", "file"):
        ap.add_argument(a)
    ap.add_argument("--count", type=int)
    ap.add_argument("--pattern", type=lambda x: int(x, 0))
    args = ap.parse_args()
    cap, src, dst, path = args.capture, args.src, args.dst, args.file
    want = open(path, "rb").read()
    msgs = []  # complete messages, in order of their last packet
    cur = None  # {psn: payload}, first psn
    for p in rdpcap(cap):
        if IP not in p or UDP not in p or p[UDP].dport != 4791:
            continue
        if p[IP].src != src or p[IP].dst != dst:
            continue
        b = bytes(p[UDP].payload)[: p[UDP].len - 8]
        op, pad = b[0], (b[1] >> 4) & 3
        psn = int.from_bytes(b[9:12], "big")
        end = len(b) - ICRC - pad
        if op in (FIRST, ONLY, ONLY_IMM):
            hdr = BTH + RETH + (IMM if op == ONLY_IMM else 0)
            cur = {"first": psn, "parts": {psn: b[hdr:end]}}
            if op != FIRST:
                msgs.append(cur)
                cur = None
        elif op in (MIDDLE, LAST, LAST_IMM) and cur is not None:
            hdr = BTH + (IMM if op == LAST_IMM else 0)
            cur["parts"][psn] = b[hdr:end]
            if op != MIDDLE:
                msgs.append(cur)
                cur = None
    if not msgs:
        print("write_payload: no RDMA WRITE message %s -> %s in %s" % (src, dst, cap))
        return 1
    def payload(m):
        order = sorted(m["parts"], key=lambda q: (q - m["first"]) & 0xFFFFFF)
        return b"".join(m["parts"][q] for q in order), len(order)

    if args.count is not None and len(msgs) != args.count:
        print("write_payload: %d RDMA WRITE messages %s -> %s in the capture, expected %d"
              % (len(msgs), src, dst, args.count))
        return 1
    if args.pattern is not None:
        for k, m in enumerate(msgs):
            data, _ = payload(m)
            if data != pattern(args.pattern + k, len(data)):
                print("write_payload: WRITE message %d %s -> %s is not pattern stream %#x"
                      % (k, src, dst, args.pattern + k))
                return 1
        print("write_payload: all %d WRITE messages %s -> %s carry their pattern streams"
              % (len(msgs), src, dst))
    got, npkts = payload(msgs[-1])
    if got != want:
        at = next((i for i, (x, y) in enumerate(zip(got, want)) if x != y), min(len(got), len(want)))
        print("write_payload: last WRITE %s -> %s (%d bytes, %d packets) differs from %s (%d bytes) at byte %d"
              % (src, dst, len(got), npkts, path, len(want), at))
        return 1
    print("write_payload: last WRITE %s -> %s on the wire (%d bytes, %d packets) equals %s"
          % (src, dst, len(got), npkts, path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
