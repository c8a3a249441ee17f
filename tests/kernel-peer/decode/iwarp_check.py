#!/usr/bin/env python3
"""Check every iWARP connection of a capture, independently of smc-iwarp.

Part of smc-rs tests/kernel-peer. For each TCP connection that starts with an MPA Request
("MPA ID Req Frame", RFC 5044 §7.1) the two directions are reassembled from the TCP
sequence numbers (scapy reads the pcap; retransmitted bytes count once) and parsed here:

  * the MPA Request and Reply: revision, M/C/R/S flags, private data length and, with S,
    the RFC 6581 §9 enhanced data (A/B/C/D, IRD, ORD), printed;
  * every FPDU after them (no markers): ULPDU length, pad, and the CRC32c, computed by the
    table-driven CRC32c below (Castagnoli, reflected, init/xorout 0xFFFFFFFF; the RFC 3720
    B.4 vectors are checked at start-up), which must match when C was negotiated and be 0
    when it was not;
  * the DDP/RDMAP header of each FPDU (version 1/1, opcode, tagged or untagged queue),
    counted per opcode; the first FPDU of the initiator in peer-to-peer mode must be the
    RTR the Reply allowed (zero-length Send, Write or Read);
  * tshark (iwarp_mpa / iwarp_ddp_rdmap) must decode every data frame of those connections
    as iWARP, and call none of them malformed.

Usage: iwarp_check.py CAPTURE [--json OUT] [--ports 7174,18515] [--ours IP,...] [--expect K=V ...]
  --expect crc=1|0, p2p=1|0, rtr=write|read|send, rev=1|2, enhanced=1|0, terminate=1|0
  applies to every connection found (on the given ports).
Exit status: 0 all checks passed, 1 a check failed, 2 unusable input.
"""
import argparse
import collections
import json
import os
import struct
import subprocess
import sys

KEY_REQ = b"MPA ID Req Frame"
KEY_REP = b"MPA ID Rep Frame"
OPS = {0: "Write", 1: "ReadRequest", 2: "ReadResponse", 3: "Send", 4: "SendInvalidate",
       5: "SendSE", 6: "SendSEInvalidate", 7: "Terminate"}


def _crc_table():
    poly = 0x82F63B78  # CRC32c (Castagnoli), reflected
    t = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ poly if c & 1 else c >> 1
        t.append(c)
    return t


CRC_TABLE = _crc_table()


def crc32c(data):
    c = 0xFFFFFFFF
    for b in data:
        c = CRC_TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


# RFC 3720 B.4: 32 zero bytes -> aa 36 91 8a on the wire (LSB first), 32 x 0xff -> 43 ab a8 62
assert struct.pack("<I", crc32c(bytes(32))) == bytes.fromhex("aa36918a")
assert struct.pack("<I", crc32c(b"\xff" * 32)) == bytes.fromhex("43aba862")


def streams(pcap):
    """{(src, sport, dst, dport): (isn, {offset: bytes})} from scapy."""
    from scapy.all import IP, TCP, PcapReader  # noqa: PLC0415
    s = {}
    frames = collections.defaultdict(list)
    first = {}
    with PcapReader(pcap) as rd:
        for n, p in enumerate(rd, 1):
            if IP not in p or TCP not in p:
                continue
            ip, t = p[IP], p[TCP]
            k = (ip.src, t.sport, ip.dst, t.dport)
            if t.flags & 0x02:  # SYN
                s[k] = [t.seq + 1, {}]
                continue
            data = bytes(t.payload)
            if not data or k not in s:
                continue
            off = (t.seq - s[k][0]) & 0xFFFFFFFF
            s[k][1].setdefault(off, data)
            frames[k].append(n)
            first.setdefault(k, n)
    out = {}
    for k, (_, segs) in s.items():
        buf = bytearray()
        for off in sorted(segs):
            d = segs[off]
            if off > len(buf):
                out[k] = (bytes(buf), "gap at %d" % len(buf), frames[k])
                break
            buf[off:off + len(d)] = d
        else:
            out[k] = (bytes(buf), None, frames[k])
    return out, first


