"""asyncio streams over ri2n connections.

::

    reader, writer = await ri2n.aio.open_connection(client, ["10.0.1.2:7000"], timeout=10)
    writer.write(b"hello")
    writer.write_eof()                 # Connection.finish(): the peer reads b"" after this
    reply = await reader.read()        # until the peer's end of stream
    writer.close()
    await writer.wait_closed()

    reader, writer = await ri2n.aio.accept(server)      # on the server

The streams are asyncio's own ``StreamReader``/``StreamWriter`` over a ``Transport`` of this
module, which never blocks a thread. It watches the byte stream's two readiness descriptors
with ``loop.add_reader``: the reading one (``Connection.stream_read_fileno()``) wakes
``try_recv``, the writing one (``Connection.stream_write_fileno()``) wakes ``try_send`` for what
the send buffer could not take at once. Each descriptor is cleared only by its own calls, so
neither direction can swallow the other's wake-up, nor can the application's message and
datagram calls on the connection (``get_extra_info("connection")``).

As with asyncio's sockets, ``writer.close()`` first hands over what is still buffered, as the
peer makes room; ``writer.transport.abort()`` gives up at once. Once handed over, the
connection delivers it in the background (``Connection.close``).
"""

import asyncio
import functools
import math
import os
import threading
import weakref
from typing import Any, Optional, Sequence, Tuple, Union

from ._ri2n import Connection, Endpoint

__all__ = ["Transport", "accept", "open_connection", "wrap"]

Addrs = Union[str, Sequence[str]]

#: The reader's buffer limit, as asyncio's own streams have it.
_DEFAULT_LIMIT = 2**16
#: Bytes asked of ``try_recv`` per call.
_READ_SIZE = 256 * 1024
#: Default write-buffer limits (asyncio's defaults): ``drain()`` waits above the high mark
#: until the buffer falls to the low one.
_HIGH_WATER = 64 * 1024
_LOW_WATER = 16 * 1024


