//! Request-response exchanges of large messages over two capped links whose queues are deep,
//! as behind a token-bucket shaper: a link's window then grows far beyond what one message
//! puts in flight, and only a measured delivery rate tells the scheduler how to split each
//! message so that both links finish it together.

use std::time::Duration;

use ri2n_proto::LinkState;
use ri2n_sim::testbed::{Testbed, TestbedConfig};
use ri2n_sim::{DirectionConfig, LinkConfig, HEADER_BYTES, MAX_DATAGRAM};

const GBIT: u64 = 1_000_000_000;
const MESSAGE: usize = 2 << 20;
const PIECE: usize = 64 << 10;

/// The links' one-way delays.
const DELAYS: [Duration; 2] = [Duration::from_micros(30), Duration::from_micros(300)];

/// The client writes `count` messages of `MESSAGE` bytes, each in pieces of `PIECE` a little
/// apart (as an application's writes are, each sent before the next is made); the server reads
/// all of a message and answers one byte before the next. Returns each exchange's simulated
/// time and the stream bytes each of the client's links carried.
fn exchanges(count: usize) -> (Vec<Duration>, Vec<u64>) {
    // 1 Gbit/s with a 10 ms queue
    let dir = |delay| {
        DirectionConfig::default()
            .with_rate(GBIT)
            .with_delay(delay)
            .with_queue_limit(1_250_000)
    };
    let mut cfg = TestbedConfig::new(2);
    cfg.links = DELAYS.map(|d| LinkConfig::symmetric(dir(d))).to_vec();
    let mut tb = Testbed::new(cfg);
    tb.establish();
    let limit = tb.now() + Duration::from_secs(5);
    tb.run_until(limit, |tb| {
        let links = tb.client_conn().stats().links;
        links.len() == 2 && links.iter().all(|l| l.state == LinkState::Up)
    });
    let (ch, sh) = (tb.ch, tb.sh.expect("accepted"));
    let piece = vec![0x5a; PIECE];
    let mut buf = vec![0; 256 << 10];
    let mut times = Vec::new();
    for _ in 0..count {
        let start = tb.now();
        for _ in 0..MESSAGE / PIECE {
            let conn = tb.client.connection_mut(ch).unwrap();
            assert_eq!(
                conn.write(&piece),
                Ok(PIECE),
                "the send buffer takes it all"
            );
            tb.advance(Duration::from_micros(20), |_| {});
        }
        let (mut got, mut answered) = (0, false);
        let limit = tb.now() + Duration::from_secs(5);
        tb.run_until(limit, |tb| {
            let server = tb.server.connection_mut(sh).unwrap();
            while got < MESSAGE {
                match server.read(&mut buf[..(MESSAGE - got).min(256 << 10)]) {
                    Ok(n) => got += n,
                    Err(_) => break,
                }
            }
            if got == MESSAGE && !answered {
                answered = server.write(b"k") == Ok(1);
            }
            let mut ack = [0u8; 1];
            answered && tb.client.connection_mut(ch).unwrap().read(&mut ack) == Ok(1)
        });
        times.push(tb.now() - start);
    }
    let carried = (tb.client_conn().stats().links.iter())
        .map(|l| l.stream_bytes_sent)
        .collect();
    (times, carried)
}

/// Judging a link busy only when it used half its window, the scheduler took the window's
/// rate (a multiple of the real one, the window having grown into the queue) for each link,
/// and split the messages so unevenly that some exchanges took three times as long.
#[test]
fn large_messages_written_in_pieces_take_both_links_at_their_rate() {
    let (times, carried) = exchanges(24);
    let total = 24 * MESSAGE as u64;
    for c in &carried {
        assert!(*c > total / 4, "each link carries its part: {carried:?}");
    }
    // the first exchanges grow the windows
    let steady = &times[4..];
    let mean = steady.iter().sum::<Duration>() / steady.len() as u32;
    let capacity = 2.0 * GBIT as f64 * MAX_DATAGRAM as f64 / (MAX_DATAGRAM + HEADER_BYTES) as f64;
    let ideal = Duration::from_secs_f64(MESSAGE as f64 * 8.0 / capacity);
    println!("exchanges {times:?}: {mean:?} in steady state (the rate alone: {ideal:?})");
    assert!(mean < ideal * 11 / 10, "{mean:?} per exchange");
}
