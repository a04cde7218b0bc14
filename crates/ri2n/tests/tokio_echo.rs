//! The tokio adapter: an echo server of async tasks serving many concurrent connections over
//! two loopback links, every echo exact, on either transport.

use std::future::Future;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ri2n::{ConnectionConfig, Endpoint, EndpointConfig, Transport};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

mod common;

use common::{loopback, payload};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokio_echo_server_serves_100_connections_over_two_links() {
    echo(Transport::Udp, 100).await;
}

/// The TCP transport's connections cost threads (two per link), so fewer of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokio_echo_server_serves_20_tcp_transport_connections_over_two_links() {
    echo(Transport::Tcp, 20).await;
}

async fn echo(transport: Transport, clients: usize) {
    let locals = [loopback("127.0.0.1"), loopback("127.0.0.2")];
    let config = EndpointConfig::new(locals.to_vec()).with_transport(transport);
    let server = Endpoint::bind(config.clone().server()).unwrap();
    let to = server.local_addrs()[0];
    let server_task = tokio::spawn(async move {
        let mut echoes = Vec::new();
        for _ in 0..clients {
            let mut conn = ri2n::tokio::accept(&server).await.unwrap();
            echoes.push(tokio::spawn(async move {
                let mut buf = vec![0u8; 16384];
                loop {
                    let n = conn.read(&mut buf).await.unwrap();
                    if n == 0 {
                        break;
                    }
                    conn.write_all(&buf[..n]).await.unwrap();
                }
                conn.shutdown().await.unwrap();
                conn
            }));
        }
        let mut conns = Vec::new();
        for e in echoes {
            conns.push(e.await.unwrap());
        }
        // let the clients read their echoes before the endpoint goes
        drop(conns);
        tokio::task::spawn_blocking(move || server.close(Some(Duration::from_secs(20))))
            .await
            .unwrap()
            .unwrap();
    });
    let client = Endpoint::bind(config).unwrap();
    let mut tasks = Vec::new();
    for k in 0..clients {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            let conn = ri2n::tokio::connect(&client, &[to], ConnectionConfig::default())
                .await
                .unwrap();
            let links = conn.get_ref().stats().links.len();
            let (mut rd, mut wr) = tokio::io::split(conn);
            let writer = tokio::spawn(async move {
                wr.write_all(&payload(k)).await.unwrap();
                wr.shutdown().await.unwrap();
                wr
            });
            let mut back = Vec::new();
            rd.read_to_end(&mut back).await.unwrap();
            drop(writer.await.unwrap());
            assert!(back == payload(k), "client {k}: echo differs");
            links
        }));
    }
    let all = async {
        for c in tasks {
            assert_eq!(c.await.unwrap(), 2, "two links");
        }
        server_task.await.unwrap();
    };
    tokio::time::timeout(Duration::from_secs(120), all)
        .await
        .expect("echoes within 2 minutes");
}

/// A task reading a fast two-link TCP-transport stream through its readiness descriptor is
/// woken for every arrival: three times 2 GiB from a blocking writer arrive in order, no
/// read waiting longer than 10 s. (Wake-ups signalled by link threads outside the
/// connection's lock were once lost, leaving the reader asleep over a full window, in about
/// one such transfer of three.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tokio_reader_of_a_two_link_tcp_stream_is_never_left_asleep() {
    const LEN: usize = 2 << 30;
    let locals = [loopback("127.0.0.1"), loopback("127.0.0.2")];
    let config = EndpointConfig::new(locals.to_vec()).with_transport(Transport::Tcp);
    let server = Endpoint::bind(config.server()).unwrap();
    for _ in 0..3 {
        read_fast(&server, LEN).await;
    }
}

