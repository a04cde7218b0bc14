//! The tokio adapter (cargo feature `tokio`): [`AsyncConnection`] is `AsyncRead` +
//! `AsyncWrite` and [`accept`] awaits the next incoming connection, both built on the
//! readiness descriptors (`AsyncFd`) and the non-blocking calls, so no thread blocks.
//!
//! Two things still block, as in any code: the calls of [`AsyncConnection::get_ref`]'s
//! [`Connection`] other than its `try_` calls, and dropping the last handle of an endpoint
//! (its last connection included), which waits up to `EndpointConfig::close_linger` for
//! what was written to be delivered. Drop the last one in `tokio::task::spawn_blocking`, or
//! call [`Endpoint::close`] there first, when the peer may be unreachable.
//!
//! ```no_run
//! # async fn f(server: ri2n::Endpoint) -> std::io::Result<()> {
//! use tokio::io::{AsyncReadExt, AsyncWriteExt};
//! let mut conn = ri2n::tokio::accept(&server).await?;
//! let mut buf = vec![0u8; 4096];
//! let n = conn.read(&mut buf).await?;
//! conn.write_all(&buf[..n]).await?;
//! conn.shutdown().await?; // finishes our stream
//! # Ok(()) }
//! ```

use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::task::{ready, Context, Poll};

use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::readiness::{Caller, Interest};
use crate::{Connection, Endpoint, Error};

/// A tokio registration of a readiness descriptor, on a duplicate of it (the `AsyncFd` owns
/// what it watches).
fn watch(fd: BorrowedFd<'_>) -> io::Result<AsyncFd<OwnedFd>> {
    let own = fd.try_clone_to_owned()?;
    // SAFETY: `own` is an open descriptor the AsyncFd owns: it stays open, and the same,
    // until the AsyncFd is dropped.
    unsafe { AsyncFd::register_with_interest(own, tokio::io::Interest::READABLE) }
        .map_err(io::Error::from)
}

/// A readiness descriptor of the connection as the adapter waits on it.
#[derive(Debug)]
struct Watched {
    fd: AsyncFd<OwnedFd>,
    /// Which of the connection's descriptors it is.
    interest: Interest,
    /// Calls of [`AsyncConnection::op`] on it under way: several tasks may wait on one.
    calls: AtomicUsize,
}

impl Watched {
    fn new(fd: BorrowedFd<'_>, interest: Interest) -> io::Result<Self> {
        Ok(Self {
            fd: watch(fd)?,
            interest,
            calls: AtomicUsize::new(0),
        })
    }

    /// Counts a call until the returned guard is dropped (also when the call is cancelled).
    fn count_call(&self) -> CountedCall<'_> {
        self.calls.fetch_add(1, Ordering::AcqRel);
        CountedCall(&self.calls)
    }
}

/// One call counted in [`Watched::calls`].
struct CountedCall<'a>(&'a AtomicUsize);

impl Drop for CountedCall<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A connection for async code. Dropping it drops the connection (see [`Connection`]).
#[derive(Debug)]
pub struct AsyncConnection {
    /// Watched by readers of the stream (`poll_read`, `read_chunk`).
    stream_ready: Watched,
    /// Watched by readers of messages, and of datagrams, each made on first use. Readers of
    /// different kinds wait apart, each on a descriptor its own calls alone clear: with one
    /// for all, a stream reader's look cleared the wake-up of a task waiting for a message
    /// before the runtime saw it, and that task slept on with the message there.
    message_ready: OnceLock<Watched>,
    datagram_ready: OnceLock<Watched>,
    /// Watched by writers: a reader and a writer of one connection (e.g. after
    /// `tokio::io::split`) wait apart, each on the descriptor its own calls clear.
    write_ready: Watched,
    conn: Connection,
}

impl AsyncConnection {
    /// Wraps a connection; must be called within a tokio runtime. If it cannot (no
    /// descriptor left for its readiness), the connection is aborted with the error as the
    /// reason, so its peer learns why, and the error returned.
    pub fn new(conn: Connection) -> io::Result<Self> {
        let stream = Interest::Kind(Caller::ReadStream);
        let watched = (conn.kind_fd(Caller::ReadStream))
            .and_then(|fd| Watched::new(fd, stream))
            .and_then(|r| {
                let w = conn.write_readiness_fd()?;
                Ok((r, Watched::new(w, Interest::Write)?))
            });
        match watched {
            Ok((stream_ready, write_ready)) => Ok(Self {
                stream_ready,
                message_ready: OnceLock::new(),
                datagram_ready: OnceLock::new(),
                write_ready,
                conn,
            }),
            Err(e) => {
                conn.abort(0, &format!("the peer could not take the connection: {e}"));
                Err(e)
            }
        }
    }

