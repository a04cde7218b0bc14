//! Driving ri2n from an application's own event loop: one thread, one `epoll` instance (mio),
//! the readiness descriptors of the endpoint and of every connection, and only non-blocking
//! calls, serving 100 concurrent echo clients over two loopback links.

use std::collections::HashMap;
use std::io::{self, ErrorKind, Read, Write};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token};
use ri2n::{Connection, ConnectionConfig, Endpoint};

mod common;

use common::{loopback, payload};

const CLIENTS: usize = 100;
const ACCEPT: Token = Token(usize::MAX);

/// One echo connection of the server: bytes read and not yet written back.
struct Echo {
    conn: Connection,
    pending: Vec<u8>,
    eof: bool,
    finished: bool,
}

impl Echo {
    /// Moves what can move without blocking; returns true once everything was echoed and the
    /// stream finished.
    fn pump(&mut self) -> bool {
        let mut buf = [0u8; 16384];
        loop {
            if !self.pending.is_empty() {
                match self.conn.try_write(&self.pending) {
                    Ok(n) => {
                        self.pending.drain(..n);
                        continue;
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                    Err(e) => panic!("write: {e}"),
                }
            }
            if self.eof {
                if self.pending.is_empty() && !self.finished {
                    self.conn.finish().unwrap();
                    self.finished = true;
                }
                return self.finished;
            }
            // bound what waits to be echoed: read only while it is small
            if self.pending.len() > 1 << 20 {
                return false;
            }
            match self.conn.try_read(&mut buf) {
                Ok(0) => self.eof = true,
                Ok(n) => self.pending.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == ErrorKind::WouldBlock => return false,
                Err(e) => panic!("read: {e}"),
            }
        }
    }
}

/// The server: everything from one thread's poll loop.
fn serve(server: Endpoint, clients: usize, deadline: Instant) {
    let mut poll = Poll::new().unwrap();
    let accept_fd = server.readiness_fd().unwrap().as_raw_fd();
    poll.registry()
        .register(&mut SourceFd(&accept_fd), ACCEPT, Interest::READABLE)
        .unwrap();
    let mut events = Events::with_capacity(256);
    let mut conns: HashMap<usize, Echo> = HashMap::new();
    let mut next = 0;
    let mut done = 0;
    while done < clients {
        assert!(
            Instant::now() < deadline,
            "echo server: {done} of {clients} done"
        );
        poll.poll(&mut events, Some(Duration::from_millis(100)))
            .unwrap();
        for ev in events.iter() {
            if ev.token() == ACCEPT {
                loop {
                    match server.try_accept() {
                        Ok(conn) => {
                            let fd = conn.readiness_fd().unwrap().as_raw_fd();
                            poll.registry()
                                .register(&mut SourceFd(&fd), Token(next), Interest::READABLE)
                                .unwrap();
                            let mut echo = Echo {
                                conn,
                                pending: Vec::new(),
                                eof: false,
                                finished: false,
                            };
                            if echo.pump() {
                                done += 1;
                            }
                            conns.insert(next, echo);
                            next += 1;
                        }
                        Err(ri2n::Error::Io(e)) if e.kind() == ErrorKind::WouldBlock => break,
                        Err(e) => panic!("accept: {e}"),
                    }
                }
            } else if let Some(echo) = conns.get_mut(&ev.token().0) {
                if !echo.finished && echo.pump() {
                    done += 1;
                }
            }
        }
    }
    // wait for the clients to have read their echoes before the server goes away
    drop(conns);
    server.close(Some(Duration::from_secs(10))).unwrap();
}

#[test]
fn one_thread_epoll_echo_server_serves_100_connections_over_two_links() {
    let server = Endpoint::server(&[loopback("127.0.0.1"), loopback("127.0.0.2")]).unwrap();
    let to = server.local_addrs()[0];
    let deadline = Instant::now() + Duration::from_secs(120);
    let server_thread = std::thread::spawn(move || serve(server, CLIENTS, deadline));
    let client = Endpoint::client(&[loopback("127.0.0.1"), loopback("127.0.0.2")]).unwrap();
    let workers: Vec<_> = (0..CLIENTS)
        .map(|k| {
            let client = client.clone();
            std::thread::spawn(move || {
                let conn = client.connect(&[to], ConnectionConfig::default()).unwrap();
                let data = payload(k);
                let reader = std::thread::scope(|s| {
                    let r = s.spawn(|| {
                        let mut back = Vec::new();
                        (&conn).read_to_end(&mut back).unwrap();
                        back
                    });
                    (&conn).write_all(&data).unwrap();
                    conn.finish().unwrap();
                    r.join().unwrap()
                });
                assert!(reader == data, "client {k}: echo differs");
                conn.stats().links.len()
            })
        })
        .collect();
    let links: Vec<usize> = workers.into_iter().map(|w| w.join().unwrap()).collect();
    server_thread.join().unwrap();
    assert!(
        links.iter().all(|&l| l == 2),
        "every connection used two links"
    );
    let _ = client.close(None);
}

/// Issue 9, finding 3: after a transfer read in many small pieces, the state changes
/// (connected, the second link added and up) are still there to poll, and no data-readiness
/// flood pushed them out.
#[test]
fn state_events_are_not_crowded_out_by_data_readiness() {
    use ri2n::{Event, LinkState};
    let server = Endpoint::server(&[loopback("127.0.0.1"), loopback("127.0.0.2")]).unwrap();
    let to = server.local_addrs()[0];
    let sender = std::thread::spawn(move || {
        let client = Endpoint::client(&[loopback("127.0.0.1"), loopback("127.0.0.2")]).unwrap();
        let mut conn = client.connect(&[to], ConnectionConfig::default()).unwrap();
        // many small writes, each its own burst of arrivals at the reader
        for i in 0..5000u32 {
            conn.write_all(&i.to_le_bytes().repeat(256)).unwrap();
            conn.flush().unwrap();
        }
    });
    let mut conn = server.accept().unwrap();
    let mut buf = [0u8; 700];
    let mut got = 0;
    while let Ok(n @ 1..) = conn.read(&mut buf) {
        got += n;
    }
    sender.join().unwrap();
    assert_eq!(got, 5000 * 1024);
    let events: Vec<Event> = conn.poll_events().into_iter().map(|e| e.event).collect();
    assert!(events.contains(&Event::Connected), "{events:?}");
    assert!(
        events.iter().any(|e| matches!(e, Event::LinkAdded { .. })),
        "{events:?}"
    );
    assert!(
        events.iter().any(|e| matches!(
            e,
            Event::LinkStateChanged {
                to: LinkState::Up,
                ..
            }
        )),
        "{events:?}"
    );
    assert!(
        !events
            .iter()
            .any(|e| matches!(e, Event::Readable | Event::Writable)),
        "{events:?}"
    );
}

/// What one handshake of the client's loop came to.
enum Outcome {
    Waiting,
    /// Established: the datagrams received so far.
    Carrying(Vec<Vec<u8>>),
    Closed(ri2n::ConnectionError),
}

/// A cluster member's view: one thread starts every handshake at once (`start_connect`) and
/// waits on all of them and on their datagrams in one poll loop. Servers that answer are
/// reached and their datagrams read without blocking; one address where nothing answers
/// times out on its own, without holding back the others.
#[test]
fn one_thread_connects_to_many_peers_and_reads_their_datagrams() {
    const PEERS: usize = 6;
    const DATAGRAMS: usize = 3;
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let done_rx = std::sync::Arc::new(std::sync::Mutex::new(done_rx));
    let mut servers = Vec::new();
    let mut remotes = Vec::new();
    for k in 0..PEERS {
        let server = Endpoint::server(&[loopback("127.0.0.1"), loopback("127.0.0.2")]).unwrap();
        remotes.push(server.local_addrs());
        let done = done_rx.clone();
        servers.push(std::thread::spawn(move || {
            let conn = server.accept().unwrap();
            for i in 0..DATAGRAMS {
                conn.send_datagram(format!("peer {k} datagram {i}").as_bytes())
                    .unwrap();
            }
            // keep the connection until the client read everything
            let _ = done.lock().unwrap().recv_timeout(Duration::from_secs(60));
        }));
    }
    // a port where nothing ever answers: its handshake times out
    let silent = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    remotes.push(vec![silent.local_addr().unwrap()]);

    let client = Endpoint::client(&[loopback("127.0.0.1"), loopback("127.0.0.2")]).unwrap();
    let timeout = Duration::from_millis(500);
    let started = Instant::now();
    let conns: Vec<Connection> = remotes
        .iter()
        .map(|r| {
            let config = ConnectionConfig::default().with_handshake_timeout(timeout);
            client.start_connect(r, config).unwrap()
        })
        .collect();
    assert!(
        started.elapsed() < timeout,
        "start_connect waited for handshakes ({:?})",
        started.elapsed()
    );
    assert_eq!(
        conns[PEERS].state(),
        ri2n::ConnectionState::Connecting,
        "the silent peer's handshake had not ended"
    );

    let mut poll = Poll::new().unwrap();
    for (k, c) in conns.iter().enumerate() {
        let fd = c.read_readiness_fd().unwrap().as_raw_fd();
        poll.registry()
            .register(&mut SourceFd(&fd), Token(k), Interest::READABLE)
            .unwrap();
    }
    let mut outcomes: Vec<Outcome> = conns.iter().map(|_| Outcome::Waiting).collect();
    let mut events = Events::with_capacity(64);
    let mut bufs = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    // every connection looked at once first: a handshake may have ended before its
    // descriptor was registered
    let mut ready: Vec<usize> = (0..conns.len()).collect();
    loop {
        for &k in &ready {
            let c = &conns[k];
            // a non-blocking call first: it clears the descriptor before it looks (while the
            // handshake lasts it finds nothing), so the end of the handshake signals again
            let first = c.try_recv_datagrams_into(&mut bufs, 64);
            match (&mut outcomes[k], c.state()) {
                (o @ Outcome::Waiting, ri2n::ConnectionState::Closed) => {
                    *o = Outcome::Closed(c.close_reason().expect("a closed connection says why"));
                }
                (Outcome::Waiting | Outcome::Carrying(_), ri2n::ConnectionState::Connecting) => {}
                (o @ Outcome::Waiting, _) => *o = Outcome::Carrying(Vec::new()),
                _ => {}
            }
            if let Outcome::Carrying(got) = &mut outcomes[k] {
                if first.is_ok() {
                    got.append(&mut bufs);
                }
                loop {
                    match c.try_recv_datagrams_into(&mut bufs, 64) {
                        Ok(()) => got.append(&mut bufs),
                        Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                        Err(e) => panic!("peer {k}: {e}"),
                    }
                }
            }
        }
        let finished = outcomes.iter().all(|o| match o {
            Outcome::Carrying(got) => got.len() == DATAGRAMS,
            Outcome::Closed(_) => true,
            Outcome::Waiting => false,
        });
        if finished {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the loop did not finish in 30 s: {:?}",
            outcomes
                .iter()
                .map(|o| match o {
                    Outcome::Waiting => "waiting".to_owned(),
                    Outcome::Carrying(got) => format!("{} datagrams", got.len()),
                    Outcome::Closed(e) => e.to_string(),
                })
                .collect::<Vec<_>>()
        );
        poll.poll(&mut events, Some(Duration::from_millis(100)))
            .unwrap();
        ready = events.iter().map(|e| e.token().0).collect();
    }

    for (k, o) in outcomes.iter().enumerate().take(PEERS) {
        let Outcome::Carrying(got) = o else {
            panic!("peer {k} was not reached");
        };
        let expected: Vec<Vec<u8>> = (0..DATAGRAMS)
            .map(|i| format!("peer {k} datagram {i}").into_bytes())
            .collect();
        assert_eq!(got, &expected, "peer {k}'s datagrams");
    }
    assert!(
        matches!(
            outcomes[PEERS],
            Outcome::Closed(ri2n::ConnectionError::TimedOut(_))
        ),
        "the silent peer's handshake timed out"
    );
    drop(done_tx);
    for s in servers {
        s.join().unwrap();
    }
}

/// Whether `fd` is readable now.
fn readable(fd: std::os::fd::RawFd) -> bool {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: poll(2) on one live pollfd, without waiting.
    unsafe { libc::poll(&mut pfd, 1, 0) == 1 }
}

/// The endpoint's descriptor stays readable while connections wait for `try_accept`, so a
/// level-triggered loop that accepts one per wake-up gets every one; it clears once none is
/// left, whether `try_accept` or `accept_timeout` took the last. Before, each `try_accept`
/// cleared it, and a second waiting connection stayed unaccepted until a third client came;
/// and on the TCP transport `accept_timeout` left it readable with none waiting, so that a
/// loop calling it on each wake-up spun. Both transports.
#[test]
fn the_accept_descriptor_stays_readable_while_connections_wait() {
    let transports = [ri2n::Transport::Udp, ri2n::Transport::Tcp];
    for (transport, last_by_try) in transports.into_iter().flat_map(|t| [(t, true), (t, false)]) {
        let config =
            ri2n::EndpointConfig::new(vec![loopback("127.0.0.1")]).with_transport(transport);
        let server = Endpoint::bind(config.clone().server()).unwrap();
        let fd = server.readiness_fd().unwrap().as_raw_fd();
        let to = server.local_addrs()[0];
        // two clients, each confirmed by a byte the server acknowledged (the server's driver
        // may send that acknowledgement just before it hands the connection to `accept`)
        let clients: Vec<_> = (0..2)
            .map(|_| {
                let client = Endpoint::bind(config.clone()).unwrap();
                let conn = client.connect(&[to], ConnectionConfig::default()).unwrap();
                (&conn).write_all(b"x").unwrap();
                conn.finish().unwrap();
                conn.wait_acknowledged(Some(Duration::from_secs(10)))
                    .unwrap();
                (client, conn)
            })
            .collect();
        wait_readable(fd, &format!("{transport:?}: none waiting"));
        let first = server.try_accept().unwrap();
        // one waits, or is about to: nothing signals the descriptor again for one that
        // waits already, so a descriptor cleared with one waiting fails here
        wait_readable(
            fd,
            &format!("{transport:?}: cleared with one still waiting"),
        );
        let second = match last_by_try {
            true => server.try_accept().unwrap(),
            false => server
                .accept_timeout(Some(Duration::ZERO))
                .unwrap()
                .unwrap(),
        };
        assert!(
            !readable(fd),
            "{transport:?}: readable with none waiting (the last taken by {})",
            if last_by_try {
                "try_accept"
            } else {
                "accept_timeout"
            }
        );
        assert!(
            matches!(server.try_accept(), Err(ri2n::Error::Io(e)) if e.kind() == ErrorKind::WouldBlock)
        );
        drop((first, second, clients));
    }
}

/// Waits (at most 10 s) until `fd` is readable.
fn wait_readable(fd: std::os::fd::RawFd, what: &str) {
    wait_until(&format!("{what}: never signalled"), || readable(fd));
}

/// Waits (at most 10 s, looking every millisecond) until `done` holds; `what` says what
/// never came.
fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A client and the server's end of its connection, on one loopback link.
fn pair(transport: ri2n::Transport, config: ConnectionConfig) -> (Endpoint, Endpoint, Connection) {
    let endpoint = ri2n::EndpointConfig::new(vec![loopback("127.0.0.1")]).with_transport(transport);
    let server = Endpoint::bind(endpoint.clone().server()).unwrap();
    let to = server.local_addrs()[0];
    let client = Endpoint::bind(endpoint).unwrap();
    let conn = client.connect(&[to], config).unwrap();
    (server, client, conn)
}

/// A non-blocking call that finds nothing of its own kind leaves the descriptors readable
/// while something of another kind waits: an event loop that looks for a message or a
/// datagram (or writes a reply) after stream bytes arrived must still be woken for them.
/// A connection signals an arrival once; before, `try_recv_datagram` cleared the read
/// descriptor and `try_write` the combined one, and the loop slept with the bytes unread
/// (on the TCP transport `try_recv_message` and `try_write` did). Both transports.
#[test]
fn a_call_of_another_kind_does_not_hide_what_waits_to_be_read() {
    for transport in [ri2n::Transport::Udp, ri2n::Transport::Tcp] {
        let (server, _client, conn) = pair(transport, ConnectionConfig::default());
        (&conn).write_all(b"x").unwrap();
        let peer = server.accept().unwrap();
        let read_fd = peer.read_readiness_fd().unwrap().as_raw_fd();
        let any_fd = peer.readiness_fd().unwrap().as_raw_fd();
        let mut buf = [0u8; 64];
        (&peer).read_exact(&mut buf[..1]).unwrap();
        let mut others = vec!["a message looked for", "a reply written"];
        if transport == ri2n::Transport::Udp {
            others.push("a datagram looked for");
        }
        for other in others {
            let what = format!("{transport:?}, {other}");
            // nothing waits: this clears both descriptors, so what follows signals them
            let e = peer.try_read(&mut buf).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::WouldBlock, "{what}");
            assert!(!readable(any_fd), "{what}: readable with nothing waiting");
            (&conn).write_all(b"yz").unwrap();
            // the premise: the bytes are there (a frame without them, an acknowledgement,
            // may signal the descriptors first)
            wait_until(&format!("{what}: the bytes never came"), || {
                peer.stats().recv_buffered >= 2
            });
            wait_readable(read_fd, &what);
            wait_readable(any_fd, &what);
            let reading = other != "a reply written";
            match other {
                "a message looked for" => {
                    let e = peer.try_recv_message().unwrap_err();
                    assert_eq!(e.kind(), ErrorKind::WouldBlock, "{what}");
                }
                "a datagram looked for" => {
                    let e = peer.try_recv_datagram().unwrap_err();
                    assert_eq!(e.kind(), ErrorKind::WouldBlock, "{what}");
                }
                _ => assert_eq!(peer.try_write(b"r").unwrap(), 1, "{what}"),
            }
            assert!(
                readable(any_fd),
                "{what}: the combined descriptor was cleared"
            );
            if reading {
                assert!(readable(read_fd), "{what}: the read descriptor was cleared");
            }
            assert_eq!(peer.try_read(&mut buf).unwrap(), 2, "{what}");
        }
    }
}