/// Has a client on another endpoint write `len` bytes to `server`, read by a task.
async fn read_fast(server: &Endpoint, len: usize) {
    let to = server.local_addrs()[0];
    let server = server.clone();
    let reader = tokio::spawn(async move {
        let mut conn = ri2n::tokio::accept(&server).await.unwrap();
        let request = conn.recv_message().await.unwrap().unwrap();
        conn.send_message(&request).await.unwrap();
        let (mut buf, mut got) = (vec![0u8; 256 << 10], 0usize);
        loop {
            let read = tokio::time::timeout(Duration::from_secs(10), conn.read(&mut buf));
            let n = (read.await)
                .unwrap_or_else(|_| panic!("no wake-up after {got} bytes"))
                .unwrap();
            if n == 0 {
                break;
            }
            // a spot check: a slower reader would not race the link threads as a fast one does
            assert_eq!(buf[0], pattern(got), "byte {got} differs");
            got += n;
        }
        conn.send_message(&got.to_be_bytes()).await.unwrap();
        conn.shutdown().await.unwrap();
        conn
    });
    let locals = [loopback("127.0.0.1"), loopback("127.0.0.2")];
    let config = EndpointConfig::new(locals.to_vec()).with_transport(Transport::Tcp);
    let client = Endpoint::bind(config).unwrap();
    let count = tokio::task::spawn_blocking(move || {
        let conn = client.connect(&[to], ConnectionConfig::default()).unwrap();
        conn.send_message(b"start").unwrap();
        assert_eq!(conn.recv_message().unwrap().unwrap(), b"start");
        let data: Vec<u8> = (0..64 << 20).map(pattern).collect();
        for _ in 0..len / data.len() {
            for piece in data.chunks(64 << 10) {
                std::io::Write::write_all(&mut &conn, piece).unwrap();
            }
        }
        conn.finish().unwrap();
        let count = conn.recv_message().unwrap().unwrap();
        assert_eq!(conn.stats().links.len(), 2);
        // the reader's end of stream before this side goes: closed first, it would end the
        // connection before the reader's `shutdown`, which then fails
        let mut rest = Vec::new();
        std::io::Read::read_to_end(&mut &conn, &mut rest).unwrap();
        assert!(rest.is_empty(), "nothing but the count after the stream");
        count
    })
    .await
    .unwrap();
    assert_eq!(count, len.to_be_bytes());
    drop(reader.await.unwrap());
}

/// `AsyncConnection::write_bytes` and `read_chunk` on either transport: slices of one shared
/// buffer, large (shared) and small (copied), both ways, arrive exact in chunks as received.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_tasks_share_their_bytes_without_copies_both_ways() {
    for transport in [Transport::Udp, Transport::Tcp] {
        let locals = [loopback("127.0.0.1"), loopback("127.0.0.2")];
        let config = EndpointConfig::new(locals.to_vec()).with_transport(transport);
        let server = Endpoint::bind(config.clone().server()).unwrap();
        let to = server.local_addrs()[0];
        let data = ri2n::Bytes::from((0..16 << 20).map(pattern).collect::<Vec<u8>>());
        let sizes = [1 << 20, 100, 64 << 10, 7, 300_000];
        // the server reads everything with `read_chunk`, then sends it back with
        // `write_bytes` of the chunks it read
        let server_task = tokio::spawn(async move {
            let conn = ri2n::tokio::accept(&server).await.unwrap();
            let (mut chunk, mut got) = (ri2n::Bytes::new(), Vec::new());
            while conn.read_chunk(&mut chunk).await.unwrap() > 0 {
                got.push(chunk.clone());
            }
            for c in got {
                conn.write_bytes(c).await.unwrap();
            }
            conn.get_ref().finish().unwrap();
            conn
        });
        // (the endpoint outlives the blocking task that connects)
        let client = Endpoint::bind(config).unwrap();
        let connecting = client.clone();
        let conn = tokio::task::spawn_blocking(move || {
            connecting
                .connect(&[to], ConnectionConfig::default())
                .unwrap()
        })
        .await
        .unwrap();
        let conn = ri2n::tokio::AsyncConnection::new(conn).unwrap();
        let (mut at, mut k) = (0, 0);
        while at < data.len() {
            let n = sizes[k % sizes.len()].min(data.len() - at);
            conn.write_bytes(data.slice(at..at + n)).await.unwrap();
            (at, k) = (at + n, k + 1);
        }
        conn.get_ref().finish().unwrap();
        let (mut chunk, mut back) = (ri2n::Bytes::new(), Vec::new());
        while conn.read_chunk(&mut chunk).await.unwrap() > 0 {
            back.extend_from_slice(&chunk);
        }
        assert_eq!(back.len(), data.len(), "{transport:?}");
        assert!(back == data, "{transport:?}: the bytes came back changed");
        drop(server_task.await.unwrap());
    }
}

