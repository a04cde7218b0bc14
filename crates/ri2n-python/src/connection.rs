//! `ri2n.Connection`: a reliable byte stream, whole messages and unreliable datagrams over
//! every link of one connection, with the calls of a Python socket where they fit.
//!
//! Every wait runs with the GIL released. Reads and waits come back to Python every
//! [`SIGNAL_CHECK`] so that Ctrl-C gets through, with a timeout or without (then the deadline
//! is [`never`]): a message or datagram is received by the library's timed call, in slices; a
//! stream read (the library has no timed read) retries the non-blocking read and waits on the
//! connection's reading descriptor in between, which `try_read` clears before it looks and
//! the driver signals when retrying may succeed, so no wake-up is lost. Stream writes and
//! messages wait the same way, on the writing descriptor.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pyo3::exceptions::{PyTimeoutError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyType};
use ri2n::{Cipher, Connection, ConnectionState, ConnectionStats, Event, TimedEvent};

use crate::buffer::Held;
use crate::errors::{connection_error, io_error};
use crate::{
    drop_detached, drop_interruptible, timeout_arg, AbortCode, AbortReason, Kept, Shared,
    SIGNAL_CHECK,
};

/// One ri2n connection. Reads and writes block (with the GIL released) until they can
/// proceed; while every link is down they simply wait. The ``try_*`` calls never block: they
/// raise ``BlockingIOError`` instead, and ``fileno()`` becomes readable when retrying may
/// succeed. ``close()`` (or leaving a ``with`` block) finishes the streams and lets the
/// connection deliver what was written in the background while its endpoint lives and the
/// peer is heard from.
#[pyclass(name = "Connection", module = "ri2n", frozen)]
pub struct PyConnection {
    inner: Kept<Connection>,
}

impl PyConnection {
    pub(crate) fn new(conn: Connection) -> Self {
        Self {
            inner: Kept::new(conn, "connection"),
        }
    }

    /// The connection, or `ValueError` once closed.
    fn get(&self) -> PyResult<Shared<Connection>> {
        self.inner.get()
    }

    /// The number of the readiness descriptor `which` gives, or -1 once the connection is
    /// closed, like a closed socket's `fileno()`.
    fn descriptor(
        &self,
        py: Python<'_>,
        which: impl for<'c> FnOnce(&'c Connection) -> io::Result<BorrowedFd<'c>>,
    ) -> PyResult<i32> {
        let Ok(conn) = self.get() else {
            return Ok(-1);
        };
        let fd = which(&conn).map_err(|e| io_error(py, e))?;
        Ok(fd.as_raw_fd())
    }

    fn take(&self) -> Option<Arc<Connection>> {
        self.inner.take()
    }
}

/// Runs the library's timed `call` (a read, receive or write given how long it may wait) in
/// slices of at most [`SIGNAL_CHECK`] until `deadline` (`TimeoutError` then), letting Python
/// handle signals between slices. The first slice runs even when the deadline has passed (a
/// timeout of 0: what is there is taken). Every blocking call of this module waits here: in
/// the library, which clears no readiness descriptor, so a thread blocked in one never takes
/// a wake-up meant for an event loop watching `fileno()`, `read_fileno()` or
/// `write_fileno()` (a loop of non-blocking calls and waits on a descriptor did, at the end
/// of each slice: each such call clears the shared descriptors).
fn timed_slices<T: Send>(
    py: Python<'_>,
    deadline: Instant,
    mut call: impl FnMut(Duration) -> io::Result<T> + Send,
) -> PyResult<T> {
    let mut tried = false;
    loop {
        let now = Instant::now();
        if tried && now >= deadline {
            return Err(PyTimeoutError::new_err("timed out"));
        }
        tried = true;
        let slice = deadline.saturating_duration_since(now).min(SIGNAL_CHECK);
        match py.detach(|| call(slice)) {
            // the slice ran out; a connection that timed out carries its ConnectionError
            Err(e) if e.kind() == io::ErrorKind::TimedOut && !ends_connection(&e) => {
                py.check_signals()?
            }
            r => return r.map_err(|e| io_error(py, e)),
        }
    }
}