/// A loop that looks for one kind while another waits unread (a task waiting for a message
/// with stream bytes nobody reads yet) is woken for them once, not by each of its own looks:
/// the first look signals the descriptors again, the next ones leave them clear until
/// something new comes. Before, every look signalled them again and such a loop (tokio's
/// `recv_message`, woken by each edge) spun at full speed. Both transports.
#[test]
fn a_reader_of_one_kind_is_not_woken_for_ever_by_another_kind_unread() {
    for transport in [ri2n::Transport::Udp, ri2n::Transport::Tcp] {
        let (server, _client, conn) = pair(transport, ConnectionConfig::default());
        (&conn).write_all(b"x").unwrap();
        let peer = server.accept().unwrap();
        let read_fd = peer.read_readiness_fd().unwrap().as_raw_fd();
        let any_fd = peer.readiness_fd().unwrap().as_raw_fd();
        wait_until(&format!("{transport:?}: the byte never came"), || {
            peer.stats().recv_buffered > 0
        });
        const LOOKS: usize = 20;
        let mut woken = 0;
        for _ in 0..LOOKS {
            let e = peer.try_recv_message().unwrap_err();
            assert_eq!(e.kind(), ErrorKind::WouldBlock, "{transport:?}");
            if readable(read_fd) || readable(any_fd) {
                woken += 1;
            }
        }
        // once, and maybe once more for a keepalive's acknowledgement meanwhile
        assert!(
            woken <= 2,
            "{transport:?}: woken after {woken} of {LOOKS} looks for a message"
        );
        // the premise: the byte was there to read all along
        let mut buf = [0u8; 8];
        assert_eq!(peer.try_read(&mut buf).unwrap(), 1, "{transport:?}");
    }
}

