#!/usr/bin/env python3
"""Verdict of a tests/kernel-peer run (called by run.sh; usable on its own).

Reads OUT/config.env, the result lines every VM wrote (OUT/<vm>/results.log:
"KPEER <event> vm=<name> key=value ..."), the kernel log lines in the same
file ("KPEER-DMESG ..."), PEER_CMD's exit statuses (OUT/peer/steps.tsv) and
the capture census (OUT/decode/census.json), applies the checks of the run's
mode and writes OUT/verdict.txt, OUT/verdict.json, OUT/<vm>/dmesg.txt and
OUT/<vm>/verbs-<tool>.txt.

Usage: verdict.py OUT
Exit status: 0 every check passed, 1 a check failed, 3 the harness itself
failed (a VM did not boot or finish, a wait timed out).
"""
import collections
import json
import os
import re
import sys

# Kernel messages that mean a peer broke the protocol or the kernel broke.
DMESG_FAIL = [
    r"LLC protocol violation",
    r"dropped unexpected LLC msg",
    r"\bBUG:",
    r"\bOops\b",
    r"WARNING: CPU:",
    r"general protection fault",
    r"Kernel panic",
    r"blocked for more than \d+ seconds",
    r"soft lockup",
    r"UBSAN:",
    r"KASAN:",
]
# A kernel line on a VM's console: "[ seconds.micros] text", possibly after the end of
# a line that userspace wrote at the same moment (no newline in between)
CONSOLE_KERNEL_LINE = re.compile(r"\[ *\d+\.\d+\] [^\n]*")

# SMC-R messages worth showing (not failures by themselves)
DMESG_INFO = [
    r"smc: SMC-R lg .*",
    r"rdma_rxe: .*",
    # A TCG guest on a loaded host reports RCU stalls when the host starves its vCPU
    # (seen at boot, before any SMC traffic, while the host compiled); not a failure.
    r"rcu: .*stall",
]

# Under TCG (no KVM) the emulator now and then raises a debug exception (#DB) in the
# guest kernel with no debugger attached: the kernel warns in exc_debug_kernel, with
# EFLAGS bits above 31 set that no x86 CPU has (seen once in rxe's receive path while
# the host was loaded). An artefact of the emulator, not of either SMC-R stack: shown
# as a warning, not counted as a kernel error.
DMESG_TCG_ARTEFACTS = [
    r"WARNING: CPU: .* at arch/x86/kernel/traps\.c:\d+ exc_debug_kernel",
]

# the PEER_CMD exit status of a process killed by our SIGTERM (bash: 128+15)
TERMINATED_STATUSES = ("143", "-15", "0")


def parse_kv(text):
    kv = {}
    for word in text.split():
        if "=" in word:
            k, v = word.split("=", 1)
            kv[k] = v
    return kv


def read_config(out):
    cfg = {}
    with open(os.path.join(out, "config.env")) as fh:
        for line in fh:
            line = line.rstrip("\n")
            if "=" in line:
                k, v = line.split("=", 1)
                cfg[k] = v
    return cfg


class Vm:
    def __init__(self, out, name):
        self.name = name
        self.dir = os.path.join(out, name)
        self.events = []  # (event, kv)
        self.dmesg = []
        self.tool_out = {}
        # a tool's output since its last result, handed to the next result ("_out")
        pending = {}
        path = os.path.join(self.dir, "results.log")
        raw = ""
        if os.path.exists(path):
            with open(path, "rb") as fh:
                raw = fh.read().decode("utf-8", "replace")
        for line in raw.replace("\r", "").split("\n"):
            if line.startswith("KPEER-DMESG "):
                self.dmesg.append(line[len("KPEER-DMESG "):])
            elif line.startswith("KPEER-OUT "):
                parts = line.split(" ", 2)
                if len(parts) >= 2:
                    text = parts[2] if len(parts) > 2 else ""
                    self.tool_out.setdefault(parts[1], []).append(text)
                    pending.setdefault(parts[1], []).append(text)
            elif line.startswith("KPEER "):
                parts = line.split(" ", 2)
                if len(parts) >= 2:
                    kv = parse_kv(parts[2] if len(parts) > 2 else "")
                    if parts[1] == "verbs":
                        kv["_out"] = pending.pop(kv.get("tool"), [])
                    self.events.append((parts[1], kv))
        if self.dmesg:
            with open(os.path.join(self.dir, "dmesg.txt"), "w") as fh:
                fh.write("\n".join(self.dmesg) + "\n")
        # The console (console.log, loglevel=4: errors and worse) has the kernel's own
        # lines, which a VM that crashed or hung never sends as its dmesg: an oops there
        # must fail the run even when the results hold no dmesg at all.
        self.console = []
        path = os.path.join(self.dir, "console.log")
        if os.path.exists(path):
            with open(path, "rb") as fh:
                text = fh.read().decode("utf-8", "replace").replace("\r", "")
            self.console = [m.group(0) for m in CONSOLE_KERNEL_LINE.finditer(text)]
        for tool, lines in self.tool_out.items():
            with open(os.path.join(self.dir, "verbs-%s.txt" % tool), "w") as fh:
                fh.write("\n".join(lines) + "\n")

    def all(self, event):
        return [kv for ev, kv in self.events if ev == event]

    def first(self, event):
        found = self.all(event)
        return found[0] if found else None


