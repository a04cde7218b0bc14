"""ri2n: one reliable connection striped over several network links, over UDP (or TCP:
``transport="tcp"`` on both ends).

An ``Endpoint`` binds one UDP socket (with the TCP transport, one listening TCP socket) per
local address; each (local, remote) address pair a connection uses is a link. Data is
striped over every healthy link, a failed or degraded link is detected within milliseconds
and its data re-sent on the others, and a connection survives every link being down: reads
and writes just wait until a link works again::

    import ri2n
    key = ri2n.Key.from_file("/etc/ri2n/cluster.key")     # the same on every host
    server = ri2n.Endpoint.server(["10.0.1.2:7000", "10.0.2.2:7000"], key=key)
    client = ri2n.Endpoint.client(["10.0.1.1:0", "10.0.2.1:0"], key=key)
    with client.connect(["10.0.1.2:7000"], timeout=10) as conn:  # one address is enough
        conn.sendall(b"hello")
        conn.finish()                      # the end of the stream
    peer = server.accept(timeout=10)
    peer.recv(65536)                       # b"hello", then b"" at the end of the stream

Besides the byte stream (``send``/``sendall``/``recv``/``recv_into``) a connection carries
whole messages (``send_message``/``recv_message``) and unreliable datagrams
(``send_datagram``/``recv_datagram``). Every call that waits releases the GIL. Timeouts are
seconds (``None``: wait for ever) and raise the built-in ``TimeoutError``; the end of a
stream is ``b""`` from ``recv`` and ``None`` from ``recv_message``/``recv_datagram``.

Non-blocking use: the ``try_*`` calls (``try_recv``, ``try_recv_into``, ``try_send``,
``try_recv_message``, ``try_send_message``, ``try_recv_datagram``, ``Endpoint.try_accept``)
never wait and raise ``BlockingIOError`` instead; ``fileno()`` (of a connection or an
endpoint) becomes readable when retrying may succeed, for ``select``/``selectors``/asyncio.
It is a readiness descriptor only: never read it. ``ri2n.aio`` builds asyncio streams on it.
A thread blocked in a waiting call (``recv``, ``sendall``, ``send_message``, …) never takes a
wake-up meant for a loop that watches these descriptors on another thread.

Errors: ``KeyMismatch`` (a ``ConnectionError``) when the keys differ, ``PeerGone`` (a
``ConnectionResetError``) when the peer is gone, aborted or restarted,
``ConnectionRefusedError`` when nothing listens, ``TimeoutError``, ``ValueError`` for bad
arguments, ``OSError`` subclasses for the system's errors; ``ri2n.Error`` is the base of
ri2n's own exceptions.
"""

from . import aio
from ._errors import Error, KeyMismatch, NotDelivered, PeerGone
from ._ri2n import MAX_LINKS, Connection, Endpoint, Key, __version__

__all__ = [
    "Connection",
    "Endpoint",
    "Error",
    "Key",
    "KeyMismatch",
    "MAX_LINKS",
    "NotDelivered",
    "PeerGone",
    "__version__",
    "aio",
]
