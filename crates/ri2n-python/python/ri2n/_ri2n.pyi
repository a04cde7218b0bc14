"""Type stubs of the extension module ``ri2n._ri2n`` (src/*.rs); ``ri2n`` re-exports it."""

import os
import sys
from types import TracebackType
from typing import ClassVar, List, Optional, Protocol, Sequence, Tuple, Type, TypedDict, Union

if sys.version_info >= (3, 12):
    from collections.abc import Buffer
else:
    from typing_extensions import Buffer

from typing_extensions import Self

# "ip:port" or (ip, port), as socket takes it; one or a sequence of them
_Addr = Union[str, Tuple[str, int]]
_Addrs = Union[_Addr, Sequence[_Addr]]

class _Cancel(Protocol):
    """What ``Endpoint.connect`` looks at to give up: a ``threading.Event``, say."""

    def is_set(self) -> bool: ...
_Path = Union[str, "os.PathLike[str]"]

MAX_LINKS: int
__version__: str

# The dicts of Connection.stats() and Connection.events(), for type checkers only (they do
# not exist at run time).

class _LinkStats(TypedDict):
    id: int
    state: str  # "up", "down", "degraded", "validating"
    local: str  # "ip:port"
    remote: str
    srtt: float  # seconds
    min_rtt: float
    cwnd: int
    bytes_in_flight: int
    bytes_sent: int
    bytes_received: int
    packets_sent: int
    packets_received: int
    packets_lost: int
    stream_bytes_sent: int
    stream_bytes_acked: int
    max_datagram: int
    refusals: int
    counts_packets: bool  # False on the TCP transport: the packet counts read 0

class _SendLimits(TypedDict):
    # seconds of the time the connection was busy (something unacknowledged or waiting to
    # be sent): sent at its own pace, or waiting for what the name says; all 0 on the TCP
    # transport, whose sending the kernel does
    sending: float
    congestion_window: float
    pacing: float
    peer_window: float
    send_buffer: float
    no_link: float

class _ConnectionStats(TypedDict):
    links: List[_LinkStats]
    send_buffered: int
    recv_buffered: int
    recv_fragments: int
    bytes_acknowledged: int
    stream_acknowledged: int  # the byte stream's own bytes: no framing, no messages
    bytes_received: int
    cipher: Optional[str]  # "aegis-256x4", "aes-256-gcm", "chacha20-poly1305"; None without a key
    key_updates: Tuple[int, int]
    packets_opened_ahead: int
    datagrams_sent: int
    datagrams_resent: int
    datagrams_send_dropped: int
    datagrams_received: int
    datagrams_receive_dropped: int
    datagrams_reordered: int
    datagrams_duplicate: int
    datagrams_waiting: Tuple[int, int]
    send_limits: _SendLimits

_Event = TypedDict(
    "_Event",
    {
        "kind": str,  # "connected", "link_added", "link_state_changed", "all_acknowledged", "closed"
        "link": Optional[int],
        "from": Optional[str],
        "to": Optional[str],
        "reason": Optional[str],
        "at": float,  # time.monotonic() seconds
    },
)

class Key:
    """The key a cluster shares; ``repr()`` never shows it."""

    @staticmethod
    def generate() -> Key:
        """A new random key."""
    @staticmethod
    def from_text(text: str) -> Key:
        """The key in a key file's text; ``ValueError`` if it is not one."""
    @staticmethod
    def from_file(path: _Path) -> Key:
        """Reads a key file; ``FileNotFoundError``/``OSError``, ``ValueError`` for bad content."""
    def save(self, path: _Path, *, overwrite: bool = False) -> None:
        """Writes a new key file of mode 0600 (``FileExistsError`` unless ``overwrite``)."""
    def to_text(self) -> str:
        """``ri2n-key-v1:`` and 64 hex digits."""
    @property
    def path(self) -> Optional[os.PathLike[str]]:
        """The file the key was read from, if it was (a ``pathlib.Path``)."""
    def __eq__(self, other: object) -> bool: ...
    # compared by value, not hashable
    __hash__: ClassVar[None]  # type: ignore[assignment]

class Endpoint:
    """A host's ri2n endpoint: one UDP socket (with ``transport="tcp"``, one TCP socket)
    per local address; each address pair a connection uses is a link. After ``os.fork()``,
    one made before it is closed in the child, as are its connections."""

    @staticmethod
    def server(
        addrs: _Addrs,
        key: Optional[Key] = None,
        key_file: Optional[_Path] = None,
        transport: str = "udp",
    ) -> Endpoint:
        """An endpoint that accepts connections on ``addrs`` (``"ip:port"`` or ``(ip, port)``,
        one or a list); ``transport`` ``"udp"`` or ``"tcp"``."""
    @staticmethod
    def client(
        addrs: _Addrs,
        key: Optional[Key] = None,
        key_file: Optional[_Path] = None,
        transport: str = "udp",
    ) -> Endpoint:
        """An endpoint that only connects, from ``addrs`` (port 0: any)."""
    def connect(
        self, addrs: _Addrs, timeout: Optional[float] = None, *, cancel: Optional[_Cancel] = None
    ) -> Connection:
        """Connects to a server; ``TimeoutError``, ``ConnectionRefusedError``, ``KeyMismatch``;
        ``InterruptedError`` once ``cancel.is_set()``."""
    def accept(self, timeout: Optional[float] = None) -> Connection:
        """The next incoming connection; ``TimeoutError`` if none came in time."""
    def try_accept(self) -> Connection:
        """The next incoming connection if one waits; ``BlockingIOError`` otherwise."""
    def fileno(self) -> int:
        """Readiness descriptor for ``try_accept`` (never read it)."""
    def local_addrs(self) -> List[str]:
        """The bound addresses, ports resolved."""
    def refused_handshakes(self) -> List[Tuple[str, str]]:
        """``(client address, reason)`` of handshakes refused since the last call."""
    def abort(self, code: int = 0, reason: str = "") -> None:
        """Aborts every connection at once; each peer sees ``PeerGone`` naming ``code``
        (an int >= 0, else ``ValueError``) and ``reason``."""
    def close(self, timeout: Optional[float] = None) -> None:
        """Closes every connection gracefully; ``NotDelivered`` if data was not acknowledged.
        Ctrl-C stops the wait and aborts what is left (the peers see ``PeerGone``)."""
    @property
    def closed(self) -> bool: ...
    def __enter__(self) -> Self: ...
    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc_value: Optional[BaseException],
        traceback: Optional[TracebackType],
    ) -> bool: ...

