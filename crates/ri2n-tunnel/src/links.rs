//! This host's endpoint on its link addresses. An address that is not (yet) one of this
//! host's, a NIC dead or late at boot, does not stop the daemon: it starts on the others,
//! looks for the missing ones every second, and once one is there makes the endpoint again
//! with it. The connections are made again; the interface, and the inner connections
//! through it, stay.

use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::sync::RwLock;
use std::thread;
use std::time::{Duration, Instant};

use ri2n::{Endpoint, EndpointConfig};

use crate::Error;

/// How often the missing addresses are looked for.
const LOOK_AGAIN: Duration = Duration::from_secs(1);
/// How long a new endpoint waits for the old one's sockets to be released.
const REBIND_WAIT: Duration = Duration::from_secs(5);

/// The endpoint in use, and how many were made before it; none while it is being made again
/// (no handle of the old one may be kept then: its sockets, and so its addresses, must go).
pub struct Current {
    inner: RwLock<(u64, Option<Endpoint>)>,
    /// The host's link addresses the endpoint lacks while they are looked for (for status: a
    /// host none of whose links are up is waited for by its peers, and only this says why).
    missing: RwLock<Vec<SocketAddr>>,
}

impl Current {
    /// `endpoint` in use; none while no link address of the host is there yet.
    pub fn new(endpoint: Option<Endpoint>) -> Current {
        Current {
            inner: RwLock::new((0, endpoint)),
            missing: RwLock::default(),
        }
    }

