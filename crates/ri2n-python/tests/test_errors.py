"""What goes wrong, as exceptions: timeouts, refusals, bad arguments, a peer that is gone,
calls on what was closed."""

import errno
import os
import signal
import socket
import threading
import time
from typing import Optional

import pytest

import ri2n
from conftest import (
    LINKS,
    Pair,
    close_quietly,
    ctrl_c_after,
    server_process,
    wait_blocked_in,
    wait_stopped,
)


def test_accept_times_out(endpoints) -> None:
    server, _ = endpoints
    start = time.monotonic()
    with pytest.raises(TimeoutError):
        server.accept(timeout=0.3)
    assert 0.25 < time.monotonic() - start < 3
    with pytest.raises(TimeoutError):
        server.accept(timeout=0)


def test_connect_to_a_silent_peer_times_out(endpoints) -> None:
    """A UDP socket that reads and never answers (a host that drops the handshake)."""
    _, client = endpoints
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as silent:
        silent.bind(("127.0.0.1", 0))
        to = "%s:%d" % silent.getsockname()
        start = time.monotonic()
        with pytest.raises(TimeoutError) as e:
            client.connect(to, timeout=1.5)
        took = time.monotonic() - start
        assert 1.4 < took < 5, took
        assert to in str(e.value)
        assert e.value.errno == errno.ETIMEDOUT
        silent.settimeout(0)
        assert silent.recv(2048), "the handshake reached the silent socket"


def test_connect_to_a_closed_port_is_refused(endpoints) -> None:
    """Nothing listens: the host answers "port unreachable" and connect fails at once."""
    _, client = endpoints
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        to = "%s:%d" % s.getsockname()
    start = time.monotonic()
    with pytest.raises(ConnectionRefusedError) as e:
        client.connect(to, timeout=10)
    assert time.monotonic() - start < 5
    assert e.value.errno == errno.ECONNREFUSED


def test_a_client_of_the_other_transport_is_told_to_look_at_it() -> None:
    """A UDP client of a TCP server finds its port closed (no UDP socket there): refused,
    with the transport named as a cause to look at. It said only "nothing listens"."""
    server = ri2n.Endpoint.server(["127.0.0.1:0"], transport="tcp")
    client = ri2n.Endpoint.client(["127.0.0.1:0"])
    try:
        with pytest.raises(ConnectionRefusedError, match="same transport"):
            client.connect(server.local_addrs(), timeout=10)
    finally:
        close_quietly(client, server)


def test_connect_to_an_endpoint_that_is_not_a_server(endpoints) -> None:
    _, client = endpoints
    other = ri2n.Endpoint.client(["127.0.0.1:0"])
    try:
        with pytest.raises(ConnectionRefusedError, match="not a server"):
            client.connect(other.local_addrs(), timeout=5)
    finally:
        other.close()


@pytest.mark.parametrize(
    "addr", ["nonsense", "127.0.0.1", "localhost:7000", "127.0.0.1:99999", "", "1.2.3.4:-1"]
)
def test_bad_addresses_are_value_errors(endpoints, addr: str) -> None:
    _, client = endpoints
    with pytest.raises(ValueError):
        ri2n.Endpoint.client([addr])
    with pytest.raises(ValueError):
        ri2n.Endpoint.server(["127.0.0.1:0", addr])
    with pytest.raises(ValueError):
        client.connect([addr], timeout=1)


