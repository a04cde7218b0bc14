//! The driver's own tests: single takes, receiving lanes, and who receives a reply.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::time::Duration;

use crate::{ConnectionConfig, Endpoint};

fn taken_alone(e: &Endpoint) -> u64 {
    (e.udp().expect("a UDP endpoint").drivers.iter())
        .flat_map(|d| d.shared().receivers.iter())
        .map(|r| r.lock().unwrap().taken_alone)
        .sum()
}

/// How long each end of [`echo_exchange`] pauses before it sends: the other end is then
/// waiting for the message when it arrives, and its lane is idle, as in a request-response
/// exchange over a real network, also when the tests' threads outnumber the CPUs and a
/// thread may not have started to wait by the time its message comes. Shorter than the
/// longest an acknowledgement waits (`ConnectionConfig::max_ack_delay`), so each goes with
/// the next message instead of arriving alone just as one does.
const ECHO_PAUSE: Duration = Duration::from_micros(500);

/// Round trips of [`echo_exchange`], and how many of an end's arrivals its waiting calls
/// must take alone: with [`ECHO_PAUSE`] nearly all of them, and at least this many also
/// beside a thread that keeps a CPU busy. (With the driver's threads woken first, the
/// client's calls take far fewer.)
const ROUNDS: u64 = 500;
const MOSTLY_ALONE: u64 = ROUNDS * 3 / 4;

/// [`ROUNDS`] 64-byte messages from `client`, each echoed by `server` (on a thread of its
/// own) before the next, every echo checked, each end pausing [`ECHO_PAUSE`] before it
/// sends; then `measure` of the server, taken there.
fn echo_exchange<T: Send + 'static>(
    server: Endpoint,
    client: &Endpoint,
    measure: fn(&Endpoint) -> T,
) -> T {
    let to = server.local_addrs();
    let echo = std::thread::spawn(move || {
        let mut conn = server.accept().unwrap();
        let mut buf = [0u8; 64];
        for _ in 0..ROUNDS {
            conn.read_exact(&mut buf).unwrap();
            std::thread::sleep(ECHO_PAUSE);
            conn.write_all(&buf).unwrap();
        }
        measure(&server)
    });
    let mut conn = client.connect(&to, ConnectionConfig::default()).unwrap();
    let mut reply = [0u8; 64];
    for i in 0..ROUNDS {
        let msg = [i as u8; 64];
        std::thread::sleep(ECHO_PAUSE);
        conn.write_all(&msg).unwrap();
        conn.read_exact(&mut reply).unwrap();
        assert_eq!(reply, msg);
    }
    echo.join().unwrap()
}

/// A call that waits for one message at a time takes each arrival alone, with a plain
/// `recvmsg` ([`SINGLE_TAKES`](super::SINGLE_TAKES)), not with a `recvmmsg` that then
/// looks for more in vain.
#[test]
fn a_request_response_exchange_is_received_one_datagram_at_a_time() {
    let addrs = one_link();
    let server = Endpoint::server(&addrs).unwrap();
    let client = Endpoint::client(&addrs).unwrap();
    let at_server = echo_exchange(server, &client, taken_alone);
    let at_client = taken_alone(&client);
    // one message arrives at each end per round trip
    assert!(
        at_client >= MOSTLY_ALONE && at_server >= MOSTLY_ALONE,
        "of the {ROUNDS} messages at each end, taken alone: client {at_client}, server \
         {at_server}"
    );
}

