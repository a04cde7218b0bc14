//! Opening received packets outside the engine: a driver that keeps the engine behind a lock
//! opens what it received before it takes the lock, so that with a key its largest cost per
//! packet runs in parallel with what other threads do under the lock.
//!
//! The engine hands out an [`Opener`] per connection ([`Endpoint::opener`]); [`Openers`]
//! keeps them by connection ID, opens each datagram whose ID it knows, and the driver hands
//! the engine the proof with the datagram ([`Endpoint::handle_opened_datagram`]). Whatever it
//! did not open goes the engine's own way, and then the engine is asked again
//! ([`Openers::learn`]): that is how a key update of the peer's, a new connection or a
//! connection's end reaches the cache.

use std::collections::HashMap;

use crate::crypto::{Opened, Opener};
use crate::wire::{self, Steering};
use crate::Endpoint;

/// Most openers kept: beyond, the cache starts over (the connections still sending are
/// learned again from their next packet).
const MAX_OPENERS: usize = 16 * 1024;

/// The openers of the connections a receiving thread has heard from, by connection ID.
#[derive(Debug, Default)]
pub struct Openers {
    by_cid: HashMap<u64, Opener>,
}

impl Openers {
    /// Opens `datagram` in place if it is a short packet of a connection whose opener is
    /// known (see [`Opener::open`]).
    pub fn open(&self, datagram: &mut [u8]) -> Option<Opened> {
        match wire::steering(datagram) {
            Some(Steering::Shard(cid)) => self.by_cid.get(&cid)?.open(datagram),
            _ => None,
        }
    }

    /// After `engine` handled `datagram` itself (it was not opened here): learns how the
    /// packets of its connection open now. A connection without a key is remembered as such,
    /// so its datagrams cost the engine no question.
    pub fn learn(&mut self, engine: &Endpoint, datagram: &[u8]) {
        let Some(Steering::Shard(cid)) = wire::steering(datagram) else {
            return;
        };
        if self.by_cid.get(&cid).is_some_and(|o| !o.is_keyed()) {
            return;
        }
        match engine.opener(cid) {
            Some(opener) => {
                if self.by_cid.len() >= MAX_OPENERS {
                    self.by_cid.clear();
                }
                self.by_cid.insert(cid, opener);
            }
            None => {
                self.by_cid.remove(&cid);
            }
        }
    }
}
