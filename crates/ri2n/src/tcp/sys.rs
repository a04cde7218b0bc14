//! The few socket calls std does not offer: TCP_INFO (round trip, state),
//! TCP_NOTSENT_LOWAT, reads into spare capacity, connection attempts from a chosen address
//! (raced by `super::dial`), and next-hop confirmation.

use std::io;
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::os::fd::AsRawFd;
use std::time::Duration;

use bytes::BytesMut;
use socket2::{Domain, Protocol, SockAddr, Socket, Type};

/// Unsent bytes a link's TCP connection may queue before its writer blocks: enough to keep
/// the link busy between two runs, small enough that a run waits little behind others and
/// that a slow link does not hoard work (MuniSocket's back-pressure on the unsent queue
/// rather than the whole buffer).
const NOTSENT_LOWAT: libc::c_int = 64 << 10;

/// Sets what every link socket needs: no Nagle delay (records go out at once) and the
/// unsent-queue limit.
pub(crate) fn tune(s: &TcpStream) -> io::Result<()> {
    s.set_nodelay(true)?;
    let v: libc::c_int = NOTSENT_LOWAT;
    // SAFETY: setsockopt reads `size_of::<c_int>()` bytes from a live c_int.
    let rc = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_NOTSENT_LOWAT,
            (&v as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Waits at most `timeout` until the connection takes more data without blocking (its unsent
/// queue below the low-water mark); `Ok(false)` if it did not in time.
pub(crate) fn wait_writable(s: &TcpStream, timeout: Duration) -> io::Result<bool> {
    let mut pfd = libc::pollfd {
        fd: s.as_raw_fd(),
        events: libc::POLLOUT,
        revents: 0,
    };
    let ms = match timeout.is_zero() {
        true => 0,
        false => timeout.as_millis().clamp(1, i32::MAX as u128) as libc::c_int,
    };
    // SAFETY: poll(2) on one live pollfd.
    match unsafe { libc::poll(&mut pfd, 1, ms) } {
        n if n < 0 => {
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::Interrupted => Ok(false),
                _ => Err(e),
            }
        }
        0 => Ok(false),
        // an error or hang-up is writable too: the write that follows reports it
        _ => Ok(true),
    }
}

/// The kernel's TCP_INFO of a TCP connection.
fn tcp_info(s: &TcpStream) -> Option<libc::tcp_info> {
    // SAFETY: tcp_info is plain data; getsockopt writes at most `len` bytes into it.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    let rc = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        )
    };
    (rc == 0).then_some(info)
}

/// The kernel's smoothed round-trip time of a TCP connection and its congestion window in
/// bytes.
pub(crate) fn rtt_and_cwnd(s: &TcpStream) -> Option<(Duration, u64)> {
    tcp_info(s).map(|info| {
        (
            Duration::from_micros(u64::from(info.tcpi_rtt)),
            u64::from(info.tcpi_snd_cwnd) * u64::from(info.tcpi_snd_mss),
        )
    })
}

/// How long ago the kernel last received data on a TCP connection (`tcpi_last_data_recv`, in
/// milliseconds): what arrived, whether or not the link's reader has read it yet.
pub(crate) fn since_data_arrived(s: &TcpStream) -> Option<Duration> {
    tcp_info(s).map(|info| Duration::from_millis(u64::from(info.tcpi_last_data_recv)))
}

/// Whether the peer's host answered this side's end of a TCP connection shut after the
/// peer's end: `Some(true)` once the connection is over (state `TCP_CLOSE`) by this side's
/// end acknowledged, or reset; `Some(false)` once it is over by a timeout (no answer, or an
/// ICMP error, ever came); `None` while this side's end waits for an answer.
pub(crate) fn close_answered(s: &TcpStream) -> Option<bool> {
    // include/net/tcp_states.h
    const TCP_CLOSE: u8 = 7;
    if tcp_info(s)?.tcpi_state != TCP_CLOSE {
        return None;
    }
    let error = s.take_error().ok().flatten().and_then(|e| e.raw_os_error());
    Some(matches!(error, None | Some(libc::ECONNRESET | libc::EPIPE)))
}

/// Bytes a TCP connection holds that the peer's kernel has not acknowledged, sent or not
/// (`SIOCOUTQ`); 0 when the kernel cannot tell.
pub(crate) fn held(s: &TcpStream) -> u64 {
    let mut n: libc::c_int = 0;
    // SAFETY: SIOCOUTQ writes one c_int into `n`, which lives through the call.
    let rc = unsafe { libc::ioctl(s.as_raw_fd(), libc::TIOCOUTQ, &mut n) };
    if rc == 0 {
        u64::try_from(n).unwrap_or(0)
    } else {
        0
    }
}

/// Starts a connection from `local`'s address (any port) to `remote` without waiting for it:
/// the SYN goes out now, and [`finish_connect`] tells how it ended once [`wait_connects`]
/// names the socket.
pub(crate) fn start_connect(local: SocketAddr, remote: SocketAddr) -> io::Result<Socket> {
    let s = Socket::new(
        Domain::for_address(remote),
        Type::STREAM.nonblocking(),
        Some(Protocol::TCP),
    )?;
    // any port, the address with its scope (a link-local one binds only with it)
    let mut from = local;
    from.set_port(0);
    s.bind(&SockAddr::from(from))?;
    match s.connect(&SockAddr::from(remote)) {
        Err(e) if e.raw_os_error() != Some(libc::EINPROGRESS) => Err(e),
        _ => Ok(s),
    }
}

/// Waits at most `timeout` for one of the connections started by [`start_connect`] to open
/// or fail; returns the index of one that did, if any.
pub(crate) fn wait_connects(socks: &[&Socket], timeout: Duration) -> io::Result<Option<usize>> {
    let mut pfds: Vec<libc::pollfd> = (socks.iter())
        .map(|s| libc::pollfd {
            fd: s.as_raw_fd(),
            events: libc::POLLOUT,
            revents: 0,
        })
        .collect();
    // rounded up: a wait cut short of its deadline would only spin
    let ms = timeout.as_micros().div_ceil(1000).min(i32::MAX as u128) as libc::c_int;
    // SAFETY: poll(2) on `pfds.len()` live pollfds.
    let n = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, ms) };
    if n < 0 {
        let e = io::Error::last_os_error();
        return match e.kind() {
            io::ErrorKind::Interrupted => Ok(None),
            _ => Err(e),
        };
    }
    Ok(pfds.iter().position(|p| p.revents != 0))
}