def test_addresses_may_be_ip_port_tuples_as_socket_takes_them(endpoints) -> None:
    """An ``(ip, port)`` tuple, or a list of them, is an address as ``"ip:port"`` is (a
    socket user passes one first); what is neither is a ``TypeError`` that says what an
    address is. It was a ``TypeError`` about Rust's enum variants, naming no argument."""
    server, client = endpoints
    host, port = server.local_addrs()[0].rsplit(":", 1)
    conn = client.connect((host, int(port)), timeout=10)
    conn.close()
    conn = client.connect([(host, int(port)), server.local_addrs()[1]], timeout=10)
    conn.close()
    v6 = ri2n.Endpoint.client([("::1", 0)])
    assert v6.local_addrs()[0].startswith("[::1]:")
    v6.close()
    for wrong in [7000, None, b"127.0.0.1:0", [("127.0.0.1",)], ("127.0.0.1", 7000, 0)]:
        with pytest.raises(TypeError, match=r'"ip:port" strings or \(ip, port\) tuples'):
            client.connect(wrong, timeout=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not a socket address"):
        client.connect(("localhost", 7000), timeout=1)


def test_bad_arguments_are_value_errors(endpoints) -> None:
    server, client = endpoints
    with pytest.raises(ValueError):
        ri2n.Endpoint.client([])  # no local address
    with pytest.raises(ValueError):
        client.connect([], timeout=1)  # no remote address
    with pytest.raises(ValueError):
        client.connect(server.local_addrs(), timeout=-1)
    with pytest.raises(ValueError):
        client.connect(server.local_addrs(), timeout=float("nan"))
    with pytest.raises(ValueError):
        server.accept(timeout=-0.5)
    with pytest.raises(TypeError):
        ri2n.Endpoint.client([1, 2])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="client"):
        client.accept(timeout=0)  # a client never has a connection to accept
    with pytest.raises(ValueError):
        ri2n.Endpoint.client(LINKS, key=ri2n.Key.generate(), key_file="both.key")


def test_a_peer_that_aborts_is_gone(pair: Pair) -> None:
    """With the errno a socket's exception carries (as the C interface returns it), for code
    that checks ``e.errno``."""
    pair.conn.abort(7, "enough")
    with pytest.raises(ri2n.PeerGone, match="enough") as e:
        pair.peer.recv(100, timeout=5)
    assert isinstance(e.value, ConnectionResetError)
    assert isinstance(e.value, ri2n.Error)
    assert e.value.errno == errno.ECONNRESET
    assert isinstance(pair.peer.close_reason(), ri2n.PeerGone)
    # this side aborted: its own calls say so
    with pytest.raises(ConnectionAbortedError) as aborted:
        pair.conn.sendall(b"x")
    assert aborted.value.errno == errno.ECONNABORTED


def test_an_abort_code_out_of_range(pair_on_each_transport: Pair) -> None:
    """A negative code is a ValueError (it was an OverflowError, which ``except ValueError``
    misses), and nothing is aborted; one beyond what the wire carries is capped, the same on
    either transport, however large (from 2**128 on it was an OverflowError too)."""
    pair = pair_on_each_transport
    with pytest.raises(ValueError, match="code must be >= 0"):
        pair.conn.abort(-1)
    with pytest.raises(ValueError, match="code must be >= 0"):
        pair.server.abort(-5, "no")
    with pytest.raises(ValueError, match="code must be >= 0"):
        pair.conn.abort(-(2**200))
    with pytest.raises(TypeError):
        pair.conn.abort(1.5)  # type: ignore[arg-type]
    pair.conn.sendall(b"still up")
    assert pair.peer.recv(8, timeout=5) == b"still up"
    pair.conn.abort(2**200, "large")
    with pytest.raises(ri2n.PeerGone, match="large") as e:
        pair.peer.recv(100, timeout=5)
    assert f"code {2**62 - 1 - 16}" in str(e.value)


def test_a_server_endpoint_aborted_tells_its_client(pair_on_each_transport: Pair) -> None:
    pair = pair_on_each_transport
    # the premise: the connection carries data before the abort
    pair.conn.sendall(b"ping")
    assert pair.peer.recv(4, timeout=5) == b"ping"
    pair.server.abort(9, "server stopped")
    with pytest.raises(ri2n.PeerGone, match="server stopped") as e:
        pair.conn.recv(100, timeout=5)
    assert "code 9" in str(e.value)