/// A whole message or datagram from `recv` (the library's call, given how long it may wait),
/// waiting at most `timeout` seconds (`None`: as long as it takes).
fn receive_whole<'py>(
    py: Python<'py>,
    timeout: Option<f64>,
    recv: impl Fn(Option<Duration>) -> io::Result<Option<Vec<u8>>> + Sync,
) -> PyResult<Option<Bound<'py, PyBytes>>> {
    let got = timed_slices(py, deadline(timeout)?, |slice| recv(Some(slice)))?;
    Ok(got.map(|m| PyBytes::new(py, &m)))
}

/// A received message or datagram as Python sees it: `bytes`, `None` at the end.
fn whole<'py>(
    py: Python<'py>,
    got: io::Result<Option<Vec<u8>>>,
) -> PyResult<Option<Bound<'py, PyBytes>>> {
    let got = got.map_err(|e| io_error(py, e))?;
    Ok(got.map(|m| PyBytes::new(py, &m)))
}

/// Whether an error says the connection ended (as opposed to a wait that ran out).
fn ends_connection(e: &io::Error) -> bool {
    e.get_ref()
        .is_some_and(|inner| inner.downcast_ref::<ri2n::ConnectionError>().is_some())
}

/// Bytes handed to the library whole by [`write_all`], at most, as `ri2n send` hands them.
const SEND_CHUNK: usize = 1 << 20;
/// The smallest buffer the library takes whole (`Connection::write_buf_timeout`).
const WHOLE_BUFFER: usize = 16 << 10;

/// Writes all of `data`, waiting for room as [`timed_slices`] waits, and letting Python handle
/// signals between pieces (as its own `sendall` does). Pieces of 16 KiB or more are copied
/// into a buffer of our own, without the GIL, and handed over whole
/// (`Connection::write_buf_timeout`): the copy is then made before the engine's lock is
/// taken, not under it as a write makes it, so the library's threads never wait for it.
fn write_all(py: Python<'_>, conn: &Connection, data: &[u8]) -> PyResult<()> {
    if data.is_empty() {
        // as a socket's sendall(b""), a write all the same: it fails where any would
        timed_slices(py, never(), |slice| conn.write_timeout(data, Some(slice)))?;
        return Ok(());
    }
    let mut rest = data;
    // handed over whole, the buffer comes back with the memory of one already acknowledged,
    // so the pieces after the first few allocate nothing
    let mut buf = Vec::new();
    while !rest.is_empty() {
        let piece = &rest[..rest.len().min(SEND_CHUNK)];
        let taken = if piece.len() < WHOLE_BUFFER {
            timed_slices(py, never(), |slice| conn.write_timeout(piece, Some(slice)))?
        } else {
            buf.clear();
            // a slice that ran out leaves the buffer as it was: copied once
            timed_slices(py, never(), |slice| {
                if buf.is_empty() {
                    buf.extend_from_slice(piece);
                }
                conn.write_buf_timeout(&mut buf, Some(slice))
            })?
        };
        rest = &rest[taken..];
        py.check_signals()?;
    }
    Ok(())
}

/// The deadline of a timeout argument; [`never`] for none (wait for ever).
fn deadline(timeout: Option<f64>) -> PyResult<Instant> {
    Ok((timeout_arg(timeout)?.and_then(|t| Instant::now().checked_add(t))).unwrap_or_else(never))
}

/// A deadline that never comes: the waits are sliced all the same, for Ctrl-C.
fn never() -> Instant {
    const CENTURY: Duration = Duration::from_secs(100 * 365 * 24 * 3600);
    let now = Instant::now();
    now.checked_add(CENTURY).unwrap_or(now)
}

#[pymethods]
impl PyConnection {
    /// Writes as much of ``data`` (any bytes-like object) as the send buffer takes, waiting
    /// until it takes some; returns how many bytes it took.
    fn send(&self, py: Python<'_>, data: &Bound<'_, PyAny>) -> PyResult<usize> {
        let conn = self.get()?;
        let held = Held::readable(data)?;
        let bytes = held.bytes();
        timed_slices(py, never(), |slice| conn.write_timeout(bytes, Some(slice)))
    }

    /// Writes all of ``data`` (any bytes-like object, read where it lies), waiting for room
    /// as needed, with the GIL released.
    fn sendall(&self, py: Python<'_>, data: &Bound<'_, PyAny>) -> PyResult<()> {
        let conn = self.get()?;
        let held = Held::readable(data)?;
        write_all(py, &conn, held.bytes())
    }