    /// The host's link addresses the endpoint lacks: missing at the start (not addresses of
    /// this machine, or their port held) and looked for since.
    pub fn missing(&self) -> Vec<SocketAddr> {
        self.missing
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Says which of the host's link addresses the endpoint lacks now.
    pub fn set_missing(&self, missing: &[SocketAddr]) {
        *self.missing.write().unwrap_or_else(|e| e.into_inner()) = missing.to_vec();
    }

    /// The endpoint in use and its generation; none while it is being made again.
    pub fn get(&self) -> Option<(u64, Endpoint)> {
        let inner = self.inner.read().unwrap_or_else(|e| e.into_inner());
        inner.1.clone().map(|e| (inner.0, e))
    }

    /// The generation of the endpoint in use; none while it is being made again.
    pub fn generation(&self) -> Option<u64> {
        let inner = self.inner.read().unwrap_or_else(|e| e.into_inner());
        inner.1.as_ref().map(|_| inner.0)
    }

    /// Takes the endpoint in use out, to make it again.
    fn take(&self) -> Option<Endpoint> {
        self.inner
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .1
            .take()
    }

    /// Puts `endpoint` in use, of the next generation.
    fn put(&self, endpoint: Endpoint) {
        let mut inner = self.inner.write().unwrap_or_else(|e| e.into_inner());
        *inner = (inner.0 + 1, Some(endpoint));
    }
}

/// Binds an endpoint (`config` of the addresses) on every address of `locals` this host has;
/// returns it (none when it has none of them yet) and the addresses it lacks, each said on
/// stderr. Fails on any other error (an address in use).
pub fn bind_present(
    locals: &[SocketAddr],
    config: &dyn Fn(Vec<SocketAddr>) -> EndpointConfig,
) -> Result<(Option<Endpoint>, Vec<SocketAddr>), Error> {
    let (endpoint, missing) = bind_available(locals, config).map_err(Error::Endpoint)?;
    for addr in &missing {
        eprintln!(
            "ri2n tunnel: cannot bind {addr} (it is not an address of this host): starting \
             without it, and looking for it every {} s",
            LOOK_AGAIN.as_secs()
        );
    }
    Ok((endpoint, missing))
}

/// [`bind_present`] without a word: the endpoint on the addresses of `locals` this host has
/// now (none if it has none of them), and those it lacks.
pub(crate) fn bind_available(
    locals: &[SocketAddr],
    config: &dyn Fn(Vec<SocketAddr>) -> EndpointConfig,
) -> Result<(Option<Endpoint>, Vec<SocketAddr>), ri2n::Error> {
    // an address that is not this host's binds all the same where nonlocal binding is on:
    // missing, as where it is off
    let here = crate::here::Addresses::now();
    let (mut present, mut missing): (Vec<SocketAddr>, Vec<SocketAddr>) =
        locals.iter().partition(|a| here.has(a.ip()));
    while !present.is_empty() {
        match Endpoint::bind(config(present.clone())) {
            Ok(endpoint) => return Ok((Some(endpoint), missing)),
            Err(ri2n::Error::Bind { addr, source })
                if source.kind() == io::ErrorKind::AddrNotAvailable =>
            {
                present.retain(|&a| a != addr);
                missing.push(addr);
            }
            Err(e) => return Err(e),
        }
    }
    Ok((None, missing))
}

/// Whether `addr`'s IP is one of this host's now.
fn is_present(addr: SocketAddr) -> bool {
    crate::here::Addresses::now().has(addr.ip())
}

/// Whether `addr` itself, its port too, can be bound now: no other socket holds it.
fn is_free(addr: SocketAddr) -> bool {
    UdpSocket::bind(addr).is_ok()
}

/// Looks for the `missing` addresses of `locals` every second; when one appears, makes the
/// endpoint again with every address present then and puts it in `current`. An address of
/// the endpoint that went away meanwhile is left out and looked for in turn, so the daemon
/// keeps whatever links the host can bind (a NIC swapped for another). An address that
/// appears with its port held by another socket waits until the port is free: the endpoint
/// in use is not given up for an address the new one could not bind. `before_replacing` is
/// called with the old endpoint, closed, before the new one is bound (to end the connections
/// still held). While no endpoint can be made (no address left), it tries again every
/// second. Returns once the endpoint has every address.
pub fn bind_late(
    current: &Current,
    locals: &[SocketAddr],
    mut missing: Vec<SocketAddr>,
    config: &dyn Fn(Vec<SocketAddr>) -> EndpointConfig,
    before_replacing: &dyn Fn(&Endpoint),
) {
    // the last attempt failed: `current` is empty, and every look is an attempt
    let mut failing = false;
    // addresses said to be here with their port held, until it is free
    let mut held = Vec::new();
    while !missing.is_empty() {
        thread::sleep(LOOK_AGAIN);
        let (appeared, taken): (Vec<SocketAddr>, Vec<SocketAddr>) = (missing.iter().copied())
            .filter(|&a| is_present(a))
            .partition(|&a| is_free(a));
        for a in taken.iter().filter(|a| !held.contains(*a)) {
            eprintln!(
                "ri2n tunnel: {a} is an address of this host now, but another socket holds \
                 its port: its links wait until the port is free"
            );
        }
        held = taken;
        if appeared.is_empty() && !failing {
            continue;
        }
        if !failing {
            for a in &appeared {
                eprintln!("ri2n tunnel: {a} is an address of this host now: its links start");
            }
        }
        if let Some(old) = current.take() {
            let _ = old.close(Some(Duration::from_millis(100)));
            before_replacing(&old);
        }
        // the old endpoint's sockets go with its last handle, held a moment longer by the
        // threads that used it
        let deadline = Instant::now() + REBIND_WAIT;
        let made = loop {
            match bind_available(locals, config) {
                Ok(made) => break Ok(made),
                Err(_) if !failing && Instant::now() < deadline => {
                    thread::sleep(Duration::from_millis(50))
                }
                Err(e) => break Err(e),
            }
        };
        match made {
            Ok((endpoint, now_missing)) => {
                for a in now_missing.iter().filter(|a| !missing.contains(a)) {
                    eprintln!(
                        "ri2n tunnel: {a} is no longer an address of this host: its links \
                         wait for it"
                    );
                }
                // none: what appeared went again before it was bound
                if let Some(endpoint) = endpoint {
                    current.put(endpoint);
                }
                current.set_missing(&now_missing);
                missing = now_missing;
                failing = false;
            }
            Err(e) => {
                // the endpoint was let go: none of the addresses is bound now
                current.set_missing(locals);
                if !failing {
                    eprintln!(
                        "ri2n tunnel: cannot bind the link addresses again ({e}): trying \
                         every {} s",
                        LOOK_AGAIN.as_secs()
                    );
                }
                failing = true;
            }
        }
    }
}