/// Byte `i` of the reader test's stream (which repeats every 64 MiB)./// Byte `i` of the reader test's stream (which repeats every 64 MiB).
fn pattern(i: usize) -> u8 {
    let i = i % (64 << 20);
    (i ^ (i >> 9) ^ (i >> 17)) as u8
}

/// A server on both loopback links, and a client endpoint with its connection to it, on
/// which `first` was done (blocking calls, on a thread of the runtime's pool).
async fn connected(
    first: impl FnOnce(&ri2n::Connection) -> std::io::Result<()> + Send + 'static,
) -> (Endpoint, (Endpoint, ri2n::Connection)) {
    let addrs = [loopback("127.0.0.1"), loopback("127.0.0.2")];
    let server = Endpoint::server(&addrs).unwrap();
    let client = Endpoint::client(&addrs).unwrap();
    let to = server.local_addrs();
    let pair = tokio::task::spawn_blocking(move || {
        let c = client.connect(&to, ConnectionConfig::default()).unwrap();
        first(&c).unwrap();
        (client, c)
    })
    .await
    .unwrap();
    (server, pair)
}

/// A connection read with its own calls, then wrapped (again): what waits is read at once.
/// The readiness descriptor was clear with data waiting, a new registration starts without
/// readiness, and the first read waited for a signal that never came.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_wrapped_again_reads_what_waits() {
    let (server, conn) = connected(|mut c| std::io::Write::write_all(&mut c, &[5u8; 100])).await;
    let accepted = ri2n::tokio::accept(&server).await.unwrap().into_inner();
    // the premise: all 100 bytes wait before the first wrapping is undone
    let deadline = Instant::now() + Duration::from_secs(10);
    while accepted.stats().recv_buffered < 100 {
        assert!(Instant::now() < deadline, "the 100 bytes never came");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let mut ten = [0u8; 10];
    assert_eq!(accepted.try_read(&mut ten).unwrap(), 10);
    let mut again = ri2n::tokio::AsyncConnection::new(accepted).unwrap();
    let mut rest = [0u8; 90];
    tokio::time::timeout(Duration::from_secs(5), again.read_exact(&mut rest))
        .await
        .expect("the 90 bytes waiting were not read within 5 s")
        .unwrap();
    assert_eq!(rest, [5u8; 90]);
    drop(conn);
}

/// Two tasks wait for a message on one connection at once: both get one. Each waits with a
/// waker of its own; the second used to replace the first's, which was never woken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_tasks_waiting_on_one_connection_are_both_woken() {
    let (server, (client, sender)) = connected(|c| c.send_message(b"hello")).await;
    let conn = Arc::new(ri2n::tokio::accept(&server).await.unwrap());
    assert_eq!(conn.recv_message().await.unwrap().unwrap(), b"hello");
    let waiting: Vec<_> = (0..2).map(|_| Arc::new(AtomicBool::new(false))).collect();
    let waiters: Vec<_> = (waiting.iter().cloned())
        .map(|waiting| {
            let conn = conn.clone();
            tokio::spawn(async move { noting_pending(conn.recv_message(), waiting).await })
        })
        .collect();
    // the premise: both wait, each with its waker registered, before anything is sent
    until_all_pending(&waiting).await;
    for m in [b"one", b"two"] {
        sender.send_message(m).unwrap();
    }
    let mut got = Vec::new();
    for w in waiters {
        let m = tokio::time::timeout(Duration::from_secs(5), w)
            .await
            .expect("a waiting task was never woken")
            .unwrap()
            .unwrap()
            .unwrap();
        got.push(m);
    }
    got.sort();
    assert_eq!(got, vec![b"one".to_vec(), b"two".to_vec()]);
    drop((client, sender));
}

