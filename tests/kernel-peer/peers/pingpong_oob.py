#!/usr/bin/env python3
"""ibv_rc_pingpong's TCP exchange, without any RDMA (part of smc-rs tests/kernel-peer).

A PEER_CMD for the verbs-server / verbs-client modes with VERBS_TOOLS=pingpong
that proves the plumbing: it is started once per tool with KPEER_TOOL,
KPEER_ROLE, KPEER_PEER_IP, KPEER_PORT, it exchanges queue-pair addresses with
the VM's ibv_rc_pingpong (rdma-core 44) over TCP and exits 0. It has no RoCE
transport, so the VM's tool then waits for SENDs that never come and is stopped
by VERBS_TIMEOUT (busybox timeout: exit status 143): a run with this stand-in fails by design at
exactly that point. A real peer replaces the part after the exchange with
VERBS_ITERS ping-pongs of KPEER_SIZE-byte SENDs, client first.

The exchange: the client connects to port 18515 and writes one message, the
server answers with one, the client writes "done" (5 bytes with the NUL).
A message is "%04x:%06x:%06x:%s" % (LID, QPN, PSN, GID) plus a NUL, 52 bytes;
the GID is 32 lowercase hex digits in wire order (::ffff:a.b.c.d for RoCEv2).
"""
import os
import socket
import sys
import time

MSG_LEN = 52


def log(*a):
    print("[pingpong_oob %.3f]" % time.monotonic(), *a, flush=True)


def my_message(ip):
    gid = b"\0" * 10 + b"\xff\xff" + socket.inet_aton(ip)
    qpn, psn = 0x000ABC, 0x123456  # made up: nothing will answer on them
    m = ("%04x:%06x:%06x:%s" % (0, qpn, psn, gid.hex())).encode() + b"\0"
    assert len(m) == MSG_LEN
    return m


def recv_exact(s, n):
    b = b""
    while len(b) < n:
        c = s.recv(n - len(b))
        if not c:
            raise EOFError("peer closed after %d of %d bytes" % (len(b), n))
        b += c
    return b


def describe(m):
    lid, qpn, psn, gid = m.rstrip(b"\0").decode().split(":")
    return "LID %s QPN 0x%s PSN 0x%s GID %s" % (lid, qpn, psn,
                                                 socket.inet_ntop(socket.AF_INET6, bytes.fromhex(gid)))


def main():
    if os.environ.get("KPEER_TOOL") != "pingpong":
        log("only knows pingpong, not %s" % os.environ.get("KPEER_TOOL"))
        return 1
    port = int(os.environ.get("KPEER_PORT", "18515"))
    me = os.environ["KPEER_LOCAL_IP"]
    if os.environ.get("KPEER_ROLE") == "client":
        s = None
        for _ in range(100):
            try:
                s = socket.create_connection((os.environ["KPEER_PEER_IP"], port), timeout=10)
                break
            except ConnectionRefusedError:
                time.sleep(0.2)
        if s is None:
            log("cannot connect")
            return 1
        s.sendall(my_message(me))
        log("VM's queue pair:", describe(recv_exact(s, MSG_LEN)))
        s.sendall(b"done\0")
    else:
        ls = socket.socket()
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        ls.bind((me, port))
        ls.listen(1)
        ls.settimeout(120)
        s, _ = ls.accept()
        log("VM's queue pair:", describe(recv_exact(s, MSG_LEN)))
        s.sendall(my_message(me))
        recv_exact(s, 5)
    s.close()
    log("exchange done; no RDMA here, so the VM's tool will time out")
    return 0


if __name__ == "__main__":
    sys.exit(main())
