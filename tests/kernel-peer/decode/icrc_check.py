#!/usr/bin/env python3
"""Independent RoCEv2 ICRC checker (part of smc-rs tests/kernel-peer).

Recomputes the Invariant CRC of every RoCEv2 packet (UDP destination port
4791 by default) in a pcap or pcapng file and compares it with the four bytes
at the end of the packet. Wireshark shows that field but never checks it, and
Linux rxe silently drops a packet whose ICRC is wrong, so this is the only
way to see such a bug in a capture.

How the ICRC is computed (InfiniBand Architecture Specification, Annex A17
"RoCEv2", section A17.3.3 "ICRC"): a CRC-32 with the Ethernet polynomial
(the same CRC as zlib.crc32) over
  * 8 bytes of 0xFF standing in for the LRH that RoCEv2 does not carry,
  * the IP header with the variant fields set to all ones:
      IPv4: type of service (DSCP+ECN), time to live, header checksum;
      IPv6: traffic class, flow label, hop limit,
  * the UDP header with its checksum set to all ones,
  * the BTH with its reserved byte 4 ("resv8a") set to all ones,
  * everything after the BTH up to the ICRC (extension headers, payload, pad).
The CRC is transmitted least significant byte first.

Usage: icrc_check.py [--port N] [--json] [--max-report N] capture.pcap
Exit status: 0 no bad ICRC, 1 at least one bad ICRC, 2 unreadable input.
"""
import argparse
import json
import struct
import sys
import zlib

ROCE_PORT = 4791

# link-layer types we can find IP in
LINKTYPE_ETHERNET = 1
LINKTYPE_RAW = 101
LINKTYPE_LINUX_SLL = 113
LINKTYPE_IPV4 = 228
LINKTYPE_IPV6 = 229
LINKTYPE_LINUX_SLL2 = 276


class CaptureError(Exception):
    pass


def _pcap_records(fh, header):
    magic = header[:4]
    if magic in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1"):
        endian = "<"
    elif magic in (b"\xa1\xb2\xc3\xd4", b"\xa1\xb2\x3c\x4d"):
        endian = ">"
    else:
        raise CaptureError("not a pcap file")
    full = header + fh.read(16)  # 24-byte global header
    if len(full) < 24:
        raise CaptureError("truncated pcap header")
    linktype = struct.unpack(endian + "I", full[20:24])[0] & 0x0FFFFFFF
    while True:
        rec = fh.read(16)
        if len(rec) < 16:
            return
        _, _, caplen, origlen = struct.unpack(endian + "IIII", rec)
        data = fh.read(caplen)
        if len(data) < caplen:
            return
        yield linktype, data, origlen


def _pcapng_records(fh, first):
    """Enhanced and simple packet blocks of a pcapng file."""
    buf = first
    endian = "<"
    linktypes = []
    while True:
        if len(buf) < 8:
            buf += fh.read(8 - len(buf))
            if len(buf) < 8:
                return
        btype = struct.unpack(endian + "I", buf[:4])[0]
        if btype == 0x0A0D0D0A:  # section header: learn the byte order
            bom = fh.read(4) if len(buf) == 8 else buf[8:12]
            if bom == b"\x4d\x3c\x2b\x1a":
                endian = "<"
            elif bom == b"\x1a\x2b\x3c\x4d":
                endian = ">"
            else:
                raise CaptureError("bad pcapng byte-order magic")
            blen = struct.unpack(endian + "I", buf[4:8])[0]
            body = bom + fh.read(blen - 12)
            linktypes = []
        else:
            blen = struct.unpack(endian + "I", buf[4:8])[0]
            if blen < 12:
                raise CaptureError("bad pcapng block length")
            body = fh.read(blen - 8)
            if len(body) < blen - 8:
                return
            body = body[:-4]  # trailing block length
            if btype == 1:  # interface description
                linktypes.append(struct.unpack(endian + "H", body[:2])[0])
            elif btype == 6:  # enhanced packet
                iface, _, _, caplen, origlen = struct.unpack(endian + "IIIII", body[:20])
                lt = linktypes[iface] if iface < len(linktypes) else LINKTYPE_ETHERNET
                yield lt, body[20:20 + caplen], origlen
            elif btype == 3:  # simple packet
                origlen = struct.unpack(endian + "I", body[:4])[0]
                lt = linktypes[0] if linktypes else LINKTYPE_ETHERNET
                yield lt, body[4:4 + origlen], origlen
        buf = b""


def records(path):
    """Yield (frame number, linktype, bytes, original length)."""
    try:
        fh = open(path, "rb")
    except OSError as e:
        raise CaptureError(str(e)) from e
    with fh:
        head = fh.read(8)
        if len(head) < 8:
            raise CaptureError("file too short")
        if head[:4] == b"\x0a\x0d\x0d\x0a":
            gen = _pcapng_records(fh, head)
        else:
            gen = _pcap_records(fh, head)
        for n, (lt, data, origlen) in enumerate(gen, 1):
            yield n, lt, data, origlen