/// Datagrams in async code: a task echoes what `recv_datagram` gives it, and a client task
/// gets every one of its datagrams back exactly, waiting with `recv_datagram` and
/// `recv_datagrams_into` too. A wait
/// given up (a timeout dropping the future while nothing came) takes nothing: the datagram
/// sent after it is the next one received.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokio_tasks_exchange_datagrams() {
    let locals = [loopback("127.0.0.1"), loopback("127.0.0.2")];
    let config = EndpointConfig::new(locals.to_vec());
    let server = Endpoint::bind(config.clone().server()).unwrap();
    let to = server.local_addrs()[0];
    const SENT: usize = 200 + 16;
    let echo = tokio::spawn(async move {
        let conn = ri2n::tokio::accept(&server).await.unwrap();
        for _ in 0..SENT {
            let d = conn.recv_datagram().await.unwrap().expect("a datagram");
            conn.get_ref().send_datagram(&d).unwrap();
        }
        (conn, server)
    });
    let client = Endpoint::bind(config).unwrap();
    let conn = ri2n::tokio::connect(&client, &[to], ConnectionConfig::default())
        .await
        .unwrap();
    let idle = tokio::time::timeout(Duration::from_millis(50), conn.recv_datagram()).await;
    assert!(idle.is_err(), "a datagram out of nowhere: {idle:?}");
    // one at a time, each awaited: nothing is dropped for want of room
    for i in 0..200u32 {
        let sent: Vec<u8> = (0..i % 1000 + 1).map(|j| (j ^ i) as u8).collect();
        conn.get_ref().send_datagram(&sent).unwrap();
        let back = tokio::time::timeout(Duration::from_secs(10), conn.recv_datagram())
            .await
            .unwrap_or_else(|_| panic!("datagram {i} never came back"))
            .unwrap();
        assert_eq!(back.as_deref(), Some(&sent[..]), "datagram {i}");
    }
    // a batch, received with one call or a few
    for i in 0..16u32 {
        conn.get_ref().send_datagram(&i.to_be_bytes()).unwrap();
    }
    let (mut bufs, mut got) = (Vec::new(), Vec::new());
    while got.len() < 16 {
        let recv = conn.recv_datagrams_into(&mut bufs, 64);
        tokio::time::timeout(Duration::from_secs(10), recv)
            .await
            .expect("the batch came back")
            .unwrap();
        got.extend(
            bufs.iter()
                .map(|b| u32::from_be_bytes(b[..].try_into().unwrap())),
        );
    }
    got.sort();
    assert_eq!(got, (0..16).collect::<Vec<_>>());
    tokio::time::timeout(Duration::from_secs(20), echo)
        .await
        .expect("the echo task ends")
        .unwrap();
}

/// A task waiting for a message while another task of the same runtime reads the stream of
/// the same connection: the message that arrives with stream bytes wakes it, however often
/// the stream reader looks meanwhile, on either transport. Before, both waited on one
/// descriptor: the stream reader's second look cleared the wake-up meant for the message
/// task before the (busy) runtime saw it, and the task slept on with the message there.
#[test]
fn a_task_waiting_for_a_message_is_woken_while_another_reads_the_stream() {
    for transport in [Transport::Udp, Transport::Tcp] {
        let woken = message_waiter_beside_a_stream_reader(transport);
        assert!(
            woken,
            "{transport:?}: the message task slept on with a message there"
        );
    }
}

