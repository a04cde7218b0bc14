//! What a peer of the TCP transport can make a server hold in memory: about its receive
//! window for bytes sent a byte per run or a byte per stream chunk, and next to
//! nothing for a replayed keyed hello that announces a large first frame; and that a sender
//! lets go of what was acknowledged after an empty message, and holds about its send buffer
//! of empty messages. Each test measures
//! this process's resident memory, so they run one at a time, in a binary of their own.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ri2n::{Connection, ConnectionConfig, Endpoint, EndpointConfig, Key, Transport};
use ri2n_proto::tcp::chunk::{header, Kind};
use ri2n_proto::tcp::frame::{HelloStatus, Record};
use ri2n_proto::tcp::keys::{ClientLinkHandshake, MAX_FRAME};

mod common;
use common::{read_reply, say_hello, say_hello_with};

/// The receive window of the server's connections.
const WINDOW: u64 = 1 << 20;

/// One test at a time: each reads the resident memory of the whole process.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// This process's resident memory, bytes.
fn resident() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    // SAFETY: sysconf has no preconditions
    pages * unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64
}

fn tcp_server(key: Option<Key>) -> Endpoint {
    let connection = ConnectionConfig::default()
        .with_stream_receive_window(WINDOW)
        .with_accept_messages(true);
    let config = EndpointConfig::new(vec!["127.0.0.1:0".parse().unwrap()])
        .with_transport(Transport::Tcp)
        .with_server_connection(connection)
        .with_key(key)
        .server();
    Endpoint::bind(config).unwrap()
}

/// Sends `records` to a new connection of `server` from a raw client, waits until the server
/// received all of it (`bytes` of the sequence), calls `look` on the connection, and returns
/// it, the raw client, and by how much this process's memory grew meanwhile.
fn memory_for(
    server: &Endpoint,
    records: &[u8],
    bytes: u64,
    look: impl Fn(&Connection),
) -> (Connection, TcpStream, u64) {
    let mut s = say_hello(server.local_addrs()[0], 0x3e3_0001, 0);
    assert_eq!(read_reply(&mut s).0.status, HelloStatus::Accepted);
    let accepted = server.accept().unwrap();
    // what the server sends (ACKs) is drained, so that it never waits on this client
    let mut drain = s.try_clone().unwrap();
    std::thread::spawn(move || {
        let mut b = [0; 4096];
        while matches!(drain.read(&mut b), Ok(1..)) {}
    });
    let before = resident();
    s.write_all(records).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while accepted.stats().bytes_received < bytes {
        assert!(Instant::now() < deadline, "{:?}", accepted.stats());
        std::thread::sleep(Duration::from_millis(10));
    }
    look(&accepted);
    let grown = resident().saturating_sub(before);
    (accepted, s, grown)
}

/// The records of a link that sends `runs` from the start of the sequence, in order.
fn runs_from_the_start<'a>(runs: impl IntoIterator<Item = &'a [u8]>) -> Vec<u8> {
    let mut records = Vec::new();
    let round = Record::Round {
        pos: 0,
        backward: false,
    };
    round.encode(&mut records);
    for run in runs {
        let len = u32::try_from(run.len()).expect("a run's length");
        Record::Run { len }.encode(&mut records);
        records.extend_from_slice(run);
    }
    records
}

/// Stream byte `i` of a test.
fn byte(i: usize) -> u8 {
    (i % 251) as u8
}

/// Reads `len` stream bytes from `conn` and checks that they are those sent.
fn read_stream(conn: &Connection, len: usize) {
    let mut got = vec![0; len];
    (&*conn).read_exact(&mut got).unwrap();
    let changed = (0..len).find(|&i| got[i] != byte(i));
    assert_eq!(changed, None, "the first stream byte that changed");
}

