#!/usr/bin/env python3
"""Carrier of a kernel-peer VM's network card, through QEMU's QMP socket.

Usage: vmlink.py OUT VM NIC up|down
  OUT  the run's output directory ($KPEER_OUT); VM server|client|guest; NIC eth0|eth1
"down" is QMP set_link: the guest's virtio-net loses its carrier (the cable pulled),
rdma_rxe on it reports IB_EVENT_PORT_ERR and the kernel's SMC-R takes the links on that
port down (RFC 7609 section 4.6 failover); "up" gives the carrier back (IB_EVENT_PORT_ACTIVE).
Each change is appended to OUT/links.log ("<unix time> VM NIC up|down"). Exit 0 done,
1 QEMU refused or did not answer, 2 usage.
"""
import json
import os
import socket
import sys
import time

NICS = {"eth0": "n0", "eth1": "n1"}


def qmp(path, command, arguments=None):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect(path)
    f = s.makefile("rwb")

    def reply():
        while True:
            line = f.readline()
            if not line:
                raise OSError("QMP closed the connection")
            msg = json.loads(line)
            if "return" in msg or "error" in msg:
                return msg
            # asynchronous events (NIC_RX_FILTER_CHANGED, ...) are skipped

    json.loads(f.readline())  # greeting
    for cmd in ({"execute": "qmp_capabilities"},
                {"execute": command, "arguments": arguments or {}}):
        f.write(json.dumps(cmd).encode() + b"\n")
        f.flush()
        msg = reply()
        if "error" in msg:
            raise OSError("QMP %s: %s" % (cmd["execute"], msg["error"].get("desc", msg["error"])))
    s.close()


def main(argv):
    if len(argv) != 5 or argv[3] not in NICS or argv[4] not in ("up", "down"):
        print(__doc__, file=sys.stderr)
        return 2
    out, vm, nic, state = argv[1:]
    try:
        qmp(os.path.join(out, vm, "qmp.sock"), "set_link",
            {"name": NICS[nic], "up": state == "up"})
    except (OSError, ValueError) as e:
        print("vmlink: %s %s %s: %s" % (vm, nic, state, e), file=sys.stderr)
        return 1
    with open(os.path.join(out, "links.log"), "a") as fh:
        fh.write("%.3f %s %s %s\n" % (time.time(), vm, nic, state))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
