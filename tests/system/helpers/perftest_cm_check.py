#!/usr/bin/env python3
"""Check perftest rdma_cm (-R) runs in a capture against what our side saw (smc-rs tests/system).

Usage: perftest_cm_check.py CAPTURE --port 18515 --ours IP --seed SEED
                            --step VERB:ROLE:SIZE:ITERS:DUMP [--step ...]

Each --step is one ib_<VERB>_bw -R run (VERB send|write|read) in which our tool
(`smc rdma perftest`) had ROLE client|server and wrote DUMP (see its --dump). perftest runs
two iWARP connections to the server's port, a communication one and a data one; the steps
are matched, in order, to the pairs of connections on --port in the capture. Both TCP
directions are reassembled and parsed into FPDUs here (tests/kernel-peer/decode/iwarp_check.py
does the MPA, CRC and framing checks), independently of the tool:

communication connection: every FPDU a Send on queue 0; message sizes in perftest's order
  (16, 4, 4, 2, then 56-byte pingpong_dest blocks, for write/read five 8-byte results);
  version "6.06" both ways, the cycle buffer / cache line words, the two all-zero blocks
  around the data connection, then each side's keys (the same QPN, RKey, VAddr in every
  later block); the client's results name -s and -n.
data connection, per verb:
  send   the client's Send messages: -n of -s bytes; their concatenation equals DUMP; as
         client ours are pattern stream SEED + k; the server's credit WRITEs go to the
         client's credit word and carry the counts perftest's rule gives;
  write  the client's RDMA WRITE messages: -n of -s bytes, each to the server's RKey at its
         VAddr + perftest's offset; as client message k is stream SEED + k and all of them
         equal DUMP; as server the server's buffer rebuilt from them equals DUMP;
  read   the client's Read Requests: -n of -s bytes from the server's RKey at VAddr +
         offset; every Read Response message equals DUMP at that offset (as server DUMP is
         stream SEED itself).
Exit 0 when everything holds, 1 otherwise (the reasons are printed).
"""
import argparse
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "kernel-peer", "decode"))
sys.path.insert(0, HERE)
import iwarp_check  # noqa: E402  (streams, parse_rr: the same reassembly)
from write_payload import pattern  # noqa: E402  (the harness data pattern)

DEST = 56
OP_WRITE, OP_RREQ, OP_RRESP, OP_SEND = 0, 1, 2, 3


def fpdus(b):
    """[(tagged, last, op, header dict, payload)] of a stream after its MPA frame."""
    out, at = [], 0
    while at + 2 <= len(b):
        ulen = struct.unpack(">H", b[at:at + 2])[0]
        total = 2 + ulen + (4 - (2 + ulen) % 4) % 4 + 4
        u = b[at + 2:at + 2 + ulen]
        at += total
        if len(u) < 2:
            raise ValueError("FPDU shorter than a DDP header")
        tagged, last, op = bool(u[0] & 0x80), bool(u[0] & 0x40), u[1] & 0x0F
        if tagged:
            stag, to = struct.unpack(">IQ", u[2:14])
            out.append((True, last, op, {"stag": stag, "to": to}, u[14:]))
        else:
            _, qn, msn, mo = struct.unpack(">IIII", u[2:18])
            out.append((False, last, op, {"qn": qn, "msn": msn, "mo": mo}, u[18:]))
    return out


def messages(fs, want_op, tagged):
    """Reassembles messages of one opcode: [(first header, payload)]."""
    out, cur = [], None
    for t, last, op, h, p in fs:
        if op != want_op or t != tagged:
            continue
        if cur is None:
            cur = [h, bytearray()]
        elif tagged and h["to"] != cur[0]["to"] + len(cur[1]):
            raise ValueError("tagged message with a hole at TO %#x" % h["to"])
        elif not tagged and h["mo"] != len(cur[1]):
            raise ValueError("untagged message with MO %d at %d" % (h["mo"], len(cur[1])))
        cur[1] += p
        if last:
            out.append((cur[0], bytes(cur[1])))
            cur = None
    if cur is not None:
        raise ValueError("message without its last segment")
    return out


