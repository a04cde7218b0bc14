#!/usr/bin/env python3
"""Send a file over several links with ri2n, from Python (``pip install crates/ri2n-python``).

On loopback's two addresses (two links)::

    python send_file.py recv --listen 127.0.0.1:7000 --listen 127.0.0.2:7000 --output got.bin &
    python send_file.py send --to 127.0.0.1:7000 --local 127.0.0.1 --local 127.0.0.2 --input big.iso

Between two hosts with two networks, and a key (``ri2n keygen --output cluster.key``, or
``ri2n.Key.generate().save("cluster.key")``, copied to both hosts)::

    python send_file.py recv --listen 10.0.1.2:7000 --listen 10.0.2.2:7000 --output big.iso --key-file cluster.key
    python send_file.py send --to 10.0.1.2:7000 --local 10.0.1.1 --local 10.0.2.1 --input big.iso --key-file cluster.key

The receiver writes ``OUTPUT.partial`` and renames it once the sender's stream ended; both
print the byte count, the rate and the SHA-256 of what they moved. Exit status: 0 done, 1
error, 3 the keys differ, 4 the peer is gone, 130 interrupted. The files also work with
``ri2n send`` and ``ri2n recv`` on the other side.
"""

import argparse
import hashlib
import os
import sys
import time
from typing import List, Optional

import ri2n

CHUNK = 4 << 20  # bytes per read from the file and per sendall / recv_into


def with_port(addr: str) -> str:
    """``10.0.1.1`` -> ``10.0.1.1:0`` (any port); an address with a port stays."""
    if addr.startswith("[") or addr.count(":") == 1:
        return addr
    return f"[{addr}]:0" if ":" in addr else f"{addr}:0"


def report(what: str, n: int, seconds: float, digest: str) -> None:
    rate = n * 8 / seconds / 1e9 if seconds > 0 else 0.0
    print(f"{what} {n} bytes in {seconds:.2f} s ({rate:.2f} Gbit/s), sha256 {digest}")


def send(to: List[str], local: List[str], path: str, key_file: Optional[str]) -> None:
    client = ri2n.Endpoint.client([with_port(a) for a in local], key_file=key_file)
    with client:
        conn = client.connect(to, timeout=10)
        with conn:
            buf = bytearray(CHUNK)
            view = memoryview(buf)
            digest = hashlib.sha256()
            sent = 0
            start = time.monotonic()
            try:
                with open(path, "rb", buffering=0) as f:
                    while (n := f.readinto(buf)) > 0:
                        digest.update(view[:n])
                        conn.sendall(view[:n])  # no copy: the library reads the bytearray
                        sent += n
                conn.finish()
                conn.wait_acknowledged()  # the receiver has every byte
            except KeyboardInterrupt:
                conn.abort(130, "the sender was interrupted")
                raise
            report("sent", sent, time.monotonic() - start, digest.hexdigest())
            links = ", ".join(f"{l['local']}->{l['remote']} {l['state']}" for l in conn.stats()["links"])
            print(f"links: {links}")


def recv(listen: List[str], path: str, key_file: Optional[str]) -> None:
    server = ri2n.Endpoint.server(listen, key_file=key_file)
    with server:
        print(f"listening on {', '.join(server.local_addrs())}", flush=True)
        while True:
            try:
                conn = server.accept(timeout=1)
                break
            except TimeoutError:
                # a client holding another key (or none) is refused; say so, as `ri2n recv` does
                for client, why in server.refused_handshakes():
                    print(f"refused {client}: {why}", file=sys.stderr)
        with conn:
            partial = path + ".partial"
            buf = bytearray(CHUNK)
            view = memoryview(buf)
            digest = hashlib.sha256()
            got = 0
            start = time.monotonic()
            try:
                with open(partial, "wb") as f:
                    # recv_into: the library copies straight into our buffer
                    while (n := conn.recv_into(buf)) > 0:
                        digest.update(view[:n])
                        f.write(view[:n])
                        got += n
            except KeyboardInterrupt:
                conn.abort(130, "the receiver was interrupted")
                raise
            except ri2n.PeerGone:
                print(f"{partial} holds the {got} bytes that arrived", file=sys.stderr)
                raise
            os.replace(partial, path)
            report("received", got, time.monotonic() - start, digest.hexdigest())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="role", required=True)
    s = sub.add_parser("send", help="send a file to a receiver")
    s.add_argument("--to", action="append", required=True, help="a receiver address ip:port")
    s.add_argument(
        "--local",
        action="append",
        default=None,
        help="a local address, one per network (default: every IPv4 address of the host)",
    )
    s.add_argument("--input", required=True, help="the file to send")
    r = sub.add_parser("recv", help="receive a file")
    r.add_argument("--listen", action="append", required=True, help="a local ip:port, one per link")
    r.add_argument("--output", required=True, help="where to write the file")
    for p in (s, r):
        p.add_argument("--key-file", help="the cluster key (both sides must hold the same)")
    args = parser.parse_args()
    try:
        if args.role == "send":
            send(args.to, args.local or ["0.0.0.0:0"], args.input, args.key_file)
        else:
            recv(args.listen, args.output, args.key_file)
    except KeyboardInterrupt:
        return 130
    except ri2n.KeyMismatch as e:
        print(f"send_file: {e}", file=sys.stderr)
        return 3
    except ri2n.PeerGone as e:
        print(f"send_file: {e}", file=sys.stderr)
        return 4
    except (OSError, ValueError) as e:
        print(f"send_file: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