/// A window's worth of the sequence (one stream chunk), each byte a run of its own, arrives
/// while the application reads nothing: the server holds about the window, not a map entry
/// and an allocation per byte; then every byte reads back as sent.
#[test]
fn a_sequence_sent_a_byte_per_run_is_held_in_about_its_window() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let server = tcp_server(None);
    let stream = WINDOW as usize - header(Kind::Stream, 0).len();
    let mut sequence = header(Kind::Stream, stream).to_vec();
    sequence.extend((0..stream).map(byte));
    let records = runs_from_the_start(sequence.chunks(1));
    let (conn, _client, grown) = memory_for(&server, &records, WINDOW, |_| {});
    eprintln!("a byte per run: memory grew by {grown} bytes for a {WINDOW}-byte window");
    assert!(
        grown < 3 * WINDOW,
        "{grown} bytes held for a {WINDOW}-byte window"
    );
    read_stream(&conn, stream);
    // the raw client acknowledges no CLOSE: not waited for
    server.abort(0, "measured");
}

/// A window's worth of stream chunks of one byte each, in one run, split into the stream
/// while the application looks only for messages: the server holds about the window (the
/// run as it came), not an entry and an allocation per stream byte; then every byte reads
/// back as sent.
#[test]
fn a_stream_sent_a_byte_per_chunk_is_held_in_about_its_window() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let server = tcp_server(None);
    let mut sequence = Vec::new();
    let mut chunks = 0;
    while sequence.len() + header(Kind::Stream, 1).len() < WINDOW as usize {
        sequence.extend_from_slice(&header(Kind::Stream, 1));
        sequence.push(byte(chunks));
        chunks += 1;
    }
    let records = runs_from_the_start([&sequence[..]]);
    let look_for_messages = |c: &Connection| {
        let e = c.try_recv_message().unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock, "{e}");
    };
    let (conn, _client, grown) =
        memory_for(&server, &records, sequence.len() as u64, look_for_messages);
    eprintln!("a byte per chunk: memory grew by {grown} bytes for {chunks} stream bytes");
    assert!(
        grown < 2 * WINDOW,
        "{grown} bytes held for {chunks} stream bytes"
    );
    read_stream(&conn, chunks);
    server.abort(0, "measured");
}

/// Keyed hellos replayed (made here with the key, byte for byte what a recording holds: they
/// pass the handshake), each followed by a first frame announcing the largest length and
/// never completed: the server, waiting for the confirmation (a frame of no records), holds
/// next to nothing for them, as for silent strangers (docs/PROTOCOL.md §12.6).
#[test]
fn a_replayed_keyed_hello_announcing_a_large_first_frame_is_held_in_little_memory() {
    const REPLAYS: u64 = 32;
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let key = Key::from_bytes([9; 32]);
    let server = tcp_server(Some(key.clone()));
    let to = server.local_addrs()[0];
    let body = vec![0x33; MAX_FRAME - 1];
    let before = resident();
    let mut replays = Vec::new();
    for k in 0..REPLAYS {
        let id = 0x7e91_a700 + k;
        let (_, message) = ClientLinkHandshake::start(&key, id, 0);
        let mut s = say_hello_with(to, id, 0, Some(&message));
        // the premise: the replay passed the handshake
        assert_eq!(read_reply(&mut s).0.status, HelloStatus::Accepted);
        s.write_all(&(MAX_FRAME as u32).to_be_bytes()).unwrap();
        // a server that refused the frame has closed the connection
        let _ = s.write_all(&body);
        replays.push(s);
    }
    // the server's hello threads read what was sent
    std::thread::sleep(Duration::from_millis(500));
    let grown = resident().saturating_sub(before);
    eprintln!("{REPLAYS} replays: memory grew by {grown} bytes");
    assert!(
        grown < REPLAYS << 16,
        "{REPLAYS} replays held {grown} bytes"
    );
}

