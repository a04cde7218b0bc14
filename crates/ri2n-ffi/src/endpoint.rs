//! Endpoints (`ri2n_endpoint_server`, `ri2n_endpoint_client`, and their `_tcp` forms for the
//! TCP transport), the cluster key, and the calls that make connections (`ri2n_connect`,
//! `ri2n_accept`, `ri2n_try_accept`).

use std::ffi::{c_char, c_int};
use std::fs;
use std::net::{SocketAddr, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::time::Duration;

use ri2n::fork::Generation;
use ri2n::{ConnectionConfig, Endpoint, EndpointConfig, Key, KeyReadError, Transport};

use crate::conn::ri2n_conn;
use crate::error::{guard, guard_int, guard_len, guard_ptr, reason_text, text, Failure};

/// A host's ri2n endpoint: its local addresses (one per link), its threads and connections.
pub struct ri2n_endpoint {
    endpoint: Endpoint,
    /// The key file it holds, named when a peer holds another key.
    key_file: Option<String>,
    /// The process it was made in: a forked child may not use it (see `ri2n::fork`).
    made: Generation,
}

/// The addresses of a C array of `n` strings, each `IP:PORT` (`[IPv6]:PORT`) or `NAME:PORT`.
///
/// # Safety
/// `list` is NULL or points to `n` pointers, each NULL or a NUL-terminated string.
unsafe fn addresses(
    list: *const *const c_char,
    n: usize,
    what: &str,
) -> Result<Vec<SocketAddr>, Failure> {
    if list.is_null() || n == 0 {
        return Err(Failure::invalid(format!("no {what} given (an empty list)")));
    }
    // SAFETY: non-NULL, and the caller promises `n` entries
    let entries = unsafe { std::slice::from_raw_parts(list, n) };
    entries
        .iter()
        .map(|&entry| {
            // SAFETY: the caller promises NULL or a NUL-terminated string
            let s = unsafe { text(entry, what) }?;
            if let Ok(addr) = s.parse() {
                return Ok(addr);
            }
            s.to_socket_addrs()
                .ok()
                .and_then(|mut a| a.next())
                .ok_or_else(|| {
                    Failure::invalid(format!(
                        "{what} \"{s}\": not an address; give IP:PORT, e.g. 10.0.1.2:7000 or \
                     [fd00::2]:7000"
                    ))
                })
        })
        .collect()
}

/// Reads a key file (`ri2n keygen` makes one).
fn load_key(path: &str) -> Result<Key, Failure> {
    let cannot = |e| Failure::from(e).context(format_args!("cannot read the key file {path}"));
    let file = fs::File::open(path).map_err(cannot)?;
    // a directory opens, and reading it fails with EISDIR, which the header does not promise
    if file.metadata().is_ok_and(|m| m.is_dir()) {
        return Err(Failure::invalid(format!(
            "the key file {path} is a directory"
        )));
    }
    Key::read_from(file).map_err(|e| match e {
        KeyReadError::Io(e) => cannot(e),
        e => Failure::invalid(format!("the key file {path}: {e}")),
    })
}

/// # Safety
/// As for [`ri2n_endpoint_server`].
unsafe fn bind(
    addrs: *const *const c_char,
    n: usize,
    key_file: *const c_char,
    server: bool,
    transport: Transport,
) -> Result<Box<ri2n_endpoint>, Failure> {
    // SAFETY: passed on from the caller
    let addrs = unsafe { addresses(addrs, n, "local address") }?;
    let key_file = match key_file.is_null() {
        true => None,
        // SAFETY: non-NULL; the caller promises a NUL-terminated string
        false => Some(unsafe { text(key_file, "key_file") }?.to_owned()),
    };
    let key = key_file.as_deref().map(load_key).transpose()?;
    let mut config = EndpointConfig::new(addrs)
        .with_key(key)
        .with_transport(transport);
    if server {
        config = config.server();
    }
    let endpoint = Endpoint::bind(config)?;
    Ok(Box::new(ri2n_endpoint {
        endpoint,
        key_file,
        made: Generation::now(),
    }))
}

/// # Safety
/// `ep` is NULL or a live endpoint from this library.
unsafe fn endpoint<'a>(ep: *const ri2n_endpoint) -> Result<&'a ri2n_endpoint, Failure> {
    // SAFETY: the caller promises NULL or a live endpoint
    let ep = unsafe { ep.as_ref() }.ok_or_else(|| Failure::invalid("the endpoint is NULL"))?;
    match ep.made.inherited() {
        false => Ok(ep),
        true => Err(Failure::made_before_fork("endpoint")),
    }
}

/// A timeout in milliseconds from C: negative means none (wait as long as it takes).
pub(crate) fn timeout(ms: c_int) -> Option<Duration> {
    u64::try_from(ms).ok().map(Duration::from_millis)
}

/// An endpoint that accepts connections on `listen_addrs` (`n` strings such as
/// `"10.0.1.2:7000"`, one per link; port 0 picks a free port) and tells each client all of
/// them, so a client given one opens a link to each. `key_file`: a file made by `ri2n keygen`
/// that every host of the cluster holds (connections are then authenticated and encrypted,
/// and peers with another key or none are refused), or NULL for no key. NULL on failure:
/// `EINVAL` (bad address or key file), `EADDRINUSE`, `EADDRNOTAVAIL`, `ENOENT` (no key file),
/// `EACCES` (a key file this process may not read: keygen makes it readable by its owner
/// alone).
///
/// # Safety
/// `listen_addrs` points to `n` NUL-terminated strings; `key_file` is NULL or one.
#[no_mangle]
pub unsafe extern "C" fn ri2n_endpoint_server(
    listen_addrs: *const *const c_char,
    n: usize,
    key_file: *const c_char,
) -> *mut ri2n_endpoint {
    // SAFETY: passed on from the caller
    guard_ptr(|| unsafe { bind(listen_addrs, n, key_file, true, Transport::Udp) })
}

/// An endpoint that makes connections from `local_addrs` (one per link, e.g. `"10.0.1.1:0"`
/// and `"10.0.2.1:0"`). `key_file` as for [`ri2n_endpoint_server`].
///
/// # Safety
/// `local_addrs` points to `n` NUL-terminated strings; `key_file` is NULL or one.
#[no_mangle]
pub unsafe extern "C" fn ri2n_endpoint_client(
    local_addrs: *const *const c_char,
    n: usize,
    key_file: *const c_char,
) -> *mut ri2n_endpoint {
    // SAFETY: passed on from the caller
    guard_ptr(|| unsafe { bind(local_addrs, n, key_file, false, Transport::Udp) })
}

/// [`ri2n_endpoint_server`] on the TCP transport: each link is one TCP connection, the
/// stream and messages striped over them (docs/PROTOCOL.md §12). Only TCP-transport clients
/// reach it; unreliable datagrams are refused (`EOPNOTSUPP`).
///
/// # Safety
/// As for [`ri2n_endpoint_server`].
#[no_mangle]
pub unsafe extern "C" fn ri2n_endpoint_server_tcp(
    listen_addrs: *const *const c_char,
    n: usize,
    key_file: *const c_char,
) -> *mut ri2n_endpoint {
    // SAFETY: passed on from the caller
    guard_ptr(|| unsafe { bind(listen_addrs, n, key_file, true, Transport::Tcp) })
}

/// [`ri2n_endpoint_client`] on the TCP transport, for servers made with
/// [`ri2n_endpoint_server_tcp`] (a UDP server refuses it: `ECONNREFUSED`).
///
/// # Safety
/// As for [`ri2n_endpoint_client`].
#[no_mangle]
pub unsafe extern "C" fn ri2n_endpoint_client_tcp(
    local_addrs: *const *const c_char,
    n: usize,
    key_file: *const c_char,
) -> *mut ri2n_endpoint {
    // SAFETY: passed on from the caller
    guard_ptr(|| unsafe { bind(local_addrs, n, key_file, false, Transport::Tcp) })
}

/// Connects to a peer given one or more of its addresses, waiting for the handshake at most
/// `timeout_ms` (0 or less: the library's default, 10 s). NULL on failure, with errno
/// `ETIMEDOUT` (no answer), `ECONNREFUSED` (nothing listens there, or it is not a server, or
/// it is full), `EACCES` (the peer holds another key, or only one side has one), `EINVAL`
/// (bad address), `EADDRNOTAVAIL` (a TCP client's local address is not this machine's: it
/// binds each connection's sockets only here).
///
/// # Safety
/// `ep` is a live endpoint; `remote_addrs` points to `n` NUL-terminated strings.
#[no_mangle]
pub unsafe extern "C" fn ri2n_connect(
    ep: *mut ri2n_endpoint,
    remote_addrs: *const *const c_char,
    n: usize,
    timeout_ms: c_int,
) -> *mut ri2n_conn {
    guard_ptr(|| {
        // SAFETY: passed on from the caller
        let ep = unsafe { endpoint(ep) }?;
        // SAFETY: passed on from the caller
        let remotes = unsafe { addresses(remote_addrs, n, "remote address") }?;
        let mut config = ConnectionConfig::default();
        if timeout_ms > 0 {
            config = config.with_handshake_timeout(Duration::from_millis(timeout_ms as u64));
        }
        let doing = format!("connecting to {}", remotes[0]);
        match ep.endpoint.connect(&remotes, config) {
            Ok(conn) => Ok(Box::new(ri2n_conn::new(conn))),
            Err(e) => {
                let failure = Failure::from(e).context(&doing);
                if failure.errno != libc::EACCES {
                    return Err(failure);
                }
                let ours = match &ep.key_file {
                    Some(path) => format!("this side's key file: {path}"),
                    None => "this side holds no key".to_owned(),
                };
                Err(Failure::new(
                    failure.errno,
                    format!("{} ({ours})", failure.message),
                ))
            }
        }
    })
}

/// Waits at most `timeout_ms` (negative: as long as it takes; 0: only looks) for the next
/// incoming connection. NULL with `ETIMEDOUT` when none came. A client that holds another
/// key is refused without ever reaching `ri2n_accept`. Only a connection ends the wait
/// (closing or aborting the endpoint's connections does not; on a client endpoint none ever
/// comes): a server that must stop waits with a timeout, or polls [`ri2n_endpoint_fd`]
/// beside a descriptor of its own and calls [`ri2n_try_accept`]. Never free the endpoint
/// while another thread waits here.
///
/// # Safety
/// `ep` is a live endpoint.
#[no_mangle]
pub unsafe extern "C" fn ri2n_accept(ep: *mut ri2n_endpoint, timeout_ms: c_int) -> *mut ri2n_conn {
    guard_ptr(|| {
        // SAFETY: passed on from the caller
        let ep = unsafe { endpoint(ep) }?;
        match ep.endpoint.accept_timeout(timeout(timeout_ms))? {
            Some(conn) => Ok(Box::new(ri2n_conn::new(conn))),
            None => Err(Failure::new(
                libc::ETIMEDOUT,
                format!("no connection arrived within {timeout_ms} ms"),
            )),
        }
    })
}

/// The next incoming connection if one is waiting; NULL with `EAGAIN` otherwise. Never
/// blocks; wait for [`ri2n_endpoint_fd`] between tries (with edge-triggered `epoll`, try
/// until `EAGAIN` after each wake-up).
///
/// # Safety
/// `ep` is a live endpoint.
#[no_mangle]
pub unsafe extern "C" fn ri2n_try_accept(ep: *mut ri2n_endpoint) -> *mut ri2n_conn {
    guard_ptr(|| {
        // SAFETY: passed on from the caller
        let ep = unsafe { endpoint(ep) }?;
        Ok(Box::new(ri2n_conn::new(ep.endpoint.try_accept()?)))
    })
}

/// A descriptor that becomes readable when [`ri2n_try_accept`] may find a connection, and
/// stays readable while connections wait: register it with `poll`/`epoll` for reading and
/// never read or close it. Valid while `ep` lives.
///
/// # Safety
/// `ep` is a live endpoint.
#[no_mangle]
pub unsafe extern "C" fn ri2n_endpoint_fd(ep: *const ri2n_endpoint) -> c_int {
    guard(
        |e| -e,
        // SAFETY: passed on from the caller
        || {
            Ok(unsafe { endpoint(ep) }?
                .endpoint
                .readiness_fd()?
                .as_raw_fd())
        },
    )
}

/// Writes the `i`-th bound local address (ports resolved, e.g. `"127.0.0.1:41234"`) to `buf`
/// as a NUL-terminated string of at most `len` bytes; returns its length without the NUL. A
/// TCP client's port stays as given (0: each connection binds sockets of its own).
/// `-ENOENT` when the endpoint has no `i`-th address, `-ERANGE` when `buf` is too small (64
/// bytes always suffice).
///
/// # Safety
/// `ep` is a live endpoint; `buf` points to `len` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn ri2n_endpoint_local_addr(
    ep: *const ri2n_endpoint,
    i: usize,
    buf: *mut c_char,
    len: usize,
) -> libc::ssize_t {
    guard_len(|| {
        // SAFETY: passed on from the caller
        let ep = unsafe { endpoint(ep) }?;
        let addr = ep.endpoint.local_addrs().get(i).copied().ok_or_else(|| {
            Failure::new(
                libc::ENOENT,
                format!("the endpoint has no local address {i}"),
            )
        })?;
        // SAFETY: passed on from the caller
        unsafe { write_text(&addr.to_string(), buf, len) }
    })
}