class Verdict:
    def __init__(self):
        self.lines = []
        self.failed = 0

    def check(self, ok, what):
        self.lines.append(("PASS " if ok else "FAIL ") + what)
        if not ok:
            self.failed += 1
        return ok

    def info(self, what):
        self.lines.append("INFO " + what)

    def warn(self, what):
        self.lines.append("WARN " + what)


def planned_conns(cfg):
    if cfg.get("CONNS"):
        return int(cfg["CONNS"])
    scen = cfg.get("SCEN", "echo")
    if scen == "echo":
        return len([s for s in cfg.get("SIZES", "4096").split(",") if s])
    return {"multi": 8, "abort": 2}.get(scen, 1)


def check_mode(v, expect, vm, conn):
    """Does one connection's smc_diag result match EXPECT?"""
    mode, reason = conn.get("mode"), conn.get("reason_name", "?")
    desc = "%s conn %s (%s): mode=%s reason=%s peer_diag=%s" % (
        vm.name, conn.get("idx"), conn.get("role"), mode, reason, conn.get("peer_diag_name", "?"))
    if expect == "any":
        v.info(desc)
        return
    if expect == "smcr":
        v.check(mode == "SMCR", desc + " (expected SMCR)")
        # smc_diag again after the data (before close): still SMCR, also after a failover
        end_mode = conn.get("end_mode")
        if end_mode not in (None, "-"):
            v.check(end_mode == "SMCR", "%s conn %s: smc_diag after the data: mode=%s link %s (%s)%s" % (
                vm.name, conn.get("idx"), end_mode, conn.get("end_link_id"), conn.get("end_ibdev"),
                "" if end_mode == "SMCR" else " (expected SMCR)"))
    elif expect == "fallback":
        v.check(mode == "FALLBACK", desc + " (expected a TCP fallback)")
    elif expect == "peernosmc":
        v.check(mode == "FALLBACK" and reason == "PEERNOSMC",
                desc + " (expected a fallback with PEERNOSMC: the peer did not offer SMC)")
    elif expect == "decline":
        if conn.get("role") == "client":
            ok = mode == "FALLBACK" and reason == "PEERDECL"
            v.check(ok, desc + " (expected a fallback after the peer's CLC Decline: PEERDECL)")
        else:
            # the kernel server declined itself: any reason except "the peer
            # did not even offer SMC"
            ok = mode == "FALLBACK" and reason not in ("PEERNOSMC", "NONE")
            v.check(ok, desc + " (expected a fallback after this kernel's own CLC Decline)")


def scan_dmesg(v, vm, extra, tcg=False):
    pats = DMESG_FAIL + ([extra] if extra else [])
    seen = set(l.strip() for l in vm.dmesg)
    lines = vm.dmesg + [l for l in vm.console if l.strip() not in seen]
    bad = [l for l in lines if any(re.search(p, l) for p in pats)]
    if tcg:
        artefacts = [l for l in bad if any(re.search(p, l) for p in DMESG_TCG_ARTEFACTS)]
        for l in artefacts:
            v.warn("%s kernel: emulator artefact (TCG), not counted: %s" % (vm.name, l.strip()))
        bad = [l for l in bad if l not in artefacts]
    v.check(not bad, "%s kernel log: %d protocol-violation/kernel-error lines%s" % (
        vm.name, len(bad), (": " + " | ".join(bad[:5])) if bad else ""))
    infos = [l for l in vm.dmesg if any(re.search(p, l) for p in DMESG_INFO)]
    for l in infos[:12]:
        v.info("%s kernel: %s" % (vm.name, l.strip()))


