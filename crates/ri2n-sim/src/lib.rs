//! A deterministic, seeded simulator of two hosts joined by K links, driving the sans-IO ri2n
//! engine ([`ri2n_proto`]) through whole transfers.
//!
//! Host A (the client, addresses [`host_addr`]`(A, i)`) connects to host B (the server,
//! [`host_addr`]`(B, i)`); link `i` carries exactly the datagrams between `A_i` and `B_i`, in
//! each direction through a transmitter with a drop-tail queue, a rate, a propagation delay and
//! random impairments (see [`DirectionConfig`]). A [`Scenario`] describes the links, timed
//! [`Action`]s (link down / up / blackhole, rate and loss changes, server restart), the
//! application workload and both engines' configuration; [`run`] plays it in simulated time and
//! returns a [`Report`], or a [`SimError`] that prints the seed and the whole scenario.
//!
//! All time is simulated: one base `Instant` is taken at the start and every instant handed to
//! the engine is that base plus simulated time, so a run depends only on its scenario.
//!
//! ```no_run
//! use std::time::Duration;
//! use ri2n_sim::{run, Action, Scenario};
//!
//! let scenario = Scenario::default()
//!     .with_seed(7)
//!     .at(Duration::from_millis(20), Action::down(1));
//! let report = run(&scenario).unwrap();
//! println!("done at {:?}", report.completed_at);
//! ```
//!
//! For tests that step the two engines by hand, [`testbed::Testbed`] joins a client and a
//! server `Endpoint` by the same network model: ideal links by default, changed with the same
//! [`Action`]s, with the client's datagrams captured and any datagram injectable.
//!
//! Modules: [`net`] (links and the network model), [`scenario`] (descriptions and random
//! scenarios), `app` (the application model), `sim` (the scenario runner's event loop),
//! [`testbed`] (the stepped pair), [`report`] and [`error`]; [`tcp`] models the TCP transport
//! (its own links: byte pipes in order) around the same core's TCP parts.

#![warn(missing_docs)]
#![forbid(unsafe_code)]

mod app;
pub mod error;
mod events;
pub mod net;
mod outgoing;
pub mod report;
pub mod scenario;
mod sim;
pub mod tcp;
pub mod testbed;

pub use error::{FailureKind, SimError};
pub use net::{
    host_addr, Dir, DirectionConfig, DirectionCounters, HostId, LinkConfig, LinkStatus,
    HEADER_BYTES, MAX_DATAGRAM, UNLIMITED_RATE,
};
pub use report::{BufferPeaks, CloseRecord, LinkChange, LinkReport, Report, TransferReport};
pub use scenario::{Action, AppConfig, AppMode, Scenario};
pub use sim::run;
pub use tcp::{run_tcp, TcpAction, TcpReport, TcpScenario};
pub use testbed::{Testbed, TestbedConfig};

/// Derives an independent 64-bit seed from `seed` for the given purpose (SplitMix64 finalizer).
pub(crate) fn derive_seed(seed: u64, purpose: u64) -> u64 {
    let mut z = seed ^ purpose.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}
