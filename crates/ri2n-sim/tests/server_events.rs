//! What a server's application is told of its connection's links, whichever of the client's
//! first packets reaches the server first (a driver receiving each link on a thread of its
//! own hands them over in any order).

use std::net::SocketAddr;
use std::time::Instant;

use std::time::Duration;

use ri2n_proto::wire::{self, frame_type, packet_type, Header, Writer};
use ri2n_proto::{
    ConnectionConfig, ConnectionHandle, ConnectionState, DropReason, Endpoint, EndpointConfig,
    Event, LinkId, Transmit, WriteError,
};
use ri2n_sim::testbed::drain;

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

/// The client's packets on its second link reach the server before any on the first, so
/// the one that confirms the connection came on a link the server added while it kept no
/// events: the application is still told that link was added, before it hears of it again.
#[test]
fn a_link_opened_before_the_connection_was_confirmed_is_announced() {
    let client_addrs = [addr("10.0.0.1:7000"), addr("10.0.1.1:7000")];
    let server_addrs = [addr("10.0.0.2:7400"), addr("10.0.1.2:7400")];
    let now = Instant::now();
    let mut client = Endpoint::new(EndpointConfig::new(client_addrs.to_vec()), 1, now);
    let mut server = Endpoint::new(EndpointConfig::new(server_addrs.to_vec()).server(), 2, now);
    client
        .connect(now, &server_addrs, ConnectionConfig::default())
        .unwrap();
    // the handshake, without the client's short packets: the server stays unconfirmed
    let mut held = Vec::new();
    for _ in 0..4 {
        for (t, d) in drain(&mut client, now) {
            if d[1] == packet_type::SHORT {
                held.push((t, d));
            } else {
                server.handle_datagram(now, t.remote, t.local, &mut d.clone());
            }
        }
        for (t, mut d) in drain(&mut server, now) {
            client.handle_datagram(now, t.remote, t.local, &mut d);
        }
    }
    held.extend(drain(&mut client, now));
    let second = |t: &Transmit| t.local == client_addrs[1];
    assert!(
        held.iter().any(|(t, _)| second(t)) && held.iter().any(|(t, _)| !second(t)),
        "the client sent short packets on both links: {:?}",
        held.iter().map(|(t, _)| t.local).collect::<Vec<_>>()
    );
    // the second link's first
    held.sort_by_key(|(t, _)| !second(t));
    for (t, mut d) in held {
        server.handle_datagram(now, t.remote, t.local, &mut d);
    }
    let h = server.accept().expect("the connection was confirmed");
    let events: Vec<Event> = std::iter::from_fn(|| server.poll_event())
        .filter(|&(c, _)| c == h)
        .map(|(_, e)| e)
        .collect();
    let added = events
        .iter()
        .position(|e| matches!(e, Event::LinkAdded { link } if *link != LinkId(0)));
    let added = added.unwrap_or_else(|| panic!("no second link added: {events:?}"));
    let Event::LinkAdded { link } = events[added] else {
        unreachable!()
    };
    let first_news_of_it = events.iter().position(|e| match e {
        Event::LinkAdded { link: l } | Event::LinkStateChanged { link: l, .. } => *l == link,
        _ => false,
    });
    assert_eq!(
        first_news_of_it,
        Some(added),
        "the link was named before it was added: {events:?}"
    );
    assert!(
        matches!(events.first(), Some(Event::Connected)),
        "{events:?}"
    );
}

/// The client and server addresses of [`connecting_to_a_server_that_takes_no_datagrams`].
const CLIENT: &str = "10.0.0.1:7000";
const SERVER: &str = "10.0.0.2:7400";

/// A client endpoint (on [`CLIENT`]) connecting, at `now`, to a server endpoint (on
/// [`SERVER`]) whose connections take no datagrams; nothing sent yet.
fn connecting_to_a_server_that_takes_no_datagrams(
    now: Instant,
) -> (Endpoint, Endpoint, ConnectionHandle) {
    let mut client = Endpoint::new(EndpointConfig::new(vec![addr(CLIENT)]), 1, now);
    let mut cfg = EndpointConfig::new(vec![addr(SERVER)]).server();
    cfg.server_connection = ConnectionConfig::default().with_accept_datagrams(false);
    let server = Endpoint::new(cfg, 2, now);
    let ch = client
        .connect(now, &[addr(SERVER)], ConnectionConfig::default())
        .unwrap();
    (client, server, ch)
}