class Connection:
    """One ri2n connection: a byte stream, messages and datagrams over several links."""

    def send(self, data: Buffer) -> int:
        """Writes what the send buffer takes (waiting for some room); returns the count."""
    def sendall(self, data: Buffer) -> None:
        """Writes all of ``data``."""
    def try_send(self, data: Buffer) -> int:
        """Writes what the send buffer takes now; ``BlockingIOError`` when it is full."""
    def recv(self, n: int, *, timeout: Optional[float] = None) -> bytes:
        """At most ``n`` bytes of the stream; ``b""`` at its end."""
    def recv_into(
        self, buffer: Buffer, nbytes: int = 0, *, timeout: Optional[float] = None
    ) -> int:
        """Reads into a writable buffer; returns the count, 0 at the end of the stream."""
    def try_recv(self, n: int) -> bytes:
        """``recv`` without waiting: ``BlockingIOError`` when nothing is waiting."""
    def try_recv_into(self, buffer: Buffer, nbytes: int = 0) -> int:
        """``recv_into`` without waiting: ``BlockingIOError`` when nothing is waiting."""
    def send_message(self, data: Buffer) -> None:
        """Sends one whole message."""
    def try_send_message(self, data: Buffer) -> None:
        """``send_message`` without waiting: ``BlockingIOError`` when the buffer is full."""
    def recv_message(self, *, timeout: Optional[float] = None) -> Optional[bytes]:
        """One whole message; ``None`` once the peer finished."""
    def try_recv_message(self) -> Optional[bytes]:
        """``recv_message`` without waiting: ``BlockingIOError`` when none is waiting."""
    def send_datagram(self, data: Buffer) -> None:
        """Sends one unreliable datagram; does not wait for the links (see the Rust docs)."""
    def recv_datagram(self, *, timeout: Optional[float] = None) -> Optional[bytes]:
        """One datagram; ``None`` once the connection closed cleanly and all were read."""
    def try_recv_datagram(self) -> Optional[bytes]:
        """``recv_datagram`` without waiting: ``BlockingIOError`` when none is waiting."""
    def max_message_size(self) -> int: ...
    def max_datagram_size(self) -> int: ...
    def unsplit_datagram_size(self) -> int: ...
    def finish(self) -> None:
        """Ends the outgoing streams: the peer reads the end after what was written. Raises
        the connection's error once it ended on one."""
    def wait_acknowledged(self, timeout: Optional[float] = None) -> None:
        """Waits until the peer acknowledged everything and the end (after ``finish``)."""
    def is_acknowledged(self) -> bool: ...
    def fileno(self) -> int:
        """Readiness descriptor for the ``try_*`` calls (never read it); -1 once closed. The
        waiting calls clear it too: beside a thread making them, use ``read_fileno()`` or
        ``write_fileno()``."""
    def read_fileno(self) -> int:
        """Readiness descriptor of the reading calls alone (``-1`` once closed)."""
    def write_fileno(self) -> int:
        """Readiness descriptor of the writing calls alone (``-1`` once closed)."""
    def stream_read_fileno(self) -> int:
        """Readiness descriptor of the byte stream's reads alone (``-1`` once closed)."""
    def stream_write_fileno(self) -> int:
        """Readiness descriptor of the byte stream's writes alone (``-1`` once closed)."""
    def state(self) -> str:
        """``"connecting"``, ``"established"``, ``"draining"`` or ``"closed"``."""
    def close_reason(self) -> Optional[BaseException]:
        """Why the connection ended, as the exception its calls raise; ``None`` if it did not."""
    def stats(self) -> _ConnectionStats:
        """Counters, and ``"links"``: a list of per-link dicts."""
    def events(self) -> List[_Event]:
        """State changes since the last call: ``kind``, ``link``, ``from``, ``to``, ``reason``, ``at``."""
    def set_timeouts(
        self, all_links_down: Optional[float] = None, idle: Optional[float] = None
    ) -> None:
        """Ends the connection (its calls raise ``TimeoutError``) when no link was up for
        ``all_links_down`` seconds or nothing was received for ``idle``; ``None``: never."""
    def abort(self, code: int = 0, reason: str = "") -> None:
        """Aborts the connection; the peer sees ``PeerGone`` naming ``code`` (an int >= 0,
        else ``ValueError``) and ``reason``."""
    def close(self) -> None:
        """Lets go: finishes the streams; the connection delivers in the background. Where
        the ``Endpoint`` object is gone, waits up to its close_linger (10 s) for delivery;
        Ctrl-C stops that wait."""
    @property
    def closed(self) -> bool: ...
    def __enter__(self) -> Self: ...
    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc_value: Optional[BaseException],
        traceback: Optional[TracebackType],
    ) -> bool: ...