/// A reader that takes what it waited for and looks no further (one call per byte count or
/// message, as Python's `recv(n)` and a poll loop per thread do) leaves the next arrival
/// signalled: another thread asleep on the descriptor that read cleared is woken for it.
/// Before, a connection reported an arrival only after a look had found nothing, so with two
/// threads reading one connection the second slept through the next byte until its own
/// timeout (two threads polling the stream's descriptor: the second byte, sent 5 ms after
/// the first, taken 180 ms later, on each of 20 rounds). Each kind, both transports.
#[test]
fn the_arrival_after_a_read_that_took_the_last_is_signalled() {
    for transport in [ri2n::Transport::Udp, ri2n::Transport::Tcp] {
        let (server, _client, conn) = pair(transport, ConnectionConfig::default());
        (&conn).write_all(b"x").unwrap();
        let peer = server.accept().unwrap();
        let mut buf = [0u8; 8];
        (&peer).read_exact(&mut buf[..1]).unwrap();
        let read_fd = peer.read_readiness_fd().unwrap().as_raw_fd();
        let stream_fd = peer.stream_read_readiness_fd().unwrap().as_raw_fd();
        let mut kinds = vec!["stream bytes", "a message"];
        if transport == ri2n::Transport::Udp {
            kinds.push("a datagram");
        }
        for kind in kinds {
            let what = format!("{transport:?}, {kind}");
            let send = |n: u8| match kind {
                "stream bytes" => (&conn).write_all(&[n]).unwrap(),
                "a message" => conn.send_message(&[n]).unwrap(),
                _ => conn.send_datagram(&[n]).unwrap(),
            };
            // one read that takes exactly the one there
            let take = || -> io::Result<Vec<u8>> {
                match kind {
                    "stream bytes" => {
                        let mut b = [0u8; 1];
                        let n = peer.try_read(&mut b)?;
                        Ok(b[..n].to_vec())
                    }
                    "a message" => Ok(peer.try_recv_message()?.unwrap_or_default()),
                    _ => Ok(peer.try_recv_datagram()?.unwrap_or_default()),
                }
            };
            let fds = match kind {
                "stream bytes" => vec![read_fd, stream_fd],
                _ => vec![read_fd],
            };
            // a look that finds nothing: the next arrival is reported
            assert_eq!(take().unwrap_err().kind(), ErrorKind::WouldBlock, "{what}");
            send(1);
            wait_until(&format!("{what}: the first never signalled"), || {
                fds.iter().all(|&fd| readable(fd))
            });
            assert_eq!(take().unwrap(), [1], "{what}");
            // the reader looks no further: the next arrival must wake whoever waits
            send(2);
            wait_until(&format!("{what}: the second never signalled"), || {
                fds.iter().all(|&fd| readable(fd))
            });
            assert_eq!(take().unwrap(), [2], "{what}");
        }
    }
}

