#!/usr/bin/env python3
"""Bulk MPTCP (or TCP) flow with a receiver-side goodput timeline at 10 ms resolution.

iperf3 cannot report more often than every 0.1 s, so the fault timeline measures MPTCP with
this small pair instead (the kernel does all the work; Python only moves 1 MiB buffers):

    mptcp_flow.py recv --listen 10.77.1.2:5300 --out FILE --max-time 20 [--bin 0.01]
    mptcp_flow.py send --to 10.77.1.2:5300 --time 11

The receiver counts the bytes it reads in bins of CLOCK_MONOTONIC (shared by every network
namespace), so its timeline lines up with the sender's start, which the sender prints on stdout
as `T0 <monotonic seconds>` right after connect() returns. Both ends use IPPROTO_MPTCP unless
--tcp is given, and record whether the kernel really ran MPTCP (TCP_IS_MPTCP) or fell back.
Every loop is bounded by --time / --max-time.
"""
import argparse
import json
import socket
import sys
import time

IPPROTO_MPTCP = 262
TCP_IS_MPTCP = 43  # getsockopt(SOL_TCP): 1 when the socket really runs MPTCP (Linux >= 5.16)


def addr(s):
    host, port = s.rsplit(":", 1)
    return host, int(port)


def is_mptcp(sock):
    try:
        return bool(sock.getsockopt(socket.SOL_TCP, TCP_IS_MPTCP))
    except OSError:
        return None


def make_socket(tcp):
    return socket.socket(socket.AF_INET, socket.SOCK_STREAM, 0 if tcp else IPPROTO_MPTCP)


def recv(args):
    ls = make_socket(args.tcp)
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(addr(args.listen))
    ls.listen(1)
    ls.settimeout(args.max_time)
    print("LISTENING", flush=True)
    conn, peer = ls.accept()
    t_accept = time.monotonic()
    deadline = t_accept + args.max_time
    conn.settimeout(0.2)
    binw = args.bin
    first = int(t_accept / binw)
    bins = []
    buf = bytearray(1 << 20)
    total = 0
    mptcp = is_mptcp(conn)
    while True:
        now = time.monotonic()
        if now >= deadline:
            break
        try:
            n = conn.recv_into(buf)
        except socket.timeout:
            continue
        if n == 0:
            break
        now = time.monotonic()
        k = int(now / binw) - first
        if k >= len(bins):
            bins.extend([0] * (k + 1 - len(bins)))
        bins[k] += n
        total += n
    conn.close()
    ls.close()
    doc = {
        "bin": binw,
        "t_first": first * binw,
        "t_accept": t_accept,
        "peer": "%s:%d" % peer,
        "mptcp": mptcp,
        "bytes_total": total,
        "bytes": bins,
    }
    with open(args.out, "w") as f:
        json.dump(doc, f)


def send(args):
    s = make_socket(args.tcp)
    s.settimeout(5)
    s.connect(addr(args.to))
    t0 = time.monotonic()
    print("T0 %.6f mptcp=%s" % (t0, is_mptcp(s)), flush=True)
    deadline = t0 + args.time
    data = memoryview(bytes(1 << 20))
    sent = 0
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        s.settimeout(min(left, 0.5))
        try:
            sent += s.send(data)
        except socket.timeout:
            continue
    print("SENT %d mptcp=%s" % (sent, is_mptcp(s)), flush=True)
    s.close()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("recv")
    r.add_argument("--listen", required=True)
    r.add_argument("--out", required=True)
    r.add_argument("--max-time", type=float, default=30)
    r.add_argument("--bin", type=float, default=0.01)
    r.add_argument("--tcp", action="store_true")
    s = sub.add_parser("send")
    s.add_argument("--to", required=True)
    s.add_argument("--time", type=float, default=10)
    s.add_argument("--tcp", action="store_true")
    a = p.parse_args()
    recv(a) if a.cmd == "recv" else send(a)


if __name__ == "__main__":
    sys.exit(main())
