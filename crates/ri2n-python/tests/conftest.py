"""Shared fixtures: endpoints and connections on loopback.

Two links are two loopback addresses, 127.0.0.1 and 127.0.0.2 (all of 127.0.0.0/8 is
loopback on Linux), each with a free port, as the Rust tests in crates/ri2n/tests do.
"""

import asyncio
import contextlib
import linecache
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Iterator, List, Optional, Tuple

import pytest

import ri2n

#: One local address per link.
LINKS = ["127.0.0.1:0", "127.0.0.2:0"]


def close_quietly(*things: object) -> None:
    """Closes connections and endpoints at the end of a test, whatever state it left them in
    (an endpoint whose connection was aborted may report data it could not deliver)."""
    for t in things:
        with contextlib.suppress(ri2n.NotDelivered, ValueError):
            if isinstance(t, ri2n.Endpoint):
                t.close(timeout=2)
            elif isinstance(t, ri2n.Connection):
                t.close()


class Pair:
    """A server and a client endpoint on both links, and a connection between them."""

    def __init__(self, key: Optional[ri2n.Key] = None, transport: str = "udp") -> None:
        self.server = ri2n.Endpoint.server(LINKS, key=key, transport=transport)
        self.client = ri2n.Endpoint.client(LINKS, key=key, transport=transport)
        # one address is enough: the server tells the client its other one
        self.conn = self.client.connect(self.server.local_addrs()[0], timeout=10)
        self.peer = self.server.accept(timeout=10)

    def close(self) -> None:
        close_quietly(self.conn, self.peer, self.client, self.server)


@pytest.fixture
def pair() -> Iterator[Pair]:
    p = Pair()
    yield p
    p.close()


@pytest.fixture(params=["udp", "tcp"])
def pair_on_each_transport(request: pytest.FixtureRequest) -> Iterator[Pair]:
    """A connected pair on the UDP transport, then on the TCP transport."""
    p = Pair(transport=request.param)
    yield p
    p.close()


@pytest.fixture
def endpoints() -> Iterator[Tuple[ri2n.Endpoint, ri2n.Endpoint]]:
    """A server and a client endpoint, not connected."""
    server = ri2n.Endpoint.server(LINKS)
    client = ri2n.Endpoint.client(LINKS)
    yield server, client
    close_quietly(client, server)


def wait_links_up(conn: ri2n.Connection, n: int, timeout: float = 5.0) -> List[Any]:
    """The connection's links once ``n`` are up (a server learns of the client's second link
    shortly after the handshake)."""
    deadline = time.monotonic() + timeout
    while True:
        links = conn.stats()["links"]
        if sum(1 for l in links if l["state"] == "up") >= n:
            return links
        if time.monotonic() > deadline:
            raise AssertionError(f"not {n} links up: {links}")
        time.sleep(0.01)


@contextlib.contextmanager
def server_process(transport: str = "udp") -> Iterator[Tuple[subprocess.Popen, str]]:
    """A server in a process of its own (to kill or stop): it accepts one connection, sends
    b"hi" on it and waits until its stdin closes. Yields the process and its address."""
    code = (
        "import sys, ri2n\n"
        f"s = ri2n.Endpoint.server({LINKS!r}, transport={transport!r})\n"
        "print(s.local_addrs()[0], flush=True)\n"
        "c = s.accept(timeout=30)\n"
        "c.sendall(b'hi')\n"
        "sys.stdin.read()\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        yield proc, proc.stdout.readline().strip()
    finally:
        proc.kill()
        proc.wait()


def _thread_state(task: str) -> str:
    """The state letter of the thread whose /proc directory is ``task`` (``S``: asleep)."""
    with open(f"{task}/stat") as f:
        # the state is the field after the command name, which is in parentheses
        return f.read().rsplit(")", 1)[1].split()[0]


def wait_stopped(pid: int, timeout: float = 5.0) -> None:
    """Waits until every thread of process ``pid`` has stopped. A stop signal takes effect
    later than ``kill`` returns: until the scheduler has run each thread into the stop, a
    thread that is awake (the endpoint's driver) still receives and acknowledges."""
    deadline = time.monotonic() + timeout
    tasks = f"/proc/{pid}/task"
    while True:
        states = set()
        for t in os.listdir(tasks):
            states.add(_thread_state(f"{tasks}/{t}"))
        if states == {"T"}:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"process {pid} did not stop: thread states {states}")
        time.sleep(0.001)


def wait_blocked_in(thread: threading.Thread, call: str, timeout: float = 5.0) -> None:
    """Waits until ``thread`` waits inside the call on the line of its code that holds
    ``call`` (e.g. ``"server.accept("``): the premise of a test that acts on what another
    thread is blocked in, which a fixed sleep only hopes for. Seen twice, 20 ms apart, at that
    line and asleep: a thread asleep there the first time may only have been waiting for the
    interpreter's lock to enter the call, but it has it in between, while this thread sleeps."""
    assert thread.ident is not None and thread.native_id is not None, "thread not started"
    deadline = time.monotonic() + timeout
    seen = 0
    while seen < 2:
        frame = sys._current_frames().get(thread.ident)
        line = frame and linecache.getline(frame.f_code.co_filename, frame.f_lineno)
        if line and call in line and _thread_state(f"/proc/self/task/{thread.native_id}") == "S":
            seen += 1
        else:
            seen = 0
        if time.monotonic() > deadline:
            raise AssertionError(f"the thread never waited in {call!r}: at {line!r}")
        time.sleep(0.02)


def _awaits_in(task: "asyncio.Task[Any]", coroutine: str) -> bool:
    """Whether ``task`` is suspended in the coroutine function named ``coroutine`` (anywhere
    in its chain of awaits), itself awaiting a future, not another coroutine: the end of the
    chain, where the task sleeps until that future is done."""
    c: Any = task.get_coro()
    while c is not None:
        code = getattr(c, "cr_code", None)
        if code is not None and code.co_name == coroutine:
            return c.cr_await is not None and not asyncio.iscoroutine(c.cr_await)
        c = getattr(c, "cr_await", None)
    return False


async def until_suspended_in(
    task: "asyncio.Task[Any]", coroutine: str, timeout: float = 5.0
) -> None:
    """Lets the loop run until ``task`` waits in ``coroutine`` (see ``_awaits_in``): the
    premise of a test that acts on what a task waits for, which a fixed sleep only hopes for."""
    deadline = time.monotonic() + timeout
    while not _awaits_in(task, coroutine):
        assert not task.done(), f"the task ended instead of waiting in {coroutine}"
        assert time.monotonic() < deadline, f"the task never came to wait in {coroutine}"
        await asyncio.sleep(0)


@contextlib.contextmanager
def ctrl_c_after(seconds: float) -> Iterator[None]:
    """SIGINT to this (the main) thread after ``seconds``, as Ctrl-C would send it, with
    Python's own handler for it meanwhile: a process started as a background job of a
    non-interactive shell begins with SIGINT ignored, and Python then leaves it so (the
    signal would be lost and the wait under test would go on for ever)."""
    main = threading.main_thread().ident
    assert main == threading.get_ident(), "run from the main thread"
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(seconds, lambda: signal.pthread_kill(main, signal.SIGINT))
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, previous)