def test_a_peer_whose_process_is_gone(endpoints) -> None:
    """The server's process is killed: its host answers "port unreachable" to the client's
    keepalives, and the client's waiting read raises PeerGone within a few seconds."""
    _, client = endpoints
    with server_process() as (proc, addr):
        conn = client.connect(addr, timeout=10)
        assert conn.recv(2, timeout=10) == b"hi"
        proc.kill()
        proc.wait()
        start = time.monotonic()
        with pytest.raises(ri2n.PeerGone, match="gone"):
            conn.recv(10, timeout=10)
        assert time.monotonic() - start < 5
        conn.close()


@pytest.mark.parametrize("transport", ["udp", "tcp"])
def test_a_silent_peer_ends_the_connection_at_the_idle_limit_set(transport: str) -> None:
    """The server's process is stopped (a host whose power was cut: nothing answers; over TCP
    its kernel still acknowledges, the process says nothing). By default the connection waits
    as long as it takes; with an idle limit set, a waiting read raises TimeoutError once
    nothing was heard for that long, and so the connection ended."""
    client = ri2n.Endpoint.client(LINKS, transport=transport)
    with server_process(transport) as (proc, addr):
        conn = client.connect(addr, timeout=10)
        assert conn.recv(2, timeout=10) == b"hi"
        for bad in (0, 1e-10, -1.0, float("nan"), float("-inf")):
            with pytest.raises(ValueError, match="idle must be None or a number of seconds"):
                conn.set_timeouts(idle=bad)
        proc.send_signal(signal.SIGSTOP)
        wait_stopped(proc.pid)
        # the premise: without a limit the silence ends nothing (the recv's own timeout ends
        # the wait)
        with pytest.raises(TimeoutError):
            conn.recv(10, timeout=1.5)
        assert conn.state() == "established" and conn.close_reason() is None
        conn.set_timeouts(idle=1.0)
        start = time.monotonic()
        with pytest.raises(TimeoutError):
            conn.recv(10, timeout=10)
        assert time.monotonic() - start < 5
        assert conn.state() == "closed"
        assert isinstance(conn.close_reason(), TimeoutError)
        close_quietly(conn, client)


def test_calls_on_closed_things(pair: Pair) -> None:
    pair.conn.close()
    assert pair.conn.closed
    assert pair.conn.fileno() == -1
    with pytest.raises(ValueError, match="closed"):
        pair.conn.sendall(b"x")
    pair.conn.close()  # twice is fine
    pair.client.close(timeout=5)
    assert pair.client.closed
    with pytest.raises(ValueError, match="closed"):
        pair.client.connect(pair.server.local_addrs(), timeout=1)
    pair.client.close()


def test_writing_after_finish_is_a_broken_pipe(pair_on_each_transport: Pair) -> None:
    """Also an empty write, as Python's own ``socket.send(b"")`` and ``sendall(b"")`` after
    ``shutdown``; with ``errno`` set, as a socket's, for code that looks at it."""
    pair = pair_on_each_transport
    pair.conn.finish()
    with pytest.raises(BrokenPipeError) as raised:
        pair.conn.sendall(b"x")
    assert raised.value.errno == errno.EPIPE
    with pytest.raises(BrokenPipeError):
        pair.conn.send(b"")
    with pytest.raises(BrokenPipeError):
        pair.conn.sendall(b"")


def test_nothing_to_take_now_is_eagain(pair_on_each_transport: Pair) -> None:
    """Non-blocking calls that find nothing raise ``BlockingIOError`` with ``errno`` EAGAIN,
    as a non-blocking socket's do: code that checks ``e.errno`` (selectors-era libraries)
    must not take it for a failure."""
    pair = pair_on_each_transport
    for call in (lambda: pair.peer.try_recv(10), lambda: pair.peer.try_recv_message()):
        with pytest.raises(BlockingIOError) as raised:
            call()
        assert raised.value.errno == errno.EAGAIN
        assert raised.value.strerror


