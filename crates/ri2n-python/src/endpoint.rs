//! `ri2n.Endpoint`: a host's local addresses (one UDP socket, one link, each), from which it
//! connects, or on which a server accepts.

use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use pyo3::exceptions::{PyException, PyInterruptedError, PyTimeoutError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyType;
use ri2n::{ConnectionConfig, ConnectionError, Endpoint, EndpointConfig, Transport};

use crate::connection::PyConnection;
use crate::errors::endpoint_error;
use crate::key::PyKey;
use crate::{
    drop_detached, timeout_arg, wait_on_thread, AbortCode, AbortReason, Addrs, Kept, Shared,
    SIGNAL_CHECK,
};

/// How long leaving a `with` block waits for the peers to acknowledge what was written: the
/// library's own `close_linger`, what dropping the endpoint would wait.
const EXIT_LINGER: Duration = Duration::from_secs(10);

/// A host's ri2n endpoint: one UDP socket per local address (each address a link), the
/// driver threads, and the connections. Make one with ``Endpoint.server`` (accepts
/// connections) or ``Endpoint.client`` (only connects). Closing it (``close()``, or leaving a
/// ``with`` block) waits until the peers acknowledged what was written to them. After
/// ``os.fork()``, an endpoint made before it is closed in the child (its threads stay in
/// the parent, which keeps it), as are its connections: make a new one there.
#[pyclass(name = "Endpoint", module = "ri2n", frozen, weakref)]
pub struct PyEndpoint {
    inner: Kept<Endpoint>,
    /// The file the key came from, named by `KeyMismatch`.
    key_file: Option<PathBuf>,
    server: bool,
}

impl PyEndpoint {
    fn bind(
        py: Python<'_>,
        addrs: Addrs,
        key: Option<PyRef<'_, PyKey>>,
        key_file: Option<PathBuf>,
        transport: &str,
        server: bool,
    ) -> PyResult<Self> {
        let addrs = addrs.parse()?;
        let transport = match transport {
            "udp" => Transport::Udp,
            "tcp" => Transport::Tcp,
            other => {
                return Err(PyValueError::new_err(format!(
                    "transport must be \"udp\" or \"tcp\", not {other:?}"
                )))
            }
        };
        let (key, key_file) = match (key, key_file) {
            (Some(_), Some(_)) => {
                return Err(PyValueError::new_err("give key= or key_file=, not both"))
            }
            (Some(k), None) => (Some(k.key.clone()), k.path.clone()),
            (None, Some(f)) => {
                let k = PyKey::read(py, f)?;
                (Some(k.key), k.path)
            }
            (None, None) => (None, None),
        };
        let mut config = EndpointConfig::new(addrs)
            .with_key(key)
            .with_transport(transport);
        if server {
            config = config.server();
        }
        let endpoint = py
            .detach(|| Endpoint::bind(config))
            .map_err(|e| endpoint_error(py, e, None))?;
        Ok(Self {
            inner: Kept::new(endpoint, "endpoint"),
            key_file,
            server,
        })
    }

    /// The endpoint, for `accept`: `ValueError` for a client, which never has a connection
    /// to accept (the library would wait for ever).
    fn get_server(&self) -> PyResult<Shared<Endpoint>> {
        if !self.server {
            return Err(PyValueError::new_err(
                "a client endpoint accepts no connections (make it with Endpoint.server)",
            ));
        }
        self.get()
    }

    /// The endpoint, or `ValueError` once closed.
    fn get(&self) -> PyResult<Shared<Endpoint>> {
        self.inner.get()
    }

    fn take(&self) -> Option<Arc<Endpoint>> {
        self.inner.take()
    }
}

#[pymethods]
impl PyEndpoint {
    /// An endpoint that accepts connections on ``addrs`` (``"ip:port"`` strings or
    /// ``(ip, port)`` tuples, as ``socket`` takes them, here and wherever addresses are given;
    /// port 0 picks
    /// a free port, see ``local_addrs()``; ``"0.0.0.0:7000"`` stands for every IPv4 address the
    /// host has now). Clients given one of the addresses learn the others and open a link to
    /// each. With ``key`` (a ``Key``) or ``key_file`` (a path to one), only clients holding
    /// the same key are accepted. ``transport``: ``"udp"`` (ri2n's own protocol) or ``"tcp"``
    /// (one TCP connection per link, the stream and messages striped over them; no
    /// datagrams); clients must use the same.
    #[staticmethod]
    #[pyo3(signature = (addrs, key = None, key_file = None, transport = "udp"))]
    fn server(
        py: Python<'_>,
        addrs: Addrs,
        key: Option<PyRef<'_, PyKey>>,
        key_file: Option<PathBuf>,
        transport: &str,
    ) -> PyResult<Self> {
        Self::bind(py, addrs, key, key_file, transport, true)
    }

    /// An endpoint that only makes outgoing connections, from ``addrs`` (usually one address
    /// per network, port 0). ``key``/``key_file``/``transport`` as for ``server``.
    #[staticmethod]
    #[pyo3(signature = (addrs, key = None, key_file = None, transport = "udp"))]
    fn client(
        py: Python<'_>,
        addrs: Addrs,
        key: Option<PyRef<'_, PyKey>>,
        key_file: Option<PathBuf>,
        transport: &str,
    ) -> PyResult<Self> {
        Self::bind(py, addrs, key, key_file, transport, false)
    }

    /// Connects to a server given one or more of its addresses and returns the
    /// ``Connection`` once the handshake completed. Raises ``TimeoutError`` when nobody
    /// answered within ``timeout`` seconds (``None``: keeps trying for ever),
    /// ``ConnectionRefusedError`` when nothing listens there (or an endpoint that is not a
    /// server, or a full server), ``KeyMismatch`` when the keys differ. ``cancel``: an object
    /// with ``is_set()`` (a ``threading.Event``) that another thread may set to give the
    /// connect up (``InterruptedError``, within a fifth of a second); Ctrl-C and closing the
    /// endpoint give it up too.
    #[pyo3(signature = (addrs, timeout = None, *, cancel = None))]
    fn connect(
        &self,
        py: Python<'_>,
        addrs: Addrs,
        timeout: Option<f64>,
        cancel: Option<Bound<'_, PyAny>>,
    ) -> PyResult<PyConnection> {
        let remotes = addrs.parse()?;
        let timeout = timeout_arg(timeout)?;
        if timeout.is_some_and(|t| t.is_zero()) {
            return Err(PyValueError::new_err("a connect timeout must be positive"));
        }
        let endpoint = self.get()?;
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        // What gives the connect up: Ctrl-C, an endpoint closed by another thread (an
        // asyncio task given up, as for `accept`), or the cancel.
        let given_up = |py: Python<'_>| -> PyResult<()> {
            py.check_signals()?;
            self.get()?;
            if let Some(cancel) = &cancel {
                if cancel.call_method0("is_set")?.is_truthy()? {
                    return Err(PyInterruptedError::new_err("the connect was cancelled"));
                }
            }
            Ok(())
        };
        // One handshake for the whole timeout (with `None`, one after another for as long as
        // it takes), waited for in slices so that `given_up` is looked at meanwhile; and
        // before each, so that a cancel set already (a task cancelled before the executor's
        // thread came to it) opens nothing.
        loop {
            given_up(py)?;
            let mut config = ConnectionConfig::default();
            if let Some(d) = deadline {
                let left = d.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(no_answer(&remotes, timeout));
                }
                config = config.with_handshake_timeout(left);
            }
            let started = match endpoint.transport() {
                // the TCP transport makes the whole handshake within the call; the others
                // return at once, the handshake under way
                Transport::Tcp => {
                    let (ep, to) = (endpoint.arc(), remotes.clone());
                    wait_on_thread(
                        py,
                        "ri2n-connect",
                        move || ep.start_connect(&to, config),
                        |late| {
                            if let Ok(conn) = late {
                                conn.abort(0, "the client gave up its connect");
                            }
                        },
                        given_up,
                    )?
                }
                _ => py.detach(|| endpoint.start_connect(&remotes, config)),
            };
            let conn = match started {
                Ok(conn) => conn,
                Err(ri2n::Error::Connection(ConnectionError::TimedOut(_)))
                    if deadline.is_none() =>
                {
                    continue;
                }
                Err(ri2n::Error::Connection(ConnectionError::TimedOut(_))) => {
                    return Err(no_answer(&remotes, timeout))
                }
                Err(e) => return Err(endpoint_error(py, e, self.key_file.as_deref())),
            };
            loop {
                match py.detach(|| conn.wait_connected(Some(SIGNAL_CHECK))) {
                    Ok(true) => return Ok(PyConnection::new(conn)),
                    Ok(false) => {
                        if let Err(e) = given_up(py) {
                            let why = match e.is_instance_of::<PyValueError>(py) {
                                true => "the client's endpoint was closed",
                                false => "the client gave up its connect",
                            };
                            conn.abort(0, why);
                            return Err(e);
                        }
                    }
                    Err(e) => {
                        // closed by another thread meanwhile, whose close ended the
                        // handshake: said as a closed endpoint, as when this loop saw it first
                        self.get()?;
                        match e {
                            // nobody answered: the next handshake, unless the time is up
                            ConnectionError::TimedOut(_) if deadline.is_none() => break,
                            ConnectionError::TimedOut(_) => {
                                return Err(no_answer(&remotes, timeout))
                            }
                            e => {
                                let e = ri2n::Error::Connection(e);
                                return Err(endpoint_error(py, e, self.key_file.as_deref()));
                            }
                        }
                    }
                }
            }
        }
    }

    /// Waits for the next incoming connection, at most ``timeout`` seconds (``None``: for
    /// ever); ``TimeoutError`` if none came. A connection is handed over once its client
    /// confirmed the handshake, so never one a replayed or forged handshake started.
    #[pyo3(signature = (timeout = None))]
    fn accept(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<PyConnection> {
        let endpoint = self.get_server()?;
        let deadline = timeout_arg(timeout)?.and_then(|t| Instant::now().checked_add(t));
        loop {
            let wait = deadline.map_or(SIGNAL_CHECK, |d| {
                d.saturating_duration_since(Instant::now())
                    .min(SIGNAL_CHECK)
            });
            match py.detach(|| endpoint.accept_timeout(Some(wait))) {
                Ok(Some(conn)) => return Ok(PyConnection::new(conn)),
                Ok(None) if deadline.is_some_and(|d| Instant::now() >= d) => {
                    return Err(PyTimeoutError::new_err("no connection arrived in time"))
                }
                Ok(None) => {
                    py.check_signals()?;
                    // closed by another thread meanwhile: stop waiting, as a socket does
                    self.get()?;
                }
                Err(e) => return Err(endpoint_error(py, e, None)),
            }
        }
    }

    /// The next incoming connection if one is waiting; ``BlockingIOError`` otherwise. For
    /// event loops, with ``fileno()``.
    fn try_accept(&self, py: Python<'_>) -> PyResult<PyConnection> {
        let endpoint = self.get_server()?;
        endpoint
            .try_accept()
            .map(PyConnection::new)
            .map_err(|e| endpoint_error(py, e, None))
    }

    /// A descriptor that becomes readable when a connection may be waiting for
    /// ``try_accept()``: register it with ``select``/``selectors``/asyncio for reading, and
    /// call ``try_accept()`` until ``BlockingIOError`` after each wake-up. Never read it.
    /// It is closed with the endpoint.
    fn fileno(&self, py: Python<'_>) -> PyResult<i32> {
        let endpoint = self.get()?;
        let fd = endpoint
            .readiness_fd()
            .map_err(|e| crate::errors::io_error(py, e))?
            .as_raw_fd();
        Ok(fd)
    }

    /// The bound local addresses, ports resolved, as ``"ip:port"`` strings.
    fn local_addrs(&self) -> PyResult<Vec<String>> {
        Ok(self
            .get()?
            .local_addrs()
            .iter()
            .map(|a| a.to_string())
            .collect())
    }

    /// Handshakes refused since the last call because the client holds another key (or one
    /// side has none) or speaks another application: ``(client address, reason)`` pairs, for
    /// a server to log (about one per second is reported, the rest only counted).
    fn refused_handshakes(&self) -> PyResult<Vec<(String, String)>> {
        Ok(self
            .get()?
            .refused_handshakes()
            .into_iter()
            .map(|r| (r.remote.to_string(), r.reason.to_string()))
            .collect())
    }

    /// Closes every connection gracefully: finishes their streams and waits, at most
    /// ``timeout`` seconds (``None``: as long as it takes), until each peer acknowledged
    /// everything written to it, then releases the sockets (once no ``Connection`` of the
    /// endpoint is left). Raises ``NotDelivered`` if some data was never acknowledged.
    /// An ``accept`` waiting in another thread then raises ``ValueError``. Closing a closed
    /// endpoint does nothing. Ctrl-C stops the wait: what was not acknowledged by then is
    /// dropped, each peer told so (as by ``abort()``), and ``KeyboardInterrupt`` raised.
    #[pyo3(signature = (timeout = None))]
    fn close(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<()> {
        let timeout = timeout_arg(timeout)?;
        let Some(endpoint) = self.take() else {
            return Ok(());
        };
        let closing = Arc::clone(&endpoint);
        let closed = wait_on_thread(
            py,
            "ri2n-close",
            move || closing.close(timeout),
            drop,
            |py| py.check_signals(),
        );
        let closed = match closed {
            Ok(closed) => closed,
            Err(interrupted) => {
                // the close on its thread then ends at once
                py.detach(|| endpoint.abort(0, "the endpoint's close was interrupted"));
                drop_detached(endpoint);
                return Err(interrupted);
            }
        };
        drop_detached(endpoint);
        closed.map_err(|e| endpoint_error(py, e, None))
    }

    /// Aborts every connection of the endpoint at once, as ``Connection.abort`` aborts one:
    /// each peer's calls raise ``PeerGone`` naming ``code`` and ``reason``, and what was not
    /// delivered is dropped. Returns once the aborts have been sent, so the process may exit
    /// right after (a server that is stopped tells its clients why). The endpoint stays
    /// open until ``close()``.
    #[pyo3(
        signature = (code = AbortCode(0), reason = AbortReason::default()),
        text_signature = "($self, code=0, reason=\"\")"
    )]
    fn abort(&self, py: Python<'_>, code: AbortCode, reason: AbortReason) -> PyResult<()> {
        let (AbortCode(code), AbortReason(reason)) = (code, reason);
        let endpoint = self.get()?;
        py.detach(|| endpoint.abort(code, &reason));
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

    /// Closes the endpoint, waiting up to 10 s for the peers to acknowledge what was written
    /// (what dropping it would wait); ``NotDelivered`` is raised only if the block itself
    /// raised nothing. Ctrl-C (``KeyboardInterrupt``), or another exception that is not an
    /// ``Exception``, during that wait is raised in any case: it must not vanish behind the
    /// block's own exception.
    #[pyo3(signature = (exc_type = None, _exc_value = None, _traceback = None))]
    fn __exit__(
        &self,
        py: Python<'_>,
        exc_type: Option<Bound<'_, PyType>>,
        _exc_value: Option<Bound<'_, PyAny>>,
        _traceback: Option<Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        let closed = self.close(py, Some(EXIT_LINGER.as_secs_f64()));
        match closed {
            Err(e) if exc_type.is_none() || !e.is_instance_of::<PyException>(py) => Err(e),
            _ => Ok(false),
        }
    }

    fn __repr__(&self) -> String {
        let kind = if self.server { "server" } else { "client" };
        match self.get() {
            Ok(e) => {
                let addrs: Vec<String> = e.local_addrs().iter().map(|a| a.to_string()).collect();
                format!("<ri2n.Endpoint {kind} {}>", addrs.join(", "))
            }
            Err(_) => format!("<ri2n.Endpoint {kind} closed>"),
        }
    }
}

impl Drop for PyEndpoint {
    fn drop(&mut self) {
        if let Some(endpoint) = self.take() {
            drop_detached(endpoint);
        }
    }
}

/// The `TimeoutError` of a handshake nobody answered, with the errno of a socket's connect
/// that timed out (a wait's own timeout, as a socket's, carries none).
fn no_answer(remotes: &[std::net::SocketAddr], timeout: Option<Duration>) -> PyErr {
    let to: Vec<String> = remotes.iter().map(|a| a.to_string()).collect();
    let within = timeout.map_or(String::new(), |t| format!(" within {} s", t.as_secs_f64()));
    PyTimeoutError::new_err((
        libc::ETIMEDOUT,
        format!("no answer to the handshake from {}{within}", to.join(", ")),
    ))
}
