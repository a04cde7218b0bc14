#!/usr/bin/env python3
"""Goodput of Python's ``sendall`` over two loopback links into a Python receiver that reads
with ``recv_into``: what the binding adds to the library on a bulk transfer.

    python bench/sendall_goodput.py [--buffers 64] [--size-mib 16] [--key]

The receiver is a process of its own (this script with ``--receiver``), so neither side
waits for the other's GIL. The sender hands the same ``--size-mib`` buffer to ``sendall``
``--buffers`` times; the clock runs from the first ``sendall`` until the receiver
acknowledged every byte (``wait_acknowledged``). Prints one line of ``key=value`` fields:

    sendall_goodput gbit_per_s=... bytes=... seconds=... recv_seconds=... buffers=... size_mib=... key=...

``recv_seconds`` is the receiver's own clock, from its first byte to the end of the stream.
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time

import ri2n

LINKS = ["127.0.0.1:0", "127.0.0.2:0"]


def receiver(key_file: str, recv_mib: int) -> None:
    """Accepts one connection, reads it to its end into one reused buffer, and prints the
    byte count and its seconds on stdout."""
    server = ri2n.Endpoint.server(LINKS, key_file=key_file or None)
    print(server.local_addrs()[0], flush=True)
    conn = server.accept(timeout=30)
    buf = bytearray(recv_mib << 20)
    total = conn.recv_into(buf)  # the first bytes start the clock
    start = time.monotonic()
    while (n := conn.recv_into(buf)) > 0:
        total += n
    print(total, time.monotonic() - start, flush=True)
    conn.close()
    server.close(timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--buffers", type=int, default=64, help="sendall calls (default 64)")
    parser.add_argument("--size-mib", type=int, default=16, help="MiB per call (default 16)")
    parser.add_argument("--recv-mib", type=int, default=4, help="MiB per recv_into (default 4)")
    parser.add_argument("--key", action="store_true", help="keyed: encrypted and authenticated")
    parser.add_argument("--receiver", metavar="KEY_FILE", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.receiver is not None:
        return receiver(args.receiver, args.recv_mib)

    with tempfile.TemporaryDirectory() as tmp:
        key_file = ""
        if args.key:
            key_file = os.path.join(tmp, "bench.key")
            ri2n.Key.generate().save(key_file)
        proc = subprocess.Popen(
            [sys.executable, __file__, "--receiver", key_file, "--recv-mib", str(args.recv_mib)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None
        to = proc.stdout.readline().strip()
        client = ri2n.Endpoint.client(LINKS, key_file=key_file or None)
        conn = client.connect(to, timeout=10)
        data = os.urandom(args.size_mib << 20)
        start = time.monotonic()
        for _ in range(args.buffers):
            conn.sendall(data)
        conn.finish()
        conn.wait_acknowledged()
        seconds = time.monotonic() - start
        received, recv_seconds = proc.stdout.readline().split()
        proc.wait(timeout=30)
        conn.close()
        client.close(timeout=10)
    total = args.buffers * len(data)
    assert int(received) == total, f"the receiver got {received} bytes of {total}"
    print(
        f"sendall_goodput gbit_per_s={total * 8 / seconds / 1e9:.3f} bytes={total} "
        f"seconds={seconds:.3f} recv_seconds={float(recv_seconds):.3f} "
        f"buffers={args.buffers} size_mib={args.size_mib} key={'yes' if args.key else 'no'}"
    )


if __name__ == "__main__":
    main()