def test_closing_an_endpoint_ends_a_waiting_accept(endpoints) -> None:
    import threading

    server, _ = endpoints
    raised = []

    def wait() -> None:
        try:
            server.accept()
        except ValueError as e:
            raised.append(e)

    waiter = threading.Thread(target=wait)
    waiter.start()
    wait_blocked_in(waiter, "server.accept(")
    server.close(timeout=1)
    waiter.join(timeout=5)
    assert not waiter.is_alive() and raised and "closed" in str(raised[0])


def test_closing_an_endpoint_stops_its_connect_on_another_thread(endpoints) -> None:
    """A connect without a timeout to a peer that never answers, on another thread (as
    ``ri2n.aio.open_connection`` runs it): closing the endpoint ends it with ``ValueError``
    within a slice of its wait instead of leaving the thread trying for ever, which held up
    interpreter exit."""
    _, client = endpoints
    silent = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    silent.bind(("127.0.0.1", 0))  # bound and never read: no "port unreachable"
    outcome: list = []

    def connect() -> None:
        try:
            client.connect(f"127.0.0.1:{silent.getsockname()[1]}")
            outcome.append("connected")
        except Exception as e:  # noqa: BLE001 - the test inspects it
            outcome.append(e)

    t = threading.Thread(target=connect, daemon=True)
    t.start()
    wait_blocked_in(t, "client.connect(")
    client.close()
    t.join(timeout=10)
    silent.close()
    assert not t.is_alive(), "connect still running 10 s after the endpoint was closed"
    assert len(outcome) == 1 and isinstance(outcome[0], ValueError), outcome


@pytest.mark.parametrize(
    "call", ["recv", "recv_into", "recv_message", "wait_acknowledged", "sendall"]
)
def test_ctrl_c_interrupts_a_wait_without_a_timeout(pair: Pair, call: str) -> None:
    """Ctrl-C reaches a read that waits for ever on an idle peer, as it reaches Python's own
    ``socket.recv``; it used to wait on until data came. So it reaches a write waiting for
    room that a peer which reads nothing never makes."""
    waits = {
        "recv": lambda: pair.conn.recv(10),
        "recv_into": lambda: pair.conn.recv_into(bytearray(10)),
        "recv_message": lambda: pair.conn.recv_message(),
        # without finish(): the end of the streams, which it waits for, never comes
        "wait_acknowledged": lambda: pair.conn.wait_acknowledged(),
        # more than the send buffer and the peer's window together (8 MiB each by default)
        "sendall": lambda: pair.conn.sendall(bytes(64 << 20)),
    }
    start = time.monotonic()
    with ctrl_c_after(0.3), pytest.raises(KeyboardInterrupt):
        waits[call]()
    assert time.monotonic() - start < 2.0
    if call == "sendall":
        # the premise: it stopped for want of room, the send buffer full (8 MiB)
        assert pair.conn.stats()["send_buffered"] >= 7 << 20


@pytest.mark.parametrize("how", ["close", "drop"])
def test_ctrl_c_interrupts_a_close_waiting_for_delivery(how: str) -> None:
    """A connection whose ``Endpoint`` object is gone holds the endpoint's last handle:
    ``close()`` waits there up to the endpoint's close_linger (10 s) for delivery, here never
    coming (the server is stopped), and so does dropping it (``del``, the end of a function).
    Ctrl-C ends that wait at once; before, it came only when the linger ran out, and
    ``KeyboardInterrupt`` with it (for a drop, after 10.0 s)."""
    with server_process() as (proc, addr):
        # the endpoint's handle goes at once: the connection's is the last
        conn = ri2n.Endpoint.client(LINKS).connect(addr, timeout=10)
        assert conn.recv(2, timeout=10) == b"hi"
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            wait_stopped(proc.pid)
            conn.sendall(bytes(10_000))  # never acknowledged
            start = time.monotonic()
            with ctrl_c_after(0.3), pytest.raises(KeyboardInterrupt):
                if how == "close":
                    conn.close()
                else:
                    # a drop cannot raise: Python raises the interrupt at its next check
                    del conn
                    for _ in range(50):
                        time.sleep(0.1)
            waited = time.monotonic() - start
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        if how == "close":
            assert conn.closed
        assert 0.25 < waited < 2.0, "the close did not wait for delivery, or Ctrl-C came late"


