#!/usr/bin/env python3
"""Plain-TCP stand-in for PEER_CMD (part of smc-rs tests/kernel-peer).

It speaks the "echo" scenario over an ordinary TCP socket, so it never offers
SMC-R: the kernel VM must fall back to TCP with reason PEERNOSMC. The
harness's self-tests use it to prove that PEER_CMD is started, gets its
environment and that its exit status counts. It also shows what a real peer
does with the KPEER_* variables, and it is the reference for the data pattern.

Client role (KPEER_ROLE=client, kernel server VM): one connection per entry of
KPEER_SIZES (or KPEER_CONNS connections cycling through it) to
KPEER_PEER_IP:KPEER_PORT; connection i sends the pattern with seed i, half-closes,
and checks the echo byte for byte.
Server role (KPEER_ROLE=server, kernel client VM): listens on
KPEER_LOCAL_IP:KPEER_PORT, echoes each connection until EOF, and exits after
the planned number of connections.
Exit status: 0 all connections verified, 1 otherwise.
"""
import os
import socket
import sys
import time

MASK = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15


def mix64(z):
    """splitmix64 finaliser"""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def pattern(seed, off, n):
    """Bytes off..off+n of the stream with this seed: byte i is byte i%8
    (little-endian) of mix64((seed + 1) * GOLDEN + i // 8)."""
    base = ((seed + 1) * GOLDEN) & MASK
    first, last = off // 8, (off + n + 7) // 8
    words = b"".join(mix64((base + w) & MASK).to_bytes(8, "little") for w in range(first, last))
    start = off - first * 8
    return words[start:start + n]


def parse_size(s):
    mult = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    s = s.strip()
    if s and s[-1].lower() in mult:
        return int(s[:-1]) * mult[s[-1].lower()]
    return int(s)


def log(*a):
    print("[tcp_peer %.3f]" % time.monotonic(), *a, flush=True)


def plan():
    sizes = [parse_size(s) for s in os.environ.get("KPEER_SIZES", "4096").split(",") if s]
    conns = int(os.environ.get("KPEER_CONNS") or len(sizes))
    return sizes, conns


def client():
    host, port = os.environ["KPEER_PEER_IP"], int(os.environ["KPEER_PORT"])
    sizes, conns = plan()
    ok = True
    for i in range(conns):
        size = sizes[i % len(sizes)]
        data = pattern(i, 0, size)
        with socket.create_connection((host, port), timeout=30) as s:
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
            got = bytearray()
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                got += chunk
        good = bytes(got) == data
        ok &= good
        log("conn %d: sent %d, echoed %d, %s" % (i, size, len(got), "verified" if good else "MISMATCH"))
    return ok


def server():
    host, port = os.environ["KPEER_LOCAL_IP"], int(os.environ["KPEER_PORT"])
    _, conns = plan()
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind((host, port))
    ls.listen(8)
    ls.settimeout(300)
    for i in range(conns):
        c, addr = ls.accept()
        c.settimeout(60)
        n = 0
        with c:
            while True:
                chunk = c.recv(65536)
                if not chunk:
                    break
                c.sendall(chunk)
                n += len(chunk)
        log("conn %d from %s:%d: echoed %d bytes" % (i, addr[0], addr[1], n))
    return True


def main():
    role = os.environ.get("KPEER_ROLE")
    if os.environ.get("KPEER_SCEN", "echo") != "echo":
        log("only the echo scenario is implemented here")
        return 1
    log("role %s, mode %s, logs in %s" % (role, os.environ.get("KPEER_MODE"), os.environ.get("KPEER_LOGDIR")))
    try:
        ok = client() if role == "client" else server() if role == "server" else False
    except OSError as e:
        log("error: %s" % e)
        ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