    /// The connection, for statistics, events, messages and the other calls (those that
    /// wait block the thread: from a task, use their `try_` forms). A reading `try_` call
    /// beside a task waiting here for the same kind leaves that task woken while more of the
    /// kind waits. A writing one (`try_write`, `try_send_message`) beside a task waiting
    /// here for room may take the wake-up meant for it, and that task then sleeps on with
    /// room there: write through this adapter alone while a task of it waits for room.
    pub fn get_ref(&self) -> &Connection {
        &self.conn
    }

    /// The connection itself, for its blocking calls (e.g. on a thread of its own, where a
    /// waiting call receives for itself: the lowest round trip for request-response).
    /// [`AsyncConnection::new`] wraps it again.
    pub fn into_inner(self) -> Connection {
        self.conn
    }

    /// Retries the non-blocking `op` until it does not say `WouldBlock`, waiting on `ready`
    /// in between. It looks before it waits: a descriptor can be clear with data waiting (a
    /// connection wrapped again, or read with its own calls before), and a new registration
    /// starts without readiness.
    fn poll_op<T>(
        &self,
        ready: &Watched,
        cx: &mut Context<'_>,
        mut op: impl FnMut(&Connection) -> io::Result<T>,
    ) -> Poll<io::Result<T>> {
        match op(&self.conn) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            r => return Poll::Ready(r),
        }
        loop {
            let mut guard = ready!(ready.fd.poll_read_ready(cx))?;
            match op(&self.conn) {
                // clears only what this guard saw: a signal since then is kept
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => guard.clear_ready(),
                r => return Poll::Ready(r),
            }
        }
    }

    /// [`Self::poll_op`] for the calls that take `&self`, which several tasks may make at
    /// once on one connection: each waits with a waker of its own (`poll_read_ready` keeps
    /// only the last caller's, and the others would never be woken).
    ///
    /// Each call's look clears the descriptor, and with it a signal that was to wake another
    /// call waiting on it, if the runtime had not seen it yet (an edge drained is gone): that
    /// call slept on with room or a message there for it. So a call that ends while others
    /// are under way gives the signal back; they look again, and those with nothing to do
    /// wait again. So does one whose first look finds nothing while others wait: writers
    /// wait for room of their own sizes, and the signal it cleared may have been for room
    /// that fits a smaller one (a writer's later looks need not: the connection signals the
    /// writers' descriptor again itself while room it told of is not taken). It is counted
    /// before it first looks, so that a signal coming after that look and cleared by another
    /// call is given back too.
    async fn op<T>(
        &self,
        ready: &Watched,
        mut op: impl FnMut(&Connection) -> io::Result<T>,
    ) -> io::Result<T> {
        let _counted = ready.count_call();
        let r = match op(&self.conn) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                // once: the looks after a wait clear only what woke this call
                if ready.calls.load(Ordering::Acquire) > 1 {
                    self.conn.signal_again(ready.interest);
                }
                loop {
                    let mut guard = ready.fd.readable().await?;
                    match op(&self.conn) {
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => guard.clear_ready(),
                        r => break r,
                    }
                }
            }
            r => r,
        };
        if ready.calls.load(Ordering::Acquire) > 1 {
            self.conn.signal_again(ready.interest);
        }
        r
    }

    /// The descriptor the reading calls of `kind` wait on (`slot`), registered on first use.
    fn read_ready<'a>(&self, slot: &'a OnceLock<Watched>, kind: Caller) -> io::Result<&'a Watched> {
        if slot.get().is_none() {
            // two tasks may make one at once: one is kept, the other dropped
            let fd = self.conn.kind_fd(kind)?;
            let _ = slot.set(Watched::new(fd, Interest::Kind(kind))?);
        }
        Ok(slot.get().expect("set above"))
    }

    /// Receives one whole message; `Ok(None)` once the peer finished its message stream.
    /// Cancel-safe: dropped before it completes, it took no message.
    pub async fn recv_message(&self) -> io::Result<Option<Vec<u8>>> {
        let ready = self.read_ready(&self.message_ready, Caller::ReadMessage)?;
        self.op(ready, Connection::try_recv_message).await
    }

    /// Receives one unreliable datagram (see [`Connection::recv_datagram`]); `Ok(None)` once
    /// the connection closed cleanly and every datagram that arrived was read. Cancel-safe:
    /// dropped before it completes, it took no datagram. Sending one never waits: call
    /// [`Connection::send_datagram`] through [`get_ref`](Self::get_ref).
    pub async fn recv_datagram(&self) -> io::Result<Option<Vec<u8>>> {
        let ready = self.read_ready(&self.datagram_ready, Caller::ReadDatagram)?;
        self.op(ready, Connection::try_recv_datagram).await
    }

    /// [`recv_datagram`](Self::recv_datagram) for every datagram waiting, at most `max` (at
    /// least one: waits for it), into `bufs` as [`Connection::recv_datagrams_into`] does:
    /// afterwards `bufs` holds exactly the datagrams received, none once the connection
    /// closed cleanly and every datagram that arrived was read. Cancel-safe.
    pub async fn recv_datagrams_into(&self, bufs: &mut Vec<Vec<u8>>, max: usize) -> io::Result<()> {
        let ready = self.read_ready(&self.datagram_ready, Caller::ReadDatagram)?;
        self.op(ready, |c| c.try_recv_datagrams_into(bufs, max))
            .await
    }

    /// Replaces `chunk` with the next bytes of the stream, without copying them (see
    /// [`Connection::read_chunk`]); returns how many (0: the peer finished). Cancel-safe: no
    /// bytes are lost. What `chunk` held counts as read once the call started, whether it
    /// completes or is cancelled (a cancelled call may leave it holding those bytes again, or
    /// other memory): do not look at it until a call returns.
    pub async fn read_chunk(&self, chunk: &mut bytes::Bytes) -> io::Result<usize> {
        self.op(&self.stream_ready, |c| c.try_read_chunk(chunk))
            .await
    }

    /// Writes all of `data` without copying a large one (see [`Connection::write_bytes`]),
    /// waiting for buffer space. Not cancel-safe: dropped while it waits, the part of `data`
    /// taken before is written and the rest is not, and the caller cannot tell how much
    /// (`AsyncWriteExt::write` says how much each call took).
    pub async fn write_bytes(&self, data: bytes::Bytes) -> io::Result<()> {
        let mut rest = data;
        while !rest.is_empty() {
            let n = self
                .op(&self.write_ready, |c| c.try_write_bytes(&rest))
                .await?;
            bytes::Buf::advance(&mut rest, n);
        }
        Ok(())
    }

    /// Sends one whole message, waiting for buffer space. Cancel-safe: dropped before it
    /// completes, it sent nothing.
    pub async fn send_message(&self, msg: &[u8]) -> io::Result<()> {
        self.op(&self.write_ready, |c| c.try_send_message(msg))
            .await
    }
}