class Transport(asyncio.Transport):
    """An asyncio transport over a ri2n ``Connection``; it owns the connection and closes it
    when it closes. ``write_eof()`` finishes the connection's outgoing streams (the peer reads
    end of stream), ``abort()`` aborts the connection. ``get_extra_info("connection")`` is the
    ``Connection``, for ``stats()``, ``events()`` and messages."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        conn: Connection,
        protocol: asyncio.BaseProtocol,
    ) -> None:
        super().__init__({"connection": conn})
        self._loop = loop
        self._conn = conn
        # the stream's own descriptors: the application's message and datagram calls on
        # the connection (get_extra_info("connection")) never take their wake-ups
        self._fd = conn.stream_read_fileno()
        self._write_fd = conn.stream_write_fileno()
        self._protocol: Any = protocol
        self._buffer = bytearray()  # written, not yet taken by the connection
        self._reading = True  # not paused
        self._watching = False  # the reading descriptor is registered with the loop
        self._watching_writes = False  # the writing descriptor is
        self._read_scheduled = False
        self._at_eof = False  # the peer's stream ended
        self._eof_pending = False  # write_eof() waits for the buffer to drain
        self._eof_written = False
        self._closing = False
        self._closed = False  # connection_lost was called (or is about to be)
        self._high = _HIGH_WATER
        self._low = _LOW_WATER
        self._protocol_paused = False
        protocol.connection_made(self)
        self._update_watch()
        self._schedule_read()

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._protocol  # type: ignore[no-any-return]

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        """Hands what comes from now on (data, end of stream, pauses, the loss) to
        ``protocol``, as asyncio's own transports do."""
        self._protocol = protocol

    # --- reading -----------------------------------------------------------------------

    def _update_watch(self) -> None:
        """Watches the descriptor exactly while reads are wanted: a readable descriptor
        that nobody clears (reading paused) would wake the loop for ever."""
        want = self._reading and not self._at_eof and not self._closed
        if want and not self._watching:
            self._loop.add_reader(self._fd, self._read_ready)
            self._watching = True
        elif not want and self._watching:
            self._loop.remove_reader(self._fd)
            self._watching = False

    def _schedule_read(self) -> None:
        """Tries a read soon: at the start and on resuming, what arrived meanwhile may have
        signalled the descriptor while nobody watched it."""
        if not self._read_scheduled and self._reading and not self._at_eof:
            self._read_scheduled = True
            self._loop.call_soon(self._read_ready)

    def _read_ready(self) -> None:
        self._read_scheduled = False
        # until the descriptor is cleared with nothing left (it is edge-like), or the
        # protocol pauses us
        while self._reading and not self._at_eof and not self._closed:
            try:
                data = self._conn.try_recv(_READ_SIZE)
            except BlockingIOError:
                return
            except Exception as exc:  # the connection ended: PeerGone, TimeoutError...
                self._fatal_error(exc)
                return
            if not data:
                self._at_eof = True
                self._update_watch()
                try:
                    keep_open = self._protocol.eof_received()
                except (SystemExit, KeyboardInterrupt):
                    raise
                except BaseException as exc:
                    self._protocol_failed(exc, "eof_received")
                    return
                if not keep_open:
                    self.close()
                return
            try:
                self._protocol.data_received(data)
            except (SystemExit, KeyboardInterrupt):
                raise
            except BaseException as exc:
                self._protocol_failed(exc, "data_received")
                return

    def is_reading(self) -> bool:
        return self._reading and not self._closing

    def pause_reading(self) -> None:
        self._reading = False
        self._update_watch()

    def resume_reading(self) -> None:
        if self._reading or self._closing:
            return
        self._reading = True
        self._update_watch()
        self._schedule_read()

    # --- writing -----------------------------------------------------------------------

    def write(self, data: Union[bytes, bytearray, memoryview]) -> None:
        if self._eof_pending or self._eof_written:
            raise RuntimeError("cannot call write() after write_eof()")
        # written after close() but before the connection is closed: sent too, as asyncio's
        # own transports send it
        if self._closed or not data:
            return
        view = memoryview(data).cast("B")
        if not self._buffer:
            # the fast path: the send buffer usually has room. Until it says BlockingIOError:
            # only a refused try_send makes the connection signal the writing descriptor
            # when room is freed (a partial take does not)
            try:
                while view:
                    view = view[self._conn.try_send(view) :]
            except BlockingIOError:
                pass
            except Exception as exc:
                self._fatal_error(exc)
                return
        if view:
            self._buffer += view
            self._watch_writes(True)
            self._maybe_pause_protocol()

    def _watch_writes(self, want: bool) -> None:
        """Watches the writing descriptor exactly while something waits to be taken."""
        if want and not self._watching_writes:
            self._loop.add_reader(self._write_fd, self._write_ready)
            self._watching_writes = True
        elif not want and self._watching_writes:
            self._loop.remove_reader(self._write_fd)
            self._watching_writes = False

    def _write_ready(self) -> None:
        """Room may have been freed: hands over what it can, until the connection takes no
        more (its descriptor, cleared by that ``try_send``, then signals the next room)."""
        while self._buffer and not self._closed:
            try:
                taken = self._conn.try_send(self._buffer)
            except BlockingIOError:
                # what is left may already be below the low mark
                self._maybe_resume_protocol()
                return
            except Exception as exc:  # the connection ended
                self._fatal_error(exc)
                return
            del self._buffer[:taken]
        if self._closed:
            return
        self._watch_writes(False)
        self._maybe_resume_protocol()
        if self._eof_pending:
            self._eof_pending = False
            self._write_eof_now()
        if self._closing:
            self._finish_close(None)

    def write_eof(self) -> None:
        if self._eof_pending or self._eof_written or self._closing:
            return
        if self._buffer:
            self._eof_pending = True
        else:
            self._write_eof_now()

    def _write_eof_now(self) -> None:
        self._eof_written = True
        try:
            self._conn.finish()
        except Exception as exc:
            self._fatal_error(exc)

    def can_write_eof(self) -> bool:
        return True

    def get_write_buffer_size(self) -> int:
        return len(self._buffer)

    def get_write_buffer_limits(self) -> Tuple[int, int]:
        return (self._low, self._high)

    def set_write_buffer_limits(
        self, high: Optional[int] = None, low: Optional[int] = None
    ) -> None:
        if high is None:
            high = _HIGH_WATER if low is None else 4 * low
        if low is None:
            low = high // 4
        if not high >= low >= 0:
            raise ValueError(f"high ({high!r}) must be >= low ({low!r}) must be >= 0")
        self._high, self._low = high, low
        self._maybe_pause_protocol()

    def _maybe_pause_protocol(self) -> None:
        if not self._protocol_paused and self.get_write_buffer_size() > self._high:
            self._protocol_paused = True
            self._protocol.pause_writing()

    def _maybe_resume_protocol(self) -> None:
        if self._protocol_paused and self.get_write_buffer_size() <= self._low:
            self._protocol_paused = False
            self._protocol.resume_writing()

    # --- closing -----------------------------------------------------------------------

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        """Closes once what was written is handed to the connection, which then delivers it
        in the background (see ``Connection.close``)."""
        if self._closing:
            return
        self._closing = True
        self._reading = False
        self._update_watch()
        if not self._buffer:
            self._loop.call_soon(self._close_if_drained)

    def _close_if_drained(self) -> None:
        """Closes, unless a write since ``close()`` left bytes waiting: ``_write_ready``
        closes once they are taken."""
        if not self._buffer:
            self._finish_close(None)

    def abort(self) -> None:
        """Aborts the connection: what was not delivered is dropped; the peer's calls raise
        ``PeerGone``."""
        if self._closed:
            return
        self._closing = True
        self._buffer.clear()
        try:
            self._conn.abort(0, "aborted")
        except ValueError:  # closed already
            pass
        self._finish_close(None)

    def _protocol_failed(self, exc: BaseException, call: str) -> None:
        """The protocol raised from ``call``: as asyncio's own transports do, the error goes
        to the loop's exception handler and the connection is aborted (the peer is told,
        where it would otherwise wait on a connection nobody reads), then
        ``connection_lost(exc)``."""
        self._loop.call_exception_handler(
            {
                "message": f"Fatal error: protocol.{call}() call failed.",
                "exception": exc,
                "transport": self,
                "protocol": self._protocol,
            }
        )
        try:
            self._conn.abort(0, f"the application's protocol failed in {call}()")
        except ValueError:  # closed already
            pass
        self._fatal_error(exc)

    def _fatal_error(self, exc: BaseException) -> None:
        self._closing = True
        self._buffer.clear()
        self._finish_close(exc)

    def _finish_close(self, exc: Optional[BaseException]) -> None:
        if self._closed:
            return
        self._closed = True
        self._update_watch()
        self._watch_writes(False)
        # Where this is the connection's last handle (its endpoint's went), closing waits up
        # to the endpoint's close_linger for delivery: not on the loop's thread.
        try:
            self._loop.run_in_executor(None, self._conn.close)
        except RuntimeError:  # the loop's executor is shut down: the loop is ending anyway
            self._conn.close()
        # on the loop's next turn, as asyncio's own transports do: a protocol's call that
        # ended the connection (a write, an abort) returns before the protocol hears of it
        try:
            self._loop.call_soon(self._protocol.connection_lost, exc)
        except RuntimeError:  # the loop is closed: nothing else will run on it
            self._protocol.connection_lost(exc)

    def __repr__(self) -> str:
        state = "closed" if self._closed else "closing" if self._closing else "open"
        return f"<ri2n.aio.Transport {state} {self._conn!r}>"