/// Whether a task in `recv_message` gets the message sent right after stream bytes that
/// another task reads (`read_chunk` twice: the second finds nothing and waits), while the
/// runtime's one thread was busy as both arrived.
fn message_waiter_beside_a_stream_reader(transport: Transport) -> bool {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let locals = [
            "127.0.0.1:0".parse().unwrap(),
            "127.0.0.2:0".parse().unwrap(),
        ];
        let config = EndpointConfig::new(locals.to_vec()).with_transport(transport);
        let server = Endpoint::bind(config.clone().server()).unwrap();
        let client = Endpoint::bind(config).unwrap();
        let to = server.local_addrs();
        let (go, went) = std::sync::mpsc::channel();
        let peer = std::thread::spawn(move || {
            let c = client
                .connect(&to[..1], ConnectionConfig::default())
                .unwrap();
            c.send_message(b"hello").unwrap();
            went.recv().unwrap();
            (&c).write_all(&[7u8; 100]).unwrap();
            c.send_message(b"ping").unwrap();
            went.recv().unwrap();
        });
        let conn = Arc::new(ri2n::tokio::accept(&server).await.unwrap());
        assert_eq!(conn.recv_message().await.unwrap().unwrap(), b"hello");
        let waiting = Arc::new(AtomicBool::new(false));
        let waiter = {
            let (conn, waiting) = (conn.clone(), waiting.clone());
            tokio::spawn(async move { noting_pending(conn.recv_message(), waiting).await })
        };
        // the waiter is registered and asleep
        until_all_pending(&[waiting]).await;
        go.send(()).unwrap();
        // the runtime's thread busy while the stream bytes and the message arrive
        std::thread::sleep(Duration::from_millis(300));
        let mut chunk = ri2n::Bytes::new();
        assert_eq!(conn.read_chunk(&mut chunk).await.unwrap(), 100);
        let again = conn.read_chunk(&mut chunk);
        assert!(tokio::time::timeout(Duration::from_millis(100), again)
            .await
            .is_err());
        let got = tokio::time::timeout(Duration::from_secs(2), waiter).await;
        let woken = got.is_ok_and(|m| m.unwrap().unwrap().as_deref() == Some(&b"ping"[..]));
        // the premise: the message was there, whether the task was woken or not
        let there = woken || conn.get_ref().try_recv_message().unwrap().as_deref() == Some(b"ping");
        assert!(there, "the message never arrived");
        go.send(()).unwrap();
        peer.join().unwrap();
        woken
    })
}

/// Polls `fut` and sets `pending` once a poll found nothing: from then on the task's waker is
/// registered (a future that returns `Pending` has arranged to be woken), the premise of a
/// test of wake-ups, proven rather than hoped for after a sleep.
async fn noting_pending<F: Future>(fut: F, pending: Arc<AtomicBool>) -> F::Output {
    let mut fut = std::pin::pin!(fut);
    std::future::poll_fn(|cx| {
        let poll = fut.as_mut().poll(cx);
        if poll.is_pending() {
            pending.store(true, Ordering::SeqCst);
        }
        poll
    })
    .await
}

/// Yields to the runtime until every flag of [`noting_pending`] is set (at most 10 s).
async fn until_all_pending(flags: &[Arc<AtomicBool>]) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !flags.iter().all(|f| f.load(Ordering::SeqCst)) {
        assert!(Instant::now() < deadline, "a task never came to wait");
        tokio::task::yield_now().await;
    }
}

/// What another task does on the connection while one waits, in [`waiter_beside`].
#[derive(Debug, Clone, Copy)]
enum Beside {
    /// Two stream writes, while the waiter waits for room for a message.
    StreamWrites,
    /// One small message sent, while the waiter waits for room for a large one.
    MessageSent,
    /// One message read of two that came, while the waiter waits for a message too.
    MessageTaken,
    /// The same read with the connection's own `try_recv_message` (through `get_ref`, as
    /// its doc allows a task), which the adapter does not count among its calls.
    MessageTakenDirectly,
}

/// Tasks sharing a connection wait on one descriptor per kind of call (all writers share
/// one), and each call's look clears it. A call another task made while a waiter's wake-up
/// was still unseen by the busy runtime cleared that wake-up, and the waiter slept on with
/// its room or its message there: nothing later signalled it again.
#[test]
fn a_task_waiting_beside_another_making_calls_on_its_descriptor_is_woken() {
    let udp = Transport::Udp;
    let all = [
        (Beside::StreamWrites, udp),
        (Beside::MessageSent, udp),
        (Beside::MessageTaken, udp),
        (Beside::MessageTakenDirectly, udp),
        (Beside::MessageTakenDirectly, Transport::Tcp),
    ];
    let slept: Vec<_> = (all.into_iter())
        .filter(|&(b, t)| !waiter_beside(b, t))
        .collect();
    assert!(
        slept.is_empty(),
        "the waiting task slept on with its room or message there: {slept:?}"
    );
}

