//! The `--metrics` endpoint: answers an HTTP `GET` of any path with the latest status in the
//! OpenMetrics text format ([`status::prometheus`](crate::status::prometheus)).
//!
//! A scrape is one request on one connection, so this is the small part of HTTP/1.1 it needs,
//! on std's sockets, with `httparse` reading the request head. Each client gets a thread of
//! its own (at most [`MAX_CLIENTS`] at once; the next wait their turn in the listener's
//! queue), a deadline for its request, one for the whole exchange and a short one to close
//! after the answer, so no client can hold a place for longer ([`crate::clients`]).
//! tiny_http, used before, set no timeouts (a client that stopped reading held every later
//! scrape for ever), ended its accept loop for good at the first failed accept, and read the
//! body a dropped request announced into an allocation of the announced size (a large
//! `Content-Length` aborted the daemon).

use std::io::{self, Read};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use crate::clients::{left, write_by, Places};
use crate::status::{prometheus, Status, FAILED_ACCEPT_PAUSE};

/// How long a client may take for the whole exchange: its request and our answer.
const CLIENT_DEADLINE: Duration = Duration::from_secs(10);
/// How long a client may take to send its request (a scraper sends it at once): clients
/// that say nothing hold the places for no longer.
const HEAD_DEADLINE: Duration = Duration::from_secs(2);
/// How long a client has, once the whole answer is sent, to close the connection.
const LINGER: Duration = Duration::from_secs(1);
/// Clients served at once (the next wait their turn).
const MAX_CLIENTS: usize = 16;
/// The longest request head taken (a scrape's is a few hundred bytes).
const MAX_HEAD: usize = 8 << 10;
/// The exposition's media type.
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Serves the latest snapshot as metrics over HTTP on `addr`, from threads of its own.
pub fn serve(addr: SocketAddr, latest: Arc<Mutex<Status>>) -> io::Result<()> {
    serve_on(TcpListener::bind(addr)?, latest, CLIENT_DEADLINE)
}

/// [`serve`] on `listener`, each client given `deadline` for its exchange.
fn serve_on(
    listener: TcpListener,
    latest: Arc<Mutex<Status>>,
    deadline: Duration,
) -> io::Result<()> {
    thread::Builder::new()
        .name("ri2n-metrics".into())
        .spawn(move || accept_loop(&listener, &latest, deadline))?;
    Ok(())
}

fn accept_loop(listener: &TcpListener, latest: &Arc<Mutex<Status>>, deadline: Duration) {
    let places = Places::new(MAX_CLIENTS);
    loop {
        let stream = match listener.accept() {
            Ok((stream, _)) => stream,
            Err(_) => {
                thread::sleep(FAILED_ACCEPT_PAUSE);
                continue;
            }
        };
        let latest = latest.clone();
        // with every place taken it waits its turn: clients that hold the places (saying
        // nothing, or not closing after the answer) delay a scrape by their deadlines at
        // most, where closing it at once would let them keep every scrape out
        places.serve_in_turn("ri2n-metrics-client", move || {
            let now = Instant::now();
            let head_deadline = now + deadline.min(HEAD_DEADLINE);
            let _ = answer(stream, &latest, head_deadline, now + deadline);
        });
    }
}

/// What a request asked for.
enum Asked {
    /// The metrics (`GET`), or only their head (`HEAD`).
    Metrics { body: bool },
    /// Something this server does not do, and the answer's status and text.
    Refused(&'static str, &'static [u8]),
}