    /// Writes as much of ``data`` as the send buffer takes now; ``BlockingIOError`` when it
    /// is full. Never blocks.
    fn try_send(&self, py: Python<'_>, data: &Bound<'_, PyAny>) -> PyResult<usize> {
        let conn = self.get()?;
        let held = Held::readable(data)?;
        py.detach(|| conn.try_write(held.bytes()))
            .map_err(|e| io_error(py, e))
    }

    /// Reads at most ``n`` bytes of the stream, waiting until some arrived (at most
    /// ``timeout`` seconds, ``None``: for ever; ``TimeoutError`` then); ``b""`` at the end of
    /// the stream (the peer called ``finish()`` or closed). ``recv_into`` spares the copy.
    #[pyo3(signature = (n, *, timeout = None))]
    fn recv<'py>(
        &self,
        py: Python<'py>,
        n: i64,
        timeout: Option<f64>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let n = size_arg("n", n)?;
        let conn = self.get()?;
        let deadline = deadline(timeout)?;
        if n == 0 {
            return Ok(PyBytes::new(py, b""));
        }
        let mut buf = vec![0u8; n.min(MAX_RECV)];
        let got = timed_slices(py, deadline, |slice| {
            conn.read_timeout(&mut buf, Some(slice))
        })?;
        Ok(PyBytes::new(py, &buf[..got]))
    }

    /// Reads the stream into ``buffer`` (any writable bytes-like object), at most ``nbytes``
    /// bytes (0: its length), waiting as ``recv`` does; returns how many, 0 at the end of the
    /// stream. The library copies straight into the buffer, with the GIL released.
    #[pyo3(signature = (buffer, nbytes = 0, *, timeout = None))]
    fn recv_into(
        &self,
        py: Python<'_>,
        buffer: &Bound<'_, PyAny>,
        nbytes: i64,
        timeout: Option<f64>,
    ) -> PyResult<usize> {
        let nbytes = size_arg("nbytes", nbytes)?;
        let conn = self.get()?;
        let deadline = deadline(timeout)?;
        let mut held = Held::writable(buffer)?;
        let into = limit(held.bytes_mut(), nbytes)?;
        if into.is_empty() {
            return Ok(0);
        }
        timed_slices(py, deadline, |slice| conn.read_timeout(into, Some(slice)))
    }

    /// Reads at most ``n`` bytes that have arrived; ``b""`` at the end of the stream,
    /// ``BlockingIOError`` when nothing is waiting. Never blocks.
    fn try_recv<'py>(&self, py: Python<'py>, n: i64) -> PyResult<Bound<'py, PyBytes>> {
        let n = size_arg("n", n)?;
        let conn = self.get()?;
        if n == 0 {
            return Ok(PyBytes::new(py, b""));
        }
        let mut buf = vec![0u8; n.min(MAX_RECV)];
        let got = py
            .detach(|| conn.try_read(&mut buf))
            .map_err(|e| io_error(py, e))?;
        Ok(PyBytes::new(py, &buf[..got]))
    }

    /// ``recv_into`` without waiting: ``BlockingIOError`` when nothing is waiting.
    #[pyo3(signature = (buffer, nbytes = 0))]
    fn try_recv_into(
        &self,
        py: Python<'_>,
        buffer: &Bound<'_, PyAny>,
        nbytes: i64,
    ) -> PyResult<usize> {
        let nbytes = size_arg("nbytes", nbytes)?;
        let conn = self.get()?;
        let mut held = Held::writable(buffer)?;
        let into = limit(held.bytes_mut(), nbytes)?;
        if into.is_empty() {
            return Ok(0);
        }
        py.detach(|| conn.try_read(into))
            .map_err(|e| io_error(py, e))
    }

    /// Sends one whole message (the peer receives it whole, in order, with
    /// ``recv_message``), waiting for buffer space. At most ``max_message_size()`` bytes
    /// (``ValueError`` beyond); larger data belongs on the stream.
    fn send_message(&self, py: Python<'_>, data: &Bound<'_, PyAny>) -> PyResult<()> {
        let conn = self.get()?;
        let held = Held::readable(data)?;
        let bytes = held.bytes();
        timed_slices(py, never(), |slice| {
            conn.send_message_timeout(bytes, Some(slice))
        })
    }

    /// ``send_message`` if the buffer has room now; ``BlockingIOError`` otherwise.
    fn try_send_message(&self, py: Python<'_>, data: &Bound<'_, PyAny>) -> PyResult<()> {
        let conn = self.get()?;
        let held = Held::readable(data)?;
        py.detach(|| conn.try_send_message(held.bytes()))
            .map_err(|e| io_error(py, e))
    }

    /// Receives one whole message, waiting at most ``timeout`` seconds (``None``: for ever;
    /// ``TimeoutError`` then). Returns ``None`` once the peer finished (``finish()``/
    /// ``close()``) and every message was read: ``b""`` is a message, the empty one.
    #[pyo3(signature = (*, timeout = None))]
    fn recv_message<'py>(
        &self,
        py: Python<'py>,
        timeout: Option<f64>,
    ) -> PyResult<Option<Bound<'py, PyBytes>>> {
        let conn = self.get()?;
        receive_whole(py, timeout, |t| conn.recv_message_timeout(t))
    }

    /// A whole message if one has arrived; ``None`` at the end (as ``recv_message``);
    /// ``BlockingIOError`` when none is waiting. Never blocks.
    fn try_recv_message<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyBytes>>> {
        let conn = self.get()?;
        whole(py, py.detach(|| conn.try_recv_message()))
    }

    /// Sends ``data`` as one unreliable datagram: it arrives whole or not at all, at most
    /// once, in sending order (after a short wait for a missing one; a late one is still
    /// delivered); it is sent once, never repaired after a loss (only one a failing link held
    /// is sent once more on another). Does not wait for the links (datagrams wait in a
    /// bounded queue, the oldest dropped when it is full); with a sending thread per link
    /// that falls behind, it waits for those once the queue is half full (at most the
    /// datagram age limit, 20 ms). At most ``max_datagram_size()``
    /// bytes (``ValueError`` beyond).
    fn send_datagram(&self, py: Python<'_>, data: &Bound<'_, PyAny>) -> PyResult<()> {
        let conn = self.get()?;
        let held = Held::readable(data)?;
        py.detach(|| conn.send_datagram(held.bytes()))
            .map_err(|e| io_error(py, e))
    }

    /// Receives one datagram, waiting at most ``timeout`` seconds (``None``: for ever;
    /// ``TimeoutError`` then). Returns ``None`` once the connection closed cleanly and every
    /// datagram that arrived was read.
    #[pyo3(signature = (*, timeout = None))]
    fn recv_datagram<'py>(
        &self,
        py: Python<'py>,
        timeout: Option<f64>,
    ) -> PyResult<Option<Bound<'py, PyBytes>>> {
        let conn = self.get()?;
        receive_whole(py, timeout, |t| conn.recv_datagram_timeout(t))
    }

    /// A datagram if one is waiting; ``None`` at the end (as ``recv_datagram``);
    /// ``BlockingIOError`` when none is waiting. Never blocks.
    fn try_recv_datagram<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyBytes>>> {
        let conn = self.get()?;
        whole(py, py.detach(|| conn.try_recv_datagram()))
    }

    /// Largest message ``send_message`` takes, in bytes (just under 8 MiB by default).
    fn max_message_size(&self) -> PyResult<usize> {
        Ok(self.get()?.max_message_size())
    }

    /// Largest datagram ``send_datagram`` takes, in bytes (66 559; 0 on the TCP transport,
    /// which carries none).
    fn max_datagram_size(&self) -> PyResult<usize> {
        Ok(self.get()?.max_datagram_size())
    }

    /// Largest datagram that travels in one packet, never in pieces.
    fn unsplit_datagram_size(&self) -> PyResult<usize> {
        Ok(self.get()?.unsplit_datagram_size())
    }

    /// Ends both outgoing streams (bytes and messages): the peer reads ``b""`` from ``recv``
    /// (and ``None`` from ``recv_message``) after what was written. Data keeps arriving from
    /// the peer until it finishes too. Raises the connection's error once it ended on one.
    fn finish(&self, py: Python<'_>) -> PyResult<()> {
        let conn = self.get()?;
        py.detach(|| conn.finish()).map_err(|e| io_error(py, e))
    }

    /// Waits until the peer acknowledged everything written and the end of both streams
    /// (call ``finish()`` first), at most ``timeout`` seconds (``None``: for ever;
    /// ``TimeoutError`` then).
    #[pyo3(signature = (timeout = None))]
    fn wait_acknowledged(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<()> {
        let conn = self.get()?;
        timed_slices(py, deadline(timeout)?, |slice| {
            conn.wait_acknowledged(Some(slice))
        })
    }

    /// Whether the peer acknowledged everything written and the end of both streams.
    fn is_acknowledged(&self) -> PyResult<bool> {
        Ok(self.get()?.is_acknowledged())
    }

    /// The readiness descriptor: it becomes readable when a ``try_*`` call that raised
    /// ``BlockingIOError`` may succeed if retried (data or a message arrived, buffer space was
    /// freed, a link changed state, the connection closed). For ``select``/``selectors``/
    /// asyncio readiness only: register it for reading and never read it yourself. Each
    /// ``try_*`` call clears it before it looks, so after a wake-up call them until
    /// ``BlockingIOError`` (it is edge-like). One descriptor serves reads and writes: one event
    /// loop per connection. The waiting calls (``recv``, ``sendall``, ...) clear it too, so a
    /// loop that shares the connection with a thread making them waits on ``read_fileno()``
    /// or ``write_fileno()`` instead. ``-1`` once closed, like a closed socket.
    fn fileno(&self, py: Python<'_>) -> PyResult<i32> {
        self.descriptor(py, Connection::readiness_fd)
    }

    /// A readiness descriptor for reading alone: readable when a retry of ``try_recv``,
    /// ``try_recv_into``, ``try_recv_message`` or ``try_recv_datagram`` may succeed, and
    /// cleared only by those. With ``write_fileno()``, a reader and a writer that wait apart
    /// (``ri2n.aio``'s transport) never clear each other's wake-ups. ``-1`` once closed.
    fn read_fileno(&self, py: Python<'_>) -> PyResult<i32> {
        self.descriptor(py, Connection::read_readiness_fd)
    }

    /// A readiness descriptor for writing alone: readable when a retry of ``try_send`` or
    /// ``try_send_message`` may succeed (room was freed, or the connection changed state),
    /// and cleared only by those. ``-1`` once closed.
    fn write_fileno(&self, py: Python<'_>) -> PyResult<i32> {
        self.descriptor(py, Connection::write_readiness_fd)
    }

    /// A readiness descriptor for the byte stream's reads alone: readable when a retry of
    /// ``try_recv`` or ``try_recv_into`` may succeed, and cleared only by those, so that
    /// message and datagram calls on the same connection never take its wake-ups (as they
    /// may ``read_fileno()``'s). ``ri2n.aio``'s transport waits on it. ``-1`` once closed.
    fn stream_read_fileno(&self, py: Python<'_>) -> PyResult<i32> {
        self.descriptor(py, Connection::stream_read_readiness_fd)
    }

    /// The same for the byte stream's writes: readable when a retry of ``try_send`` may
    /// succeed, cleared only by it (not by ``try_send_message``). ``-1`` once closed.
    fn stream_write_fileno(&self, py: Python<'_>) -> PyResult<i32> {
        self.descriptor(py, Connection::stream_write_readiness_fd)
    }

    /// The connection's state: ``"connecting"``, ``"established"``, ``"draining"`` (both
    /// sides done, lingering briefly) or ``"closed"``.
    fn state(&self, py: Python<'_>) -> PyResult<&'static str> {
        let conn = self.get()?;
        Ok(state_name(py.detach(|| conn.state())))
    }

    /// Why the connection ended, as the exception its calls raise (not raised: returned), or
    /// ``None`` while it runs or after a clean end.
    fn close_reason(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        let conn = self.get()?;
        let reason = py.detach(|| conn.close_reason());
        Ok(reason.map(|e| connection_error(py, &e, None).into_value(py).into_any()))
    }

    /// Statistics: a dict of the connection's counters (``bytes_acknowledged``,
    /// ``bytes_received``, ``send_buffered``, ``recv_buffered``: bytes with their framing, a
    /// message's few bytes of length prefix and on the TCP transport a 5-byte header per
    /// chunk, up to one per write, so they run ahead of the bytes written when writes are
    /// small; ``stream_acknowledged``, the byte stream's own bytes the peer acknowledged,
    /// without framing or messages; ``cipher``, the ``datagrams_*`` counts, ...) whose
    /// ``"links"`` is a list of
    /// dicts, one per link:
    /// ``id``, ``state`` (``"up"``, ``"down"``, ``"degraded"``, ``"validating"``), ``local``
    /// and ``remote`` (``"ip:port"``), ``srtt`` and ``min_rtt`` (seconds), ``cwnd``,
    /// ``bytes_in_flight``, ``bytes_sent``/``bytes_received``, ``packets_sent``/
    /// ``packets_received``/``packets_lost``, ``stream_bytes_sent``/``stream_bytes_acked``,
    /// ``max_datagram``, ``refusals``, and ``counts_packets``: false on the TCP transport,
    /// where the packet counts, ``max_datagram`` and ``refusals`` are not kept (they read 0).
    /// ``"send_limits"`` says what held the sender back: of the seconds it was busy, those it
    /// sent at its own pace (``sending``) and those it waited for the links'
    /// ``congestion_window`` or ``pacing``, the peer's window (``peer_window``), room in its
    /// ``send_buffer``, or a link (``no_link``); all 0 on the TCP transport.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let conn = self.get()?;
        let stats = py.detach(|| conn.stats());
        stats_dict(py, &stats)
    }

    /// State changes since the last call, oldest first: dicts with ``kind``
    /// (``"connected"``, ``"link_added"``, ``"link_state_changed"``, ``"all_acknowledged"``,
    /// ``"closed"``), ``link`` (its id, or ``None``), ``from``/``to`` (link states, for
    /// ``"link_state_changed"``), ``reason`` (why a ``"closed"`` connection ended, ``None``
    /// for a clean close) and ``at`` (when, in ``time.monotonic()`` seconds). Link 0, the
    /// one the handshake took, comes with ``"connected"``: no ``"link_added"`` tells it.
    fn events<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let conn = self.get()?;
        let events = py.detach(|| conn.poll_events());
        let list = PyList::empty(py);
        let (now, mono) = (Instant::now(), monotonic());
        for e in &events {
            list.append(event_dict(py, e, now, mono)?)?;
        }
        Ok(list)
    }

    /// Ends the connection when no link has been up for ``all_links_down`` seconds, or
    /// nothing at all was received from the peer for ``idle`` seconds (a host gone without a
    /// word, its power cut): each ``None`` for never, the default, with which the connection
    /// waits out any outage. Each call sets both (one left out is ``None``). Its calls then
    /// raise ``TimeoutError``. Counted from what already happened: links down longer than
    /// the new limit end it at once. An ``idle`` of less than a second may end a healthy
    /// connection that has nothing to say (a quiet peer is heard from about every 200 ms).
    /// ``ValueError`` for less than a nanosecond, a negative number or NaN.
    #[pyo3(signature = (all_links_down = None, idle = None))]
    fn set_timeouts(
        &self,
        py: Python<'_>,
        all_links_down: Option<f64>,
        idle: Option<f64>,
    ) -> PyResult<()> {
        let limit = |name: &str, seconds: Option<f64>| {
            let Some(s) = seconds else { return Ok(None) };
            match Duration::try_from_secs_f64(s) {
                // (a limit that rounds to no time at all is 0, which C refuses too)
                Ok(d) if d.is_zero() => Err(()),
                Ok(d) => Ok(Some(d)),
                // beyond what a Duration holds (infinity included) is never
                Err(_) if s > 0.0 => Ok(None),
                Err(_) => Err(()),
            }
            .map_err(|()| {
                PyValueError::new_err(format!(
                    "{name} must be None or a number of seconds of at least a nanosecond, \
                     not {s}"
                ))
            })
        };
        let all_links_down = limit("all_links_down", all_links_down)?;
        let idle = limit("idle", idle)?;
        let conn = self.get()?;
        py.detach(|| conn.set_timeouts(all_links_down, idle));
        Ok(())
    }

    /// Aborts the connection at once, dropping what was not delivered; the peer's calls
    /// raise ``PeerGone`` naming ``code`` (an int >= 0, else ``ValueError``) and ``reason``.
    /// The handle stays (for ``stats()``) until ``close()``.
    #[pyo3(
        signature = (code = AbortCode(0), reason = AbortReason::default()),
        text_signature = "($self, code=0, reason=\"\")"
    )]
    fn abort(&self, py: Python<'_>, code: AbortCode, reason: AbortReason) -> PyResult<()> {
        let (AbortCode(code), AbortReason(reason)) = (code, reason);
        let conn = self.get()?;
        py.detach(|| conn.abort(code, &reason));
        Ok(())
    }

    /// Lets go of the connection: finishes its streams (unless aborted) and lets it deliver
    /// what was written in the background while its endpoint lives and the peer is heard
    /// from (a peer silent for ``close_linger``, at least a second and three keepalive
    /// intervals, ends it;
    /// ``wait_acknowledged``
    /// first to know it did; ``Endpoint.close`` waits for every connection). Where the
    /// ``Endpoint`` object is gone already, the connection holds the endpoint's last handle,
    /// and letting go of it waits up to the endpoint's ``close_linger`` (10 s) for delivery,
    /// so that a script that writes, closes and exits loses nothing; Ctrl-C stops that wait
    /// (``KeyboardInterrupt``; the delivery goes on while the process lives). Later calls
    /// raise ``ValueError``; ``fileno()`` gives -1. Closing twice does nothing. A call another
    /// thread is in goes on (the peer's end of the stream comes to a ``recv`` as usual).
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        if let Some(conn) = self.take() {
            // the streams end now, not when the last call still running lets go of it
            // (an error: already finished, aborted or ended, which is what close wants)
            let _ = py.detach(|| conn.finish());
            drop_interruptible(py, conn)?;
        }
        Ok(())
    }

    /// Whether ``close()`` was called (in a child forked after it was made it is closed).
    #[getter]
    fn closed(&self) -> bool {
        self.inner.is_closed()
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    /// ``close()``.
    #[pyo3(signature = (_exc_type = None, _exc_value = None, _traceback = None))]
    fn __exit__(
        &self,
        py: Python<'_>,
        _exc_type: Option<Bound<'_, PyType>>,
        _exc_value: Option<Bound<'_, PyAny>>,
        _traceback: Option<Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        self.close(py)?;
        Ok(false)
    }

    fn __repr__(&self) -> String {
        match self.get() {
            Ok(c) => {
                let links = c.stats().links.len();
                format!(
                    "<ri2n.Connection {}, {links} link(s)>",
                    state_name(c.state())
                )
            }
            Err(_) => "<ri2n.Connection closed>".to_owned(),
        }
    }
}

