"""ri2n.aio: asyncio streams over connections."""

import asyncio
import contextlib
import hashlib
import os
import random
import select
import signal
import time
from typing import AsyncIterator, Tuple

import pytest

import ri2n
from conftest import LINKS, server_process, until_suspended_in, wait_stopped


@contextlib.asynccontextmanager
async def endpoints(transport: str = "udp") -> AsyncIterator[Tuple[ri2n.Endpoint, ri2n.Endpoint]]:
    """A server and a client endpoint on both links, closed (delivering) at the end."""
    server = ri2n.Endpoint.server(LINKS, transport=transport)
    client = ri2n.Endpoint.client(LINKS, transport=transport)
    try:
        yield server, client
    finally:
        client.close(timeout=5)
        server.close(timeout=5)


async def echo_server(server: ri2n.Endpoint, clients: int) -> None:
    """Echoes each client's stream back until its end, then ends its own."""

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            data = await reader.read(1 << 16)
            if not data:
                break
            writer.write(data)
            await writer.drain()
        writer.write_eof()
        writer.close()
        await writer.wait_closed()

    tasks = []
    for _ in range(clients):
        reader, writer = await ri2n.aio.accept(server, timeout=10)
        tasks.append(asyncio.ensure_future(echo(reader, writer)))
    await asyncio.gather(*tasks)


async def echo_client(client: ri2n.Endpoint, to: str, data: bytes) -> bytes:
    reader, writer = await ri2n.aio.open_connection(client, [to], timeout=10)

    async def send() -> None:
        for i in range(0, len(data), 100_000):  # uneven pieces
            writer.write(data[i : i + 100_000])
            await writer.drain()
        writer.write_eof()

    sending = asyncio.ensure_future(send())
    back = await reader.read()  # until the server's end of stream
    await sending
    writer.close()
    await writer.wait_closed()
    return back


@pytest.mark.parametrize("transport", ["udp", "tcp"])
def test_asyncio_echo_is_exact(transport: str) -> None:
    """Three clients at once, 8 MiB each, echoed by one asyncio server over two links."""

    async def main() -> None:
        async with endpoints(transport) as (server, client):
            to = server.local_addrs()[0]
            payloads = [random.Random(k).randbytes(8 << 20) for k in range(3)]
            serving = asyncio.ensure_future(echo_server(server, len(payloads)))
            backs = await asyncio.wait_for(
                asyncio.gather(*(echo_client(client, to, p) for p in payloads)), 120
            )
            await asyncio.wait_for(serving, 30)
            for sent, back in zip(payloads, backs):
                assert len(back) == len(sent)
                assert hashlib.sha256(back).digest() == hashlib.sha256(sent).digest()

    asyncio.run(main())


def test_asyncio_small_exchanges() -> None:
    """Request and reply, line by line: each write is answered before the next."""

    async def main() -> None:
        async with endpoints() as (server, client):
            accepting = asyncio.ensure_future(ri2n.aio.accept(server, timeout=10))
            reader, writer = await ri2n.aio.open_connection(client, server.local_addrs())
            sreader, swriter = await accepting
            for i in range(200):
                writer.write(b"ping %d\n" % i)
                line = await asyncio.wait_for(sreader.readline(), 5)
                swriter.write(line.replace(b"ping", b"pong"))
                assert await asyncio.wait_for(reader.readline(), 5) == b"pong %d\n" % i
            conn = writer.get_extra_info("connection")
            assert isinstance(conn, ri2n.Connection)
            assert len(conn.stats()["links"]) == 2
            writer.close()
            await writer.wait_closed()
            assert await asyncio.wait_for(sreader.read(), 5) == b"", "the client's end"
            swriter.close()
            await swriter.wait_closed()

    asyncio.run(main())