def _check_limit(limit: int) -> None:
    """``ValueError`` for a limit ``StreamReader`` refuses: checked before a connection is
    made or taken, which would otherwise be lost with the refusal."""
    if not limit > 0:
        raise ValueError(f"limit must be a number of bytes > 0, not {limit}")


def _timeout_arg(timeout: Optional[float]) -> Optional[float]:
    """``timeout`` as ``Endpoint.accept`` takes it: ``ValueError`` for a negative or NaN one
    (as there), ``None`` (for ever) for an infinite one."""
    if timeout is None:
        return None
    if math.isnan(timeout) or timeout < 0:
        raise ValueError(f"timeout must be None or a number of seconds >= 0, not {timeout}")
    return None if math.isinf(timeout) else timeout


def wrap(
    conn: Connection, *, limit: int = _DEFAULT_LIMIT
) -> Tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """asyncio streams over an established ``conn``, which they own from now on (closing the
    writer closes it). Call it from a coroutine of the running loop."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=limit, loop=loop)
    protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
    transport = Transport(loop, conn, protocol)
    writer = asyncio.StreamWriter(transport, protocol, reader, loop)
    return reader, writer


async def open_connection(
    endpoint: Endpoint,
    addrs: Addrs,
    timeout: Optional[float] = None,
    *,
    limit: int = _DEFAULT_LIMIT,
) -> Tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Connects ``endpoint`` to a server (``Endpoint.connect``: ``TimeoutError``,
    ``ConnectionRefusedError``, ``KeyMismatch``...) and returns streams over the connection.
    The handshake runs in the loop's default executor; cancelled (``asyncio.wait_for`` that
    ran out, say), the task gives the handshake up and that thread returns."""
    _check_limit(limit)
    loop = asyncio.get_running_loop()
    cancel = threading.Event()
    try:
        conn = await loop.run_in_executor(
            None, functools.partial(endpoint.connect, addrs, timeout=timeout, cancel=cancel)
        )
    except asyncio.CancelledError:
        # the executor's thread goes on until it looks at `cancel`: without it, one that
        # nobody answers would try for ever (`timeout=None`), holding a thread of the pool
        cancel.set()
        raise
    return wrap(conn, limit=limit)