@pytest.mark.parametrize("call", ["recv", "try_recv", "recv_into", "try_recv_into"])
def test_a_negative_size_is_a_value_error(pair: Pair, call: str) -> None:
    """As ``socket.recv(-1)``: a ``ValueError``, which ``except ValueError`` catches (an
    unsigned parameter raised ``OverflowError``)."""
    calls = {
        "recv": lambda: pair.conn.recv(-1, timeout=0),
        "try_recv": lambda: pair.conn.try_recv(-1),
        "recv_into": lambda: pair.conn.recv_into(bytearray(8), -1, timeout=0),
        "try_recv_into": lambda: pair.conn.try_recv_into(bytearray(8), -1),
    }
    with pytest.raises(ValueError, match="must be >= 0, not -1"):
        calls[call]()


class _SilentTcpListener:
    """A TCP listener that accepts connections and never writes to them: a ri2n TCP
    handshake with it waits until it times out."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.addr = "%s:%d" % self.sock.getsockname()
        self.accepted: list = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                self.accepted.append(self.sock.accept()[0])
            except OSError:
                return

    def close(self) -> None:
        self.sock.close()
        for c in self.accepted:
            c.close()


def test_ctrl_c_interrupts_a_tcp_connect() -> None:
    """On the TCP transport the library makes the whole handshake in one call; Ctrl-C still
    gives it up at once. It used to wait out the handshake timeout (10 s)."""
    silent = _SilentTcpListener()
    client = ri2n.Endpoint.client(["127.0.0.1:0"], transport="tcp")
    try:
        start = time.monotonic()
        with ctrl_c_after(0.3), pytest.raises(KeyboardInterrupt):
            client.connect(silent.addr)
        assert time.monotonic() - start < 2.0
        assert silent.accepted, "the handshake never reached the listener"
    finally:
        close_quietly(client)
        silent.close()


def test_a_tcp_connect_without_a_timeout_keeps_trying_until_cancelled() -> None:
    """``timeout=None`` tries handshake after handshake on the TCP transport too (it raised
    ``TimeoutError`` after the first, 10 s), and ``cancel`` gives it up within a fifth of a
    second (it was not looked at before that)."""
    silent = _SilentTcpListener()
    client = ri2n.Endpoint.client(["127.0.0.1:0"], transport="tcp")
    cancel = threading.Event()
    timer = threading.Timer(10.5, cancel.set)
    try:
        start = time.monotonic()
        timer.start()
        with pytest.raises(InterruptedError):
            client.connect(silent.addr, timeout=None, cancel=cancel)
        took = time.monotonic() - start
        assert 10.5 <= took < 11.5, took
        assert len(silent.accepted) >= 2, "one handshake only: %d" % len(silent.accepted)
    finally:
        timer.cancel()
        close_quietly(client)
        silent.close()


@pytest.mark.parametrize("transport", ["udp", "tcp"])
def test_a_connect_whose_cancel_is_set_already_opens_nothing(transport: str) -> None:
    """A cancel set before the call (an asyncio task cancelled before the executor's thread
    came to its connect) gives the connect up at once: ``InterruptedError``, and the server
    is offered no connection. Before, it was looked at only after a first wait of a fifth of
    a second, and a server on loopback was connected to in that time."""
    server = ri2n.Endpoint.server(LINKS, transport=transport)
    client = ri2n.Endpoint.client(LINKS, transport=transport)
    cancel = threading.Event()
    cancel.set()
    try:
        with pytest.raises(InterruptedError):
            client.connect(server.local_addrs(), timeout=5, cancel=cancel).close()
        with pytest.raises(TimeoutError):
            server.accept(timeout=0.5)
    finally:
        close_quietly(client, server)


def _fill(conn: ri2n.Connection, messages: bool) -> int:
    """Writes to ``conn``'s stream (or sends messages) until its peer, reading nothing, takes
    no more for 0.5 s: its window and the send buffer are full (the UDP transport gives each
    stream its own). Returns the bytes written."""
    chunk = bytes(min(64 << 10, conn.max_message_size()) if messages else 1 << 20)
    written, last, start = 0, time.monotonic(), time.monotonic()
    while time.monotonic() - last < 0.5:
        assert time.monotonic() - start < 20, "the send buffer never filled"
        try:
            if messages:
                conn.try_send_message(chunk)
                written += len(chunk)
            else:
                written += conn.try_send(chunk)
            last = time.monotonic()
        except BlockingIOError:
            time.sleep(0.02)
    return written


@pytest.mark.parametrize("call", ["send", "sendall", "sendall_large", "send_message"])
def test_ctrl_c_interrupts_a_write_to_a_peer_that_reads_nothing(
    pair_on_each_transport: Pair, call: str
) -> None:
    """Ctrl-C reaches a write that waits for room a peer never makes, as it reaches Python's
    own ``socket.sendall``; it used to wait on until the peer read."""
    pair = pair_on_each_transport
    assert _fill(pair.conn, messages=call == "send_message") > 0
    writes = {
        "send": lambda: pair.conn.send(b"x"),
        "sendall": lambda: pair.conn.sendall(b"x" * 1000),
        # handed over in whole chunks, not copied as it fits
        "sendall_large": lambda: pair.conn.sendall(bytes(4 << 20)),
        # as large as those that no longer fitted
        "send_message": lambda: pair.conn.send_message(
            bytes(min(64 << 10, pair.conn.max_message_size()))
        ),
    }
    start = time.monotonic()
    with ctrl_c_after(0.3), pytest.raises(KeyboardInterrupt):
        # again and again: should acknowledgements late under load make room after
        # all, the next write blocks
        while True:
            writes[call]()
    assert time.monotonic() - start < 2.0
    # the connection still works: the peer takes what was written before
    if call == "send_message":
        assert pair.peer.recv_message(timeout=5)
    else:
        assert pair.peer.recv(10, timeout=5)


def test_ctrl_c_while_leaving_a_with_block_that_raised_is_not_lost(
    pair_on_each_transport: Pair,
) -> None:
    """Leaving a ``with Endpoint`` block closes it, waiting for delivery; when the block
    raised, that close's ``NotDelivered`` is not raised over the block's exception, but
    Ctrl-C during the wait is: it was dropped behind the block's exception, which a retry
    loop (``except ConnectionError: continue``) would catch, the user's Ctrl-C lost."""
    pair = pair_on_each_transport
    assert _fill(pair.conn, messages=False) > 0
    start = time.monotonic()
    with ctrl_c_after(0.3), pytest.raises(KeyboardInterrupt) as raised:
        with pair.client:
            raise ConnectionError("the block failed")
    assert time.monotonic() - start < 2.0
    assert pair.client.closed
    # the block's exception is kept, as the interrupt's context
    assert isinstance(raised.value.__context__, ConnectionError)


