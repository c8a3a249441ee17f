#!/usr/bin/env python3
"""Independent checks of a RoCEv2 capture (part of smc-rs tests/system).

Usage: roce_check.py CAPTURE [--expect NAME,NAME,...] [--min-packets N]

For every UDP packet to port 4791 in CAPTURE (pcap/pcapng, as tcpdump writes it):
  * tshark must decode it as RoCE ("RRoCE": Wireshark's InfiniBand dissector on UDP 4791),
    without a malformed-packet error, and give its BTH opcode;
  * scapy's RoCE layer (scapy.contrib.roce, BTH.compute_icrc) must compute the same ICRC as
    the one at the end of the packet;
and tshark's and scapy's opcodes must agree. --expect lists the packet kinds that must occur
at least once: BTH opcode names as scapy spells them without the "RC_" prefix (SEND_FIRST,
RDMA_READ_REQUEST, ATOMIC_ACKNOWLEDGE, ...) and, for ACKNOWLEDGE packets, the AETH kinds
ACK, RNR_NAK, NAK_PSN_SEQUENCE, NAK_INVALID_REQUEST, NAK_REMOTE_ACCESS, NAK_REMOTE_OP.
Exit 0 when everything holds, 1 otherwise, 77 when tshark or scapy is missing.
"""
import argparse
import collections
import shutil
import subprocess
import sys

try:
    from scapy.all import rdpcap, UDP
    from scapy.contrib import roce
except ImportError as e:  # pragma: no cover - environment
    print("SKIP: scapy with scapy.contrib.roce is not installed (%s)" % e)
    sys.exit(77)

ROCE_PORT = 4791


def aeth_kind(syndrome):
    """IBA 9.3.5: syndrome bits 7..5 select ACK (000), RNR NAK (001), NAK (011)."""
    top = (syndrome >> 5) & 0x3
    if top == 0:
        return "ACK"
    if top == 1:
        return "RNR_NAK"
    if top == 3:
        return {0: "NAK_PSN_SEQUENCE", 1: "NAK_INVALID_REQUEST", 2: "NAK_REMOTE_ACCESS",
                3: "NAK_REMOTE_OP"}.get(syndrome & 0x1f, "NAK_RESERVED_%d" % (syndrome & 0x1f))
    return "AETH_RESERVED_%02x" % syndrome


def opcode_name(op):
    name = roce._bth_opcodes.get(op)
    if name is None:
        return "OPCODE_%02x" % op
    return name[3:] if name.startswith("RC_") else name


def tshark_frames(path):
    cmd = ["tshark", "-r", path, "-Y", "udp.dstport == %d" % ROCE_PORT, "-T", "fields",
           "-E", "separator=|", "-e", "frame.number", "-e", "_ws.col.Protocol",
           "-e", "infiniband.bth.opcode", "-e", "infiniband.aeth.syndrome",
           "-e", "_ws.malformed"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError("tshark failed (exit %d): %s" % (r.returncode, r.stderr.strip()[-300:]))
    out = r.stdout
    frames = {}
    for line in out.splitlines():
        f = line.split("|")
        if len(f) < 5:
            continue
        frames[int(f[0])] = {"proto": f[1], "opcode": f[2], "syndrome": f[3],
                             "malformed": f[4]}
    return frames


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("capture")
    ap.add_argument("--expect", default="")
    ap.add_argument("--min-packets", type=int, default=1)
    args = ap.parse_args()
    if not shutil.which("tshark"):
        print("SKIP: tshark is not installed")
        return 77

    try:
        ts = tshark_frames(args.capture)
    except RuntimeError as e:
        print("FAIL %s" % e)
        return 1
    errors = []
    kinds = collections.Counter()
    n = 0
    for i, pkt in enumerate(rdpcap(args.capture), start=1):
        if UDP not in pkt or pkt[UDP].dport != ROCE_PORT:
            continue
        n += 1
        udp = pkt[UDP]
        payload = bytes(udp.payload)
        ulen = udp.len - 8 if udp.len else len(payload)
        payload = payload[:ulen]
        if len(payload) < 16:
            errors.append("frame %d: %d bytes is too short for BTH + ICRC" % (i, len(payload)))
            continue
        # Re-dissect from the UDP payload so that trailing link-layer padding cannot shift
        # the ICRC, and let scapy compute it from the IP/UDP/BTH it sees.
        ip = pkt[UDP].underlayer
        rebuilt = ip.__class__(bytes(ip)[: len(bytes(ip)) - len(bytes(udp)) + 8 + ulen])
        bth = rebuilt[roce.BTH]
        want = bth.compute_icrc(None)
        got = payload[-4:]
        if want != got:
            errors.append("frame %d: ICRC %s, scapy computes %s" % (i, got.hex(), want.hex()))
        op = payload[0]
        name = opcode_name(op)
        kinds[name] += 1
        if name == "ACKNOWLEDGE" or name == "ATOMIC_ACKNOWLEDGE":
            kinds[aeth_kind(payload[12])] += 1
        t = ts.get(i)
        if t is None:
            errors.append("frame %d: tshark did not list it" % i)
            continue
        if t["proto"] != "RRoCE":
            errors.append("frame %d: tshark decodes it as %r, not RRoCE" % (i, t["proto"]))
        if t["malformed"]:
            errors.append("frame %d: tshark reports a malformed packet" % i)
        try:
            t_op = int(t["opcode"], 0)
        except ValueError:
            errors.append("frame %d: tshark gives no BTH opcode (%r)" % (i, t["opcode"]))
            continue
        if t_op != op:
            errors.append("frame %d: tshark opcode %d, scapy %d" % (i, t_op, op))

    print("roce_check: %d RoCEv2 packets in %s" % (n, args.capture))
    for k in sorted(kinds):
        print("  %-32s %d" % (k, kinds[k]))
    if n < args.min_packets:
        errors.append("only %d RoCEv2 packets, expected at least %d" % (n, args.min_packets))
    for k in [x for x in args.expect.split(",") if x]:
        if kinds[k] == 0:
            errors.append("no %s packet in the capture" % k)
    for e in errors[:30]:
        print("FAIL " + e)
    if len(errors) > 30:
        print("... and %d more" % (len(errors) - 30))
    if errors:
        return 1
    print("roce_check: every ICRC verified by scapy, every packet decoded by tshark, "
          "all expected kinds present")
    return 0


if __name__ == "__main__":
    sys.exit(main())