/// How a connection that [`wait_connects`] named ended: open (made blocking and tuned), or
/// the reason it failed (refused, unreachable).
pub(crate) fn finish_connect(s: Socket) -> io::Result<TcpStream> {
    if let Some(e) = s.take_error()? {
        return Err(e);
    }
    s.set_nonblocking(false)?;
    let s: TcpStream = s.into();
    tune(&s)?;
    Ok(s)
}

/// Reads at most `spare.len()` bytes from `s` into `spare` (retrying on EINTR); returns how
/// many (0: the peer closed).
fn read_spare(s: &TcpStream, spare: &mut [std::mem::MaybeUninit<u8>]) -> io::Result<usize> {
    loop {
        // SAFETY: read(2) writes at most `spare.len()` bytes into `spare`.
        let n = unsafe { libc::read(s.as_raw_fd(), spare.as_mut_ptr().cast(), spare.len()) };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Appends up to `max` bytes read from `s` to `buf`, straight into its spare capacity (no
/// zeroing pass over a run's bytes). Returns how many (0: the peer closed).
pub(crate) fn read_into(s: &TcpStream, buf: &mut BytesMut, max: usize) -> io::Result<usize> {
    buf.reserve(max);
    let spare = buf.spare_capacity_mut();
    let len = max.min(spare.len());
    let n = read_spare(s, &mut spare[..len])?;
    // SAFETY: the kernel initialised the `n` bytes after the current length.
    unsafe { buf.set_len(buf.len() + n) };
    Ok(n)
}

/// [`read_into`] for a `Vec`: appends up to `max` bytes (its capacity must allow them).
pub(crate) fn read_into_vec(s: &TcpStream, buf: &mut Vec<u8>, max: usize) -> io::Result<usize> {
    let spare = buf.spare_capacity_mut();
    let len = max.min(spare.len());
    let n = read_spare(s, &mut spare[..len])?;
    // SAFETY: the kernel initialised the `n` bytes after the current length.
    unsafe { buf.set_len(buf.len() + n) };
    Ok(n)
}

/// Tells the OS that the next hop towards `remote` is alive, sending nothing: a zero-length
/// `sendto` with `MSG_CONFIRM | MSG_PROBE` from a UDP socket on the link's local address
/// (docs/PROTOCOL.md §6.9). A TCP connection confirms its neighbour only while ACKs arrive; a
/// few seconds into an outage Linux then resolves the peer's link-layer address anew, once a
/// second, and after the heal the new TCP connection waits for the next request: up to a
/// second. Kept confirmed, the entry stays usable and the first SYN after the heal goes out.
pub(crate) fn confirm_next_hop(via: &UdpSocket, remote: SocketAddr) {
    // MSG_PROBE ("do not send, only probe the path", include/linux/socket.h) is not in libc
    const MSG_PROBE: libc::c_int = 0x10;
    let _ = socket2::SockRef::from(via).send_to_with_flags(
        &[],
        &socket2::SockAddr::from(remote),
        libc::MSG_CONFIRM | MSG_PROBE,
    );
}
