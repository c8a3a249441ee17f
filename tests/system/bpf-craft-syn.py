#!/usr/bin/env python3
"""Crafted handshakes for tests/system/bpf-option.sh (needs scapy and root).

syn IFACE SRC_IP DST_IP DST_PORT OPTIONS_HEX
    Sends an IPv4 SYN whose TCP options are given as hex (e.g. another
    kind-254 option before the SMC-R one), from an address that the local
    kernel does not own (so that it does not answer the SYN-ACK with a RST).
    Prints `synack-options=<hex>`, then completes the handshake and sends one
    line so that the server's accept() and read() return.

synack IFACE LISTEN_IP LISTEN_PORT OPTIONS_HEX
    Plays a server at an address the local kernel does not own: answers the
    first SYN to LISTEN_IP:LISTEN_PORT with a SYN-ACK carrying the given
    options, prints `syn-options=<hex>`, then answers the client's first data
    segment with the line `server-outcome=crafted`.

Exit 1 when the expected packet did not come.
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


def sniff_one(iface, match, timeout=10):
    sniffer = AsyncSniffer(iface=iface, count=1, lfilter=match)
    sniffer.start()
    # Give the sniffer's socket time to open before anything is sent.
    time.sleep(0.5)
    return sniffer


def finish(sniffer, timeout=10):
    sniffer.join(timeout=timeout)
    if sniffer.running:
        sniffer.stop()
    return sniffer.results[0] if sniffer.results else None


def play_server(iface, lip, lport, opts_hex) -> int:
    lport = int(lport)
    conf.verb = 0
    s = sniff_one(iface, lambda p: IP in p and TCP in p and p[IP].dst == lip
                  and p[TCP].dport == lport and (int(p[TCP].flags) & 0x12) == 0x02)
    syn = finish(s, 15)
    if syn is None:
        print("no SYN", file=sys.stderr)
        return 1
    t = syn[TCP]
    print("syn-options=" + bytes(t)[20 : t.dataofs * 4].hex(), flush=True)
    cip, cport, isn = syn[IP].src, t.sport, random.randint(0, 2**31)
    data_sniffer = sniff_one(iface, lambda p: IP in p and TCP in p and p[IP].dst == lip
                             and p[TCP].dport == lport and p[TCP].sport == cport
                             and len(p[TCP].payload) > 0)
    sa = tcp_segment(lip, cip, lport, cport, isn, t.seq + 1, 0x12, bytes.fromhex(opts_hex))
    send(IP(src=lip, dst=cip, proto=6) / Raw(sa), iface=iface)
    data = finish(data_sniffer)
    if data is None:
        print("no data from the client", file=sys.stderr)
        return 1
    d = data[TCP]
    # Raw(load) when scapy did not decode the payload further.
    n = len(bytes(d.payload))
    reply = tcp_segment(lip, cip, lport, cport, isn + 1, d.seq + n, 0x18,
                        payload=b"server-outcome=crafted\n")
    send(IP(src=lip, dst=cip, proto=6) / Raw(reply), iface=iface)
    return 0


def main() -> int:
    if sys.argv[1] == "synack":
        return play_server(*sys.argv[2:6])
    iface, src, dst, dport, opts_hex = sys.argv[2:7]
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