/// Has `from` send `to` a message once a look at `to` found nothing and cleared `fd` (one of
/// `to`'s descriptors that a message signals), and waits until `fd` is signalled for it.
fn a_message_signalled(
    transport: ri2n::Transport,
    from: &Connection,
    to: &Connection,
    fd: std::os::fd::RawFd,
) {
    let e = to.try_recv_message().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::WouldBlock, "{transport:?}");
    assert!(
        !readable(fd),
        "{transport:?}: readable with nothing waiting"
    );
    from.send_message(b"m").unwrap();
    wait_readable(fd, &format!("{transport:?}: the message"));
}

/// A thread waiting in `read_timeout` beside an event loop that waits on the read descriptor
/// for messages never clears the loop's wake-up, however often its wait runs out: a
/// message that arrived stays signalled until the loop looks. A loop of `try_read` and a wait
/// on the stream's own descriptor (what Python's `recv` was) cleared the shared descriptor
/// on each look after the first, and the loop slept with the message there. The timed read
/// itself returns stream bytes that come while it waits, and `TimedOut` when none came.
/// Both transports.
#[test]
fn a_timed_read_leaves_an_event_loop_its_wake_up() {
    for transport in [ri2n::Transport::Udp, ri2n::Transport::Tcp] {
        let (server, _client, conn) = pair(transport, ConnectionConfig::default());
        (&conn).write_all(b"x").unwrap();
        let peer = server.accept().unwrap();
        let mut buf = [0u8; 8];
        (&peer).read_exact(&mut buf[..1]).unwrap();
        let read_fd = peer.read_readiness_fd().unwrap().as_raw_fd();
        a_message_signalled(transport, &conn, &peer, read_fd);
        for look in 0..3 {
            let started = Instant::now();
            let e = peer
                .read_timeout(&mut buf, Some(Duration::from_millis(20)))
                .unwrap_err();
            assert_eq!(e.kind(), ErrorKind::TimedOut, "{transport:?}, look {look}");
            assert!(
                started.elapsed() >= Duration::from_millis(20),
                "{transport:?}"
            );
            assert!(
                readable(read_fd),
                "{transport:?}: the timed read's look {look} cleared the loop's wake-up"
            );
        }
        assert_eq!(peer.try_recv_message().unwrap().unwrap(), b"m");
        // bytes that come while it waits end the wait
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(50));
                (&conn).write_all(b"yz").unwrap();
            });
            let n = peer
                .read_timeout(&mut buf, Some(Duration::from_secs(10)))
                .unwrap();
            let mut got = buf[..n].to_vec();
            if got.len() < 2 {
                let m = peer
                    .read_timeout(&mut buf, Some(Duration::from_secs(10)))
                    .unwrap();
                got.extend_from_slice(&buf[..m]);
            }
            assert_eq!(got, b"yz", "{transport:?}");
        });
    }
}

