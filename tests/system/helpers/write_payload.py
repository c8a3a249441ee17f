#!/usr/bin/env python3
"""Compare the last RDMA WRITE message on the wire with a file (smc-rs tests/system).

Usage: write_payload.py CAPTURE SRC_IP DST_IP FILE [--count N] [--pattern SEED] [--send]
                         [--size BYTES]

Reassembles, from the RoCEv2 packets SRC_IP -> DST_IP in CAPTURE, the payload of every
complete RDMA WRITE message (with --send: SEND message) (First [+ Middle...] + Last, or
Only; the RETH and immediate data are skipped; pad
and ICRC removed; retransmitted PSNs counted once) and compares the last one with FILE byte
for byte. --size keeps only messages of that length (other tools' traffic on the same
addresses, e.g. ping-pong SENDs, is left out). --count N requires exactly N messages (a truncated capture is an error, not a
pass). --pattern SEED requires message k to be stream SEED + k of the harness data pattern
(splitmix64, tests/kernel-peer/README.md), i.e. what `smc rdma write-test` sends.
Exit 0 when everything holds, 1 otherwise. Uses scapy only to read the capture.
"""
import sys

from scapy.all import rdpcap, IP, UDP

BTH, RETH, IMM, ICRC = 12, 16, 4, 4
# opcode -> (starts a message, ends a message, header bytes after the BTH)
WRITE_OPS = {0x06: (True, False, RETH), 0x07: (False, False, 0), 0x08: (False, True, 0),
             0x09: (False, True, IMM), 0x0A: (True, True, RETH), 0x0B: (True, True, RETH + IMM)}
SEND_OPS = {0x00: (True, False, 0), 0x01: (False, False, 0), 0x02: (False, True, 0),
            0x03: (False, True, IMM), 0x04: (True, True, 0), 0x05: (True, True, IMM)}


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
    ap.add_argument("--send", action="store_true")
    ap.add_argument("--size", type=int, help="only messages of this many bytes count")
    args = ap.parse_args()
    ops = SEND_OPS if args.send else WRITE_OPS
    kind = "SEND" if args.send else "RDMA WRITE"
    cap, src, dst, path = args.capture, args.src, args.dst, args.file
    want = open(path, "rb").read()
    by_first = {}  # first PSN -> message
    order_seen = []
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
        if op not in ops:
            continue
        starts, ends, extra = ops[op]
        part = b[BTH + extra:end]
        if starts:
            # A retransmitted First/Only (go-back-N) restarts the message with that PSN.
            cur = by_first.get(psn)
            if cur is None:
                cur = by_first[psn] = {"first": psn, "parts": {}}
                order_seen.append(psn)
        if cur is None:
            continue
        cur["parts"][psn] = part
        if ends:
            cur["done"] = True
            cur = None
    msgs = [by_first[q] for q in order_seen if by_first[q].get("done")]
    if not msgs:
        print("write_payload: no %s message %s -> %s in %s" % (kind, src, dst, cap))
        return 1

    def payload(m):
        order = sorted(m["parts"], key=lambda q: (q - m["first"]) & 0xFFFFFF)
        return b"".join(m["parts"][q] for q in order), len(order)

    if args.size is not None:
        msgs = [m for m in msgs if len(payload(m)[0]) == args.size]
        if not msgs:
            print("write_payload: no %d-byte %s message %s -> %s" % (args.size, kind, src, dst))
            return 1
    if args.count is not None and len(msgs) != args.count:
        print("write_payload: %d %s messages %s -> %s in the capture, expected %d"
              % (len(msgs), kind, src, dst, args.count))
        return 1
    if args.pattern is not None:
        for k, m in enumerate(msgs):
            data, _ = payload(m)
            if data != pattern(args.pattern + k, len(data)):
                print("write_payload: %s message %d %s -> %s is not pattern stream %#x"
                      % (kind, k, src, dst, args.pattern + k))
                return 1
        print("write_payload: all %d %s messages %s -> %s carry their pattern streams"
              % (len(msgs), kind, src, dst))
    got, npkts = payload(msgs[-1])
    if got != want:
        at = next((i for i, (x, y) in enumerate(zip(got, want)) if x != y), min(len(got), len(want)))
        print("write_payload: last %s %s -> %s (%d bytes, %d packets) differs from %s (%d bytes) at byte %d"
              % (kind, src, dst, len(got), npkts, path, len(want), at))
        return 1
    print("write_payload: last %s %s -> %s on the wire (%d bytes, %d packets) equals %s"
          % (kind, src, dst, len(got), npkts, path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
