//! The buffer both event loops hand `Endpoint::poll_transmit_into`: it takes bursts, as the
//! driver's batches do, so the engine builds datagrams here the way it builds them for sockets.

use std::net::SocketAddr;

use ri2n_proto::{Seal, Transmit, TransmitBuffer};

/// What one `poll_transmit_into` call built.
#[derive(Debug)]
pub(crate) struct Outgoing {
    room: Vec<u8>,
    /// Each datagram built, with its addresses.
    pub(crate) built: Vec<(Transmit, Vec<u8>)>,
    /// The engine hands out the sealing of each datagram, applied once it is built.
    seals_later: bool,
    pending_seal: Option<Seal>,
}

impl Default for Outgoing {
    fn default() -> Self {
        Self::new(false)
    }
}

impl Outgoing {
    pub(crate) fn new(seals_later: bool) -> Self {
        Self {
            room: vec![0; ri2n_proto::wire::MAX_DATAGRAM_SIZE],
            built: Vec::new(),
            seals_later,
            pending_seal: None,
        }
    }
}

impl TransmitBuffer for Outgoing {
    fn buffer(&mut self, _: SocketAddr, _: SocketAddr) -> &mut [u8] {
        &mut self.room
    }

    fn commit(&mut self, t: &Transmit) {
        let mut datagram = self.room[..t.len].to_vec();
        if let Some(seal) = self.pending_seal.take() {
            seal.apply(&mut datagram);
        }
        self.built.push((*t, datagram));
    }

    fn wants_more(&self) -> bool {
        true
    }

    fn seals_later(&self) -> bool {
        self.seals_later
    }

    fn defer_seal(&mut self, seal: Seal) {
        self.pending_seal = Some(seal);
    }
}
