#!/usr/bin/env python3
"""Decode an SMC-R / RoCEv2 capture with tshark and summarise it.

Part of smc-rs tests/kernel-peer. tshark does the dissecting (with our SMC-Rv2
LLC dissector, smc_v2_llc.lua), icrc_check.py checks every RoCEv2 ICRC, and
this script counts what is on the wire:

  * TCP SYN / SYN-ACK segments carrying the SMC-R experimental option,
  * CLC messages by type and direction, first-contact flags, Decline codes,
  * SMC-Rv2 LLC messages by type, request/response and direction, and which
    TEST LINK requests got a response,
  * CDC messages, InfiniBand opcodes, frames tshark calls malformed.

Usage: decode.py CAPTURE OUTDIR [--summary] [--verbose]
Writes OUTDIR/census.json and OUTDIR/census.txt; with --summary also
OUTDIR/summary.txt (one line per SMC/RoCE control frame), with --verbose
OUTDIR/smc-verbose.txt (full trees of SMC, LLC and TCP-option frames).
Exit status: 0 decoded (whatever the content), 2 tshark or input failure.
"""
import argparse
import collections
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import icrc_check  # noqa: E402

LUA = os.path.join(HERE, "smc_v2_llc.lua")
TSHARK_OPTS = [
    "-X", "lua_script:" + LUA,
    "--disable-heuristic", "rpcrdma_infiniband",
    # GSM over IP (ip.access) owns TCP port 5000 by default and calls the TCP payload of
    # a connection that fell back to TCP malformed.
    "--disable-protocol", "gsm_ipa",
    "-o", "tcp.try_heuristic_first:TRUE",
]

CLC_NAMES = {1: "Proposal", 2: "Accept", 3: "Confirm", 4: "Decline"}
LLC2_NAMES = {
    0x21: "CONFIRM_LINK", 0x22: "ADD_LINK", 0x23: "ADD_LINK_CONT", 0x24: "DELETE_LINK",
    0x25: "REQ_ADD_LINK", 0x26: "CONFIRM_RKEY", 0x27: "TEST_LINK", 0x28: "CONFIRM_RKEY_CONT",
    0x29: "DELETE_RKEY",
}
LLC1_NAMES = {k & 0x0F: v for k, v in LLC2_NAMES.items()}
IB_OPCODES = {
    0: "SEND_First", 1: "SEND_Middle", 2: "SEND_Last", 3: "SEND_Last_Imm", 4: "SEND_Only",
    5: "SEND_Only_Imm", 6: "WRITE_First", 7: "WRITE_Middle", 8: "WRITE_Last",
    9: "WRITE_Last_Imm", 10: "WRITE_Only", 11: "WRITE_Only_Imm", 12: "READ_Request",
    13: "READ_Response_First", 14: "READ_Response_Middle", 15: "READ_Response_Last",
    16: "READ_Response_Only", 17: "Acknowledge", 18: "Atomic_Acknowledge",
}

FIELDS = [
    "frame.number", "ip.src", "ip.dst", "tcp.flags", "tcp.options.experimental.exid",
    "tcp.options.experimental.data", "smc.clc_msg", "smc.proposal.first.contact",
    "smc.confirm.first.contact", "smc.peer.diag.info", "smc.llc_msg", "smc.rmbe.ctrl.seqno",
    "smcv2llc.type", "smcv2llc.flags", "smcv2llc.length_big_endian", "infiniband.bth.opcode",
    "_ws.malformed", "infiniband.bth.destqp", "infiniband.bth.psn",
    "iwarp_mpa.rev", "iwarp_mpa.ulpdulength", "iwarp_rdma.opcode",
    "smcv2llc.link_num", "smcv2llc.reason", "smcv2llc.rtoken_others", "frame.time_relative",
]
RDMAP_OPCODES = {0: "RDMAP_Write", 1: "RDMAP_Read_Request", 2: "RDMAP_Read_Response",
                 3: "RDMAP_Send", 4: "RDMAP_Send_Invalidate", 5: "RDMAP_Send_SE",
                 6: "RDMAP_Send_SE_Invalidate", 7: "RDMAP_Terminate"}


def tshark(args, out=None):
    cmd = ["tshark"] + TSHARK_OPTS + args
    try:
        r = subprocess.run(cmd, stdout=out or subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, check=False)
    except FileNotFoundError as e:
        raise SystemExit("decode.py: tshark not found (apt-get install tshark): %s" % e) from e
    if r.returncode != 0:
        raise SystemExit("decode.py: %s failed: %s" % (" ".join(cmd), r.stderr.strip()[-500:]))
    return r.stdout