def vm_basics(v, vm, cfg_links="1"):
    boot, ready, end = vm.first("boot"), vm.first("ready"), vm.first("end")
    v.check(boot is not None and ready is not None,
            "%s booted and got ready%s" % (vm.name, " (kernel %s, rxe gid %s)" % (
                boot.get("kernel"), ready.get("gid")) if boot and ready else ""))
    if ready is not None and cfg_links == "2":
        v.check(ready.get("gid2") is not None, "%s has its second NIC and RDMA device (LINKS=2): %s %s gid %s" % (
            vm.name, ready.get("ip2"), ready.get("rxe2"), ready.get("gid2")))
    for f in vm.all("fatal"):
        v.check(False, "%s fatal error at stage %s" % (vm.name, f.get("stage")))
    for e in vm.all("error"):
        v.check(False, "%s error: %s" % (vm.name, " ".join("%s=%s" % kv for kv in e.items())))
    v.check(end is not None, "%s finished (end line present)" % vm.name)
    if ready:
        v.info("%s: ready after %ss of guest uptime" % (vm.name, ready.get("uptime")))
    for s in vm.all("sysctl"):
        v.check(s.get("ok") == "1", "%s sysctl %s" % (vm.name, s.get("set")))


def peer_steps(out):
    steps = []
    path = os.path.join(out, "peer", "steps.tsv")
    if os.path.exists(path):
        with open(path) as fh:
            for line in fh:
                f = line.rstrip("\n").split("\t")
                if len(f) == 3:
                    steps.append(f)
    return steps


def check_peer(v, cfg, steps, want):
    must_exit = cfg.get("PEER_MUST_EXIT") == "1"
    got = {s[0]: s for s in steps}
    for step in want:
        s = got.get(step)
        if s is None:
            v.check(False, "PEER_CMD (%s) was not run" % step)
            continue
        _, rc, how = s
        if how == "exited":
            v.check(rc == "0", "PEER_CMD (%s) exit status %s" % (step, rc))
        elif how == "terminated" and not must_exit:
            v.check(rc in TERMINATED_STATUSES,
                    "PEER_CMD (%s) still running at the end, stopped with SIGTERM (status %s)" % (step, rc))
        else:
            v.check(False, "PEER_CMD (%s) %s, status %s" % (step, how, rc))


def check_capture(v, cfg, out, kernel_ips):
    if cfg.get("CAPTURE") != "1" or cfg.get("DECODE") != "1":
        v.info("capture checks skipped (CAPTURE=%s DECODE=%s)" % (cfg.get("CAPTURE"), cfg.get("DECODE")))
        return None
    path = os.path.join(out, "decode", "census.json")
    if not os.path.exists(path):
        v.check(False, "capture decoded (no %s)" % path)
        return None
    with open(path) as fh:
        c = json.load(fh)
    icrc = c["icrc"]
    v.check(icrc["bad"] == 0, "RoCEv2 ICRC of every frame: %d ok, %d bad%s" % (
        icrc["ok"], icrc["bad"], "".join(" (frame %d)" % b["frame"] for b in icrc["bad_frames"][:5])))
    if icrc["truncated"]:
        v.warn("%d RoCEv2 frames truncated by SNAPLEN, their ICRC was not checked" % icrc["truncated"])
    if c["malformed"]:
        v.warn("tshark flags %d frames as malformed (see decode/summary.txt)" % c["malformed"])
    if c["llc_length_big_endian"]:
        v.warn("%d SMC-Rv2 LLC messages carry length_v2 big-endian; x86 Linux sends it little-endian"
               % c["llc_length_big_endian"])
    for k, n in sorted(c["smc_option"].items()):
        v.info("wire: SMC-R TCP option in %s x%d" % (k, n))
    for k, n in sorted(c["clc"].items()):
        v.info("wire: CLC %s x%d" % (k, n))
    for k, n in sorted(c["decline_diag"].items()):
        v.info("wire: CLC Decline peer diagnosis %s x%d" % (k, n))
    for k, n in sorted(c["llc"].items()):
        v.info("wire: LLC %s x%d" % (k, n))
    for d, t in sorted(c["testlink"].items()):
        v.info("wire: TEST LINK %s: %d requests, %d answered" % (d, t["requests"], t["answered"]))
    if cfg.get("CHECK_TESTLINK") == "1":
        sent = {d: t for d, t in c["testlink"].items() if d.split(">")[0] in kernel_ips}
        answered = sum(t["answered"] for t in sent.values())
        v.check(answered > 0 and all(t["answered"] == t["requests"] for t in c["testlink"].values()),
                "TEST LINK: a kernel's request was answered and every request got a response (%s)" %
                (", ".join("%s %d/%d" % (d, t["answered"], t["requests"]) for d, t in sorted(c["testlink"].items()))
                 or "no TEST LINK on the wire"))
    return c