/// A client whose first short packet carries a frame the server refuses (a datagram to a
/// server that takes none) ends its connection before confirming it. The server frees it at
/// once: nobody could accept or release it, and held it would count against the server's
/// limit for ever. The client's next packet is answered with a RESET, which ends its side.
#[test]
fn a_connection_ended_before_it_was_confirmed_is_freed() {
    let now = Instant::now();
    let (mut client, mut server, ch) = connecting_to_a_server_that_takes_no_datagrams(now);
    // the handshake, without the client's short packets: the server stays unconfirmed
    let mut held = Vec::new();
    for _ in 0..4 {
        for (t, mut d) in drain(&mut client, now) {
            if d[1] == packet_type::SHORT {
                held.push((t, d));
            } else {
                server.handle_datagram(now, t.remote, t.local, &mut d);
            }
        }
        for (t, mut d) in drain(&mut server, now) {
            client.handle_datagram(now, t.remote, t.local, &mut d);
        }
    }
    assert_eq!(
        server.connection_count(),
        1,
        "the unconfirmed connection is held"
    );
    let Ok((Header::Short { dcid, .. }, _)) = wire::decode_packet(&held[0].1) else {
        panic!("a short packet of the client");
    };
    // a DATAGRAM frame (sequence 0, one byte) as the client's first short packet
    let mut d = vec![0u8; 1472];
    let mut w = Writer::new(&mut d);
    wire::write_short_header(&mut w, dcid, LinkId(0), 1000, 0);
    w.u8(frame_type::DATAGRAM);
    w.varint(0);
    w.varint(1);
    w.u8(7);
    let len = w.finish();
    d.truncate(len);
    server.handle_datagram(now, addr(SERVER), addr(CLIENT), &mut d);
    let dropped = |server: &Endpoint| {
        [DropReason::Undecodable, DropReason::UnknownConnection].map(|r| server.dropped().get(r))
    };
    assert_eq!(dropped(&server), [0, 0], "the premise: the frame was read");
    assert_eq!(server.connection_count(), 0, "the ended connection is held");
    server.handle_timeout(now + Duration::from_secs(3600));
    assert_eq!(server.connection_count(), 0);
    assert!(server.accept().is_none());
    // the client's packets now find nothing, and the RESET for one as large as a full
    // data packet ends its side
    drop(held);
    client
        .connection_mut(ch)
        .unwrap()
        .write(&[5; 1200])
        .unwrap();
    for (t, mut d) in drain(&mut client, now) {
        server.handle_datagram(now, t.remote, t.local, &mut d);
    }
    for (t, mut d) in drain(&mut server, now) {
        client.handle_datagram(now, t.remote, t.local, &mut d);
    }
    assert_eq!(
        client.connection(ch).unwrap().state(),
        ConnectionState::Closed
    );
}

/// A client may queue datagrams before the handshake tells it whether the server takes any.
/// A server that takes none ends a connection that sends it one, so the queued ones are
/// dropped (and counted) when the ACCEPT says so, and the connection goes on.
#[test]
fn datagrams_queued_during_the_handshake_to_a_server_that_takes_none_are_dropped() {
    let now = Instant::now();
    let (mut client, mut server, ch) = connecting_to_a_server_that_takes_no_datagrams(now);
    let conn = client.connection_mut(ch).unwrap();
    conn.send_datagram(now, b"early").unwrap();
    conn.send_datagram(now, b"early too").unwrap();
    let mut sh = None;
    for _ in 0..6 {
        for (t, mut d) in drain(&mut client, now) {
            server.handle_datagram(now, t.remote, t.local, &mut d);
        }
        sh = sh.or_else(|| server.accept());
        for (t, mut d) in drain(&mut server, now) {
            client.handle_datagram(now, t.remote, t.local, &mut d);
        }
    }
    let sh = sh.expect("the server accepted");
    let c = client.connection_mut(ch).unwrap();
    assert_eq!(c.state(), ConnectionState::Established);
    assert_eq!(c.stats().datagrams_send_dropped, 2);
    assert_eq!(c.stats().datagrams_sent, 0);
    assert!(matches!(
        c.send_datagram(now, b"late"),
        Err(WriteError::DatagramsRefused)
    ));
    let s = server.connection(sh).unwrap();
    assert_eq!(
        s.state(),
        ConnectionState::Established,
        "{:?}",
        s.close_reason()
    );
}