/// Copies `s` and a NUL into `buf` of `len` bytes.
///
/// # Safety
/// `buf` is NULL or points to `len` writable bytes.
pub(crate) unsafe fn write_text(s: &str, buf: *mut c_char, len: usize) -> Result<usize, Failure> {
    if buf.is_null() {
        return Err(Failure::invalid("the buffer is NULL"));
    }
    if s.len() >= len {
        return Err(Failure::new(
            libc::ERANGE,
            format!("a buffer of {len} bytes cannot hold \"{s}\" and its NUL"),
        ));
    }
    // SAFETY: `buf` holds `len` > `s.len()` bytes
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr(), buf.cast(), s.len());
        *buf.add(s.len()) = 0;
    }
    Ok(s.len())
}

/// Closes every connection of the endpoint gracefully: finishes their streams and waits at
/// most `timeout_ms` (negative: as long as it takes) until each peer has acknowledged
/// everything written to it; a connection whose peer is still sending is aborted once this
/// side's data is delivered (its calls then fail with `ECONNABORTED`, the peer's with
/// `ECONNRESET`). 0, or `-ETIMEDOUT` when some data was never acknowledged
/// ([`ri2n_last_error`](crate::ri2n_last_error) says how much). The endpoint stays open (a
/// server accepts the connections that come in after the close) until it is freed, which it
/// must still be.
///
/// # Safety
/// `ep` is a live endpoint.
#[no_mangle]
pub unsafe extern "C" fn ri2n_endpoint_close(ep: *mut ri2n_endpoint, timeout_ms: c_int) -> c_int {
    guard_int(|| {
        // SAFETY: passed on from the caller
        let ep = unsafe { endpoint(ep) }?;
        Ok(ep.endpoint.close(timeout(timeout_ms))?)
    })
}