def smc_checks(v, cfg, out, vms, steps):
    mode, expect = cfg["MODE"], cfg.get("EXPECT", "smcr")
    planned = planned_conns(cfg)
    all_conns = []
    for vm in vms:
        conns = vm.all("conn")
        all_conns += [(vm, c) for c in conns]
        role_client = vm.name == "client"
        if role_client:
            done = vm.first("client-done")
            v.check(done is not None and len(conns) == planned,
                    "%s made %d of %d planned connections (scenario %s)" % (vm.name, len(conns), planned, cfg["SCEN"]))
        else:
            served = vm.first("served")
            if mode == "smc-pair" or cfg.get("CONNS"):
                v.check(len(conns) == planned, "%s served %d of %d connections" % (vm.name, len(conns), planned))
            else:
                v.check(len(conns) >= 1, "%s served %d connection(s) from PEER_CMD" % (vm.name, len(conns)))
            v.check(served is not None, "%s server stopped cleanly" % vm.name)
        for c in conns:
            ok = c.get("result") == "ok"
            desc = "%s conn %s (%s, %s): %s bytes sent, %s received, %s mismatches, %ss" % (
                vm.name, c.get("idx"), c.get("role"), c.get("scen"), c.get("sent"), c.get("recv"),
                c.get("mismatch"), c.get("secs"))
            if c.get("detail", "-") != "-":
                desc += ", " + c["detail"]
            if not ok:
                desc += ", error " + c.get("err", "?")
            v.check(ok, desc)
            check_mode(v, expect, vm, c)
            if c.get("mode") == "SMCR":
                v.info("%s conn %s: link group(s) %s, link %s, %s -> %s, rmbe %s, peer_rmbe %s" % (
                    vm.name, c.get("idx"), c.get("lgrs"), c.get("link_id"), c.get("gid"),
                    c.get("peer_gid"), c.get("rmbe"), c.get("peer_rmbe")))
        for s in vm.all("stats"):
            v.info("%s SMC statistics: %s" % (vm.name, " ".join("%s=%s" % kv for kv in s.items() if kv[0] != "vm")))
        for s in vm.all("fallback-stats"):
            v.info("%s fallback counter: %s" % (vm.name, " ".join("%s=%s" % kv for kv in s.items() if kv[0] != "vm")))
        for kind in ("lgr", "link"):
            for l in vm.all(kind):
                v.info("%s %s: %s" % (vm.name, "link group" if kind == "lgr" else "link",
                                      " ".join("%s=%s" % kv for kv in l.items() if kv[0] != "vm")))
        for t in vm.all("teardown"):
            v.check(t.get("ok") == "1", "%s teardown %s" % (vm.name, t.get("how")))
    # link-group reuse: on SMC-R, all sequential connections of one VM should
    # sit in the same link group
    if expect == "smcr":
        for vm in vms:
            ids = {c.get("lgrs", "?") for c in vm.all("conn") if c.get("mode") == "SMCR"}
            if len(vm.all("conn")) > 1:
                v.info("%s: link groups seen by its connections: %s" % (vm.name, ", ".join(sorted(ids))))
    if mode == "smc-server":
        check_peer(v, cfg, steps, ["smc-client"])
    elif mode == "smc-client":
        check_peer(v, cfg, steps, ["smc-server"])
    kernel_ips = {cfg["SERVER_IP"], cfg["CLIENT_IP"]}
    c = check_capture(v, cfg, out, kernel_ips)
    if c is not None and cfg.get("CHECK_OPTION") == "1":
        # RFC 7609 §3.5.1: the client's SYN carries the SMC-R option, the
        # server's SYN-ACK echoes it, then the client sends its CLC Proposal
        cli, srv = {"smc-pair": (cfg["CLIENT_IP"], cfg["SERVER_IP"]),
                    "smc-server": (cfg["PEER_IP"], cfg["SERVER_IP"]),
                    "smc-client": (cfg["CLIENT_IP"], cfg["PEER_IP"])}[mode]
        wanted = (("smc_option", "SYN %s>%s" % (cli, srv), "SYN with the SMC-R option"),
                  ("smc_option", "SYN-ACK %s>%s" % (srv, cli), "SYN-ACK echoing the SMC-R option"),
                  ("clc", "Proposal %s>%s" % (cli, srv), "CLC Proposal"))
        for table, key, what in wanted:
            n = c[table].get(key, 0)
            v.check(n > 0, "%s %s: %d on the wire" % (what, key.split(" ", 1)[1], n))
    if c is not None:
        if expect == "decline":
            declines = sum(n for k, n in c["clc"].items() if k.startswith("Decline"))
            v.check(declines > 0, "a CLC Decline is on the wire (%d)" % declines)
        if expect == "smcr" and all_conns:
            v.check(c["roce_frames"] > 0, "RoCEv2 traffic on the wire (%d frames)" % c["roce_frames"])