def test_asyncio_accept_times_out_and_takes_turns() -> None:
    async def main() -> None:
        async with endpoints() as (server, client):
            with pytest.raises(TimeoutError):
                await ri2n.aio.accept(server, timeout=0.2)
            # two tasks accept at once; two clients come: each task gets one
            accepts = [asyncio.ensure_future(ri2n.aio.accept(server, timeout=10)) for _ in "ab"]
            conns = await asyncio.gather(
                *(ri2n.aio.open_connection(client, server.local_addrs()) for _ in "ab")
            )
            accepted = await asyncio.gather(*accepts)
            assert len(accepted) == 2
            for _, w in list(conns) + list(accepted):
                w.close()
                await w.wait_closed()

    asyncio.run(main())


def test_asyncio_peer_gone_reaches_the_reader() -> None:
    async def main() -> None:
        async with endpoints() as (server, client):
            accepting = asyncio.ensure_future(ri2n.aio.accept(server, timeout=10))
            reader, writer = await ri2n.aio.open_connection(client, server.local_addrs())
            _, swriter = await accepting
            swriter.transport.abort()
            with pytest.raises(ri2n.PeerGone):
                await asyncio.wait_for(reader.read(), 5)
            writer.close()

    asyncio.run(main())


def test_a_write_larger_than_the_send_buffer_drains_with_no_thread() -> None:
    """64 MiB written at once while the peer reads nothing for a while: the send buffer fills
    (the premise), the transport waits on the writing descriptor, and once the peer reads
    everything arrives exact, with no thread started for it."""
    import threading

    async def main() -> None:
        async with endpoints() as (server, client):
            to = server.local_addrs()[0]
            accepting = asyncio.ensure_future(ri2n.aio.accept(server, timeout=10))
            reader, writer = await ri2n.aio.open_connection(client, [to], timeout=10)
            peer_reader, peer_writer = await accepting
            threads = threading.active_count()
            data = random.Random(7).randbytes(64 << 20)
            writer.write(data)
            writer.write_eof()
            await asyncio.sleep(0.3)
            # the peer has read nothing: most of it still waits in the transport
            assert writer.transport.get_write_buffer_size() > 16 << 20
            back = await asyncio.wait_for(peer_reader.read(), 60)
            await asyncio.wait_for(writer.drain(), 10)
            assert writer.transport.get_write_buffer_size() == 0
            assert hashlib.sha256(back).digest() == hashlib.sha256(data).digest()
            assert threading.active_count() == threads
            for w in (writer, peer_writer):
                w.close()
                await w.wait_closed()

    asyncio.run(main())


def test_asyncio_accept_ends_when_the_endpoint_is_closed() -> None:
    """A task waiting in ``ri2n.aio.accept`` while another closes the endpoint gets
    ``ValueError``, as the blocking ``accept`` does (it waited for ever)."""

    async def main() -> None:
        server = ri2n.Endpoint.server(LINKS)
        waiting = asyncio.ensure_future(ri2n.aio.accept(server))
        await until_suspended_in(waiting, "_accept_connection")
        server.close(timeout=5)
        with pytest.raises(ValueError, match="closed"):
            await asyncio.wait_for(waiting, 5)

    asyncio.run(main())


def test_closing_a_writer_does_not_hold_the_loop() -> None:
    """Closing the writer closes its connection, and where that is the last handle (the
    endpoint's own went) the close waits up to the endpoint's close_linger (10 s) for
    delivery, here never coming (the server is stopped). It waits off the loop's thread: the
    loop runs on meanwhile. Before, it stood still for the whole linger."""
    with server_process() as (proc, addr):

        async def main() -> None:
            loop = asyncio.get_running_loop()
            # the endpoint's handle goes once the connection is made
            reader, writer = await ri2n.aio.open_connection(
                ri2n.Endpoint.client(LINKS), addr, timeout=10
            )
            assert await reader.readexactly(2) == b"hi"
            os.kill(proc.pid, signal.SIGSTOP)
            try:
                wait_stopped(proc.pid)
                writer.write(bytes(10_000))  # never acknowledged
                # the premise: the bytes are the connection's, unacknowledged, so that its
                # close has something to wait for
                conn = writer.get_extra_info("connection")
                deadline = loop.time() + 5
                while conn.stats()["send_buffered"] < 10_000:
                    assert loop.time() < deadline, "the write never reached the connection"
                    await asyncio.sleep(0.001)
                ticks = [loop.time()]
                writer.close()
                while loop.time() - ticks[0] < 2:
                    await asyncio.sleep(0.01)
                    ticks.append(loop.time())
            finally:
                os.kill(proc.pid, signal.SIGCONT)
            gaps = [b - a for a, b in zip(ticks, ticks[1:])]
            assert max(gaps) < 1, max(gaps)

        asyncio.run(main())


