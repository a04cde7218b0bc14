"""The byte stream: a large keyed transfer over two links, the socket-like calls and the
buffer protocol, and the GIL released while calls wait."""

import array
import hashlib
import random
import threading
import time
from typing import Dict, Optional

import pytest

import ri2n
from conftest import Pair, wait_links_up

MiB = 1 << 20


def test_256_mib_keyed_over_two_links_arrive_intact() -> None:
    """256 MiB of random data, keyed, sender and receiver in threads of their own: the
    receiver's hash equals the sender's, and both links carried data."""
    total, chunk = 256 * MiB, 4 * MiB
    p = Pair(key=ri2n.Key.generate())
    try:
        wait_links_up(p.conn, 2)
        sent, got = hashlib.sha256(), hashlib.sha256()
        errors = []
        received = [0]

        def send() -> None:
            try:
                rnd = random.Random(20260101)
                for _ in range(total // chunk):
                    data = rnd.randbytes(chunk)
                    sent.update(data)
                    p.conn.sendall(data)
                p.conn.finish()
                p.conn.wait_acknowledged(timeout=60)
            except BaseException as e:  # reported by the main thread
                errors.append(e)

        def receive() -> None:
            try:
                buf = bytearray(MiB)
                view = memoryview(buf)
                while True:
                    n = p.peer.recv_into(buf)
                    if n == 0:
                        return
                    got.update(view[:n])
                    received[0] += n
            except BaseException as e:
                errors.append(e)

        threads = [threading.Thread(target=send), threading.Thread(target=receive)]
        start = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        assert not any(t.is_alive() for t in threads), "the transfer did not end in 300 s"
        assert not errors, errors
        took = time.monotonic() - start
        assert received[0] == total
        assert got.hexdigest() == sent.hexdigest()
        stats = p.conn.stats()
        assert stats["cipher"] is not None, "the connection was not encrypted"
        carried = [l["stream_bytes_acked"] for l in stats["links"]]
        assert len(carried) == 2 and all(c > 0 for c in carried), stats["links"]
        print(f"256 MiB in {took:.2f} s ({total * 8 / took / 1e9:.2f} Gbit/s), per link {carried}")
    finally:
        p.close()


def test_send_recv_like_a_socket(pair: Pair) -> None:
    assert pair.conn.send(b"abc") == 3
    pair.conn.sendall(memoryview(b"xdefx")[1:4])  # any bytes-like object, slices too
    pair.conn.sendall(bytearray(b"ghi"))
    pair.conn.sendall(array.array("B", b"jk"))
    pair.conn.finish()
    got = b""
    while True:
        part = pair.peer.recv(4)
        assert len(part) <= 4
        if not part:
            break
        got += part
    assert got == b"abcdefghijk"
    assert pair.peer.recv(10) == b"", "the end of the stream stays the end"
    assert pair.peer.recv(0) == b""


def test_recv_into_bytearray_and_memoryview(pair: Pair) -> None:
    data = bytes(range(256)) * 64
    pair.conn.sendall(data)
    pair.conn.finish()
    buf = bytearray(len(data) + 100)
    view = memoryview(buf)
    pos = 0
    while True:
        # into the rest of the buffer, at most 1000 bytes per call
        n = pair.peer.recv_into(view[pos:], min(1000, len(buf) - pos))
        assert n <= 1000
        if n == 0:
            break
        pos += n
    assert pos == len(data)
    assert buf[:pos] == data
    assert buf[pos:] == bytes(100), "nothing written past what arrived"


def test_recv_into_rejects_what_it_cannot_fill(pair: Pair) -> None:
    with pytest.raises((TypeError, BufferError)):
        pair.peer.recv_into(b"read-only bytes")
    with pytest.raises(ValueError):
        pair.peer.recv_into(bytearray(10), 11)
    with pytest.raises(TypeError):
        pair.conn.sendall("a str is not bytes")  # type: ignore[arg-type]
    with pytest.raises(BufferError):
        pair.conn.sendall(memoryview(b"abcdef")[::2])  # not contiguous


def test_recv_timeout(pair: Pair) -> None:
    start = time.monotonic()
    with pytest.raises(TimeoutError):
        pair.peer.recv(10, timeout=0.3)
    assert 0.25 < time.monotonic() - start < 3
    pair.conn.sendall(b"late")
    assert pair.peer.recv(10, timeout=5) == b"late"
    pair.conn.sendall(b"any size")
    assert pair.peer.recv(1 << 62, timeout=5) == b"any size", "n is at most, not a size"
    buf = bytearray(10)
    with pytest.raises(TimeoutError):
        pair.peer.recv_into(buf, timeout=0)


def test_gil_is_released_while_a_call_waits(pair: Pair) -> None:
    """A recv waiting in one thread (with and without a timeout), a sendall of 32 MiB in
    another: meanwhile the main thread runs Python code, and the data arrives."""
    got: Dict[str, Optional[bytes]] = {}

    def wait_plain() -> None:
        got["plain"] = pair.peer.recv(100)

    waiter = threading.Thread(target=wait_plain)
    waiter.start()
    # Python keeps running while the other thread waits inside recv
    deadline, spins = time.monotonic() + 0.3, 0
    while time.monotonic() < deadline:
        spins += 1
    assert waiter.is_alive(), "recv returned with nothing sent"
    assert spins > 10_000, f"the main thread was starved ({spins} loop turns in 0.3 s)"
    pair.conn.sendall(b"wake up")
    waiter.join(timeout=10)
    assert got["plain"] == b"wake up"

    def wait_timed() -> None:
        got["timed"] = pair.peer.recv_message(timeout=30)

    waiter = threading.Thread(target=wait_timed)
    waiter.start()
    deadline, spins = time.monotonic() + 0.3, 0
    while time.monotonic() < deadline:
        spins += 1
    assert spins > 10_000
    pair.conn.send_message(b"message")
    waiter.join(timeout=10)
    assert got["timed"] == b"message"

    # a large sendall in a thread; the receiver runs Python between its reads
    data = random.Random(7).randbytes(32 * MiB)

    def send() -> None:
        pair.conn.sendall(data)
        pair.conn.finish()

    sender = threading.Thread(target=send)
    sender.start()
    buf = bytearray(MiB)
    received = hashlib.sha256()
    while (n := pair.peer.recv_into(buf)) > 0:
        received.update(memoryview(buf)[:n])
    sender.join(timeout=10)
    assert received.digest() == hashlib.sha256(data).digest()
