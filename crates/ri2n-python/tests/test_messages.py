"""Whole messages and unreliable datagrams."""

import contextlib
import time
from typing import List, Union

import pytest

import ri2n

from conftest import Pair


def test_messages_arrive_whole_and_in_order(pair_on_each_transport: Pair) -> None:
    pair = pair_on_each_transport
    msgs: List[Union[bytes, memoryview]] = [b"", b"one", bytes(range(256)) * 1000, memoryview(b"four")]
    for m in msgs:
        pair.conn.send_message(m)
    pair.conn.finish()
    for m in msgs:
        assert pair.peer.recv_message(timeout=5) == bytes(m)
    # the end of the message stream: None, not b"" (the empty message is a message)
    assert pair.peer.recv_message(timeout=5) is None
    assert pair.peer.recv_message() is None


def test_message_limits_and_timeouts(pair: Pair) -> None:
    limit = pair.conn.max_message_size()
    assert limit > 1 << 20
    with pytest.raises(ValueError):
        pair.conn.send_message(bytes(limit + 1))
    start = time.monotonic()
    with pytest.raises(TimeoutError):
        pair.peer.recv_message(timeout=0.2)
    assert time.monotonic() - start >= 0.19
    with pytest.raises(BlockingIOError):
        pair.peer.try_recv_message()
    pair.conn.try_send_message(b"now")
    deadline = time.monotonic() + 5
    while True:
        try:
            assert pair.peer.try_recv_message() == b"now"
            break
        except BlockingIOError:
            assert time.monotonic() < deadline
            time.sleep(0.001)


def test_the_tcp_transport_refuses_datagrams_and_unknown_transports() -> None:
    p = Pair(transport="tcp")
    try:
        with pytest.raises(ri2n.Error, match="TCP transport"):
            p.conn.send_datagram(b"x")
        p.conn.sendall(b"stream bytes")
        p.conn.finish()
        assert p.peer.recv(100, timeout=5) == b"stream bytes"
    finally:
        p.close()
    with pytest.raises(ValueError, match="udp"):
        ri2n.Endpoint.client(["127.0.0.1:0"], transport="quic")


def test_datagrams(pair: Pair) -> None:
    # one at a time, so none can be dropped for want of room on loopback
    for d in [b"small", bytes(range(256)) * 200, b"x" * pair.conn.unsplit_datagram_size()]:
        pair.conn.send_datagram(d)
        assert pair.peer.recv_datagram(timeout=5) == d
    # the other way, larger than a packet: it travels in pieces and arrives whole
    big = bytes(i % 251 for i in range(60_000))
    pair.peer.send_datagram(big)
    assert pair.conn.recv_datagram(timeout=5) == big
    with pytest.raises(ValueError, match="^datagram of"):
        pair.conn.send_datagram(bytes(pair.conn.max_datagram_size() + 1))
    with pytest.raises(TimeoutError):
        pair.peer.recv_datagram(timeout=0.2)
    with pytest.raises(BlockingIOError):
        pair.peer.try_recv_datagram()
    stats = pair.conn.stats()
    assert stats["datagrams_sent"] == 3 and stats["datagrams_received"] == 1


def test_datagrams_end_with_a_clean_close(pair: Pair) -> None:
    pair.conn.send_datagram(b"last")
    assert pair.peer.recv_datagram(timeout=5) == b"last"
    pair.conn.finish()
    pair.peer.finish()
    pair.conn.wait_acknowledged(timeout=5)
    pair.peer.wait_acknowledged(timeout=5)
    # both sides finished and delivered: the connection closes cleanly, and then the
    # datagram call says so with None
    assert pair.peer.recv_datagram(timeout=5) is None


def test_a_zero_timeout_takes_what_is_there(pair: Pair) -> None:
    """``timeout=0`` returns a message or datagram already waiting, as ``recv`` does, and
    raises ``TimeoutError`` only when nothing is there (it raised it always)."""
    pair.conn.send_message(b"m")
    pair.conn.send_datagram(b"d")
    deadline = time.monotonic() + 5
    got = {}
    while len(got) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
        for name, recv in (("m", pair.peer.recv_message), ("d", pair.peer.recv_datagram)):
            if name not in got:
                with contextlib.suppress(TimeoutError):
                    got[name] = recv(timeout=0)
    assert got == {"m": b"m", "d": b"d"}
    with pytest.raises(TimeoutError):
        pair.peer.recv_message(timeout=0)
    with pytest.raises(TimeoutError):
        pair.peer.recv_datagram(timeout=0)
