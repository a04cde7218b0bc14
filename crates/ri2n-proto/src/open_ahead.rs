//! Opening received packets outside the engine: a driver that keeps the engine behind a lock
//! opens what it received before it takes the lock, so that with a key its largest cost per
//! packet runs in parallel with what other threads do under the lock.
//!
//! The engine hands out an [`Opener`] per connection ([`Endpoint::opener`]); [`Openers`]
//! keeps them by connection ID, opens each datagram whose ID it knows, and the driver hands
//! the engine the proof with the datagram ([`Endpoint::handle_opened_datagram`]). Whatever it
//! did not open goes the engine's own way, and then the engine is asked again
//! ([`Openers::learn`]): that is how a key update of the peer's, a new connection or a
//! connection's end reaches the cache. A key the receiving side has moved past opens nothing
//! here (it is kept only for the engine's late packets): a packet of the next key of its
//! phase would fail under it and be left damaged.
//!
//! An opener does not keep its key alive, so it must take hold of it to open a packet. Taking
//! hold changes a count that every receiving thread shares; [`Openers::hold`] takes hold once
//! per connection for a whole received batch instead of once per packet.

use std::collections::HashMap;
use std::sync::Arc;

use smallvec::SmallVec;

use crate::crypto::{Opened, Opener, PacketKey};
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
    /// known (see [`Opener::open`]). For a batch of datagrams, [`Self::hold`] costs less.
    pub fn open(&self, datagram: &mut [u8]) -> Option<Opened> {
        self.hold().open(datagram)
    }

    /// Opens datagrams as [`Self::open`] does, each connection's key held from its first
    /// datagram until the [`HeldKeys`] is dropped: use one for a received batch.
    pub fn hold(&self) -> HeldKeys<'_> {
        HeldKeys {
            openers: self,
            held: SmallVec::new(),
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

/// [`Openers`] with the keys of the connections seen so far held (see [`Openers::hold`]).
pub struct HeldKeys<'a> {
    openers: &'a Openers,
    /// Per connection seen: a batch holds a few connections' packets, most often one's.
    held: SmallVec<[Held<'a>; 2]>,
}

/// A connection's opener, and its key if the engine still kept it when first asked.
struct Held<'a> {
    cid: u64,
    opener: &'a Opener,
    key: Option<Arc<PacketKey>>,
}

impl HeldKeys<'_> {
    /// Opens `datagram` in place if it is a short packet of a connection whose opener is
    /// known (see [`Opener::open`]).
    pub fn open(&mut self, datagram: &mut [u8]) -> Option<Opened> {
        let Some(Steering::Shard(cid)) = wire::steering(datagram) else {
            return None;
        };
        let at = match self.held.iter().position(|h| h.cid == cid) {
            Some(at) => at,
            None => {
                let opener = self.openers.by_cid.get(&cid)?;
                let key = opener.key_now();
                self.held.push(Held { cid, opener, key });
                self.held.len() - 1
            }
        };
        let h = &self.held[at];
        h.opener.open_with(h.key.as_deref()?, datagram)
    }
}

impl std::fmt::Debug for HeldKeys<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeldKeys")
            .field("connections", &self.held.len())
            .finish_non_exhaustive()
    }
}