VERBS_PERF = [
    (re.compile(r"^\s*(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s*$"), "bw",
     "bytes=%s iters=%s peak=%sMB/s avg=%sMB/s rate=%sMpps"),
    (re.compile(r"(\d+) bytes in ([\d.]+) seconds = ([\d.]+) Mbit/sec"), "pp", "%s bytes in %ss = %s Mbit/s"),
    (re.compile(r"(\d+) iters in ([\d.]+) seconds = ([\d.]+) usec/iter"), "pp", "%s iters in %ss = %s usec/iter"),
]


def verbs_perf(lines):
    found = []
    lat_header = False
    for l in lines:
        if "t_typical" in l:
            lat_header = True
            continue
        if lat_header:
            f = l.split()
            if len(f) >= 5 and f[0].isdigit():
                found.append("bytes=%s iters=%s t_min=%sus t_max=%sus t_typical=%sus" % tuple(f[:5]))
                lat_header = False
            continue
        for rx, _, fmt in VERBS_PERF:
            m = rx.search(l)
            if m:
                found.append(fmt % m.groups())
    return found


def rping_teardown_race(mode, tool, r):
    """rping's client exits 255 when its CM thread, woken by the server's disconnect,
    reads the event channel that the main thread has just destroyed (rdma-core's
    librdmacm/examples/rping.c: perror("rdma_get_cm_event"), exit): after every ping.
    Only where PEER_CMD is our server (verbs-client), whose own exit status says that
    it verified every ping, is that the tool's teardown and not a failed run."""
    out = r.get("_out", [])
    return (mode == "verbs-client" and tool == "rping" and r.get("role") == "client"
            and r.get("rc") == "255" and any("DISCONNECT EVENT" in l for l in out)
            and bool(out) and "rdma_get_cm_event: Bad file descriptor" in out[-1])


