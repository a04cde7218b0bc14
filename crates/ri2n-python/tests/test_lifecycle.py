"""Context managers, closing, statistics and events."""

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

import ri2n
from conftest import LINKS, server_process, wait_blocked_in, wait_links_up, wait_stopped


def test_context_managers_close_and_deliver() -> None:
    data = bytes(range(256)) * 4096  # 1 MiB
    with ri2n.Endpoint.server(LINKS) as server:
        with ri2n.Endpoint.client(LINKS) as client:
            with client.connect(server.local_addrs()[0], timeout=10) as conn:
                conn.sendall(data)
            # closed: the connection finished its stream and delivers in the background
            assert conn.closed
            with server.accept(timeout=10) as peer:
                got = bytearray()
                while chunk := peer.recv(1 << 20, timeout=10):
                    got += chunk
                assert got == data
        assert client.closed
    assert server.closed


def test_stream_acknowledged_counts_the_bytes_written_alone(pair_on_each_transport) -> None:
    conn = pair_on_each_transport.conn
    # small writes: on the TCP transport each may ride in a chunk of its own, with a header
    for _ in range(100):
        conn.sendall(b"x" * 10)
    conn.finish()
    conn.wait_acknowledged(timeout=10)
    stats = conn.stats()
    assert stats["stream_acknowledged"] == 1000, stats
    assert stats["bytes_acknowledged"] >= 1000, stats


def test_stats_and_events(pair) -> None:
    links = wait_links_up(pair.conn, 2)
    assert {l["id"] for l in links} == {0, 1}
    assert {l["local"].split(":")[0] for l in links} == {"127.0.0.1", "127.0.0.2"}
    for l in links:
        assert l["state"] == "up"
        assert isinstance(l["srtt"], float) and 0 < l["srtt"] < 1
        for counter in ("bytes_sent", "bytes_received", "packets_sent", "packets_lost", "cwnd"):
            assert isinstance(l[counter], int)
    pair.conn.sendall(bytes(100_000))
    pair.conn.finish()
    pair.conn.wait_acknowledged(timeout=10)
    stats = pair.conn.stats()
    assert stats["bytes_acknowledged"] >= 100_000 and stats["send_buffered"] == 0
    assert stats["cipher"] is None  # no key
    # what held the sender back: seconds, and some of them busy with the 100 kB
    held = stats["send_limits"]
    assert all(isinstance(t, float) and t >= 0 for t in held.values()), held
    assert set(held) >= {"sending", "congestion_window", "peer_window", "no_link"}, held
    assert sum(held.values()) > 0, held
    events = pair.conn.events()
    kinds = [e["kind"] for e in events]
    assert kinds[0] == "connected" and "all_acknowledged" in kinds
    ups = [e for e in events if e["kind"] == "link_state_changed" and e["to"] == "up"]
    assert {e["link"] for e in ups} == {0, 1} and all(e["from"] == "validating" for e in ups)
    now = time.monotonic()
    assert all(now - 30 < e["at"] <= now for e in events), "times are time.monotonic()"
    assert pair.conn.events() == [], "each event is reported once"
    assert pair.conn.state() == "established" and pair.conn.is_acknowledged()
    assert "established" in repr(pair.conn)


def test_endpoint_close_reports_what_was_not_delivered() -> None:
    """The server's process stops (SIGSTOP: no acknowledgement, no "port unreachable"):
    what the client writes then is never acknowledged, and close() says so."""
    with server_process() as (proc, addr):
        client = ri2n.Endpoint.client(LINKS)
        conn = client.connect(addr, timeout=10)
        assert conn.recv(2, timeout=10) == b"hi"
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            wait_stopped(proc.pid)
            conn.sendall(bytes(10_000))
            conn.close()
            start = time.monotonic()
            with pytest.raises(ri2n.NotDelivered) as e:
                client.close(timeout=0.5)
            assert 0.4 < time.monotonic() - start < 5
            assert e.value.connections == 1 and e.value.bytes >= 10_000
            assert client.closed
        finally:
            os.kill(proc.pid, signal.SIGCONT)