def test_asyncio_accept_with_no_time_takes_a_waiting_connection() -> None:
    """``accept(server, timeout=0)`` takes a connection that is waiting, as the blocking
    ``accept(timeout=0)`` does; it used to raise ``TimeoutError`` before it looked."""

    async def main() -> None:
        async with endpoints() as (server, client):
            with pytest.raises(TimeoutError):
                await ri2n.aio.accept(server, timeout=0)
            _, writer = await ri2n.aio.open_connection(client, server.local_addrs())
            writer.write(b"x")  # confirms the handshake: the server hands it over
            await writer.drain()
            deadline = asyncio.get_running_loop().time() + 5
            while True:
                try:
                    _, accepted = await ri2n.aio.accept(server, timeout=0)
                    break
                except TimeoutError:
                    assert asyncio.get_running_loop().time() < deadline, "never accepted"
                    await asyncio.sleep(0.05)
            for w in (writer, accepted):
                w.close()
                await w.wait_closed()

    asyncio.run(main())


def test_bad_arguments_are_refused_before_a_connection_is_taken() -> None:
    """``accept`` refuses a negative or NaN ``timeout`` with ``ValueError``, as the blocking
    ``accept`` does (it raised ``TimeoutError``, or took a waiting connection, or with NaN
    broke the loop on some Pythons), and a ``limit`` below 1 before it takes the connection:
    the ``StreamReader`` refused the limit after the connection had left the endpoint, and it
    was lost to every later ``accept``. ``open_connection`` refuses the limit before it
    connects."""

    async def main() -> None:
        async with endpoints() as (server, client):
            with pytest.raises(ValueError):
                await ri2n.aio.open_connection(client, server.local_addrs(), limit=0)
            _, writer = await ri2n.aio.open_connection(client, server.local_addrs(), timeout=10)
            writer.write(b"x")  # confirms the handshake: the server hands it over
            await writer.drain()
            for bad in ({"timeout": -1.0}, {"timeout": float("nan")}, {"limit": 0}):
                with pytest.raises(ValueError):
                    await asyncio.wait_for(ri2n.aio.accept(server, **bad), 5)
            # the connection waited through the refusals
            reader, accepted = await ri2n.aio.accept(server, timeout=10)
            assert await asyncio.wait_for(reader.readexactly(1), 5) == b"x"
            for w in (writer, accepted):
                w.close()
                await w.wait_closed()

    asyncio.run(main())


def test_a_cancelled_open_connection_lets_its_thread_go() -> None:
    """``open_connection`` to a peer that never answers, given up by ``wait_for``: the
    executor's thread stops trying too (here the pool's only thread runs the next job). It
    used to try for ever, holding the thread and then the interpreter's exit."""
    import concurrent.futures
    import socket

    silent = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    silent.bind(("127.0.0.1", 0))  # bound and never read: no "port unreachable"
    to = f"127.0.0.1:{silent.getsockname()[1]}"
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        loop.set_default_executor(pool)
        async with endpoints() as (_, client):
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(ri2n.aio.open_connection(client, to), 0.5)
            # the pool's one thread is free again within a slice of the connect's wait
            ran = await asyncio.wait_for(loop.run_in_executor(None, lambda: 42), 3)
            assert ran == 42

    try:
        asyncio.run(main())
    finally:
        pool.shutdown(wait=False)
        silent.close()