/// A waiting call that takes one datagram alone (single takes) while the driver thread was
/// turned away from the same socket drains the socket instead: the driver thread's
/// edge-triggered wake-up is spent, and what the call left would wait for the next arrival.
#[test]
fn a_waiting_call_drains_a_socket_the_driver_thread_was_turned_away_from() {
    use std::os::fd::AsRawFd;
    use std::sync::atomic::Ordering;
    use std::time::Instant;

    // no connection: nothing else arrives meanwhile
    let endpoint =
        Endpoint::bind(crate::EndpointConfig::new(one_link()).with_shards(Some(1))).unwrap();
    let udp = endpoint.udp().expect("a UDP endpoint");
    let shared = udp.drivers[0].shared();
    let to = endpoint.local_addrs()[0];
    let rx = shared.receivers[0].lock().unwrap();
    let peer = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    for i in 0..3u8 {
        let d = [
            ri2n_proto::wire::VERSION,
            ri2n_proto::wire::packet_type::SHORT,
            i,
        ];
        peer.send_to(&[&d[..], &[0; 40]].concat(), to).unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(2);
    while shared.receive_wanted[0].load(Ordering::SeqCst) == 0 {
        assert!(Instant::now() < deadline, "the driver thread never tried");
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut rx = rx;
    rx.take_singly(0);
    drop(rx);
    shared.take_in(0, true);
    let mut queued: libc::c_int = 0;
    // SAFETY: FIONREAD writes one c_int into `queued`, which lives through the call.
    let rc = unsafe {
        libc::ioctl(
            shared.sockets[0].io.as_raw_fd(),
            libc::FIONREAD,
            &mut queued,
        )
    };
    assert_eq!(rc, 0);
    assert_eq!(queued, 0, "datagrams left in the socket");
}

/// A client endpoint of one shard (so its connection is on the driver a test holds up),
/// with `send_threads`, connected to a server: (server, client, the client's connection,
/// the server's).
fn one_shard_pair(
    send_threads: crate::SendThreads,
) -> (Endpoint, Endpoint, crate::Connection, crate::Connection) {
    use crate::EndpointConfig;
    let addrs = one_link();
    let server = Endpoint::server(&addrs).unwrap();
    let client = Endpoint::bind(
        EndpointConfig::new(addrs)
            .with_shards(Some(1))
            .with_send_threads(send_threads),
    )
    .unwrap();
    let conn = client
        .connect(&server.local_addrs(), ConnectionConfig::default())
        .unwrap();
    let accepted = server.accept().unwrap();
    (server, client, conn, accepted)
}

/// The peer learned of the abort (code 7) and reads nothing more.
fn assert_aborted_by_peer(accepted: &crate::Connection) {
    let mut buf = [0u8; 16];
    let read = std::io::Read::read(&mut &*accepted, &mut buf);
    assert!(!matches!(read, Ok(n) if n > 0), "{read:?}");
    assert!(
        matches!(
            accepted.close_reason(),
            Some(crate::ConnectionError::PeerAborted { code: 7, .. })
        ),
        "{:?}",
        accepted.close_reason()
    );
}

/// `Endpoint::close` returns only once the CLOSE of each connection it aborted was sent,
/// also when another thread was sending at that moment and so sends it: a process that
/// ends right after the close (the tunnel daemon on SIGTERM) must not take it along.
#[test]
fn close_returns_after_the_close_queued_behind_another_sender_is_sent() {
    use std::time::Instant;

    const OTHER_SENDS_FOR: Duration = Duration::from_millis(300);
    // no lanes: the thread that finds the queue free sends it (lanes: the next test)
    let (_server, client, conn, accepted) = one_shard_pair(crate::SendThreads::Off);
    // another thread takes the sending role and keeps it for a while, as a sending
    // streak of the driver thread or of a writer does (taken once free: a round of the
    // driver thread still under way would send the CLOSE itself)
    let driver = std::sync::Arc::clone(&client.udp().unwrap().drivers[0]);
    loop {
        let mut st = driver.shared().lock();
        if !st.out.sending {
            st.out.sending = true;
            break;
        }
        drop(st);
        std::thread::sleep(Duration::from_millis(1));
    }
    let other_sender = std::sync::Arc::clone(&driver);
    let other = std::thread::spawn(move || {
        std::thread::sleep(OTHER_SENDS_FOR);
        let shared = other_sender.shared();
        let mut st = shared.lock();
        st.out.sending = false;
        drop(shared.transmit(st, None));
    });
    let started = Instant::now();
    conn.abort(7, "going away");
    // the abort's CLOSE waits in the queue for the sending thread
    assert!(!driver.shared().lock().out.queue.is_empty());
    // (it reports the aborted connection as not delivered: not what this test is about)
    let _ = client.close(Some(Duration::from_millis(10)));
    let waited = started.elapsed();
    {
        let st = driver.shared().lock();
        assert!(st.out.queue.is_empty() && !st.out.sending);
    }
    assert!(
        waited >= OTHER_SENDS_FOR,
        "close returned after {waited:?}, before the other thread sent"
    );
    other.join().unwrap();
    // and the peer learned of the abort from it
    assert_aborted_by_peer(&accepted);
}

/// The same with lanes: the CLOSE of an aborted connection waits in a lane whose socket
/// another thread holds, and `Endpoint::close` returns only once the lane sent it.
#[test]
fn close_returns_after_a_held_up_lane_has_sent_the_close() {
    use std::time::{Duration, Instant};

    const HELD_FOR: Duration = Duration::from_millis(300);
    let (_server, client, conn, accepted) = one_shard_pair(crate::SendThreads::On);
    let driver = std::sync::Arc::clone(&client.udp().unwrap().drivers[0]);
    // held once free (a send under way finishes first)
    while !driver.shared().lanes[0].hold() {
        std::thread::sleep(Duration::from_millis(1));
    }
    let holder = std::sync::Arc::clone(&driver);
    // before the thread that lets the lane go starts: it may sleep before this one goes on
    let started = Instant::now();
    let other = std::thread::spawn(move || {
        std::thread::sleep(HELD_FOR);
        let lane = &holder.shared().lanes[0];
        lane.release();
        lane.wake();
    });
    conn.abort(7, "going away");
    // the abort's CLOSE waits in the lane
    assert!(driver.shared().backlog.any_unsent());
    let _ = client.close(Some(Duration::from_millis(10)));
    let waited = started.elapsed();
    assert!(!driver.shared().backlog.any_unsent());
    assert!(
        waited >= HELD_FOR,
        "close returned after {waited:?}, before the lane sent"
    );
    other.join().unwrap();
    assert_aborted_by_peer(&accepted);
}

/// Batches each lane's thread sent and threads that built them sent themselves, summed
/// over an endpoint's shards, per link socket.
fn lane_sends(e: &Endpoint) -> Vec<(usize, usize)> {
    use std::sync::atomic::Ordering::Relaxed;
    let mut per = Vec::new();
    for d in e.udp().expect("a UDP endpoint").drivers.iter() {
        for (i, l) in d.shared().lanes.iter().enumerate() {
            if per.len() <= i {
                per.push((0, 0));
            }
            per[i].0 += l.sent_by_thread.load(Relaxed);
            per[i].1 += l.sent_by_caller.load(Relaxed);
        }
    }
    per
}

/// A server and a client on `addrs`, each with a sending lane per link socket, and with
/// a receiving one if `receiving`; both hold `key`, if any.
fn lane_endpoints(
    addrs: &[SocketAddr],
    receiving: bool,
    key: Option<crate::Key>,
) -> (Endpoint, Endpoint) {
    use crate::{EndpointConfig, LinkThreads};
    let recv = if receiving {
        LinkThreads::On
    } else {
        LinkThreads::Off
    };
    let config = || {
        EndpointConfig::new(addrs.to_vec())
            .with_send_threads(LinkThreads::On)
            .with_recv_threads(recv)
            .with_key(key.clone())
    };
    let server = Endpoint::bind(config().server()).unwrap();
    let client = Endpoint::bind(config()).unwrap();
    (server, client)
}

/// Batches each receiving lane's thread received, summed over an endpoint's shards, per
/// link socket.
fn lane_receives(e: &Endpoint) -> Vec<usize> {
    use std::sync::atomic::Ordering::Relaxed;
    let mut per = Vec::new();
    for d in e.udp().expect("a UDP endpoint").drivers.iter() {
        for (i, l) in d.shared().recv_lanes.iter().enumerate() {
            if per.len() <= i {
                per.push(0);
            }
            per[i] += l.received_by_thread.load(Relaxed);
        }
    }
    per
}

/// One loopback link, for the request-response tests.
fn one_link() -> Vec<SocketAddr> {
    vec!["127.0.0.1:0".parse().unwrap()]
}

/// The two loopback links of the stream tests.
fn two_links() -> Vec<SocketAddr> {
    vec![
        "127.0.0.1:0".parse().unwrap(),
        "127.0.0.2:0".parse().unwrap(),
    ]
}

/// `bytes` that differ from position to position, so that a piece out of place shows.
fn patterned(bytes: usize) -> Vec<u8> {
    (0..bytes as u64)
        .map(|i| (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as u8)
        .collect()
}

/// Streams `data` from `client` to `server`; returns what the server read, and the
/// server.
fn stream_through(server: Endpoint, client: &Endpoint, data: &[u8]) -> (Vec<u8>, Endpoint) {
    let to = server.local_addrs();
    let reader = std::thread::spawn(move || {
        let mut conn = server.accept().unwrap();
        let mut got = Vec::new();
        conn.read_to_end(&mut got).unwrap();
        drop(conn);
        (got, server)
    });
    let mut conn = client.connect(&to, ConnectionConfig::default()).unwrap();
    conn.write_all(data).unwrap();
    conn.finish().unwrap();
    conn.wait_acknowledged(None).unwrap();
    reader.join().unwrap()
}

/// With lanes a stream over two links arrives intact, and the lanes' threads, not the
/// writing thread, sent most of it on each link.
#[test]
fn lanes_carry_a_stream_intact_and_their_threads_send_most_of_it() {
    let (server, client) = lane_endpoints(&two_links(), false, None);
    let data = patterned(32 << 20);
    let (got, _) = stream_through(server, &client, &data);
    assert!(
        got == data,
        "{} of {} bytes arrived, or others",
        got.len(),
        data.len()
    );
    let sends = lane_sends(&client);
    assert_eq!(sends.len(), 2, "a lane per link socket");
    let by_thread: usize = sends.iter().map(|s| s.0).sum();
    let by_caller: usize = sends.iter().map(|s| s.1).sum();
    assert!(
        sends.iter().all(|s| s.0 > 0) && by_thread > by_caller,
        "batches sent by each lane's thread and by the builders: {sends:?}"
    );
}

/// Datagram `i` of `size` bytes: its number, then bytes that depend on it.
fn numbered_datagram(i: u64, size: usize) -> Vec<u8> {
    let mut d = i.to_le_bytes().to_vec();
    d.extend((0..size - 8).map(|j| (i as usize + j) as u8));
    d
}

/// With lanes, an application that queues datagrams faster than the lanes send them waits
/// for them instead of losing the oldest to the full queue (`Shared::pace_datagrams`). The
/// sender's one lane is held up while it queues more than the lane and the queue hold
/// together (without the wait, the excess is dropped); every datagram arrives, in order,
/// and the sender was seen waiting while the lane was held.
#[test]
fn a_datagram_sender_waits_for_a_held_up_lane_instead_of_dropping() {
    datagram_sender_waits_for_a_held_up_lane(ConnectionConfig::default());
}

/// The same with datagrams that never grow too old (`Duration::MAX`): the wait has no
/// deadline. Before, the deadline overflowed the clock, and the sender panicked.
#[test]
fn a_datagram_sender_with_no_age_limit_waits_for_a_held_up_lane() {
    let ageless = ConnectionConfig::default().with_datagram_max_age(Duration::MAX);
    datagram_sender_waits_for_a_held_up_lane(ageless);
}

/// The sender's connection made with `config`.
fn datagram_sender_waits_for_a_held_up_lane(config: ConnectionConfig) {
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    use std::sync::Arc;
    use std::time::Instant;

    use crate::outgoing::{BATCH_BYTES, LANE_BATCHES};
    use crate::{EndpointConfig, LinkThreads};

    const SIZE: usize = 8000;
    // the sender's datagram queue (its default bound), and what the lane holds
    let queue = ConnectionConfig::default().datagram_send_buffer;
    let lane = LANE_BATCHES * BATCH_BYTES;
    // queued while the lane is held: what the lane and the queue hold, and 40 more
    let held = ((lane + queue) / SIZE) as u64 + 40;
    let addrs = one_link();
    // the receiving application keeps all that may come at once: no loss there
    let roomy = ConnectionConfig::default().with_datagram_receive_buffer(64 << 20);
    let server = Endpoint::bind(
        EndpointConfig::new(addrs.clone())
            .with_server_connection(roomy)
            .server(),
    )
    .unwrap();
    let client = Endpoint::bind(
        EndpointConfig::new(addrs)
            .with_shards(Some(1))
            .with_send_threads(LinkThreads::On),
    )
    .unwrap();
    let conn = client.connect(&server.local_addrs(), config).unwrap();
    let accepted = server.accept().unwrap();
    // datagrams the receiver is to get, once known
    let total = Arc::new(AtomicU64::new(u64::MAX));
    let arrived = Arc::new(AtomicU64::new(0));
    let (counted, expected) = (Arc::clone(&arrived), Arc::clone(&total));
    let receiver = std::thread::spawn(move || {
        let mut out_of_place = Vec::new();
        while counted.load(Relaxed) < expected.load(Relaxed) {
            match accepted.recv_datagram_timeout(Some(Duration::from_secs(5))) {
                Ok(Some(d)) => {
                    let i = counted.load(Relaxed);
                    if d != numbered_datagram(i, SIZE) && out_of_place.len() < 5 {
                        out_of_place.push((i, d.get(..8).map(|n| n.to_vec())));
                    }
                    counted.store(i + 1, Relaxed);
                }
                _ => break,
            }
        }
        out_of_place
    });
    let wait_for = |n: u64| {
        let deadline = Instant::now() + Duration::from_secs(10);
        while arrived.load(Relaxed) < n && Instant::now() < deadline {
            std::thread::sleep(Duration::from_micros(200));
        }
    };
    // Bursts the receiver takes in before the next, until the link's congestion window
    // holds what the lane holds and half the queue more: then the lane, not the window, is
    // what stops the engine while the sender queues (it waits once half the queue is
    // full). Each burst fills the window (so that it grows), and fits the lane and the
    // queue: none waits long or is dropped.
    let needed = (lane + queue / 2) as u64;
    let mut sent = 0;
    for _ in 0..200 {
        let cwnd = conn.stats().links[0].cwnd;
        if cwnd >= needed {
            break;
        }
        let burst = (cwnd as usize / SIZE).clamp(1, 9 * (lane + queue) / 10 / SIZE);
        for _ in 0..burst {
            conn.send_datagram(&numbered_datagram(sent, SIZE)).unwrap();
            sent += 1;
        }
        wait_for(sent);
    }
    let cwnd = conn.stats().links[0].cwnd;
    assert!(
        cwnd >= needed,
        "the congestion window grew to {cwnd} bytes only, after {sent} datagrams"
    );
    total.store(sent + held, Relaxed);
    let total = sent + held;
    let driver = Arc::clone(&client.udp().unwrap().drivers[0]);
    while !driver.shared().lanes[0].hold() {
        std::thread::sleep(Duration::from_millis(1));
    }
    // lets the lane go once the sender waits for it (or after a while, if it never does)
    let holder = Arc::clone(&driver);
    let release = std::thread::spawn(move || {
        let deadline = Instant::now() + Duration::from_secs(2);
        let mut paced = false;
        while !paced && Instant::now() < deadline {
            std::thread::sleep(Duration::from_micros(100));
            paced = holder.shared().lock().paced > 0;
        }
        let lane = &holder.shared().lanes[0];
        lane.release();
        lane.wake();
        paced
    });
    for i in sent..total {
        conn.send_datagram(&numbered_datagram(i, SIZE)).unwrap();
    }
    let paced = release.join().unwrap();
    wait_for(total);
    let out_of_place = receiver.join().unwrap();
    let stats = conn.stats();
    let dropped = stats.datagrams_send_dropped;
    let cwnd = stats.links[0].cwnd;
    assert_eq!(
        (arrived.load(Relaxed), dropped, out_of_place),
        (total, 0, vec![]),
        "(datagrams arrived, dropped by the sender, out of place) of {total}; the sender \
         waited for the lane: {paced}; the link's congestion window {cwnd} bytes, packets \
         lost {}",
        stats.links[0].packets_lost
    );
    assert!(
        paced,
        "the sender never waited for the held lane (congestion window {cwnd} bytes)"
    );
}

/// A message of a request-response exchange leaves from the thread that wrote it: the
/// lanes' threads, woken for it, would add a wake-up to every round trip. (A message that
/// finds its lane still sending the one before goes with the lane: a few of the rounds may.)
#[test]
fn a_short_message_to_an_idle_lane_leaves_from_the_calling_thread() {
    let addrs = one_link();
    let (server, client) = lane_endpoints(&addrs, false, None);
    let at_server = echo_exchange(server, &client, lane_sends);
    for (side, sends) in [("client", lane_sends(&client)), ("server", at_server)] {
        let (by_thread, by_caller) = sends[0];
        assert!(
            by_caller as u64 >= ROUNDS - ROUNDS / 20 && by_thread as u64 <= ROUNDS / 20,
            "{side}: {by_thread} batches sent by the lane's thread, {by_caller} by callers"
        );
    }
}

/// With receiving lanes a stream over two links arrives intact, without a key and with
/// one (each lane opens what it receives), and each link's lane received some of it on its
/// own thread (the reading thread receives for itself only while it waits).
#[test]
fn receiving_lanes_carry_a_stream_intact_and_each_receives_on_its_link() {
    let data = patterned(32 << 20);
    for key in [None, Some(crate::Key::from_bytes([9; 32]))] {
        let keyed = key.is_some();
        let (server, client) = lane_endpoints(&two_links(), true, key);
        assert!(server.recv_threads() && client.recv_threads());
        let (got, server) = stream_through(server, &client, &data);
        assert!(
            got == data,
            "keyed {keyed}: {} bytes arrived, or others",
            got.len()
        );
        let received = lane_receives(&server);
        assert_eq!(received.len(), 2, "a receiving lane per link socket");
        assert!(
            received.iter().all(|&n| n > 0),
            "keyed {keyed}: batches each receiving lane's thread received: {received:?}"
        );
    }
}

/// With receiving lanes, a request-response exchange is still received by the calls that
/// wait for it (their epoll instance is woken first, and they take one datagram alone): a
/// lane's thread receiving it would add a wake-up to every round trip.
#[test]
fn a_waiting_call_receives_its_reply_before_a_receiving_lane() {
    let addrs = one_link();
    let (server, client) = lane_endpoints(&addrs, true, None);
    let (at_server, by_lane) =
        echo_exchange(server, &client, |e| (taken_alone(e), lane_receives(e)));
    let at_client = taken_alone(&client);
    // one message arrives at each end per round trip
    assert!(
        at_client >= MOSTLY_ALONE && at_server >= MOSTLY_ALONE,
        "of the {ROUNDS} messages at each end, taken alone by waiting calls: client \
         {at_client}, server {at_server} (batches received by the lanes' threads: client \
         {:?}, server {by_lane:?})",
        lane_receives(&client)
    );
}

/// Batches of several datagrams an endpoint sent gathered from the send buffer, and from
/// one buffer, summed over its shards.
fn gathered_sends(e: &Endpoint) -> (usize, usize) {
    use std::sync::atomic::Ordering::Relaxed;
    let drivers = &e.udp().expect("a UDP endpoint").drivers;
    let sum = |f: fn(&super::Shared) -> &std::sync::atomic::AtomicUsize| {
        drivers.iter().map(|d| f(d.shared()).load(Relaxed)).sum()
    };
    (sum(|s| &s.sent_gathered), sum(|s| &s.sent_whole))
}

/// A server and a client endpoint on `links`, without sending or receiving lanes.
fn lane_free_endpoints(links: &[SocketAddr]) -> (Endpoint, Endpoint) {
    let config = || {
        crate::EndpointConfig::new(links.to_vec())
            .with_send_threads(crate::LinkThreads::Off)
            .with_recv_threads(crate::LinkThreads::Off)
    };
    let server = Endpoint::bind(config().server()).unwrap();
    (server, Endpoint::bind(config()).unwrap())
}

/// With lanes, a stream's batches leave gathered from its send buffer (the building thread
/// copies nothing into them) and arrive intact; with a key the lanes copy the bytes in
/// before sealing, and they arrive intact (authenticated) too. Without lanes the building
/// thread copies them in as it builds.
#[test]
fn with_lanes_a_stream_leaves_gathered_from_its_send_buffer_and_sealed_batches_whole() {
    for (lanes, key) in [
        (true, None),
        (true, Some(crate::Key::generate().unwrap())),
        (false, None),
    ] {
        let keyed = key.is_some();
        let (server, client) = if lanes {
            lane_endpoints(&two_links(), false, key)
        } else {
            lane_free_endpoints(&two_links())
        };
        let data = patterned(16 << 20);
        let (got, _) = stream_through(server, &client, &data);
        assert!(
            got == data,
            "lanes {lanes}, keyed {keyed}: {} of {} bytes, or others",
            got.len(),
            data.len()
        );
        let (gathered, whole) = gathered_sends(&client);
        match (lanes, keyed) {
            (true, false) => assert!(gathered > 10 * whole, "gathered {gathered}, whole {whole}"),
            _ => assert!(
                gathered == 0 && whole > 0,
                "lanes {lanes}, keyed {keyed}: gathered {gathered}, whole {whole}"
            ),
        }
    }
}

/// A socket on which the kernel stopped taking GSO batches (`EIO` from a device or path that
/// cannot segment; provoked here with more segments than one send may carry) gets single
/// datagrams from then on: the stream arrives intact and no further batch is built for GSO.
#[test]
fn a_socket_that_stopped_taking_gso_batches_gets_single_datagrams() {
    let (server, client) = lane_free_endpoints(&one_link());
    let socket = &client.udp().unwrap().drivers[0].shared().sockets[0];
    let sink = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let refused: Vec<u8> = vec![0; 150 * 40];
    socket.send(sink.local_addr().unwrap(), &refused, Some(40));
    assert_eq!(socket.max_segments(), 1, "the premise: GSO halted");
    let data = patterned(4 << 20);
    let (got, _) = stream_through(server, &client, &data);
    assert!(
        got == data,
        "{} of {} bytes, or others",
        got.len(),
        data.len()
    );
    let (gathered, whole) = gathered_sends(&client);
    assert_eq!((gathered, whole), (0, 0), "GSO batches sent");
}