def test_a_calls_last_handle_lets_go_without_the_gil() -> None:
    """A call holds its own handle of the connection: where another thread closed the
    connection meanwhile, the call's handle is the last, and letting it go waits up to the
    endpoint's close_linger (10 s) for delivery, here never coming (the server is stopped).
    Other Python threads run meanwhile; before, they stood still for the whole linger."""
    with server_process() as (proc, addr):

        def dial() -> ri2n.Connection:
            # the endpoint's handle goes at once: the connection's last handle closes it
            return ri2n.Endpoint.client(LINKS).connect(addr, timeout=10)

        conn = dial()
        assert conn.recv(2, timeout=10) == b"hi"
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            wait_stopped(proc.pid)
            ticks = [time.monotonic()]
            stop = threading.Event()

            def tick() -> None:
                while not stop.is_set():
                    ticks.append(time.monotonic())
                    time.sleep(0.01)

            ticker = threading.Thread(target=tick)
            ticker.start()
            span = []

            def wait_in_recv() -> None:
                start = time.monotonic()
                with pytest.raises(TimeoutError):
                    conn.recv(1, timeout=1.0)
                span.extend([start, time.monotonic()])

            waiter = threading.Thread(target=wait_in_recv)
            waiter.start()
            wait_blocked_in(waiter, "conn.recv(1, timeout=1.0)")
            conn.sendall(bytes(10_000))  # never acknowledged
            conn.close()  # the waiting call's handle is the last now
            waiter.join(30)
            stop.set()
            ticker.join()
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        assert len(span) == 2, "the waiting call did not end"
        # the premise: letting go of the last handle waited for the linger
        assert span[1] - span[0] > 5, span[1] - span[0]
        gaps = [b - a for a, b in zip(ticks, ticks[1:]) if span[0] <= b <= span[1]]
        assert gaps and max(gaps) < 2, max(gaps or [0])


def test_stubs_match_the_module() -> None:
    """Every class and method the type stubs declare exists, and every public method of the
    classes is declared."""
    import ast
    import pathlib

    stub = pathlib.Path(__file__).parent.parent / "python" / "ri2n" / "_ri2n.pyi"
    tree = ast.parse(stub.read_text())
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            cls = getattr(ri2n, node.name)
            declared = {
                n.name for n in node.body if isinstance(n, ast.FunctionDef) and n.name != "__eq__"
            }
            assert declared <= set(dir(cls)), declared - set(dir(cls))
            public = {n for n in dir(cls) if not n.startswith("_")}
            assert public <= declared, f"{node.name}: not in the stubs: {public - declared}"


# A process forks after connecting; the child uses the parent's objects (refused), closes
# them (nothing happens), makes its own pair (works) and exits normally; the parent's
# connection is untouched. Exit code: 0 when all held, else which part failed.
FORK_SCRIPT = r"""
import os, sys, time, ri2n

def pair():
    server = ri2n.Endpoint.server(["127.0.0.1:0"])
    client = ri2n.Endpoint.client(["127.0.0.1:0"])
    conn = client.connect(server.local_addrs()[0], timeout=5)
    return server, client, conn, server.accept(timeout=5)

def read(conn, n):
    got = b""
    while len(got) < n:
        chunk = conn.recv(n - len(got))
        if not chunk:
            break
        got += chunk
    return got

server, client, conn, peer = pair()
pid = os.fork()
if pid == 0:
    try:
        conn.sendall(b"x")
        sys.exit(3)
    except ValueError as e:
        if "os.fork()" not in str(e) or not conn.closed or not server.closed:
            sys.exit(4)
    conn.close()
    _, _, mine, its_peer = pair()
    mine.sendall(b"child")
    mine.finish()
    sys.exit(0 if read(its_peer, 5) == b"child" else 5)
start = time.monotonic()
while True:
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        break
    if time.monotonic() - start > 20:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        print("the child hung")
        sys.exit(1)
    time.sleep(0.05)
code = os.waitstatus_to_exitcode(status)
conn.sendall(b"parent")
conn.finish()
got = read(peer, 6)
print("child exit", code, "parent's peer got", got)
sys.exit(0 if code == 0 and got == b"parent" else 2)
"""


def test_objects_made_before_a_fork_are_closed_in_the_child_and_left_to_the_parent() -> None:
    # before, the child's exit panicked joining threads that were not there, or hung on a
    # lock a driver thread held at the fork; its close ended the parent's stream
    r = subprocess.run(
        [sys.executable, "-c", FORK_SCRIPT], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert "anic" not in r.stderr, r.stderr