def ip_offset(linktype, frame):
    """Offset of the IP header inside the frame, or None."""
    if linktype == LINKTYPE_ETHERNET:
        off, ethertype = 14, frame[12:14]
        while ethertype in (b"\x81\x00", b"\x88\xa8") and len(frame) >= off + 4:
            ethertype = frame[off + 2:off + 4]
            off += 4
        return off if ethertype in (b"\x08\x00", b"\x86\xdd") else None
    if linktype == LINKTYPE_LINUX_SLL:
        return 16 if frame[14:16] in (b"\x08\x00", b"\x86\xdd") else None
    if linktype == LINKTYPE_LINUX_SLL2:
        return 20 if frame[0:2] in (b"\x08\x00", b"\x86\xdd") else None
    if linktype in (LINKTYPE_RAW, LINKTYPE_IPV4, LINKTYPE_IPV6):
        return 0
    return None


def icrc_of(frame, ip, port):
    """(computed, on-wire) ICRC of a RoCEv2 packet, or None if it is not one."""
    if len(frame) < ip + 20:
        return None
    version = frame[ip] >> 4
    if version == 4:
        ihl = (frame[ip] & 0x0F) * 4
        if frame[ip + 9] != 17 or ihl < 20:
            return None
        total = struct.unpack(">H", frame[ip + 2:ip + 4])[0]
        iph = bytearray(frame[ip:ip + ihl])
        iph[1] = 0xFF  # DSCP + ECN
        iph[8] = 0xFF  # TTL
        iph[10:12] = b"\xff\xff"  # header checksum
        udp = ip + ihl
        end = ip + total
    elif version == 6:
        if frame[ip + 6] != 17:  # extension headers are not used by RoCEv2
            return None
        plen = struct.unpack(">H", frame[ip + 4:ip + 6])[0]
        iph = bytearray(frame[ip:ip + 40])
        iph[0] |= 0x0F  # traffic class, high nibble
        iph[1:4] = b"\xff\xff\xff"  # traffic class low nibble + flow label
        iph[7] = 0xFF  # hop limit
        udp = ip + 40
        end = udp + plen
    else:
        return None
    if len(frame) < udp + 8 + 12 + 4 or end > len(frame):
        return None  # truncated capture (snaplen) or not ours
    if struct.unpack(">H", frame[udp + 2:udp + 4])[0] != port:
        return None
    udph = bytearray(frame[udp:udp + 8])
    udph[6:8] = b"\xff\xff"  # UDP checksum
    bth = bytearray(frame[udp + 8:udp + 20])
    bth[4] = 0xFF  # resv8a
    rest = frame[udp + 20:end - 4]  # anything after the IP datagram is padding
    computed = zlib.crc32(bytes(rest), zlib.crc32(bytes(bth), zlib.crc32(
        bytes(udph), zlib.crc32(bytes(iph), zlib.crc32(b"\xff" * 8)))))
    wire = struct.unpack("<I", frame[end - 4:end])[0]
    return computed, wire


def check(path, port=ROCE_PORT, max_report=20):
    result = {"file": path, "ok": 0, "bad": 0, "truncated": 0, "bad_frames": []}
    for n, lt, frame, origlen in records(path):
        ip = ip_offset(lt, frame)
        if ip is None:
            continue
        if len(frame) < origlen:
            # a snaplen-truncated RoCE frame cannot be checked
            r = icrc_of(frame + b"\0" * (origlen - len(frame)), ip, port)
            if r is not None:
                result["truncated"] += 1
            continue
        r = icrc_of(frame, ip, port)
        if r is None:
            continue
        computed, wire = r
        if computed == wire:
            result["ok"] += 1
        else:
            result["bad"] += 1
            if len(result["bad_frames"]) < max_report:
                result["bad_frames"].append(
                    {"frame": n, "computed": "%08x" % computed, "wire": "%08x" % wire})
    return result


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("capture")
    ap.add_argument("--port", type=int, default=ROCE_PORT, help="RoCEv2 UDP port (default 4791)")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    ap.add_argument("--max-report", type=int, default=20, help="bad frames to list")
    args = ap.parse_args(argv)
    try:
        r = check(args.capture, args.port, args.max_report)
    except CaptureError as e:
        print("icrc_check: %s: %s" % (args.capture, e), file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(r))
    else:
        for b in r["bad_frames"]:
            print("frame %d: bad ICRC: computed %s, on the wire %s" % (b["frame"], b["computed"], b["wire"]))
        print("RoCEv2 ICRC: %d ok, %d bad, %d truncated (not checked)" % (r["ok"], r["bad"], r["truncated"]))
    return 1 if r["bad"] else 0


if __name__ == "__main__":
    sys.exit(main())