def test_ctrl_c_interrupts_the_close_of_an_endpoint_whose_peer_reads_nothing(
    pair_on_each_transport: Pair,
) -> None:
    """``Endpoint.close()`` without a timeout waits for the peer to acknowledge what was
    written; Ctrl-C stops that wait, and the peer is told (as by ``abort()``). It used to wait
    for ever, Ctrl-C or not."""
    pair = pair_on_each_transport
    assert _fill(pair.conn, messages=False) > 0
    start = time.monotonic()
    with ctrl_c_after(0.3), pytest.raises(KeyboardInterrupt):
        pair.client.close()
    assert time.monotonic() - start < 2.0
    assert pair.client.closed
    # the peer learns that the rest will not come: its reads end with PeerGone
    with pytest.raises(ri2n.PeerGone, match="interrupted"):
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            pair.peer.recv(1 << 20, timeout=deadline - time.monotonic())


def test_closing_a_connection_another_thread_reads_ends_its_streams(pair: Pair) -> None:
    """``close()`` finishes the streams even while another thread waits in a call on the
    connection: the peer reads the end at once. It used to do nothing until that call
    returned, and a peer that answers at the end never answered."""
    got: list = []
    reader = threading.Thread(target=lambda: got.append(pair.conn.recv(10)), daemon=True)
    reader.start()
    wait_blocked_in(reader, "pair.conn.recv(10)")
    pair.conn.sendall(b"request")
    pair.conn.close()
    assert pair.peer.recv(100, timeout=5) == b"request"
    assert pair.peer.recv(100, timeout=5) == b"", "the end of the closed side's stream"
    # the reader still waits, on the peer's stream, which now ends too
    pair.peer.sendall(b"answer")
    pair.peer.finish()
    reader.join(timeout=5)
    assert got == [b"answer"]