/// Whether a task waiting in `send_message` (the send buffer full) or in `recv_message`
/// ([`Beside::MessageTaken`]) is woken within 3 s once what it waits for is there, while
/// another task of the runtime made the calls `beside` after the runtime's one thread was
/// busy as it came, on `transport`.
fn waiter_beside(beside: Beside, transport: Transport) -> bool {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let lo = "127.0.0.1:0".parse().unwrap();
        let quiet = ConnectionConfig::default().with_mtu_discovery(false);
        let config = EndpointConfig::new(vec![lo]).with_transport(transport);
        let server = Endpoint::bind(
            (config.clone().server())
                .with_server_connection(quiet.clone().with_stream_receive_window(64 << 10)),
        )
        .unwrap();
        let to = server.local_addrs();
        let reading = matches!(beside, Beside::MessageTaken | Beside::MessageTakenDirectly);
        let (go, went) = std::sync::mpsc::channel::<()>();
        let peer = std::thread::spawn(move || {
            let c = server.accept().unwrap();
            went.recv().unwrap();
            if reading {
                c.send_message(b"one").unwrap();
                c.send_message(b"two").unwrap();
                went.recv().unwrap();
            } else {
                let patience = Some(Duration::from_secs(10));
                while let Ok(Some(_)) = c.recv_message_timeout(patience) {}
            }
            (server, c)
        });
        let client = Endpoint::bind(config).unwrap();
        let conn = ri2n::tokio::connect(&client, &to, quiet.with_send_buffer(64 << 10));
        let conn = Arc::new(conn.await.unwrap());
        let msg = [1u8; 1024];
        if !reading {
            // the peer reads nothing yet: its window, then our send buffer, fill
            for _ in 0..3 {
                while conn.get_ref().try_send_message(&msg).is_ok() {}
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        let waiting = Arc::new(AtomicBool::new(false));
        let mut waiter = {
            let (conn, waiting) = (conn.clone(), waiting.clone());
            tokio::spawn(async move {
                let wait = async {
                    match reading {
                        true => conn.recv_message().await.map(drop),
                        false => conn.send_message(&[2u8; 1024]).await,
                    }
                };
                noting_pending(wait, waiting).await
            })
        };
        until_all_pending(&[waiting]).await;
        go.send(()).unwrap();
        // the runtime's thread busy while the room or the messages come
        std::thread::sleep(Duration::from_millis(300));
        match beside {
            Beside::StreamWrites => {
                for _ in 0..2 {
                    let x = ri2n::Bytes::from_static(b"x");
                    conn.write_bytes(x).await.unwrap();
                }
            }
            Beside::MessageSent => conn.send_message(b"small").await.unwrap(),
            Beside::MessageTaken => {
                assert_eq!(conn.recv_message().await.unwrap().unwrap(), b"one");
            }
            Beside::MessageTakenDirectly => {
                let deadline = Instant::now() + Duration::from_secs(5);
                let one = loop {
                    match conn.get_ref().try_recv_message() {
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                            assert!(Instant::now() < deadline, "no message came");
                            std::thread::sleep(Duration::from_millis(1));
                        }
                        r => break r.unwrap(),
                    }
                };
                assert_eq!(one.as_deref(), Some(&b"one"[..]));
            }
        }
        let wait = Duration::from_secs(3);
        let woken = tokio::time::timeout(wait, &mut waiter).await.is_ok();
        // the premise: what the task waited for was there, whether it was woken or not
        if !woken && reading {
            let m = conn.get_ref().try_recv_message().unwrap();
            assert_eq!(m.as_deref(), Some(&b"two"[..]), "no message waited");
        } else if !woken {
            let room = conn.get_ref().try_send_message(&msg);
            assert!(room.is_ok(), "no room came: {room:?}");
        }
        if reading {
            go.send(()).unwrap();
        }
        conn.get_ref().finish().unwrap();
        waiter.abort();
        drop((conn, client));
        let ends = tokio::task::spawn_blocking(move || drop(peer.join().unwrap()));
        ends.await.unwrap();
        woken
    })
}

