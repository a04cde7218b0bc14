"""fileno() with select, and the non-blocking try_* calls."""

import select
import time

import pytest

import ri2n
from conftest import Pair, wait_links_up


def readable(fd: int, timeout: float) -> bool:
    return bool(select.select([fd], [], [], timeout)[0])


def test_connection_fileno_with_select(pair: Pair) -> None:
    fd = pair.peer.fileno()
    assert fd >= 0 and fd == pair.peer.fileno()
    # the second link coming up is news too (the descriptor signals state changes): past it,
    # a try_* call clears the descriptor before it looks: nothing waiting, not readable
    wait_links_up(pair.peer, 2)
    with pytest.raises(BlockingIOError):
        pair.peer.try_recv(100)
    assert not readable(fd, 0.2)
    pair.conn.sendall(b"ping")
    assert readable(fd, 5), "data arrived but the descriptor stayed quiet"
    assert pair.peer.try_recv(100) == b"ping"
    with pytest.raises(BlockingIOError):
        pair.peer.try_recv(100)
    assert not readable(fd, 0.1)
    # try_recv_into, and the end of the stream
    pair.conn.sendall(b"pong")
    pair.conn.finish()
    buf = bytearray(10)
    got = b""
    deadline = time.monotonic() + 5
    while True:
        # edge-like: call until BlockingIOError, and only then wait
        try:
            n = pair.peer.try_recv_into(buf)
        except BlockingIOError:
            assert readable(fd, deadline - time.monotonic()), "stuck"
            continue
        if n == 0:
            break
        got += buf[:n]
    assert got == b"pong"


def test_try_send_until_the_buffer_is_full(pair: Pair) -> None:
    """Nobody reads: try_send takes data until the send buffer (and the peer's window) is
    full, then raises BlockingIOError; reading at the other end makes room, and the
    descriptor says so."""
    chunk = bytes(1 << 20)
    sent = 0
    deadline = time.monotonic() + 20
    while True:
        try:
            sent += pair.conn.try_send(chunk)
        except BlockingIOError:
            break
        assert time.monotonic() < deadline, "try_send never said the buffer was full"
    assert sent > 0
    fd = pair.conn.fileno()
    buf = bytearray(1 << 20)
    received = 0
    while received < sent:
        received += pair.peer.recv_into(buf)
    assert readable(fd, 5), "room was freed but the descriptor stayed quiet"
    assert pair.conn.try_send(b"more") == 4


def test_endpoint_fileno_and_try_accept(endpoints) -> None:
    server, client = endpoints
    fd = server.fileno()
    with pytest.raises(BlockingIOError):
        server.try_accept()
    assert not readable(fd, 0.1)
    conn = client.connect(server.local_addrs(), timeout=10)
    try:
        assert readable(fd, 5)
        peer = server.try_accept()
        assert isinstance(peer, ri2n.Connection)
        peer.close()
    finally:
        conn.close()


def test_a_thread_waiting_in_recv_leaves_a_select_loop_its_messages(pair: Pair) -> None:
    """A thread blocked in ``recv()`` beside a loop selecting on ``read_fileno()`` for
    messages, as the ``fileno()`` doc invites: the loop is woken for each message. The
    waiting ``recv`` polled the shared read descriptor, so the signal given back for the
    loop (its look found no stream bytes, and a message waiting) woke it again, and its
    next look cleared it: the loop slept with the message there (9 of 20 rounds). Then a
    look made at the end of each 200 ms wait slice, after the look that gave the signal
    back, still cleared it (1 to 5 runs in 30 on a busy host); ``recv`` now waits in the
    library and clears no descriptor."""
    import threading

    got = []
    waiting = threading.Thread(target=lambda: got.append(pair.peer.recv(100, timeout=30)))
    waiting.start()
    time.sleep(0.2)
    missed = 0
    for i in range(10):
        pair.conn.send_message(b"m%d" % i)
        # as the doc says a loop does: after each wake-up, try until BlockingIOError (a
        # wake-up may be for something else)
        deadline = time.monotonic() + 1.0
        message = None
        while message is None and readable(
            pair.peer.read_fileno(), max(0.0, deadline - time.monotonic())
        ):
            try:
                message = pair.peer.try_recv_message()
            except BlockingIOError:
                pass
        if message is None:
            missed += 1
            message = pair.peer.recv_message(timeout=5)
        assert message == b"m%d" % i
    pair.conn.sendall(b"end")
    waiting.join(timeout=10)
    assert got == [b"end"]
    assert missed == 0, f"the loop missed {missed} of 10 messages"