def as_int(v):
    v = v.split(",")[0].strip()
    if not v:
        return None
    try:
        return int(v, 0)
    except ValueError:
        return None


def census(capture):
    text = tshark(["-r", capture, "-T", "fields", "-E", "separator=/t", "-E", "occurrence=f"]
                  + sum((["-e", f] for f in FIELDS), []))
    c = {
        "frames": 0, "roce_frames": 0, "malformed": 0, "cdc": 0,
        "smc_option": collections.Counter(), "clc": collections.Counter(),
        "first_contact": collections.Counter(), "decline_diag": collections.Counter(),
        "llc": collections.Counter(), "llc_length_big_endian": 0,
        "ib_opcodes": collections.Counter(), "retransmitted": 0,
        "iwarp_frames": 0, "iwarp": collections.Counter(),
        # every v2 LLC message in order: the link-group story (ADD LINK accepted or
        # rejected, CONFIRM LINK on which link, CONFIRM RKEY's rtokens, DELETE LINK reasons)
        "llc_events": [],
    }
    testlink = []  # (src, dst, is_response)
    seen_psn = set()
    for line in text.splitlines():
        f = line.split("\t")
        if len(f) < len(FIELDS):
            f += [""] * (len(FIELDS) - len(f))
        (num, src, dst, tflags, exid, exdata, clc, pfc, cfc, diag, llc1, cdcseq,
         llc2, llc2flags, llc2be, opcode, malformed, destqp, psn,
         mpa_rev, ulpdu_len, rdmap_op, link_num, reason, rt_others, t_rel) = f[:len(FIELDS)]
        if mpa_rev or ulpdu_len:
            c["iwarp_frames"] += 1
            if mpa_rev:
                c["iwarp"]["MPA_Request/Reply rev %s %s>%s" % (mpa_rev, src, dst)] += 1
            for op in rdmap_op.split(","):
                if as_int(op) is not None:
                    c["iwarp"][RDMAP_OPCODES.get(as_int(op), "RDMAP_%s" % op)] += 1
        c["frames"] += 1
        d = "%s>%s" % (src, dst)
        if malformed:
            c["malformed"] += 1
        if exid and as_int(exid) == 0xE2D4 and exdata.startswith("c3d9"):
            fl = as_int(tflags) or 0
            kind = "SYN-ACK" if fl & 0x12 == 0x12 else "SYN" if fl & 0x02 else "other"
            c["smc_option"]["%s %s" % (kind, d)] += 1
        ct = as_int(clc)
        if ct in CLC_NAMES:
            name = CLC_NAMES[ct]
            c["clc"]["%s %s" % (name, d)] += 1
            fc = pfc if ct == 2 else cfc if ct == 3 else ""
            if fc in ("0", "1"):
                c["first_contact"]["%s first_contact=%s" % (name, fc)] += 1
            if ct == 4 and diag:
                c["decline_diag"]["%s %s" % (diag.split(",")[0], d)] += 1
        if opcode:
            c["roce_frames"] += 1
            op = as_int(opcode)
            c["ib_opcodes"][IB_OPCODES.get(op, "opcode_%s" % opcode)] += 1
        # An RC retransmission (same destination QP and PSN again, e.g. when the peer's
        # ACK came late under TCG) is one message on the wire, not a second one.
        if opcode and psn and (cdcseq or llc2 or llc1):
            key = (src, dst, destqp, psn)
            if key in seen_psn:
                c["retransmitted"] += 1
                continue
            seen_psn.add(key)
        if cdcseq:
            c["cdc"] += 1
        lt2 = as_int(llc2)
        if lt2 is not None:
            resp = (as_int(llc2flags) or 0) & 0x80
            name = LLC2_NAMES.get(lt2, "0x%02x" % lt2)
            c["llc"]["v2 %s %s %s" % (name, "response" if resp else "request", d)] += 1
            if llc2be in ("1", "True"):
                c["llc_length_big_endian"] += 1
            if lt2 == 0x27:
                testlink.append((src, dst, bool(resp)))
            else:
                fl2 = as_int(llc2flags) or 0
                ev = {"frame": as_int(num), "time": float(t_rel or 0), "type": name,
                      "response": bool(resp), "src": src, "dst": dst, "flags": fl2}
                if as_int(link_num) is not None:
                    ev["link"] = as_int(link_num)
                if lt2 == 0x22 and resp:
                    ev["rejected"] = bool(fl2 & 0x40)
                if lt2 == 0x24:
                    ev["all"] = bool(fl2 & 0x40)
                    ev["orderly"] = bool(fl2 & 0x20)
                    ev["reason"] = as_int(reason)
                if lt2 == 0x26 and as_int(rt_others) is not None:
                    ev["rtokens"] = as_int(rt_others) + 1
                c["llc_events"].append(ev)
        lt1 = as_int(llc1)
        if lt1 is not None and lt1 != 0xFE and lt1 in LLC1_NAMES:
            c["llc"]["v1 %s %s" % (LLC1_NAMES[lt1], d)] += 1
    # TEST LINK: a request from A to B is answered when a response B->A follows
    pending = collections.Counter()
    tl = collections.defaultdict(lambda: {"requests": 0, "answered": 0})
    for src, dst, resp in testlink:
        if not resp:
            pending[(src, dst)] += 1
            tl["%s>%s" % (src, dst)]["requests"] += 1
        elif pending[(dst, src)] > 0:
            pending[(dst, src)] -= 1
            tl["%s>%s" % (dst, src)]["answered"] += 1
    c["testlink"] = dict(tl)
    return c


