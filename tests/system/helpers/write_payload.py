#!/usr/bin/env python3
"""Compare the last RDMA WRITE message on the wire with a file (smc-rs tests/system).

Usage: write_payload.py CAPTURE SRC_IP DST_IP FILE

Reassembles, from the RoCEv2 packets SRC_IP -> DST_IP in CAPTURE, the payload of the last
complete RDMA WRITE message (First [+ Middle...] + Last, or Only; the RETH is skipped; pad
and ICRC removed; retransmitted PSNs counted once) and compares it with FILE byte for byte.
Exit 0 when equal, 1 otherwise. Uses scapy only to read the capture.
"""
import sys

from scapy.all import rdpcap, IP, UDP

FIRST, MIDDLE, LAST, LAST_IMM, ONLY, ONLY_IMM = 0x06, 0x07, 0x08, 0x09, 0x0A, 0x0B
BTH, RETH, IMM, ICRC = 12, 16, 4, 4


def main():
    cap, src, dst, path = sys.argv[1:5]
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
    last = msgs[-1]
    first = last["first"]
    order = sorted(last["parts"], key=lambda q: (q - first) & 0xFFFFFF)
    got = b"".join(last["parts"][q] for q in order)
    if got != want:
        at = next((i for i, (x, y) in enumerate(zip(got, want)) if x != y), min(len(got), len(want)))
        print("write_payload: last WRITE %s -> %s (%d bytes, %d packets) differs from %s (%d bytes) at byte %d"
              % (src, dst, len(got), len(order), path, len(want), at))
        return 1
    print("write_payload: last WRITE %s -> %s on the wire (%d bytes, %d packets) equals %s"
          % (src, dst, len(got), len(order), path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