class StandIn:
    """A stand-in connection for the transport's own tests: its descriptors are one end of a
    pipe nobody writes (never readable), nothing arrives, and a test's subclass says what
    ``try_send`` does."""

    def __init__(self) -> None:
        self.fds = os.pipe()
        self.closed = False

    def stream_read_fileno(self) -> int:
        return self.fds[0]

    def stream_write_fileno(self) -> int:
        return self.fds[0]

    def try_recv(self, n: int) -> bytes:
        raise BlockingIOError

    def close(self) -> None:
        self.closed = True


def test_writing_resumes_at_the_low_mark_not_only_when_empty() -> None:
    """The protocol paused above the high mark is resumed once the buffer falls to the low
    one, as asyncio's transports do; before, only once the connection had taken all of it
    (``drain()`` waited longer). A stand-in connection takes what it is told to."""

    class Conn(StandIn):
        room = 0

        def try_send(self, data: bytearray) -> int:
            if self.room == 0:
                raise BlockingIOError
            taken = min(self.room, len(data))
            self.room -= taken
            return taken

    class Protocol(asyncio.Protocol):
        paused = resumed = 0

        def pause_writing(self) -> None:
            self.paused += 1

        def resume_writing(self) -> None:
            self.resumed += 1

    loop = asyncio.new_event_loop()
    conn, protocol = Conn(), Protocol()
    try:
        transport = ri2n.aio.Transport(loop, conn, protocol)  # type: ignore[arg-type]
        transport.set_write_buffer_limits(high=100, low=50)
        transport.write(b"x" * 200)
        assert protocol.paused == 1 and transport.get_write_buffer_size() == 200
        conn.room = 160
        transport._write_ready()
        assert transport.get_write_buffer_size() == 40, "the premise: some left"
        assert protocol.resumed == 1
    finally:
        loop.remove_reader(conn.fds[0])
        loop.close()
        for fd in conn.fds:
            os.close(fd)


def test_a_write_that_finds_the_connection_ended_returns_before_connection_lost() -> None:
    """A write (or an abort) that ends the connection returns before the protocol's
    ``connection_lost`` runs, on the loop's next turn, as asyncio's transports do: a protocol
    that drops its transport there, and writes twice in a row, used to fail on the second
    write with AttributeError. A stand-in connection whose peer is gone."""

    class Conn(StandIn):
        def try_send(self, data: bytearray) -> int:
            raise ri2n.PeerGone("peer gone")

    class Protocol(asyncio.Protocol):
        def __init__(self) -> None:
            self.transport = None
            self.lost: list = []

        def connection_made(self, transport) -> None:  # type: ignore[no-untyped-def]
            self.transport = transport

        def connection_lost(self, exc) -> None:  # type: ignore[no-untyped-def]
            self.lost.append(exc)
            self.transport = None

        def answer(self) -> None:
            self.transport.write(b"one")  # type: ignore[union-attr]
            self.transport.write(b"two")  # type: ignore[union-attr]

    async def main() -> None:
        loop = asyncio.get_running_loop()
        conn, protocol = Conn(), Protocol()
        ri2n.aio.Transport(loop, conn, protocol)  # type: ignore[arg-type]
        try:
            protocol.answer()
            assert protocol.lost == [], "connection_lost ran inside write()"
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            assert len(protocol.lost) == 1 and isinstance(protocol.lost[0], ri2n.PeerGone)
        finally:
            for fd in conn.fds:
                os.close(fd)

    asyncio.run(main())


