//! The buffer both event loops hand `Endpoint::poll_transmit_into`: it takes bursts, as the
//! driver's batches do, so the engine builds datagrams here the way it builds them for sockets.

use std::net::SocketAddr;

use ri2n_proto::{Transmit, TransmitBuffer};

/// What one `poll_transmit_into` call built.
#[derive(Debug)]
pub(crate) struct Outgoing {
    room: Vec<u8>,
    /// Each datagram built, with its addresses.
    pub(crate) built: Vec<(Transmit, Vec<u8>)>,
}

impl Default for Outgoing {
    fn default() -> Self {
        Self {
            room: vec![0; ri2n_proto::wire::MAX_DATAGRAM_SIZE],
            built: Vec::new(),
        }
    }
}

impl TransmitBuffer for Outgoing {
    fn buffer(&mut self, _: SocketAddr, _: SocketAddr) -> &mut [u8] {
        &mut self.room
    }

    fn commit(&mut self, t: &Transmit) {
        self.built.push((*t, self.room[..t.len].to_vec()));
    }

    fn wants_more(&self) -> bool {
        true
    }
}