class _SlowPath:
    """A UDP relay that holds every packet ``delay`` seconds each way, between one client and
    ``server``: a path of a long round trip (a satellite hop)."""

    def __init__(self, server: str, delay: float) -> None:
        host, port = server.rsplit(":", 1)
        self.server = (host, int(port))
        self.delay = delay
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.1)
        self.client: Optional[tuple] = None
        self.running = True
        self.thread = threading.Thread(target=self._relay, daemon=True)
        self.thread.start()

    @property
    def addr(self) -> str:
        return "127.0.0.1:%d" % self.sock.getsockname()[1]

    def _relay(self) -> None:
        while self.running:
            try:
                data, src = self.sock.recvfrom(65536)
            except socket.timeout:
                continue
            if src == self.server:
                to = self.client
            else:
                self.client, to = src, self.server
            if to is not None:
                timer = threading.Timer(self.delay, self._send, (data, to))
                timer.daemon = True
                timer.start()

    def _send(self, data: bytes, to: tuple) -> None:
        if self.running:
            self.sock.sendto(data, to)

    def close(self) -> None:
        self.running = False
        self.thread.join(timeout=2)
        self.sock.close()


def test_connect_over_a_path_of_a_long_round_trip(endpoints) -> None:
    """A handshake over a path whose round trip (1.2 s here) is longer than a second
    completes within the timeout. ``connect`` used to start a new handshake every second (to
    let Ctrl-C through), each one dropping what the last had reached: it never completed."""
    server, _ = endpoints
    path = _SlowPath(server.local_addrs()[0], delay=0.6)
    client = ri2n.Endpoint.client(["127.0.0.1:0"])
    try:
        start = time.monotonic()
        conn = client.connect(path.addr, timeout=15)
        took = time.monotonic() - start
        assert took >= 1.2, f"a handshake of {took:.2f} s over a 1.2 s round trip"
        conn.abort()
        conn.close()
    finally:
        client.abort()
        close_quietly(client)
        path.close()


def _reason_not_utf8() -> str:
    """A reason Python holds as ``str`` that does not encode as UTF-8: a file name
    ``os.fsdecode`` escaped, as ``str(OSError)`` about one has it."""
    return "cannot open " + os.fsdecode(b"/data/caf\xe9.bin")


def test_an_abort_whose_reason_is_not_utf8_still_aborts(pair: Pair) -> None:
    """``Connection.abort`` and ``Endpoint.abort`` replace what does not encode and abort:
    the peer is told. Before, ``UnicodeEncodeError`` was raised and nothing was aborted."""
    pair.conn.abort(1, _reason_not_utf8())
    with pytest.raises(ri2n.PeerGone, match="cannot open /data/caf"):
        pair.peer.recv(10, timeout=5)


def test_an_endpoint_abort_whose_reason_is_not_utf8_still_aborts(pair: Pair) -> None:
    pair.server.abort(1, _reason_not_utf8())
    with pytest.raises(ri2n.PeerGone, match="cannot open /data/caf"):
        pair.conn.recv(10, timeout=5)