/// A sender lets go of what the peer acknowledged after it sent a message of no bytes: its
/// memory stays near its buffers while 128 MiB more go out. Before, the empty message stayed
/// at the front of the send buffer (letting go of bytes stopped at a piece that gave up
/// none), and everything written after it was kept for the rest of the connection.
#[test]
fn a_sender_lets_go_of_what_was_acknowledged_after_an_empty_message() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let server = tcp_server(None);
    let client = Endpoint::bind(
        EndpointConfig::new(vec!["127.0.0.1:0".parse().unwrap()]).with_transport(Transport::Tcp),
    )
    .unwrap();
    let config = ConnectionConfig::default().with_accept_messages(true);
    let conn = client.connect(&server.local_addrs(), config).unwrap();
    let accepted = server.accept().unwrap();
    const MIB: usize = 1 << 20;
    let (warm_up, rest) = (16 * MIB, 128 * MIB);
    let reader = std::thread::spawn(move || {
        let empty = accepted.recv_message().unwrap();
        // read and checked a piece at a time: this process's memory is what is measured
        let (mut piece, mut at) = (vec![0; MIB], 0);
        loop {
            let n = (&accepted).read(&mut piece).unwrap();
            if n == 0 {
                break;
            }
            let changed = (0..n).find(|&i| piece[i] != byte(at + i));
            assert_eq!(changed, None, "the first byte that changed after {at}");
            at += n;
        }
        assert_eq!(at, warm_up + rest, "bytes read");
        (empty, accepted)
    });
    conn.send_message(&[]).unwrap();
    let data: Vec<u8> = (0..warm_up + rest).map(byte).collect();
    // the buffers reach their size first
    (&conn).write_all(&data[..warm_up]).unwrap();
    let before = resident();
    for piece in data[warm_up..].chunks(MIB) {
        (&conn).write_all(piece).unwrap();
    }
    conn.finish().unwrap();
    conn.wait_acknowledged(Some(Duration::from_secs(60)))
        .unwrap();
    let grown = resident().saturating_sub(before);
    let (empty, _accepted) = reader.join().unwrap();
    assert_eq!(
        empty,
        Some(Vec::new()),
        "the premise: an empty message arrived"
    );
    eprintln!("after an empty message, memory grew by {grown} bytes sending 128 MiB");
    assert!(
        grown < (rest / 4) as u64,
        "{grown} bytes kept after sending {rest} bytes"
    );
}

/// A sender of empty messages to a peer that reads none holds about its send buffer in
/// memory, not its send buffer's worth of 5-byte chunk headers: each message was two pieces
/// (its header, its bytes), each an allocation and a queue entry, counted as 5 bytes, and
/// the 8 MiB default held some 1.7 million of them.
#[test]
fn a_sender_of_empty_messages_holds_about_its_send_buffer() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let server = tcp_server(None);
    let client = Endpoint::bind(
        EndpointConfig::new(vec!["127.0.0.1:0".parse().unwrap()]).with_transport(Transport::Tcp),
    )
    .unwrap();
    const SEND_BUFFER: u64 = 4 << 20;
    let config = ConnectionConfig::default()
        .with_accept_messages(true)
        .with_send_buffer(SEND_BUFFER);
    let conn = client.connect(&server.local_addrs(), config).unwrap();
    let _accepted = server.accept().unwrap();
    let before = resident();
    // until the peer's window and this send buffer are full: nothing taken for a while
    let (mut sent, mut refused_since) = (0u64, None::<Instant>);
    let deadline = Instant::now() + Duration::from_secs(30);
    while refused_since.is_none_or(|t| t.elapsed() < Duration::from_millis(300)) {
        assert!(Instant::now() < deadline, "the send buffer never filled");
        match conn.try_send_message(&[]) {
            Ok(()) => {
                sent += 1;
                refused_since = None;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                refused_since.get_or_insert_with(Instant::now);
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(e) => panic!("{e}"),
        }
    }
    let grown = resident().saturating_sub(before);
    let held = conn.stats().send_buffered;
    eprintln!(
        "{sent} empty messages sent, {held} bytes of them held; memory grew by {grown} bytes"
    );
    // the premise: the send buffer holds messages the peer did not take
    assert!(held > 0, "nothing held");
    assert!(
        grown < 4 * SEND_BUFFER,
        "{grown} bytes for a send buffer of {SEND_BUFFER}"
    );
}