/// The timed writes (`write_timeout`, `write_buf_timeout`, `send_message_timeout`) clear no
/// descriptor either: while they wait for room, a message that arrived stays signalled on
/// the combined descriptor for the event loop that watches it, however often their waits run
/// out. A loop of `try_write` and waits on a descriptor cleared it on each look after the
/// first. They take room that comes while they wait. Both transports.
#[test]
fn timed_writes_leave_an_event_loop_its_wake_up() {
    for transport in [ri2n::Transport::Udp, ri2n::Transport::Tcp] {
        // the peer reads nothing: its small window fills, then the send buffer, for good
        let small = ConnectionConfig::default().with_stream_receive_window(64 << 10);
        let endpoint =
            ri2n::EndpointConfig::new(vec![loopback("127.0.0.1")]).with_transport(transport);
        let server =
            Endpoint::bind(endpoint.clone().server().with_server_connection(small)).unwrap();
        let client = Endpoint::bind(endpoint).unwrap();
        let config = ConnectionConfig::default().with_send_buffer(64 << 10);
        let conn = client.connect(&[server.local_addrs()[0]], config).unwrap();
        let peer = server.accept().unwrap();
        let any_fd = conn.readiness_fd().unwrap().as_raw_fd();
        let mut written = 0;
        while let Ok(n) = conn.write_timeout(&[7u8; 16 << 10], Some(Duration::from_millis(200))) {
            written += n;
            assert!(written < 1 << 20, "{transport:?}: the writes never blocked");
        }
        // and the messages' own share
        let mut messages = 0;
        while conn
            .send_message_timeout(&[9u8; 1024], Some(Duration::from_millis(200)))
            .is_ok()
        {
            messages += 1;
            assert!(messages < 1024, "{transport:?}: the messages never blocked");
        }
        a_message_signalled(transport, &peer, &conn, any_fd);
        let slice = Some(Duration::from_millis(20));
        for look in 0..3 {
            let what = format!("{transport:?}, look {look}");
            let e = conn.write_timeout(&[7u8; 1024], slice).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::TimedOut, "{what}: write_timeout");
            let mut big = vec![7u8; 32 << 10];
            let e = conn.write_buf_timeout(&mut big, slice).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::TimedOut, "{what}: write_buf_timeout");
            assert_eq!(
                big.len(),
                32 << 10,
                "{what}: a buffer not taken is left whole"
            );
            let e = conn.send_message_timeout(&[9u8; 1024], slice).unwrap_err();
            assert_eq!(
                e.kind(),
                ErrorKind::TimedOut,
                "{what}: send_message_timeout"
            );
            assert!(
                readable(any_fd),
                "{what}: a timed write cleared the loop's wake-up for the message"
            );
        }
        assert_eq!(conn.try_recv_message().unwrap().unwrap(), b"m");
        // room that comes while they wait ends the waits
        std::thread::scope(|s| {
            s.spawn(|| {
                let mut buf = vec![0u8; 64 << 10];
                let mut got = 0;
                while got < written {
                    got += (&peer).read(&mut buf).unwrap();
                }
                for _ in 0..messages {
                    assert_eq!(peer.recv_message().unwrap().unwrap(), [9u8; 1024]);
                }
            });
            let n = conn
                .write_timeout(&[8u8; 1024], Some(Duration::from_secs(10)))
                .unwrap();
            assert!(n > 0, "{transport:?}");
            conn.send_message_timeout(b"y", Some(Duration::from_secs(10)))
                .unwrap();
        });
    }
}

