"""The exceptions ri2n defines.

They live in Python, not in the extension module, because each is a subclass of both
``ri2n.Error`` and a built-in ``OSError`` subclass (``KeyMismatch`` is a ``ConnectionError``,
``PeerGone`` a ``ConnectionResetError``), which a class made in Rust cannot express. The
extension module raises them by importing this module.
"""

from typing import Optional

__all__ = ["Error", "KeyMismatch", "PeerGone", "NotDelivered"]


class Error(OSError):
    """Base class of the exceptions ri2n defines; also raised as itself for a failure no
    built-in exception names (e.g. the peer broke the protocol, or takes no messages)."""


class KeyMismatch(Error, ConnectionError):
    """The handshake could not be authenticated: the two sides hold different keys, or only
    one of them holds a key. Raised by ``Endpoint.connect``; the server refuses such a client
    and lists it in ``Endpoint.refused_handshakes()``.

    Attributes:
        mismatch: ``"wrong_key"`` (both hold a key, not the same), ``"key_required"`` (the
            server requires a key and this side has none) or ``"no_key"`` (this side holds a
            key and the server has none).
        key_file: the file this side's key was read from, if it came from one.
    """

    mismatch: str = ""
    key_file: Optional[str] = None


class PeerGone(Error, ConnectionResetError):
    """The peer is gone: its process ended (its host answers "port unreachable"), it aborted
    the connection, it restarted and no longer knows the connection, or it closed the
    connection before acknowledging everything sent to it."""


class NotDelivered(Error):
    """``Endpoint.close`` gave up: some peers never acknowledged everything written to them.

    Attributes:
        connections: how many connections were concerned.
        bytes: how many written bytes their peers did not acknowledge.
    """

    connections: int = 0
    bytes: int = 0


# shown (and pickled) as what users import: ri2n.KeyMismatch, not ri2n._errors.KeyMismatch
for _cls in (Error, KeyMismatch, PeerGone, NotDelivered):
    _cls.__module__ = "ri2n"
del _cls