/// A writer waits for room for a message (the peer reads nothing) while another task, or
/// thread, finishes the connection: the writer is woken and fails with `BrokenPipe`, on
/// both transports, as an async task or a thread in the blocking call. Before, nothing told
/// it: the task slept on (both transports), and so did the thread on the TCP transport,
/// for as long as the peer read nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finish_wakes_a_writer_waiting_for_room() {
    for transport in [Transport::Udp, Transport::Tcp] {
        for blocking in [false, true] {
            let what = format!("{transport:?} (a thread in the blocking call: {blocking})");
            let small = ConnectionConfig::default()
                .with_stream_receive_window(64 << 10)
                .with_send_buffer(64 << 10);
            let config = EndpointConfig::new(vec![loopback("127.0.0.1")]).with_transport(transport);
            let server = Endpoint::bind(
                config
                    .clone()
                    .server()
                    .with_server_connection(small.clone()),
            )
            .unwrap();
            let client = Endpoint::bind(config).unwrap();
            let to = server.local_addrs();
            let peer = std::thread::spawn(move || {
                let c = server.accept().unwrap();
                (server, c)
            });
            let conn = ri2n::tokio::connect(&client, &to, small).await.unwrap();
            let conn = Arc::new(conn);
            let msg = [1u8; 1024];
            // the send buffer and the peer's window full
            for _ in 0..3 {
                while conn.get_ref().try_send_message(&msg).is_ok() {}
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            let waiting = Arc::new(AtomicBool::new(false));
            let writer = {
                let (conn, waiting) = (conn.clone(), waiting.clone());
                if blocking {
                    tokio::task::spawn_blocking(move || {
                        waiting.store(true, Ordering::SeqCst);
                        conn.get_ref().send_message(&msg)
                    })
                } else {
                    tokio::spawn(
                        async move { noting_pending(conn.send_message(&msg), waiting).await },
                    )
                }
            };
            until_all_pending(&[waiting]).await;
            // (the thread is in its call by then)
            tokio::time::sleep(Duration::from_millis(200)).await;
            assert!(
                !writer.is_finished(),
                "{what}: the premise: the writer waits"
            );
            conn.get_ref().finish().unwrap();
            let woken = tokio::time::timeout(Duration::from_secs(5), writer).await;
            // a thread still waiting ends with the abort
            conn.get_ref().abort(0, "the test is over");
            let e = woken
                .unwrap_or_else(|_| panic!("{what}: the writer slept on after the finish"))
                .unwrap()
                .expect_err("no message after the finish");
            assert_eq!(e.kind(), std::io::ErrorKind::BrokenPipe, "{what}: {e}");
            let ends = tokio::task::spawn_blocking(move || drop((peer.join().unwrap(), client)));
            ends.await.unwrap();
        }
    }
}

/// Two tasks wait for room on one connection: one for a little, then one for much more. Room
/// for the first comes, not for the second: the first is woken and writes, on both
/// transports for messages, on the UDP transport for the stream. Before, the second's wait
/// replaced the first's, and room was only told once there was enough for the second. (The
/// TCP transport takes a large shared buffer once there is any room, so there no stream
/// writer waits for much: woken together, either may take the room.)
#[test]
fn a_writer_waiting_for_little_room_is_woken_beside_one_waiting_for_much() {
    let mut slept = Vec::new();
    let cases = [
        (Transport::Udp, true),
        (Transport::Udp, false),
        (Transport::Tcp, true),
    ];
    for (transport, messages) in cases {
        if !small_writer_woken(transport, messages) {
            slept.push((transport, if messages { "messages" } else { "stream" }));
        }
    }
    assert!(
        slept.is_empty(),
        "the writer of 1 KiB slept on with room there: {slept:?}"
    );
}