#: One lock per endpoint (and loop), so that tasks accepting on the same endpoint take turns:
#: the endpoint's descriptor is signalled once for what arrived, and a task that took one
#: connection must not leave another waiting unseen while the next task sleeps.
_accept_locks: "weakref.WeakKeyDictionary[Endpoint, Tuple[Any, asyncio.Lock]]"
_accept_locks = weakref.WeakKeyDictionary()


def _accept_lock(endpoint: Endpoint, loop: asyncio.AbstractEventLoop) -> asyncio.Lock:
    held = _accept_locks.get(endpoint)
    if held is None or held[0] is not loop:
        held = (loop, asyncio.Lock())
        _accept_locks[endpoint] = held
    return held[1]


async def _accept_connection(endpoint: Endpoint) -> Connection:
    loop = asyncio.get_running_loop()
    async with _accept_lock(endpoint, loop):
        # a duplicate, so that whoever else watches the endpoint's descriptor on this loop
        # keeps its own registration
        fd = os.dup(endpoint.fileno())
        try:
            while True:
                # look first: a connection may be waiting with the descriptor already cleared
                try:
                    return endpoint.try_accept()
                except BlockingIOError:
                    pass
                ready: "asyncio.Future[None]" = loop.create_future()

                def wake() -> None:
                    if not ready.done():
                        ready.set_result(None)

                loop.add_reader(fd, wake)
                try:
                    await ready
                finally:
                    loop.remove_reader(fd)
        finally:
            os.close(fd)


async def accept(
    endpoint: Endpoint, timeout: Optional[float] = None, *, limit: int = _DEFAULT_LIMIT
) -> Tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Waits for the next incoming connection of the server ``endpoint``, at most
    ``timeout`` seconds (``None``: for ever; the built-in ``TimeoutError`` then), without
    blocking a thread, and returns streams over it. ``ValueError`` for a negative or NaN
    ``timeout`` or a ``limit`` below 1, before any connection is taken."""
    _check_limit(limit)
    timeout = _timeout_arg(timeout)
    try:
        if timeout is not None and timeout <= 0:
            # only a look: `wait_for` would cancel the wait before it looked once
            try:
                conn = endpoint.try_accept()
            except BlockingIOError:
                raise asyncio.TimeoutError() from None
        else:
            conn = await asyncio.wait_for(_accept_connection(endpoint), timeout)
    except asyncio.TimeoutError:
        # before Python 3.11 asyncio's TimeoutError is not the built-in one
        raise TimeoutError("no connection arrived in time") from None
    return wrap(conn, limit=limit)