def verbs_checks(v, cfg, out, vms, steps):
    mode = cfg["MODE"]
    tools = [t for t in cfg.get("VERBS_TOOLS", "").split(",") if t]
    for vm in vms:
        # results in run order; a tool listed twice has two results
        runs = collections.defaultdict(list)
        for r in vm.all("verbs"):
            runs[r.get("tool")].append(r)
        seen = collections.Counter()
        for i, t in enumerate(tools, 1):
            k = seen[t]
            seen[t] += 1
            r = runs[t][k] if k < len(runs[t]) else None
            desc = "%s %s (step %d) as %s: exit status %s%s" % (
                vm.name, t, i, r.get("role") if r else "?", r.get("rc") if r else "none",
                " in %ss" % r.get("secs") if r else "")
            if r is not None and rping_teardown_race(mode, t, r):
                v.warn(desc + ": rping's teardown race after the server's disconnect "
                       "(PEER_CMD's exit status below checks the pings)")
            else:
                v.check(r is not None and r.get("rc") == "0", desc)
            if r:
                v.info("%s %s command: %s" % (vm.name, t, r.get("cmd", "").replace("+", " ")))
            if k == 0:
                for p in verbs_perf(vm.tool_out.get(t, [])):
                    v.info("%s %s: %s (TCG numbers, not hardware)" % (vm.name, t, p))
    if mode in ("verbs-server", "verbs-client"):
        check_peer(v, cfg, steps, ["%s@%d" % (t, i) for i, t in enumerate(tools, 1)])
    c = check_capture(v, cfg, out, {cfg["SERVER_IP"], cfg["CLIENT_IP"]})
    if c is not None and cfg.get("RDMA_DEV", "rxe") == "siw":
        # iWARP runs over TCP; the MPA/DDP/RDMAP checks are decode/iwarp_check.py's
        v.check(c.get("iwarp_frames", 0) > 0, "iWARP (MPA) traffic on the wire (%d frames)"
                % c.get("iwarp_frames", 0))
        for k, n in sorted(c.get("iwarp", {}).items()):
            v.info("wire: %s x%d" % (k, n))
    elif c is not None:
        v.check(c["roce_frames"] > 0, "RoCEv2 traffic on the wire (%d frames)" % c["roce_frames"])
        for k, n in sorted(c["ib_opcodes"].items()):
            v.info("wire: %s x%d" % (k, n))


def main(argv):
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    out = argv[1]
    cfg = read_config(out)
    vms = [Vm(out, n) for n in ("server", "client") if os.path.exists(os.path.join(out, n, "kpeer.conf"))]
    # PEER_VM=1: VM "guest" runs PEER_CMD (its steps are in steps.tsv like any PEER_CMD's)
    guest = Vm(out, "guest") if os.path.exists(os.path.join(out, "guest", "kpeer.conf")) else None
    steps = peer_steps(out)
    v = Verdict()
    v.info("mode %s, kernel %s %s, accelerator %s" % (cfg.get("MODE"), cfg.get("KPKG"), cfg.get("KDEBVER"),
                                                      cfg.get("ACCEL")))
    infra = cfg.get("INFRA_ERRORS", "").split()
    for e in infra:
        v.check(False, "harness: " + e)
    for vm in vms + ([guest] if guest else []):
        vm_basics(v, vm, cfg.get("LINKS", "1"))
        scan_dmesg(v, vm, cfg.get("DMESG_FAIL", ""), cfg.get("ACCEL") == "tcg")
    if cfg["MODE"] == "peer-host":
        check_peer(v, cfg, steps, ["guest", "host"])
        c = check_capture(v, cfg, out, [])
        if c is not None:
            v.check(c["icrc"]["ok"] > 0, "RoCEv2 traffic between the guest and the host")
    elif cfg["MODE"].startswith("smc-"):
        smc_checks(v, cfg, out, vms, steps)
    else:
        verbs_checks(v, cfg, out, vms, steps)
    status = "PASS" if v.failed == 0 else "FAIL"
    v.lines.append("VERDICT: %s (%d failed checks)" % (status, v.failed))
    text = "\n".join(v.lines) + "\n"
    with open(os.path.join(out, "verdict.txt"), "w") as fh:
        fh.write(text)
    conns = [dict(c, vm=vm.name) for vm in vms for c in vm.all("conn")]
    with open(os.path.join(out, "verdict.json"), "w") as fh:
        json.dump({"verdict": status, "failed": v.failed, "checks": v.lines, "conns": conns,
                   "peer_steps": steps, "infra_errors": infra}, fh, indent=1)
    sys.stdout.write(text)
    if infra:
        return 3
    return 0 if v.failed == 0 else 1


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv))
    except (OSError, KeyError, ValueError, TypeError) as e:
        # a verdict that cannot be reached is a harness failure, never a pass
        print("FAIL verdict.py could not judge the run: %r" % e)
        sys.exit(3)
