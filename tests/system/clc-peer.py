#!/usr/bin/env python3
"""A scripted CLC peer for tests/system/smc-fallback.sh: a server that answers an SMC
client's CLC Proposal with a Decline or with garbage, and a client that sends garbage to
an SMC listener. It speaks just enough CLC (RFC 7609 A.2) to do that, with its own
byte layouts, so that it checks our stack from the outside.

server --listen HOST:PORT --action decline|garbage|junk [--code HEX]
    Accepts one connection and reads the CLC Proposal (prints `proposal type=.. len=..
    version=..`). Then:
      decline  sends a v1 Decline (28 bytes) with diagnosis --code (default 0x03030002,
               no SMC-R device) and, as the RFC wants after a Decline, carries on as
               plain TCP: echoes everything until end of stream (prints `echoed N`);
      garbage  sends a CLC header with the SMC-R eye catcher, type Accept and a length
               (12) that matches no Accept layout, then 4 more bytes;
      junk     sends 64 bytes that are not CLC at all.
    For garbage/junk it then reads until end of stream or reset and prints `peer-eof`,
    `peer-reset` or `peer-data N`.
client --connect HOST:PORT --send junk|bad-proposal
    Connects (a plain TCP client, no SMC-R option) and sends the garbage, then prints
    what came back: `decline diagnosis=0x........`, `reset`, `eof` or `data N`.
Every line goes to stdout; `listening port=P` is printed once the server listens.
"""
import argparse
import socket
import struct
import sys

EYE_R = bytes.fromhex("e2d4c3d9")  # "SMCR" in EBCDIC (RFC 7609 A.2)
CLC_PROPOSAL, CLC_ACCEPT, CLC_CONFIRM, CLC_DECLINE = 1, 2, 3, 4


def hostport(s):
    host, _, port = s.rpartition(":")
    return host.strip("[]"), int(port)


def read_exact(sock, n):
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise EOFError(f"end of stream after {len(buf)} of {n} bytes")
        buf += chunk
    return buf


def read_clc(sock):
    hdr = read_exact(sock, 8)
    length = struct.unpack(">H", hdr[5:7])[0]
    if hdr[:4] != EYE_R or length < 12:
        raise ValueError(f"not a CLC message: {hdr.hex()}")
    return hdr + read_exact(sock, length - 8)


def decline_v1(code):
    # RFC 7609 A.2.5: eye catcher, type 4, length 28, version 1 (high nibble), peer ID,
    # diagnosis, 4 reserved bytes (OS type nibble 0 in v1), trailing eye catcher.
    peer_id = b"\x00\x01" + bytes.fromhex("020000c0ffee")
    return EYE_R + bytes([CLC_DECLINE]) + struct.pack(">H", 28) + bytes([0x10]) \
        + peer_id + struct.pack(">I", code) + b"\x00" * 4 + EYE_R


def drain(sock):
    total = 0
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return f"peer-eof after {total}" if total else "peer-eof"
            total += len(chunk)
    except ConnectionResetError:
        return "peer-reset"
    except socket.timeout:
        return f"timeout (peer-data {total})"


def server(args):
    host, port = hostport(args.listen)
    fam = socket.AF_INET6 if ":" in host else socket.AF_INET
    ls = socket.socket(fam, socket.SOCK_STREAM)
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind((host, port))
    ls.listen(8)
    print(f"listening port={ls.getsockname()[1]}", flush=True)
    ls.settimeout(args.timeout)
    conn, peer = ls.accept()
    conn.settimeout(args.timeout)
    try:
        msg = read_clc(conn)
    except (ValueError, EOFError) as e:
        print(f"no-proposal {e}", flush=True)
        return 1
    print(f"proposal type={msg[4]} len={len(msg)} version={msg[7] >> 4}", flush=True)
    if msg[4] != CLC_PROPOSAL:
        return 1
    if args.action == "decline":
        conn.sendall(decline_v1(int(args.code, 16)))
        # After a Decline the connection is plain TCP (RFC 7609 §3.5.1.3): echo.
        total = 0
        while True:
            chunk = conn.recv(65536)
            if not chunk:
                break
            conn.sendall(chunk)
            total += len(chunk)
        conn.shutdown(socket.SHUT_WR)
        print(f"echoed {total}", flush=True)
    elif args.action == "garbage":
        conn.sendall(EYE_R + bytes([CLC_ACCEPT]) + struct.pack(">H", 12) + bytes([0x10]) + b"\xde\xad\xbe\xef")
        print(drain(conn), flush=True)
    else:
        conn.sendall(bytes(range(0x40, 0x80)))
        print(drain(conn), flush=True)
    conn.close()
    return 0


def client(args):
    host, port = hostport(args.connect)
    s = socket.create_connection((host, port), timeout=args.timeout)
    if args.send == "junk":
        s.sendall(b"GET / HTTP/1.0\r\n\r\n" + bytes(range(0x40, 0x80)))
    else:
        # A Proposal header whose length (20) is far too short for any Proposal layout.
        s.sendall(EYE_R + bytes([CLC_PROPOSAL]) + struct.pack(">H", 20) + bytes([0x10]) + b"\x00" * 8 + EYE_R)
    try:
        first = s.recv(8)
        if not first:
            print("eof", flush=True)
        elif first[:4] == EYE_R and len(first) >= 5 and first[4] == CLC_DECLINE:
            rest = read_exact(s, struct.unpack(">H", first[5:7])[0] - len(first))
            msg = first + rest
            print(f"decline diagnosis=0x{struct.unpack('>I', msg[16:20])[0]:08x}", flush=True)
            print(drain(s), flush=True)
        else:
            print(f"data {len(first)}", flush=True)
    except ConnectionResetError:
        print("reset", flush=True)
    except socket.timeout:
        print("timeout", flush=True)
        return 1
    return 0


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="role", required=True)
    sp = sub.add_parser("server")
    sp.add_argument("--listen", required=True)
    sp.add_argument("--action", choices=["decline", "garbage", "junk"], required=True)
    sp.add_argument("--code", default="03030002")
    sp.add_argument("--timeout", type=float, default=20.0)
    cp = sub.add_parser("client")
    cp.add_argument("--connect", required=True)
    cp.add_argument("--send", choices=["junk", "bad-proposal"], required=True)
    cp.add_argument("--timeout", type=float, default=20.0)
    args = ap.parse_args()
    return server(args) if args.role == "server" else client(args)


if __name__ == "__main__":
    sys.exit(main())