def remote_offset(k, size, cycle=4096, line=64):
    if size > cycle // 2:
        return 0
    step = ((size + line - 1) // line) * line if size > line else line
    return (k % max(cycle // step, 1)) * step


def rx_depth(iters):
    d = min(max(iters, 1), 512)
    return d + d % 2


def dest(b):
    lid, out_reads, qpn, psn, rkey = struct.unpack(">5I", b[:20])
    (vaddr,) = struct.unpack(">Q", b[24:32])
    return {"out_reads": out_reads, "qpn": qpn, "rkey": rkey, "vaddr": vaddr}


def check_comm(verb, size, iters, ini, rsp, errs, tag):
    """Returns (client keys, server keys) from the communication connection."""
    expect = [16, 4, 4, 2] + [DEST] * (7 if verb == "send" else 6)
    if verb != "send":
        expect += [8] * 5 + [DEST]
    keys = []
    for who, fs in (("client", ini), ("server", rsp)):
        if any(t or op != OP_SEND or not last or h["qn"] != 0 for t, last, op, h, _ in fs):
            errs.append("%s comm %s: an FPDU that is not a one-segment Send on queue 0" % (tag, who))
            return None
        m = [p for *_, p in fs]
        if [len(x) for x in m] != expect:
            errs.append("%s comm %s: message sizes %s, perftest sends %s" % (tag, who, [len(x) for x in m], expect))
            return None
        if m[0] != b"6.06" + bytes(12):
            errs.append("%s comm %s: version %r" % (tag, who, m[0]))
        if struct.unpack(">I", m[1])[0] != 4096 or struct.unpack(">I", m[2])[0] != 64:
            errs.append("%s comm %s: cycle buffer / cache line %s %s" % (tag, who, m[1].hex(), m[2].hex()))
        if not (chr(m[3][0]).isdigit() and m[3][1] == 0):
            errs.append("%s comm %s: MTU %r not a digit and NUL" % (tag, who, m[3]))
        if any(m[4]) or any(m[5]):
            errs.append("%s comm %s: the blocks around the data connection are not all zero" % (tag, who))
        blocks = [dest(x) for x in m[6:] if len(x) == DEST]
        if any((b["qpn"], b["rkey"], b["vaddr"]) != (blocks[0]["qpn"], blocks[0]["rkey"], blocks[0]["vaddr"])
               for b in blocks):
            errs.append("%s comm %s: keys differ between blocks" % (tag, who))
        keys.append(blocks[0])
        if who == "client" and verb != "send":
            res = m[-6:-1]
            got = struct.unpack(">QQ", res[0] + res[1])
            if got != (size, iters):
                errs.append("%s comm: the client reported size/iterations %s, expected %s" % (tag, got, (size, iters)))
    return keys[0], keys[1]


def check_step(verb, role, size, iters, dump, seed, comm, data, errs):
    tag = "%s_bw_cm (ours: %s)" % (verb, role)
    ini_c, rsp_c, ini_d, rsp_d = comm[0], comm[1], data[0], data[1]
    keys = check_comm(verb, size, iters, ini_c, rsp_c, errs, tag)
    if keys is None:
        return
    ck, sk = keys
    want = open(dump, "rb").read()
    ours_client = role == "client"
    if verb == "send":
        msgs = messages(ini_d, OP_SEND, False)
        if len(msgs) != iters or any(len(p) != size for _, p in msgs):
            errs.append("%s: %d Send messages, sizes %s; expected %d of %d" % (
                tag, len(msgs), sorted({len(p) for _, p in msgs}), iters, size))
            return
        if b"".join(p for _, p in msgs) != want:
            errs.append("%s: the Send messages on the wire differ from what our side %s" % (
                tag, "sent" if ours_client else "received"))
        if ours_client:
            bad = [k for k, (_, p) in enumerate(msgs) if p != pattern(seed + k, size)]
            if bad:
                errs.append("%s: Send messages %s are not our pattern" % (tag, bad[:5]))
        credits = messages(rsp_d, OP_WRITE, True)
        got = [(h["stag"], h["to"], struct.unpack("<I", p)[0]) for h, p in credits if len(p) == 4]
        exp = [(ck["rkey"], ck["vaddr"], r) for r in range(1, iters + 1)
               if (r % rx_depth(iters)) % max(rx_depth(iters) // 3, 1) == 0]
        if got != exp:
            errs.append("%s: credit WRITEs %s, perftest's rule gives %s" % (tag, got[:8], exp[:8]))
        print("   %s: %d Send messages of %d bytes = %s; credit WRITEs %s" % (
            tag, len(msgs), size, "what we sent" if ours_client else "what we received", [c for *_, c in got]))
    elif verb == "write":
        msgs = messages(ini_d, OP_WRITE, True)
        if len(msgs) != iters or any(len(p) != size for _, p in msgs):
            errs.append("%s: %d WRITE messages; expected %d of %d bytes" % (tag, len(msgs), iters, size))
            return
        for k, (h, _) in enumerate(msgs):
            if (h["stag"], h["to"]) != (sk["rkey"], sk["vaddr"] + remote_offset(k, size)):
                errs.append("%s: WRITE %d to %08x/%#x, expected the server's %08x/%#x" % (
                    tag, k, h["stag"], h["to"], sk["rkey"], sk["vaddr"] + remote_offset(k, size)))
                return
        if ours_client:
            if b"".join(p for _, p in msgs) != want:
                errs.append("%s: the WRITEs on the wire differ from what we sent" % tag)
            bad = [k for k, (_, p) in enumerate(msgs) if p != pattern(seed + k, size)]
            if bad:
                errs.append("%s: WRITE messages %s are not our pattern" % (tag, bad[:5]))
        else:
            img = bytearray(len(want))
            for k, (_, p) in enumerate(msgs):
                o = remote_offset(k, size)
                img[o:o + size] = p
            if bytes(img) != want:
                errs.append("%s: our buffer differs from the WRITEs on the wire" % tag)
        print("   %s: %d WRITE messages of %d bytes at the server's offsets = %s" % (
            tag, len(msgs), size, "what we sent" if ours_client else "our buffer"))
    else:
        reqs = [(h, p) for t, _, op, h, p in ini_d if op == OP_RREQ and not t]
        resp = messages(rsp_d, OP_RRESP, True)
        if len(reqs) != iters or len(resp) != iters:
            errs.append("%s: %d Read Requests, %d Read Responses; expected %d" % (tag, len(reqs), len(resp), iters))
            return
        if ours_client is False and want != pattern(seed, len(want)):
            errs.append("%s: our dump is not our read buffer's pattern" % tag)
        for k, ((_, rq), (rh, rp)) in enumerate(zip(reqs, resp)):
            sink_stag, sink_to, rsize, src_stag, src_to = struct.unpack(">IQIIQ", rq[:28])
            off = remote_offset(k, size)
            if (rsize, src_stag, src_to) != (size, sk["rkey"], sk["vaddr"] + off):
                errs.append("%s: Read Request %d for %d bytes at %08x/%#x, expected %d at %08x/%#x" % (
                    tag, k, rsize, src_stag, src_to, size, sk["rkey"], sk["vaddr"] + off))
                return
            if (rh["stag"], rh["to"]) != (sink_stag, sink_to) or rp != want[off:off + size]:
                errs.append("%s: Read Response %d differs from %s at offset %d" % (
                    tag, k, "what we read" if ours_client else "our buffer", off))
                return
        print("   %s: %d Read Request/Response pairs of %d bytes = %s" % (
            tag, iters, size, "what we read" if ours_client else "our buffer"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("capture")
    ap.add_argument("--port", type=int, default=18515)
    ap.add_argument("--ours", required=True, help="our IP address")
    ap.add_argument("--seed", type=lambda x: int(x, 0), required=True)
    ap.add_argument("--step", action="append", default=[], help="VERB:ROLE:SIZE:ITERS:DUMP")
    a = ap.parse_args()
    ss, first = iwarp_check.streams(a.capture)
    conns = []
    for k, (data, gap, _) in sorted(ss.items(), key=lambda kv: first.get(kv[0], 0)):
        if k[3] != a.port or not data.startswith(iwarp_check.KEY_REQ):
            continue
        back = (k[2], k[3], k[0], k[1])
        rdata, rgap, _ = ss.get(back, (b"", None, []))
        req, e1 = iwarp_check.parse_rr(data, iwarp_check.KEY_REQ)
        rep, e2 = iwarp_check.parse_rr(rdata, iwarp_check.KEY_REP)
        if e1 or e2 or gap or rgap:
            print("perftest_cm_check: connection %s: %s" % (k, e1 or e2 or gap or rgap))
            return 1
        conns.append((k, fpdus(data[req["len"]:]), fpdus(rdata[rep["len"]:])))
    errs = []
    if len(conns) != 2 * len(a.step):
        errs.append("%d connections on port %d, %d steps need %d" % (len(conns), a.port, len(a.step), 2 * len(a.step)))
    for i, st in enumerate(a.step):
        if 2 * i + 1 >= len(conns):
            break
        verb, role, size, iters, dump = st.split(":", 4)
        (ck, *comm), (dk, *data) = conns[2 * i], conns[2 * i + 1]
        client_ip = a.ours if role == "client" else None
        if ck[0] != dk[0] or (client_ip and ck[0] != client_ip) or (not client_ip and ck[0] == a.ours):
            errs.append("step %d: connections %s and %s are not one client's pair with ours as %s" % (i + 1, ck, dk, role))
            continue
        try:
            check_step(verb, role, int(size), int(iters), dump, a.seed, comm, data, errs)
        except (ValueError, struct.error, OSError) as e:
            errs.append("step %d (%s): %s" % (i + 1, verb, e))
    for e in errs:
        print("  ERROR " + e)
    print("perftest_cm_check: %d steps, %d connections, %d errors" % (len(a.step), len(conns), len(errs)))
    return 1 if errs else 0


if __name__ == "__main__":
    sys.exit(main())