/// The acknowledgement of a request wakes no reader: an event loop that wrote a request and
/// waits for the answer on the read descriptor (or on the combined one, no writer blocked)
/// sleeps until the answer comes. Before, on the TCP transport, every acknowledgement that
/// freed send buffer signalled every descriptor, and the loop woke once per request for
/// nothing. Both transports.
#[test]
fn the_acknowledgement_of_a_request_wakes_no_reader() {
    for transport in [ri2n::Transport::Udp, ri2n::Transport::Tcp] {
        let (server, _client, conn) = pair(transport, ConnectionConfig::default());
        (&conn).write_all(b"hello").unwrap();
        let peer = server.accept().unwrap();
        let mut buf = [0u8; 64];
        (&peer).read_exact(&mut buf[..5]).unwrap();
        let read_fd = conn.read_readiness_fd().unwrap().as_raw_fd();
        let any_fd = conn.readiness_fd().unwrap().as_raw_fd();
        const ROUNDS: usize = 20;
        let mut woken = 0;
        for round in 0..ROUNDS {
            let what = format!("{transport:?}, round {round}");
            // nothing waits: this clears both descriptors
            let e = conn.try_read(&mut buf).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::WouldBlock, "{what}");
            assert_eq!(conn.try_write(b"request").unwrap(), 7, "{what}");
            // the premise: the request was acknowledged while the loop waited
            wait_until(&format!("{what}: never acknowledged"), || {
                conn.stats().send_buffered == 0
            });
            if readable(read_fd) || readable(any_fd) {
                woken += 1;
            }
            (&peer).read_exact(&mut buf[..7]).unwrap();
            (&peer).write_all(b"answer").unwrap();
            wait_until(&format!("{what}: no answer"), || {
                conn.stats().recv_buffered >= 6
            });
            wait_readable(read_fd, &format!("{what}: the answer"));
            wait_readable(any_fd, &format!("{what}: the answer"));
            assert_eq!(conn.try_read(&mut buf).unwrap(), 6, "{what}");
            assert_eq!(&buf[..6], b"answer", "{what}");
        }
        // a keepalive's acknowledgement may come meanwhile, once or twice
        assert!(
            woken <= 2,
            "{transport:?}: woken by the acknowledgement in {woken} of {ROUNDS} rounds"
        );
    }
}

/// Fills `conn`'s send buffer with non-blocking writes while nobody reads: its writer is
/// blocked. Returns how many bytes it wrote.
fn block_a_writer(transport: ri2n::Transport, conn: &Connection) -> usize {
    let chunk = [7u8; 16 << 10];
    let mut written = 0;
    loop {
        match conn.try_write(&chunk) {
            Ok(n) => written += n,
            Err(e) if e.kind() == ErrorKind::WouldBlock => return written,
            Err(e) => panic!("{transport:?}: write: {e}"),
        }
        assert!(
            written < 1 << 20,
            "{transport:?}: the send buffer never filled"
        );
    }
}

/// [`block_a_writer`], then [`make_room`]. Returns the server's end.
fn block_a_writer_then_make_room(
    transport: ri2n::Transport,
    server: &Endpoint,
    conn: &Connection,
) -> Connection {
    let written = block_a_writer(transport, conn);
    make_room(transport, server, conn, written)
}

/// Has the server read the `written` bytes `conn` wrote, and waits until all of them were
/// acknowledged: room is back for a blocked writer. Returns the server's end.
fn make_room(
    transport: ri2n::Transport,
    server: &Endpoint,
    conn: &Connection,
    written: usize,
) -> Connection {
    let peer = server.accept().unwrap();
    let mut buf = vec![0u8; 64 << 10];
    let mut got = 0;
    while got < written {
        got += (&peer).read(&mut buf).unwrap();
    }
    wait_until(&format!("{transport:?}: never acknowledged"), || {
        conn.stats().send_buffered == 0
    });
    peer
}

/// Whether a `try_read` that finds nothing leaves `fd` clear, in one of three tries (a
/// keepalive's acknowledgement may signal it between the call and the look).
fn a_read_leaves_it_clear(conn: &Connection, fd: std::os::fd::RawFd) -> bool {
    let mut buf = [0u8; 64];
    (0..3).any(|_| {
        let e = conn.try_read(&mut buf).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::WouldBlock);
        !readable(fd)
    })
}