def render(c, icrc):
    out = ["frames: %d (RoCEv2 %d, CDC %d, malformed %d)" % (
        c["frames"], c["roce_frames"], c["cdc"], c["malformed"])]
    for title, key in (("SMC-R TCP option", "smc_option"), ("CLC", "clc"),
                       ("CLC first contact", "first_contact"),
                       ("CLC Decline peer diagnosis", "decline_diag"), ("LLC", "llc"),
                       ("InfiniBand opcodes", "ib_opcodes")):
        if c[key]:
            out.append("%s:" % title)
            for k, v in sorted(c[key].items()):
                out.append("  %6d  %s" % (v, k))
    for d, v in sorted(c["testlink"].items()):
        out.append("TEST LINK %s: %d requests, %d answered" % (d, v["requests"], v["answered"]))
    if c.get("llc_events"):
        out.append("LLC messages other than TEST LINK, in order:")
        for e in c["llc_events"]:
            extra = "".join(" %s=%s" % (k, e[k]) for k in ("link", "rejected", "all", "orderly", "rtokens")
                            if k in e)
            if e.get("reason") is not None:
                extra += " reason=0x%08x" % e["reason"]
            out.append("  %8.3fs #%-6s %-13s %-8s %s>%s%s" % (
                e["time"], e["frame"], e["type"], "response" if e["response"] else "request",
                e["src"], e["dst"], extra))
    if c["retransmitted"]:
        out.append("RC retransmissions of SMC messages (counted once above): %d" % c["retransmitted"])
    if c["llc_length_big_endian"]:
        out.append("WARNING: %d LLC messages with a big-endian length_v2" % c["llc_length_big_endian"])
    out.append("RoCEv2 ICRC: %d ok, %d bad, %d truncated" % (icrc["ok"], icrc["bad"], icrc["truncated"]))
    for b in icrc["bad_frames"]:
        out.append("  bad ICRC in frame %d: computed %s, on the wire %s" % (b["frame"], b["computed"], b["wire"]))
    return "\n".join(out) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("capture")
    ap.add_argument("outdir")
    ap.add_argument("--summary", action="store_true", help="write summary.txt")
    ap.add_argument("--verbose", action="store_true", help="write smc-verbose.txt")
    args = ap.parse_args(argv)
    os.makedirs(args.outdir, exist_ok=True)
    try:
        icrc = icrc_check.check(args.capture)
    except icrc_check.CaptureError as e:
        print("decode.py: %s: %s" % (args.capture, e), file=sys.stderr)
        return 2
    c = census(args.capture)
    c["icrc"] = icrc
    with open(os.path.join(args.outdir, "census.json"), "w") as fh:
        json.dump(c, fh, indent=1, sort_keys=True)
    with open(os.path.join(args.outdir, "census.txt"), "w") as fh:
        fh.write(render(c, icrc))
    if args.summary:
        # every frame except the bulk of the data (WRITE/SEND Middle)
        with open(os.path.join(args.outdir, "summary.txt"), "w") as fh:
            tshark(["-r", args.capture, "-Y",
                    "!(infiniband.bth.opcode == 7 || infiniband.bth.opcode == 1)"], out=fh)
    if args.verbose:
        with open(os.path.join(args.outdir, "smc-verbose.txt"), "w") as fh:
            tshark(["-r", args.capture, "-Y", "smc || smcv2llc || tcp.options.experimental.exid == 0xe2d4",
                    "-V", "-O", "smc,smcv2llc,tcp"], out=fh)
    return 0


if __name__ == "__main__":
    sys.exit(main())