/// Aborts every connection of the endpoint at once, as [`ri2n_abort`](crate::ri2n_abort)
/// aborts one: each peer's calls fail with `ECONNRESET` and see `code` and `reason` (may be
/// NULL) in their error text; what was written but not acknowledged is dropped. Returns once
/// the aborts have been sent, so the process may exit right after (a server that is stopped
/// tells its clients why): 0, or a negative errno. The endpoint must still be freed.
///
/// # Safety
/// `ep` is a live endpoint; `reason` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn ri2n_endpoint_abort(
    ep: *mut ri2n_endpoint,
    code: u64,
    reason: *const c_char,
) -> c_int {
    guard_int(|| {
        // SAFETY: passed on from the caller
        let ep = unsafe { endpoint(ep) }?;
        // SAFETY: passed on from the caller
        let reason = unsafe { reason_text(reason) };
        ep.endpoint.abort(code, &reason);
        Ok(())
    })
}

/// Frees the endpoint. Like dropping the Rust endpoint's last handle: when no connection
/// handle is left either, what was written is delivered first (waiting up to 10 s). NULL is
/// ignored.
///
/// # Safety
/// `ep` is NULL or a live endpoint, not used again.
#[no_mangle]
pub unsafe extern "C" fn ri2n_endpoint_free(ep: *mut ri2n_endpoint) {
    if !ep.is_null() {
        guard(
            |_| (),
            || {
                // SAFETY: the caller gives up its live endpoint, made by `Box::into_raw`
                let ep = unsafe { Box::from_raw(ep) };
                if ep.made.inherited() {
                    // the parent's: its memory is let go with this process
                    std::mem::forget(ep);
                }
                Ok(())
            },
        )
    }
}

/// Writes a new random key to the file `path` (mode 0600, the format of `ri2n keygen`); every
/// host of a cluster holds a copy. `-EEXIST` if the file exists (it is never replaced).
///
/// # Safety
/// `path` is a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn ri2n_key_generate(path: *const c_char) -> c_int {
    guard_int(|| {
        // SAFETY: passed on from the caller
        let path = unsafe { text(path, "path") }?;
        let key = Key::generate().map_err(|e| Failure::new(libc::EIO, e.to_string()))?;
        // written whole or not at all: a file holding part of a key (a full disk) would
        // refuse the next try (EEXIST) and every endpoint given it (EINVAL)
        ri2n::write_key_file(&key, std::path::Path::new(path), false)
            .map_err(|e| Failure::from(e).context(format_args!("cannot write the key file {path}")))
    })
}

/// The library's version, e.g. `"0.1.0"`.
#[no_mangle]
pub extern "C" fn ri2n_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}