/// A writer that found the send buffer full and was told it may retry stays told through
/// other calls: the combined descriptor stays readable until that writer retries. An event
/// loop that wrote until `WouldBlock`, sent a message, read until `WouldBlock` and slept
/// must be woken to write again once room came back in between. Before, the read (or the
/// message sent) cleared the descriptor and the loop slept with room to write. Both
/// transports.
#[test]
fn a_reader_does_not_hide_room_from_a_blocked_writer() {
    for transport in [ri2n::Transport::Udp, ri2n::Transport::Tcp] {
        let config = ConnectionConfig::default().with_send_buffer(64 << 10);
        let (server, _client, conn) = pair(transport, config);
        let any_fd = conn.readiness_fd().unwrap().as_raw_fd();
        let _peer = block_a_writer_then_make_room(transport, &server, &conn);
        wait_readable(any_fd, &format!("{transport:?}, room back"));
        conn.try_send_message(b"m").unwrap();
        let e = conn.try_read(&mut [0u8; 64]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::WouldBlock, "{transport:?}");
        assert!(
            readable(any_fd),
            "{transport:?}: a message sent and a read cleared the combined descriptor with \
             room for the stream's writer"
        );
        assert!(conn.try_write(&[7u8; 1024]).unwrap() > 0, "{transport:?}");
        // the writer's retry took the signal: nothing is left to wake for
        assert!(
            a_read_leaves_it_clear(&conn, any_fd),
            "{transport:?}: still readable with nothing new"
        );
    }
}

/// A blocked writer that gives up retrying (it finishes the stream, before or after room
/// came back, or writes with a blocking call) leaves no room to be told of: a read must not
/// signal the combined descriptor again for it, or a level-triggered loop waiting for the
/// peer's answer spins. Both transports.
#[test]
fn a_writer_that_stopped_trying_is_not_told_of_room_again() {
    for transport in [ri2n::Transport::Udp, ri2n::Transport::Tcp] {
        let ways = [
            "finished",
            "finished before room came back",
            "wrote a large buffer with write_buf",
        ];
        for instead in ways {
            let what = format!("{transport:?}, {instead}");
            let config = ConnectionConfig::default().with_send_buffer(64 << 10);
            let (server, _client, conn) = pair(transport, config);
            let any_fd = conn.readiness_fd().unwrap().as_raw_fd();
            let written = block_a_writer(transport, &conn);
            if instead == "finished before room came back" {
                conn.finish().unwrap();
            }
            let peer = make_room(transport, &server, &conn, written);
            wait_readable(any_fd, &format!("{what}: room back"));
            if instead == "finished" {
                conn.finish().unwrap();
            } else if instead.starts_with("wrote") {
                conn.write_buf(&mut vec![7u8; 32 << 10]).unwrap();
                let mut buf = vec![0u8; 32 << 10];
                (&peer).read_exact(&mut buf).unwrap();
            }
            wait_until(&format!("{what}: never acknowledged"), || {
                conn.stats().send_buffered == 0
            });
            assert!(
                a_read_leaves_it_clear(&conn, any_fd),
                "{what}: every read signals the combined descriptor again"
            );
        }
    }
}

/// Two writers wait for room on the writers' descriptor, one for a little and one for much
/// (tasks of the tokio adapter sharing a connection). Room comes for the first only, and the
/// second looks before the first was woken: its look finds too little and clears the
/// descriptor, which must be readable again for the first. Before, the second's look took the
/// room as told to it, and the first slept on with its room there until there was enough for
/// the second. Both transports, for messages, and for the stream on the UDP transport (the
/// TCP transport takes a large shared buffer once there is any room).
#[test]
fn a_writer_finding_too_little_room_leaves_the_wake_up_to_one_it_fits() {
    let cases = [
        (ri2n::Transport::Udp, true),
        (ri2n::Transport::Udp, false),
        (ri2n::Transport::Tcp, true),
    ];
    let mut slept = Vec::new();
    for (transport, messages) in cases {
        let what = format!(
            "{transport:?}, {}",
            if messages { "messages" } else { "stream" }
        );
        let quiet = ConnectionConfig::default().with_mtu_discovery(false);
        let endpoint =
            ri2n::EndpointConfig::new(vec![loopback("127.0.0.1")]).with_transport(transport);
        let window = quiet.clone().with_stream_receive_window(64 << 10);
        let server =
            Endpoint::bind(endpoint.clone().server().with_server_connection(window)).unwrap();
        let client = Endpoint::bind(endpoint).unwrap();
        let conn =
            (client.connect(&server.local_addrs(), quiet.with_send_buffer(64 << 10))).unwrap();
        let peer = server.accept().unwrap();
        let fd = conn.write_readiness_fd().unwrap().as_raw_fd();
        let kib = [1u8; 1024];
        let much = ri2n::Bytes::from(vec![2u8; 48 << 10]);
        let little = || match messages {
            true => conn.try_send_message(&kib).map(|()| kib.len()),
            false => conn.try_write(&kib),
        };
        let more = || match messages {
            true => conn.try_send_message(&much).map(|()| much.len()),
            false => conn.try_write_bytes(&much),
        };
        let blocked =
            |r: io::Result<usize>| matches!(r, Err(e) if e.kind() == ErrorKind::WouldBlock);
        // the peer reads nothing yet: its window, then our send buffer, fill
        for _ in 0..3 {
            while little().is_ok_and(|n| n > 0) {}
            std::thread::sleep(Duration::from_millis(200));
        }
        assert!(blocked(little()), "{what}: the little writer waits");
        assert!(blocked(more()), "{what}: the writer of much waits");
        // room for the little one, not for the other
        if messages {
            for _ in 0..24 {
                peer.recv_message().unwrap();
            }
        } else {
            (&peer).read_exact(&mut [0u8; 24 << 10]).unwrap();
        }
        wait_readable(fd, &format!("{what}: room"));
        assert!(blocked(more()), "{what}: room came for much");
        if !readable(fd) {
            slept.push(what.clone());
        }
        assert!(
            little().is_ok_and(|n| n > 0),
            "{what}: no room for a little"
        );
        // the room was taken: the other's looks no longer signal it (in one of three tries:
        // an acknowledgement may signal it between the call and the look)
        let clear = (0..3).any(|_| {
            assert!(blocked(more()), "{what}: room came for much");
            !readable(fd)
        });
        assert!(
            clear,
            "{what}: each look for much room signals the descriptor again"
        );
    }
    assert!(
        slept.is_empty(),
        "a look for much room cleared the wake-up of the writer that room fits: {slept:?}"
    );
}