impl AsyncRead for AsyncConnection {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let n = ready!(self.poll_op(&self.stream_ready, cx, |c| {
            c.try_read(buf.initialize_unfilled())
        }))?;
        buf.advance(n);
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for AsyncConnection {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_op(&self.write_ready, cx, |c| c.try_write(buf))
    }

    /// Written data is on its way; nothing to wait for (see [`Connection::wait_acknowledged`]).
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    /// Finishes both outgoing streams: the peer reads end-of-stream after what was written.
    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(self.conn.finish())
    }
}

/// Waits for the next incoming connection of `endpoint` without blocking a thread.
pub async fn accept(endpoint: &Endpoint) -> io::Result<AsyncConnection> {
    let ready = watch(endpoint.readiness_fd()?)?;
    loop {
        // look first: an earlier call may have cleared the descriptor and left connections
        // waiting, and this registration is new
        match endpoint.try_accept() {
            Ok(conn) => return AsyncConnection::new(conn),
            Err(Error::Io(e)) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(Error::Io(e)) => return Err(e),
            Err(e) => return Err(io::Error::other(e)),
        }
        ready.readable().await?.clear_ready();
    }
}

/// Connects without blocking the runtime. Cancel-safe on the UDP transport: dropped before
/// it completes, it aborts the handshake, which ends there. On the TCP transport, whose
/// handshake dials and waits in the calling thread, the handshake runs on a blocking-pool
/// thread: dropped, it runs on to its end (and the runtime's shutdown waits for it), and a
/// connection it made is dropped then.
pub async fn connect(
    endpoint: &Endpoint,
    remotes: &[std::net::SocketAddr],
    config: crate::ConnectionConfig,
) -> Result<AsyncConnection, Error> {
    if endpoint.transport() == crate::Transport::Tcp {
        let endpoint = endpoint.clone();
        let remotes = remotes.to_vec();
        let conn = tokio::task::spawn_blocking(move || endpoint.connect(&remotes, config))
            .await
            .map_err(io::Error::other)??;
        return Ok(AsyncConnection::new(conn)?);
    }
    let conn = AbortUnlessConnected(Some(AsyncConnection::new(
        endpoint.start_connect(remotes, config)?,
    )?));
    // the stream's descriptor becomes readable when the handshake ends; each look clears it
    // first, so that an end after the look signals it again
    let ready = &conn.get().stream_ready;
    while !(conn.get().conn.try_connected(Caller::ReadStream)).map_err(Error::Connection)? {
        ready.fd.readable().await?.clear_ready();
    }
    Ok(conn.connected())
}

/// A connection whose handshake [`connect`] waits for: aborted if the wait is dropped.
struct AbortUnlessConnected(Option<AsyncConnection>);

impl AbortUnlessConnected {
    fn get(&self) -> &AsyncConnection {
        self.0.as_ref().expect("held until connected")
    }

    fn connected(mut self) -> AsyncConnection {
        self.0.take().expect("held until connected")
    }
}

impl Drop for AbortUnlessConnected {
    fn drop(&mut self) {
        if let Some(c) = &self.0 {
            c.conn.abort(0, "the connect was cancelled");
        }
    }
}
