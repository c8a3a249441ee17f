#!/usr/bin/env python3
"""Crafted SYN for tests/system/bpf-option.sh (needs scapy and root).

Sends an IPv4 SYN whose TCP options are given as hex (e.g. another kind-254
option before the SMC-R one), from an address that the local kernel does not
own (so that it does not answer the SYN-ACK with a RST). Prints the SYN-ACK's
TCP options as hex, then completes the handshake and sends one line so that
the server's accept() and read() return.

usage: bpf-craft-syn.py IFACE SRC_IP DST_IP DST_PORT OPTIONS_HEX
prints: synack-options=<hex>   exit 0; exit 1 when no SYN-ACK came
"""
import random
import socket
import struct
import sys
import time

from scapy.all import IP, TCP, AsyncSniffer, Raw, conf, send


def checksum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\x00"
    s = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


def tcp_segment(src, dst, sport, dport, seq, ack, flags, opts=b"", payload=b""):
    """A TCP segment built by hand: scapy would re-encode kind-254 options."""
    if len(opts) % 4:
        opts += b"\x01" * (4 - len(opts) % 4)  # NOP padding
    doff = (20 + len(opts)) // 4
    hdr = struct.pack("!HHIIBBHHH", sport, dport, seq, ack, doff << 4, flags, 64240, 0, 0)
    seg = hdr + opts + payload
    pseudo = socket.inet_aton(src) + socket.inet_aton(dst) + struct.pack("!BBH", 0, 6, len(seg))
    c = checksum(pseudo + seg)
    return seg[:16] + struct.pack("!H", c) + seg[18:]


def main() -> int:
    iface, src, dst, dport, opts_hex = sys.argv[1:6]
    dport = int(dport)
    conf.verb = 0
    sport = random.randint(20000, 60000)
    seq = random.randint(0, 2**31)
    sniffer = AsyncSniffer(
        iface=iface,
        count=1,
        lfilter=lambda p: TCP in p and p[TCP].sport == dport and p[TCP].dport == sport
        and (int(p[TCP].flags) & 0x12) == 0x12,
    )
    sniffer.start()
    # Give the sniffer's socket time to open before the SYN leaves.
    time.sleep(0.5)
    syn = tcp_segment(src, dst, sport, dport, seq, 0, 0x02, bytes.fromhex(opts_hex))
    send(IP(src=src, dst=dst, proto=6) / Raw(syn), iface=iface)
    sniffer.join(timeout=8)
    if sniffer.running:
        sniffer.stop()
    res = sniffer.results
    if not res:
        print("no SYN-ACK", file=sys.stderr)
        return 1
    sa = res[0][TCP]
    print("synack-options=" + bytes(sa)[20 : sa.dataofs * 4].hex(), flush=True)
    ack = tcp_segment(src, dst, sport, dport, seq + 1, sa.seq + 1, 0x10)
    send(IP(src=src, dst=dst, proto=6) / Raw(ack), iface=iface)
    data = tcp_segment(src, dst, sport, dport, seq + 1, sa.seq + 1, 0x18, payload=b"hello\n")
    send(IP(src=src, dst=dst, proto=6) / Raw(data), iface=iface)
    return 0


if __name__ == "__main__":
    sys.exit(main())