impl Drop for PyConnection {
    fn drop(&mut self) {
        if let Some(conn) = self.take() {
            drop_detached(conn);
        }
    }
}

/// The most `recv`/`try_recv` read per call: far more than a connection's receive window
/// holds (8 MiB by default), so a read never returns less for it, while a huge `n` cannot
/// make the buffer allocation fail (which would abort the process, not raise).
const MAX_RECV: usize = 64 << 20;

/// The first `nbytes` of `buf` (all of it for 0), as `socket.recv_into` takes them.
/// A size argument: `ValueError` for a negative one (as `socket.recv` raises), not the
/// `OverflowError` of an unsigned parameter, which `except ValueError` misses.
fn size_arg(name: &str, value: i64) -> PyResult<usize> {
    usize::try_from(value)
        .map_err(|_| PyValueError::new_err(format!("{name} must be >= 0, not {value}")))
}

fn limit(buf: &mut [u8], nbytes: usize) -> PyResult<&mut [u8]> {
    match nbytes {
        0 => Ok(buf),
        n if n <= buf.len() => Ok(&mut buf[..n]),
        n => Err(PyValueError::new_err(format!(
            "nbytes ({n}) is larger than the buffer ({} bytes)",
            buf.len()
        ))),
    }
}

fn state_name(s: ConnectionState) -> &'static str {
    match s {
        ConnectionState::Connecting => "connecting",
        ConnectionState::Established => "established",
        ConnectionState::Draining => "draining",
        ConnectionState::Closed => "closed",
    }
}