def test_the_transport_hands_what_comes_to_the_protocol_set_last() -> None:
    """``get_protocol``/``set_protocol`` as asyncio's transports have them (a library that
    swaps the protocol of a transport it is handed calls both): what arrives after the swap
    goes to the new protocol, the end of stream too. Before, both raised
    NotImplementedError (asyncio.BaseTransport's own)."""

    class Collect(asyncio.Protocol):
        def __init__(self) -> None:
            self.data = bytearray()
            self.ended = asyncio.get_running_loop().create_future()

        def data_received(self, data: bytes) -> None:
            self.data += data

        def eof_received(self) -> None:
            self.ended.set_result(None)

    async def run() -> None:
        async with endpoints() as (server, client):
            conn = await asyncio.get_running_loop().run_in_executor(
                None, lambda: client.connect(server.local_addrs(), timeout=10)
            )
            reader, writer = await ri2n.aio.accept(server, timeout=10)
            transport = writer.transport
            assert transport.get_protocol() is writer._protocol  # type: ignore[attr-defined]
            first, second = Collect(), Collect()
            transport.set_protocol(first)
            assert transport.get_protocol() is first
            conn.send(b"to the first")
            while bytes(first.data) != b"to the first":
                await asyncio.sleep(0.01)
            transport.set_protocol(second)
            conn.send(b"to the second")
            conn.finish()
            await asyncio.wait_for(second.ended, 10)
            assert (bytes(first.data), bytes(second.data)) == (b"to the first", b"to the second")
            assert not first.ended.done()
            transport.close()
            conn.close()

    asyncio.run(run())


def test_what_is_written_after_close_is_still_sent() -> None:
    """A write after ``close()`` (the connection not closed yet) is sent, as asyncio's own
    transports send it, also one larger than the send buffer: the connection closes once it
    is taken. Before, it was dropped without a word."""

    async def run() -> None:
        async with endpoints() as (server, client):
            loop = asyncio.get_running_loop()
            connecting = loop.run_in_executor(
                None, lambda: client.connect(server.local_addrs(), timeout=10)
            )
            _, writer = await ri2n.aio.accept(server, timeout=10)
            peer = await connecting
            tail = random.Random(3).randbytes(32 << 20)
            writer.write(b"before close, ")
            writer.close()
            writer.write(tail)
            # the premise: most of it waits in the transport, beyond the send buffer
            assert writer.transport.get_write_buffer_size() > 0

            def read_all() -> bytes:
                got = bytearray()
                while chunk := peer.recv(1 << 20, timeout=30):
                    got += chunk
                return bytes(got)

            got = await loop.run_in_executor(None, read_all)
            await asyncio.wait_for(writer.wait_closed(), 10)
            assert len(got) == 14 + len(tail)
            assert got == b"before close, " + tail
            peer.close()

    asyncio.run(run())


@pytest.mark.parametrize("where", ["data_received", "eof_received"])
def test_a_protocol_that_raises_ends_the_connection(where: str) -> None:
    """A protocol raising from ``data_received`` or ``eof_received`` ends the transport as
    asyncio's own transports do: the error goes to the loop's exception handler, the
    connection is aborted (its peer is told) and ``connection_lost(exc)`` follows. Before,
    the error only reached the handler: the transport stayed open, nothing called
    ``connection_lost`` and the peer waited for ever."""

    class Failing(asyncio.Protocol):
        def __init__(self) -> None:
            self.lost = asyncio.get_running_loop().create_future()

        def data_received(self, data: bytes) -> None:
            if where == "data_received":
                raise RuntimeError("a bug in data_received")

        def eof_received(self) -> bool:
            raise RuntimeError("a bug in eof_received")

        def connection_lost(self, exc) -> None:  # type: ignore[no-untyped-def]
            self.lost.set_result(exc)

    async def run() -> None:
        async with endpoints() as (server, client):
            loop = asyncio.get_running_loop()
            handled: list = []
            loop.set_exception_handler(lambda _, context: handled.append(context))
            peer = await loop.run_in_executor(
                None, lambda: client.connect(server.local_addrs(), timeout=10)
            )
            conn = await loop.run_in_executor(None, lambda: server.accept(timeout=10))
            protocol = Failing()
            transport = ri2n.aio.Transport(loop, conn, protocol)
            peer.send(b"hello")
            peer.finish()
            lost = await asyncio.wait_for(protocol.lost, 10)
            assert isinstance(lost, RuntimeError) and f"a bug in {where}" in str(lost)
            assert transport.is_closing()
            assert [c["exception"] for c in handled] == [lost]
            with pytest.raises(ri2n.PeerGone, match=f"failed in {where}"):
                await loop.run_in_executor(None, lambda: peer.recv(10, timeout=10))
            peer.close()

    asyncio.run(run())


