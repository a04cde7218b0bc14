//! What a server's application is told of its connection's links, whichever of the client's
//! first packets reaches the server first (a driver receiving each link on a thread of its
//! own hands them over in any order).

use std::net::SocketAddr;
use std::time::Instant;

use ri2n_proto::wire::packet_type;
use ri2n_proto::{ConnectionConfig, Endpoint, EndpointConfig, Event, LinkId, Transmit};
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