def parse_rr(b, key):
    if len(b) < 20 or b[:16] != key:
        return None, "no %s" % key.decode()
    flags, rev, pdl = b[16], b[17], struct.unpack(">H", b[18:20])[0]
    if len(b) < 20 + pdl:
        return None, "truncated private data"
    pd = b[20:20 + pdl]
    r = {"markers": bool(flags & 0x80), "crc": bool(flags & 0x40), "reject": bool(flags & 0x20),
         "enhanced": bool(flags & 0x10), "rev": rev, "pd_len": pdl, "len": 20 + pdl}
    if r["enhanced"]:
        if len(pd) < 4:
            return None, "S set with PD_Length %d" % pdl
        ird, ord_ = struct.unpack(">HH", pd[:4])
        r.update({"A_p2p": bool(ird & 0x8000), "B_send": bool(ird & 0x4000),
                  "C_write": bool(ord_ & 0x8000), "D_read": bool(ord_ & 0x4000),
                  "ird": ird & 0x3FFF, "ord": ord_ & 0x3FFF})
    return r, None


def fpdus(b, crc_on, errors, who, notes=None):
    """Parse FPDUs; returns a list of (op, tagged, payload_len, qn, stag). With `notes`,
    a non-zero pad (RFC 5044 §4.1: set to zero by the sender, ignored by the receiver) is
    noted there instead of being an error: a peer's habit we tolerate, not ours."""
    out = []
    at = 0
    while at + 2 <= len(b):
        ulen = struct.unpack(">H", b[at:at + 2])[0]
        pad = (4 - (2 + ulen) % 4) % 4
        total = 2 + ulen + pad + 4
        if at + total > len(b):
            errors.append("%s: FPDU at %d truncated by the capture end" % (who, at))
            break
        body = b[at:at + 2 + ulen + pad]
        got = struct.unpack("<I", b[at + 2 + ulen + pad:at + total])[0]
        if crc_on and got != crc32c(body):
            errors.append("%s: FPDU %d at %d: CRC %08x, computed %08x" % (who, len(out), at, got, crc32c(body)))
        if not crc_on and got != 0:
            errors.append("%s: FPDU %d: CRC field %08x without negotiated CRC" % (who, len(out), got))
        if any(body[2 + ulen:]):
            (errors if notes is None else notes).append("%s: FPDU %d: pad not zero (%s)" % (
                who, len(out), body[2 + ulen:].hex()))
        u = body[2:2 + ulen]
        if len(u) < 2 or u[0] & 0x03 != 1 or u[1] >> 6 != 1:
            errors.append("%s: FPDU %d: bad DDP/RDMAP control %s" % (who, len(out), u[:2].hex()))
            at += total
            continue
        tagged = bool(u[0] & 0x80)
        op = u[1] & 0x0F
        hl = 14 if tagged else 18
        if len(u) < hl:
            errors.append("%s: FPDU %d: header truncated" % (who, len(out)))
        qn = None if tagged or len(u) < 18 else struct.unpack(">I", u[6:10])[0]
        stag = struct.unpack(">I", u[2:6])[0] if len(u) >= 6 else None
        term = None
        if op == 7 and len(u) >= 22:
            term = "%d/%d/0x%02x" % (u[18] >> 4, u[18] & 0x0F, u[19])
        rsize = struct.unpack(">I", u[30:34])[0] if op == 1 and len(u) >= 46 else None
        out.append({"op": OPS.get(op, "op%d" % op), "tagged": tagged, "len": len(u) - hl, "qn": qn,
                    "stag": stag, "term": term, "read_size": rsize, "last": bool(u[0] & 0x40)})
        at += total
    if at != len(b):
        errors.append("%s: %d bytes after the last FPDU" % (who, len(b) - at))
    return out