/// Reads one request (its head by `head_deadline`) and answers it by `deadline`: the metrics
/// to a `GET` (their head to a `HEAD`), 405 to another method, 400 to what is no HTTP
/// request, 431 to a head longer than [`MAX_HEAD`]. Then closes the connection.
fn answer(
    mut stream: TcpStream,
    latest: &Mutex<Status>,
    head_deadline: Instant,
    deadline: Instant,
) -> io::Result<()> {
    // the head goes out in one write, and a small answer with it: no wait for an ACK
    stream.set_nodelay(true)?;
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    let asked = loop {
        stream.set_read_timeout(Some(left(head_deadline)?))?;
        // never more than MAX_HEAD bytes: a head that long and unfinished is refused
        let room = buf.len().min(MAX_HEAD - head.len());
        let n = match stream.read(&mut buf[..room]) {
            Ok(0) => return Ok(()), // gone before it asked
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        head.extend_from_slice(&buf[..n]);
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut request = httparse::Request::new(&mut headers);
        let too_long = Asked::Refused(
            "431 Request Header Fields Too Large",
            b"request head too long\n",
        );
        match request.parse(&head) {
            // a body the request may announce is never read: a scrape has none
            Ok(httparse::Status::Complete(_)) => {
                break match request.method {
                    Some("GET") => Asked::Metrics { body: true },
                    Some("HEAD") => Asked::Metrics { body: false },
                    _ => {
                        Asked::Refused("405 Method Not Allowed", b"only GET and HEAD are served\n")
                    }
                };
            }
            Ok(httparse::Status::Partial) if head.len() < MAX_HEAD => {}
            Ok(httparse::Status::Partial) | Err(httparse::Error::TooManyHeaders) => break too_long,
            Err(_) => break Asked::Refused("400 Bad Request", b"not an HTTP request\n"),
        }
    };
    let mut answer = Vec::new();
    match asked {
        Asked::Metrics { body } => {
            // formatted outside the lock, which the sampler takes every second
            let mut status = latest.lock().unwrap_or_else(|e| e.into_inner()).clone();
            status.stamp_age();
            let metrics = prometheus(&status);
            answer_head(&mut answer, "200 OK", OPENMETRICS, metrics.len());
            if body {
                answer.extend_from_slice(metrics.as_bytes());
            }
        }
        Asked::Refused(status, text) => {
            answer_head(&mut answer, status, "text/plain; charset=utf-8", text.len());
            answer.extend_from_slice(text);
        }
    }
    write_by(&mut stream, deadline, &answer)?;
    stream.shutdown(Shutdown::Write)?;
    // Read until the client closes (or for LINGER): closing with bytes of its unread would
    // reset the connection, and the client could lose the end of the answer. Not the whole
    // deadline: a client that keeps the connection open after the answer holds its place
    let deadline = deadline.min(Instant::now() + LINGER);
    let mut rest = [0u8; 1024];
    loop {
        stream.set_read_timeout(Some(left(deadline)?))?;
        match stream.read(&mut rest) {
            Ok(0) => return Ok(()),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// Appends the head of an answer with `status`, a body of `kind` and `len` bytes.
fn answer_head(out: &mut Vec<u8>, status: &str, kind: &str, len: usize) {
    // what a 405 must name (RFC 9110, 15.5.6), said on every answer
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {len}\r\n\
         Allow: GET, HEAD\r\nConnection: close\r\n\r\n"
    );
    out.extend_from_slice(head.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::tests::snapshot;
    use crate::status::PeerStatus;
    use std::io::Write;

    /// A server of `status` on a free loopback port, each client given `deadline`.
    fn server(status: Status, deadline: Duration) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        serve_on(listener, Arc::new(Mutex::new(status)), deadline).unwrap();
        addr
    }

    /// Sends `request` and reads the answer to its end, within 30 s.
    fn ask(addr: SocketAddr, request: &[u8]) -> io::Result<String> {
        let mut stream = TcpStream::connect(addr)?;
        stream.set_read_timeout(Some(Duration::from_secs(30)))?;
        stream.write_all(request)?;
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer)?;
        Ok(String::from_utf8_lossy(&answer).into_owned())
    }

    const SCRAPE: &[u8] = b"GET /metrics HTTP/1.1\r\nHost: a\r\nAccept: */*\r\n\r\n";

    /// A scrape of `addr`, answered with the metrics: how long it took.
    fn timed_scrape(addr: SocketAddr) -> Duration {
        let start = Instant::now();
        let answer = ask(addr, SCRAPE).unwrap();
        let took = start.elapsed();
        assert!(
            answer.starts_with("HTTP/1.1 200 OK"),
            "{answer:?} after {took:?}"
        );
        took
    }

    /// The status and body of an answer, its `Content-Length` checked.
    fn parts(answer: &str) -> (&str, &str) {
        let (head, body) = answer.split_once("\r\n\r\n").expect("a head and a body");
        let length = (head.lines())
            .find_map(|l| l.strip_prefix("Content-Length: "))
            .expect("a length");
        let length: usize = length.parse().unwrap();
        assert_eq!(length, body.len(), "{head}");
        (head.lines().next().unwrap(), body)
    }

    /// A scrape tells how old the sample it serves is, counted at the scrape: a sampler that
    /// stopped shows as an age that keeps growing, not as values that merely stay.
    #[test]
    fn a_scrape_says_how_old_its_sample_is() {
        let mut status = snapshot();
        status.sampled_at = Instant::now().checked_sub(Duration::from_secs(3));
        let addr = server(status, Duration::from_secs(10));
        let answer = ask(addr, SCRAPE).unwrap();
        let age: f64 = (parts(&answer).1.lines())
            .find_map(|l| l.strip_prefix(r#"ri2n_tunnel_sample_age_seconds{host="a"} "#))
            .unwrap_or_else(|| panic!("no sample age in {answer}"))
            .parse()
            .unwrap();
        assert!((3.0..30.0).contains(&age), "{age}");
    }

    #[test]
    fn a_get_is_answered_with_the_metrics_and_anything_else_is_refused() {
        let addr = server(snapshot(), Duration::from_secs(10));
        let answer = ask(addr, SCRAPE).unwrap();
        let (status, body) = parts(&answer);
        assert_eq!(status, "HTTP/1.1 200 OK");
        assert!(answer.contains(&format!("Content-Type: {OPENMETRICS}")));
        // the same lines (the exposition's families come in no set order)
        let lines = |text: &str| {
            let mut l: Vec<String> = text.lines().map(str::to_owned).collect();
            l.sort();
            l
        };
        assert_eq!(lines(body), lines(&prometheus(&snapshot())));
        // an HTTP/1.0 client and one that sends its request in pieces
        let mut slow = TcpStream::connect(addr).unwrap();
        slow.set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        slow.write_all(b"GET / HTTP/1.0\r\n").unwrap();
        thread::sleep(Duration::from_millis(50));
        slow.write_all(b"\r\n").unwrap();
        let mut answer = String::new();
        slow.read_to_string(&mut answer).unwrap();
        assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
        // HEAD: the head alone, saying how long the metrics are
        let answer = ask(addr, b"HEAD / HTTP/1.1\r\n\r\n").unwrap();
        let (head, body) = answer.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
        let metrics_len = prometheus(&snapshot()).len();
        assert!(
            head.contains(&format!("Content-Length: {metrics_len}\r\n")),
            "{head}"
        );
        assert_eq!(body, "");
        let many_headers = format!("GET / HTTP/1.1\r\n{}\r\n", "X: y\r\n".repeat(70));
        for (request, status) in [
            (&b"POST / HTTP/1.1\r\nContent-Length: 0\r\n\r\n"[..], "405"),
            (many_headers.as_bytes(), "431"),
            (&b"\x16\x03\x01 a TLS hello\r\n\r\n"[..], "400"),
            // no end of the head in sight
            (&[b'a'; MAX_HEAD + 100][..], "431"),
        ] {
            let answer = ask(addr, request).unwrap();
            assert!(
                parts(&answer).0.starts_with(&format!("HTTP/1.1 {status} ")),
                "{answer}"
            );
        }
        // a head of MAX_HEAD bytes is served, one byte more is refused
        let with_x = |len: usize| {
            let x = "b".repeat(len - "GET / HTTP/1.1\r\nX: \r\n\r\n".len());
            format!("GET / HTTP/1.1\r\nX: {x}\r\n\r\n")
        };
        let answer = ask(addr, with_x(MAX_HEAD).as_bytes()).unwrap();
        assert!(parts(&answer).0.starts_with("HTTP/1.1 200 "), "{answer}");
        let answer = ask(addr, with_x(MAX_HEAD + 1).as_bytes()).unwrap();
        assert!(parts(&answer).0.starts_with("HTTP/1.1 431 "), "{answer}");
    }

    /// A TCP connection to `addr` whose receive buffer is as small as the kernel allows: what
    /// a server writes to it fills the server's buffers after a few kilobytes.
    fn narrow_client(addr: SocketAddr) -> TcpStream {
        use socket2::{Domain, Socket, Type};
        let socket = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
        socket.set_recv_buffer_size(1).unwrap();
        socket.connect(&addr.into()).unwrap();
        socket.into()
    }

    /// Clients that stall the server in every way a client can: one that asks and then reads
    /// nothing of a large answer, one that sends half a request, one that says nothing, and
    /// one that announces a body of a terabyte and sends none. Each is let go by its
    /// deadline, and a scrape among them is answered at once. With tiny_http the first held
    /// every later scrape for ever, and the last made it allocate a terabyte.
    #[test]
    fn clients_that_stall_are_let_go_and_hold_up_no_one() {
        // metrics far larger than the sockets' buffers take while nobody reads
        let mut many = snapshot();
        let peer = many.peers[0].clone();
        many.peers = (0..5000)
            .map(|i| PeerStatus {
                name: format!("peer{i}"),
                ..peer.clone()
            })
            .collect();
        let size = prometheus(&many).len();
        assert!(size > 5 << 20, "{size} bytes");
        // longer than the request's deadline: the stalled answer is let go after the others
        let deadline = Duration::from_secs(5);
        let addr = server(many, deadline);
        let start = Instant::now();
        let mut stalled = narrow_client(addr);
        stalled.write_all(SCRAPE).unwrap();
        let mut half = TcpStream::connect(addr).unwrap();
        half.write_all(b"GET / HTTP/1.1\r\nHost:").unwrap();
        let mut silent = TcpStream::connect(addr).unwrap();
        // the terabyte's announcer gets its answer without its body ever being read
        let huge = thread::spawn(move || {
            let huge = b"GET / HTTP/1.1\r\nContent-Length: 1000000000000\r\n\r\n";
            ask(addr, huge)
        });
        let answer = ask(addr, SCRAPE).unwrap();
        let scraped = start.elapsed();
        assert_eq!(parts(&answer).1.len(), size, "the whole answer");
        assert!(scraped < deadline, "answered after {scraped:?}");
        // each client that does not finish its request is closed by the request's deadline
        for (what, client) in [("half", &mut half), ("silent", &mut silent)] {
            client.set_read_timeout(Some(deadline * 5)).unwrap();
            let mut buf = [0u8; 64];
            assert!(
                matches!(client.read(&mut buf), Ok(0) | Err(_)),
                "{what}: still open"
            );
            let at = start.elapsed();
            assert!(
                at >= HEAD_DEADLINE / 2 && at < deadline,
                "{what}: let go after {at:?}"
            );
        }
        assert_eq!(parts(&huge.join().unwrap().unwrap()).1.len(), size);
        drop(stalled);
        // and the server still serves
        assert!(ask(addr, SCRAPE).unwrap().starts_with("HTTP/1.1 200 OK"));
    }

    /// The server serves on after a quiet spell longer than a client's deadline (no timeout
    /// applies to the wait for the next client); and a scrape that comes while a crowd of
    /// clients that say nothing holds every place, more of them waiting, is answered in its
    /// turn, once those before it reached their deadlines. Before, those beyond the places
    /// were closed at once: a crowd renewed within its deadlines kept every scrape out.
    #[test]
    fn the_server_serves_on_after_quiet_and_in_turn_behind_a_crowd() {
        let deadline = Duration::from_millis(300);
        let addr = server(snapshot(), deadline);
        thread::sleep(deadline * 3);
        assert!(ask(addr, SCRAPE).unwrap().starts_with("HTTP/1.1 200 OK"));
        let deadline = Duration::from_secs(1);
        let addr = server(snapshot(), deadline);
        let crowd: Vec<TcpStream> = (0..MAX_CLIENTS * 2)
            .map(|_| TcpStream::connect(addr).unwrap())
            .collect();
        let took = timed_scrape(addr);
        // the premise: it waited for the crowd before it
        assert!(took >= deadline, "answered after {took:?}");
        drop(crowd);
    }

    /// Clients that keep the connection open once answered hold their places for a moment
    /// (LINGER), not for their whole deadline: with every place so held, the next scrape is
    /// answered within half that deadline. Before, it waited the deadline out.
    #[test]
    fn clients_that_stay_after_the_answer_hold_a_scrape_up_for_a_moment() {
        let deadline = Duration::from_secs(10);
        let addr = server(snapshot(), deadline);
        let stayed: Vec<TcpStream> = (0..MAX_CLIENTS)
            .map(|_| {
                let mut c = TcpStream::connect(addr).unwrap();
                c.write_all(SCRAPE).unwrap();
                c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                // the premise: answered, and the connection kept
                let mut head = [0u8; 15];
                c.read_exact(&mut head).unwrap();
                assert_eq!(&head, b"HTTP/1.1 200 OK");
                c
            })
            .collect();
        let took = timed_scrape(addr);
        assert!(took < deadline / 2, "answered after {took:?}");
        drop(stayed);
    }
}