/// Seconds of `CLOCK_MONOTONIC`: Python's `time.monotonic()`, and the clock of Rust's
/// `Instant` on Linux, so event times convert by their distance from now.
fn monotonic() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec to fill; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

/// The cipher's name in lower case, as Python's stats give it.
fn cipher_name(c: Cipher) -> String {
    c.name().to_ascii_lowercase()
}

fn stats_dict<'py>(py: Python<'py>, s: &ConnectionStats) -> PyResult<Bound<'py, PyDict>> {
    let links = PyList::empty(py);
    for l in &s.links {
        let d = PyDict::new(py);
        d.set_item("id", l.id.0)?;
        d.set_item("state", l.state.to_string())?;
        d.set_item("local", l.local.to_string())?;
        d.set_item("remote", l.remote.to_string())?;
        d.set_item("srtt", secs(l.srtt))?;
        d.set_item("min_rtt", secs(l.min_rtt))?;
        d.set_item("cwnd", l.cwnd)?;
        d.set_item("bytes_in_flight", l.bytes_in_flight)?;
        d.set_item("bytes_sent", l.bytes_sent)?;
        d.set_item("bytes_received", l.bytes_received)?;
        d.set_item("packets_sent", l.packets_sent)?;
        d.set_item("packets_received", l.packets_received)?;
        d.set_item("packets_lost", l.packets_lost)?;
        d.set_item("stream_bytes_sent", l.stream_bytes_sent)?;
        d.set_item("stream_bytes_acked", l.stream_bytes_acked)?;
        d.set_item("max_datagram", l.max_datagram)?;
        d.set_item("refusals", l.refusals)?;
        d.set_item("counts_packets", l.counts_packets)?;
        links.append(d)?;
    }
    let d = PyDict::new(py);
    d.set_item("links", links)?;
    d.set_item("send_buffered", s.send_buffered)?;
    d.set_item("recv_buffered", s.recv_buffered)?;
    d.set_item("recv_fragments", s.recv_fragments)?;
    d.set_item("bytes_acknowledged", s.bytes_acknowledged)?;
    d.set_item("stream_acknowledged", s.stream_acknowledged)?;
    d.set_item("bytes_received", s.bytes_received)?;
    d.set_item("cipher", s.cipher.map(cipher_name))?;
    d.set_item("key_updates", s.key_updates)?;
    d.set_item("packets_opened_ahead", s.packets_opened_ahead)?;
    d.set_item("datagrams_sent", s.datagrams_sent)?;
    d.set_item("datagrams_resent", s.datagrams_resent)?;
    d.set_item("datagrams_send_dropped", s.datagrams_send_dropped)?;
    d.set_item("datagrams_received", s.datagrams_received)?;
    d.set_item("datagrams_receive_dropped", s.datagrams_receive_dropped)?;
    d.set_item("datagrams_reordered", s.datagrams_reordered)?;
    d.set_item("datagrams_duplicate", s.datagrams_duplicate)?;
    d.set_item("datagrams_waiting", s.datagrams_waiting)?;
    let held = &s.send_limits;
    let limits = PyDict::new(py);
    for (name, t) in [
        ("sending", held.sending),
        ("congestion_window", held.congestion_window),
        ("pacing", held.pacing),
        ("peer_window", held.peer_window),
        ("send_buffer", held.send_buffer),
        ("no_link", held.no_link),
    ] {
        limits.set_item(name, t.as_secs_f64())?;
    }
    d.set_item("send_limits", limits)?;
    Ok(d)
}

fn event_dict<'py>(
    py: Python<'py>,
    e: &TimedEvent,
    now: Instant,
    mono: f64,
) -> PyResult<Bound<'py, PyDict>> {
    let (kind, link, from, to) = match &e.event {
        Event::Connected => ("connected", None, None, None),
        Event::LinkAdded { link } => ("link_added", Some(link.0), None, None),
        Event::LinkStateChanged { link, from, to } => (
            "link_state_changed",
            Some(link.0),
            Some(from.to_string()),
            Some(to.to_string()),
        ),
        Event::Readable => ("readable", None, None, None),
        Event::Writable => ("writable", None, None, None),
        Event::AllAcknowledged => ("all_acknowledged", None, None, None),
        Event::Closed(_) => ("closed", None, None, None),
        _ => ("other", None, None, None),
    };
    let reason = match &e.event {
        Event::Closed(Some(why)) => Some(why.to_string()),
        _ => None,
    };
    let d = PyDict::new(py);
    d.set_item("kind", kind)?;
    d.set_item("link", link)?;
    d.set_item("from", from)?;
    d.set_item("to", to)?;
    d.set_item("reason", reason)?;
    d.set_item("at", mono - secs(now.saturating_duration_since(e.at)))?;
    Ok(d)
}
