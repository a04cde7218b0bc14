//! Opening a received batch before the engine's lock is taken (see
//! [`ri2n_proto::Openers`]): with a key, the receiving thread's largest cost then runs in
//! parallel with whatever other threads do under the lock (the application reading and
//! writing, the sending thread building packets).

use ri2n_proto::{Endpoint as ProtoEndpoint, Opened, Openers};

use crate::socket::RecvBatch;

/// A shard's openers, and what they opened of the batch received last.
#[derive(Debug, Default)]
pub(crate) struct OpenAhead {
    openers: Openers,
    /// By position in the batch ([`RecvBatch::for_each_datagram`]).
    opened: Vec<Option<Opened>>,
}

impl OpenAhead {
    /// Opens what it can of the batch just received.
    pub fn open(&mut self, batch: &mut RecvBatch) {
        let Self { openers, opened } = self;
        opened.clear();
        let mut keys = openers.hold();
        batch.for_each_datagram(&mut |_, _, d| opened.push(keys.open(d)));
    }

    /// The proof that datagram `n` of the batch was opened, if it was.
    pub fn take(&mut self, n: usize) -> Option<Opened> {
        self.opened.get_mut(n)?.take()
    }

    /// After the engine handled datagram `d` that was not opened here (see
    /// [`Openers::learn`]).
    pub fn learn(&mut self, engine: &ProtoEndpoint, d: &[u8]) {
        self.openers.learn(engine, d);
    }
}