@pytest.mark.parametrize("transport", ["udp", "tcp"])
def test_message_calls_beside_the_stream_leave_its_reader_its_wake_up(transport: str) -> None:
    """A message and stream bytes arrive; in one step of the loop (no await), the application
    takes the messages of ``get_extra_info("connection")`` until BlockingIOError, as the
    docs say to. The StreamReader still gets the bytes. Before, the transport waited on the
    descriptor of every reading call, which the message calls cleared: it waited for ever
    with the bytes in the connection."""

    async def main() -> None:
        async with endpoints(transport) as (server, client):
            loop = asyncio.get_running_loop()
            accepting = asyncio.ensure_future(ri2n.aio.accept(server, timeout=10))
            peer = await loop.run_in_executor(
                None, lambda: client.connect(server.local_addrs(), timeout=10)
            )
            r, w = await asyncio.wait_for(accepting, 10)
            conn = w.get_extra_info("connection")
            # one round first, so that the reader waits on its descriptor
            peer.sendall(b"hello")
            assert await asyncio.wait_for(r.readexactly(5), 5) == b"hello"
            reading = asyncio.ensure_future(r.readexactly(6))
            await asyncio.sleep(0.05)
            # one step of the loop, no await
            peer.send_message(b"msg")
            peer.sendall(b"stream")
            read_fd = conn.read_fileno()
            deadline = time.monotonic() + 5
            while conn.stats()["recv_buffered"] < 6 or not select.select([read_fd], [], [], 0)[0]:
                assert time.monotonic() < deadline, "premise: the bytes and the message came"
                time.sleep(0.01)
            time.sleep(0.2)  # the message too
            messages = []
            while True:
                try:
                    messages.append(conn.try_recv_message())
                except BlockingIOError:
                    break
            assert messages == [b"msg"]
            # back to the loop
            assert await asyncio.wait_for(reading, 3) == b"stream"
            peer.close()
            w.close()
            await asyncio.wait_for(w.wait_closed(), 5)

    asyncio.run(main())


def test_message_calls_beside_the_stream_leave_its_writer_its_wake_up() -> None:
    """The transport waits for room (64 MiB written, the peer reads nothing); the peer reads
    4 MiB, and in one step of the loop the application sends two messages on
    ``get_extra_info("connection")``. The transport still hears of the room and hands over
    more. Before, the message calls cleared the descriptor it waited on: its buffer stayed
    where it was, and drain() would have waited for ever."""

    async def main() -> None:
        async with endpoints() as (server, client):
            loop = asyncio.get_running_loop()
            accepting = loop.run_in_executor(None, lambda: server.accept(timeout=10))
            r, w = await ri2n.aio.open_connection(client, server.local_addrs(), timeout=10)
            peer = await asyncio.wait_for(accepting, 10)
            conn = w.get_extra_info("connection")
            w.write(bytes(64 << 20))
            settled = -1
            while True:  # the send buffer and the peer's window full
                await asyncio.sleep(0.3)
                size = w.transport.get_write_buffer_size()
                if size == settled:
                    break
                settled = size
            # one step of the loop, no await
            taken = 0
            while taken < (4 << 20):
                taken += len(peer.recv(1 << 20, timeout=5))
            time.sleep(0.5)
            assert select.select([conn.write_fileno()], [], [], 0)[0], "premise: room signalled"
            conn.try_send_message(b"one")
            conn.try_send_message(b"two")
            # back to the loop
            before = w.transport.get_write_buffer_size()
            await asyncio.sleep(2)
            after = w.transport.get_write_buffer_size()
            w.transport.abort()
            peer.close()
            # what the abort left undelivered
            with contextlib.suppress(ri2n.NotDelivered):
                client.close(timeout=5)
            assert after < before, f"the transport took nothing in 2 s ({before} -> {after})"

    asyncio.run(main())