def tshark_check(pcap, conns, errors):
    """Every data frame of the iWARP connections decoded as iWARP, none malformed."""
    ports = sorted({c["server_port"] for c in conns})
    if not ports:
        return {}
    flt = " || ".join("tcp.port == %d" % p for p in ports)
    lua = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mpa_6581.lua")
    # rpcrdma_iwarp: Wireshark's RPC-over-RDMA heuristic claims small Sends (perftest's
    # rdma_cm exchange) and then calls them malformed; they are not RPC-over-RDMA. Two
    # passes (-2) so that a frame carrying part of an FPDU names the frame completing it.
    r = subprocess.run(["tshark", "-2", "--disable-heuristic", "rpcrdma_iwarp", "-X", "lua_script:" + lua, "-r", pcap, "-Y", "(%s) && tcp.len > 0" % flt,
                        "-T", "fields", "-E", "separator=\t", "-e", "frame.number", "-e", "frame.protocols",
                        "-e", "_ws.malformed", "-e", "mpa6581.ird", "-e", "mpa6581.ord",
                        "-e", "tcp.analysis.retransmission", "-e", "tcp.reassembled_in"],
                       capture_output=True, text=True, check=False)
    if r.returncode != 0:
        errors.append("tshark failed: %s" % r.stderr.strip()[-300:])
        return {}
    n = bad = undecoded = retrans = parts = 0
    enhanced = []
    for line in r.stdout.splitlines():
        f = (line.split("\t") + [""] * 7)[:7]
        if f[5]:
            # a TCP retransmission: tshark does not dissect its payload again (our own
            # reassembly above counts those bytes once)
            retrans += 1
            continue
        if f[6] and "iwarp_mpa" not in f[1]:
            # part of an FPDU that spans TCP segments (siw sends FPDUs of one MSS, not
            # aligned to segments): dissected in the frame that completes it
            parts += 1
            continue
        n += 1
        if f[3]:
            enhanced.append("IRD %s ORD %s" % (f[3], f[4]))
        if f[2]:
            bad += 1
            errors.append("tshark: frame %s malformed" % f[0])
        if "iwarp_mpa" not in f[1]:
            undecoded += 1
            errors.append("tshark: frame %s not decoded as iWARP (%s)" % (f[0], f[1]))
    want = sum(int(bool(c["request"].get("enhanced"))) + int(bool((c.get("reply") or {}).get("enhanced")))
               for c in conns)
    if len(enhanced) != want:
        errors.append("tshark + mpa_6581.lua showed the enhanced data of %d frames, %d expected"
                      % (len(enhanced), want))
    return {"frames": n, "malformed": bad, "not_iwarp": undecoded, "enhanced_shown": len(enhanced),
            "tcp_retransmissions": retrans, "fpdu_parts": parts}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("capture")
    ap.add_argument("--json")
    ap.add_argument("--ports", default="")
    ap.add_argument("--expect", action="append", default=[])
    ap.add_argument("--no-tshark", action="store_true")
    ap.add_argument("--ours", default="", help="our addresses (comma-separated): a non-zero "
                    "FPDU pad from any other sender is a note, not an error (Linux siw leaves "
                    "stale bytes in the pad of short FPDUs)")
    a = ap.parse_args()
    ports = {int(p) for p in a.ports.split(",") if p}
    expect = dict(e.split("=", 1) for e in a.expect)
    try:
        ss, first = streams(a.capture)
    except Exception as e:  # noqa: BLE001 - unreadable input
        print("iwarp_check: cannot read %s: %s" % (a.capture, e), file=sys.stderr)
        return 2
    errors, conns, notes = [], [], []
    ours = {x for x in a.ours.split(",") if x}
    for k, (data, gap, _) in sorted(ss.items(), key=lambda kv: first.get(kv[0], 0)):
        if not data.startswith(KEY_REQ) or (ports and k[3] not in ports):
            continue
        back = (k[2], k[3], k[0], k[1])
        rdata, rgap, _ = ss.get(back, (b"", None, []))
        who = "%s:%d>%s:%d" % k
        for g in (gap, rgap):
            if g:
                errors.append("%s: stream %s (frames missing from the capture)" % (who, g))
        req, err = parse_rr(data, KEY_REQ)
        if err:
            errors.append("%s: %s" % (who, err))
            continue
        rep, err = parse_rr(rdata, KEY_REP)
        c = {"conn": who, "server_port": k[3], "request": req, "reply": rep, "first_frame": first.get(k)}
        conns.append(c)
        if err:
            errors.append("%s: reply: %s" % (who, err))
            continue
        if rep["reject"]:
            c["fpdus_initiator"] = c["fpdus_responder"] = 0
            continue
        crc_on = req["crc"] or rep["crc"]
        lenient = lambda ip: notes if ours and ip not in ours else None  # noqa: E731
        fi = fpdus(data[req["len"]:], crc_on, errors, who + " initiator", lenient(k[0]))
        fr = fpdus(rdata[rep["len"]:], crc_on, errors, who + " responder", lenient(k[2]))
        c.update({"crc": crc_on, "fpdus_initiator": len(fi), "fpdus_responder": len(fr),
                  "ops_initiator": dict(collections.Counter(x["op"] for x in fi)),
                  "ops_responder": dict(collections.Counter(x["op"] for x in fr)),
                  "terminates": [x["term"] for x in fi + fr if x["term"]]})
        p2p = req.get("A_p2p") and rep.get("A_p2p")
        c["p2p"] = bool(p2p)
        if p2p and fi:
            f0 = fi[0]
            rtr = {"Write": "write", "ReadRequest": "read", "Send": "send"}.get(f0["op"])
            zero = f0["len"] == 0 if f0["op"] != "ReadRequest" else f0["read_size"] == 0
            if rtr is None or not zero:
                errors.append("%s: first initiator FPDU in P2P mode is %s, not a zero-length RTR" % (who, f0))
            else:
                allowed = {"write": rep.get("C_write"), "read": rep.get("D_read"), "send": rep.get("B_send")}
                if not allowed[rtr]:
                    errors.append("%s: RTR %s not allowed by the Reply" % (who, rtr))
                c["rtr"] = rtr
        for kk, vv in expect.items():
            got = {"crc": int(crc_on), "p2p": int(bool(p2p)), "rtr": c.get("rtr", "none"),
                   "rev": rep["rev"], "enhanced": int(rep["enhanced"]),
                   "terminate": int(bool(c["terminates"]))}.get(kk)
            if str(got) != vv:
                errors.append("%s: expected %s=%s, got %s" % (who, kk, vv, got))
    if not conns:
        errors.append("no iWARP connection (MPA Request) in the capture")
    ts = {} if a.no_tshark else tshark_check(a.capture, conns, errors)
    for c in conns:
        rq, rp = c["request"], c.get("reply") or {}
        enh = lambda r: ("A=%d B=%d C=%d D=%d IRD=%d ORD=%d" % (  # noqa: E731
            r["A_p2p"], r["B_send"], r["C_write"], r["D_read"], r["ird"], r["ord"])) if r.get("enhanced") else "-"
        print("%s: Request rev %d M=%d C=%d S=%d [%s] | Reply rev %s R=%s C=%s S=%s [%s] | "
              "FPDUs %s/%s crc=%s p2p=%s rtr=%s ops %s / %s%s" % (
                  c["conn"], rq["rev"], rq["markers"], rq["crc"], rq["enhanced"], enh(rq),
                  rp.get("rev"), int(rp.get("reject", 0)), int(rp.get("crc", 0)), int(rp.get("enhanced", 0)),
                  enh(rp), c.get("fpdus_initiator"), c.get("fpdus_responder"), int(c.get("crc", 0)),
                  int(c.get("p2p", 0)), c.get("rtr", "-"), c.get("ops_initiator"), c.get("ops_responder"),
                  " TERM %s" % c["terminates"] if c.get("terminates") else ""))
    n_fpdu = sum(c.get("fpdus_initiator", 0) + c.get("fpdus_responder", 0) for c in conns)
    print("iwarp_check: %d connections, %d FPDUs, CRC32c checked where negotiated; tshark %s; %d errors"
          % (len(conns), n_fpdu, ts, len(errors)))
    for e in notes[:10]:
        print("  NOTE (peer) " + e)
    if len(notes) > 10:
        print("  NOTE (peer) ... %d more" % (len(notes) - 10))
    for e in errors[:30]:
        print("  ERROR " + e)
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"connections": conns, "tshark": ts, "errors": errors, "peer_notes": notes}, fh, indent=1)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