/// Whether, in [`a_writer_waiting_for_little_room_is_woken_beside_one_waiting_for_much`], the
/// small writer was woken within 5 s once its room came.
fn small_writer_woken(transport: Transport, messages: bool) -> bool {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let quiet = ConnectionConfig::default().with_mtu_discovery(false);
        let config = EndpointConfig::new(vec![loopback("127.0.0.1")]).with_transport(transport);
        let server = Endpoint::bind(
            (config.clone().server())
                .with_server_connection(quiet.clone().with_stream_receive_window(64 << 10)),
        )
        .unwrap();
        let to = server.local_addrs();
        let (go, went) = std::sync::mpsc::channel::<()>();
        // the peer reads 24 KiB once told, then nothing until the test is over
        let peer = std::thread::spawn(move || {
            let c = server.accept().unwrap();
            went.recv().unwrap();
            if messages {
                for _ in 0..24 {
                    c.recv_message().unwrap();
                }
            } else {
                let mut read = vec![0u8; 24 << 10];
                std::io::Read::read_exact(&mut &c, &mut read).unwrap();
            }
            let _ = went.recv();
            (server, c)
        });
        let client = Endpoint::bind(config).unwrap();
        let conn = ri2n::tokio::connect(&client, &to, quiet.with_send_buffer(64 << 10));
        let conn = Arc::new(conn.await.unwrap());
        let write = |conn: Arc<ri2n::tokio::AsyncConnection>, len: usize, waiting| async move {
            let data = vec![2u8; len];
            let wait = async {
                match messages {
                    true => conn.send_message(&data).await,
                    false => conn.write_bytes(ri2n::Bytes::from(data.clone())).await,
                }
            };
            noting_pending(wait, waiting).await
        };
        // the peer reads nothing yet: its window, then our send buffer, fill
        let kib = [1u8; 1024];
        for _ in 0..3 {
            match messages {
                true => while conn.get_ref().try_send_message(&kib).is_ok() {},
                false => while conn.get_ref().try_write(&kib).is_ok_and(|n| n > 0) {},
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let flags: Vec<_> = (0..2).map(|_| Arc::new(AtomicBool::new(false))).collect();
        let mut small = tokio::spawn(write(conn.clone(), 1 << 10, flags[0].clone()));
        until_all_pending(&flags[..1]).await;
        let large = tokio::spawn(write(conn.clone(), 48 << 10, flags[1].clone()));
        until_all_pending(&flags).await;
        go.send(()).unwrap();
        let woken = tokio::time::timeout(Duration::from_secs(5), &mut small)
            .await
            .is_ok();
        if !woken {
            // the premise: the room was there
            let room = match messages {
                true => conn.get_ref().try_send_message(&kib).map(|()| 1024),
                false => conn.get_ref().try_write(&kib),
            };
            let what = (transport, messages);
            assert!(
                matches!(room, Ok(n) if n > 0),
                "{what:?}: no room came: {room:?}"
            );
        }
        small.abort();
        large.abort();
        conn.get_ref().abort(0, "the test is over");
        let _ = go.send(());
        drop((conn, client));
        let ends = tokio::task::spawn_blocking(move || drop(peer.join().unwrap()));
        ends.await.unwrap();
        woken
    })
}

/// A connect cancelled while the peer does not answer (a timeout around it) leaves nothing
/// running: the handshake stops (the silent peer hears no more of it) and the runtime shuts
/// down at once. It ran on a blocking-pool thread, which went on for the handshake's whole
/// timeout, and the runtime's drop waited for it.
#[test]
fn a_cancelled_connect_stops_its_handshake_and_holds_up_nothing() {
    let silent = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let to = silent.local_addr().unwrap();
    let client = Endpoint::client(&[loopback("127.0.0.1")]).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    // a handshake that fails ends the wait as one that succeeds does
    let closed = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let nobody = [closed.local_addr().unwrap()];
    drop(closed);
    let refused = rt.block_on(async {
        let connect = ri2n::tokio::connect(&client, &nobody, ConnectionConfig::default());
        tokio::time::timeout(Duration::from_secs(5), connect).await
    });
    assert!(
        matches!(
            refused,
            Ok(Err(ri2n::Error::Connection(ri2n::ConnectionError::Refused)))
        ),
        "{refused:?}"
    );
    let cancelled = rt.block_on(async {
        let remotes = [to];
        let connect = ri2n::tokio::connect(&client, &remotes, ConnectionConfig::default());
        tokio::time::timeout(Duration::from_millis(200), connect).await
    });
    assert!(cancelled.is_err(), "the connect did not time out");
    let shutting = Instant::now();
    drop(rt);
    let took = shutting.elapsed();
    // the handshake was under way: its first packets reached the silent peer
    silent
        .set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let mut buf = [0u8; 2048];
    let mut heard = 0;
    while silent.recv(&mut buf).is_ok() {
        heard += 1;
    }
    assert!(heard > 0, "no handshake packet reached the peer");
    // and no more after the cancel (its retries come within a second or two)
    silent
        .set_read_timeout(Some(Duration::from_secs(3)))
        .unwrap();
    let after = silent.recv(&mut buf);
    assert!(after.is_err(), "the handshake went on after the cancel");
    assert!(
        took < Duration::from_secs(5),
        "the runtime's shutdown waited {took:?} for the cancelled connect"
    );
}