/// `try_write_buf` takes a large buffer whole or not at all: with the send buffer full it
/// says `WouldBlock` and leaves the buffer as it was, the writing descriptor becomes readable
/// once room is back, and the retry takes it all, leaving it empty; a small buffer is taken as
/// far as there is room. The peer reads exactly what was taken. Both transports.
#[test]
fn try_write_buf_takes_a_large_buffer_whole_once_there_is_room() {
    for transport in [ri2n::Transport::Udp, ri2n::Transport::Tcp] {
        let config = ConnectionConfig::default().with_send_buffer(64 << 10);
        let (server, _client, conn) = pair(transport, config);
        let write_fd = conn.write_readiness_fd().unwrap().as_raw_fd();
        let mut written = block_a_writer(transport, &conn);
        let mut large = vec![9u8; 32 << 10];
        // acknowledgements may make room meanwhile (the peer's window takes what its
        // application does not read): then it is taken whole, and the buffer filled again,
        // until the peer's window is full too
        let e = loop {
            match conn.try_write_buf(&mut large) {
                Ok(n) => {
                    assert!(n == 32 << 10 && large.is_empty(), "{transport:?}: took {n}");
                    written += n + block_a_writer(transport, &conn);
                    large = vec![9u8; 32 << 10];
                }
                Err(e) => break e,
            }
            assert!(
                written < 64 << 20,
                "{transport:?}: the peer's window never filled"
            );
        };
        assert_eq!(e.kind(), ErrorKind::WouldBlock, "{transport:?}");
        assert_eq!(
            large,
            vec![9u8; 32 << 10],
            "{transport:?}: a refused buffer changed"
        );
        let peer = make_room(transport, &server, &conn, written);
        wait_readable(write_fd, &format!("{transport:?}: room back"));
        assert_eq!(
            conn.try_write_buf(&mut large).unwrap(),
            32 << 10,
            "{transport:?}"
        );
        assert!(
            large.is_empty(),
            "{transport:?}: a buffer taken whole is left empty"
        );
        let mut small = b"tail".to_vec();
        assert_eq!(conn.try_write_buf(&mut small).unwrap(), 4, "{transport:?}");
        assert!(small.is_empty(), "{transport:?}");
        let mut got = vec![0u8; (32 << 10) + 4];
        (&peer).read_exact(&mut got).unwrap();
        assert!(got[..32 << 10].iter().all(|&b| b == 9), "{transport:?}");
        assert_eq!(&got[32 << 10..], b"tail", "{transport:?}");
    }
}

/// Messages sent in one call arrive whole, in order and unchanged, taken in batches of at
/// most `max` into the caller's buffers; a batch that does not fit the send buffer is taken
/// in part, the count saying how far, and the rest sent later; with nothing waiting, both
/// calls say `WouldBlock`. Both transports.
#[test]
fn messages_go_and_come_in_batches() {
    for transport in [ri2n::Transport::Udp, ri2n::Transport::Tcp] {
        let config = ConnectionConfig::default().with_send_buffer(256 << 10);
        let (server, _client, conn) = pair(transport, config);
        let peer = server.accept().unwrap();
        let sizes = [
            1usize, 1400, 65_536, 0, 3000, 40_000, 7, 65_536, 65_536, 65_536,
        ];
        let msgs: Vec<Vec<u8>> = (sizes.iter().enumerate())
            .map(|(i, &n)| payload(n).into_iter().map(|b| b ^ i as u8).collect())
            .collect();
        let mut got: Vec<Vec<u8>> = Vec::new();
        let mut bufs = vec![vec![0xaa; 10]; 2];
        let e = peer.try_recv_messages_into(&mut bufs, 4).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::WouldBlock, "{transport:?}");
        let (mut sent, mut calls) = (0, 0);
        let deadline = Instant::now() + Duration::from_secs(10);
        while got.len() < msgs.len() {
            assert!(
                Instant::now() < deadline,
                "{transport:?}: {} of {} came",
                got.len(),
                msgs.len()
            );
            if sent < msgs.len() {
                match conn.try_send_messages(msgs[sent..].iter().map(Vec::as_slice)) {
                    Ok(n) => {
                        assert!(n >= 1, "{transport:?}: Ok(0) with messages to send");
                        sent += n;
                        calls += 1;
                    }
                    Err(e) => assert_eq!(e.kind(), ErrorKind::WouldBlock, "{transport:?}"),
                }
            }
            match peer.try_recv_messages_into(&mut bufs, 4) {
                Ok(()) => {
                    assert!(
                        (1..=4).contains(&bufs.len()),
                        "{transport:?}: {}",
                        bufs.len()
                    );
                    got.extend(bufs.iter().cloned());
                }
                Err(e) => assert_eq!(e.kind(), ErrorKind::WouldBlock, "{transport:?}"),
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(got == msgs, "{transport:?}: the messages differ");
        // the buffer took the batch in parts (the premise of the count)
        assert!(calls > 1, "{transport:?}: one call took the whole batch");
        assert_eq!(conn.try_send_messages(std::iter::empty()).unwrap(), 0);
    }
}
