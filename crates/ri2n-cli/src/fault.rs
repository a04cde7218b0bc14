//! `--fault AFTER:LOCAL_ADDR:ACTION`: scheduled link faults (down, up, loss, rate cap) applied
//! through the library's impairment switches, so tests and demos can break links without root.

use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ri2n::{Endpoint, Impairment};

use crate::error::{list, Failure};

/// What a fault does to a socket.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Action {
    Down,
    Up,
    /// Drop probability, 0 to 1.
    Loss(f64),
    /// Cap in bits per second; `None` removes it.
    Rate(Option<u64>),
}

/// Which local sockets a fault applies to.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Target {
    /// Every socket bound to this IP.
    Ip(IpAddr),
    /// The socket bound to exactly this address.
    Socket(SocketAddr),
}

impl Target {
    fn matches(&self, a: SocketAddr) -> bool {
        match *self {
            Target::Ip(ip) => a.ip() == ip,
            Target::Socket(s) => a == s,
        }
    }
}

/// One parsed `--fault`.
#[derive(Debug, Clone, PartialEq)]
pub struct FaultSpec {
    pub after: Duration,
    pub target: Target,
    pub action: Action,
    text: String,
}

impl FromStr for FaultSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bad = |why: &str| {
            format!("`{s}`: {why} (expected AFTER:LOCAL_ADDR:ACTION, e.g. 1.5:127.0.0.2:down)")
        };
        let (after, rest) = s.split_once(':').ok_or_else(|| bad("missing fields"))?;
        let (addr, action) = rest.rsplit_once(':').ok_or_else(|| bad("missing fields"))?;
        let after = crate::parse_secs(after).map_err(|why| bad(&format!("AFTER {why}")))?;
        // an IPv6 address may come bracketed, as in URLs and IP:PORT: [::1]
        let bare = addr
            .strip_prefix('[')
            .and_then(|a| a.strip_suffix(']'))
            .unwrap_or(addr);
        let target = if let Ok(ip) = bare.parse::<IpAddr>() {
            Target::Ip(ip)
        } else if let Ok(sa) = addr.parse::<SocketAddr>() {
            Target::Socket(sa)
        } else {
            return Err(bad("LOCAL_ADDR is neither an IP nor IP:PORT"));
        };
        let action = parse_action(action).map_err(|why| bad(&why))?;
        Ok(Self {
            after,
            target,
            action,
            text: s.to_owned(),
        })
    }
}

fn parse_action(s: &str) -> Result<Action, String> {
    match s {
        "down" => return Ok(Action::Down),
        "up" => return Ok(Action::Up),
        _ => {}
    }
    if let Some(p) = s.strip_prefix("loss=") {
        let v = match p.strip_suffix('%') {
            Some(pct) => pct.parse::<f64>().map(|x| x / 100.0),
            None => p.parse::<f64>(),
        }
        .map_err(|_| format!("loss `{p}` is not a number"))?;
        if !(0.0..=1.0).contains(&v) {
            return Err(format!("loss `{p}` must be between 0 and 1"));
        }
        return Ok(Action::Loss(v));
    }
    if let Some(r) = s.strip_prefix("rate=") {
        let bits = parse_bits(r).map_err(|why| format!("rate {why}"))?;
        return Ok(Action::Rate((bits > 0).then_some(bits)));
    }
    Err(format!(
        "unknown ACTION `{s}` (one of down, up, loss=P, rate=BITS)"
    ))
}

/// `100M`, `1.5G`, `64k`, `1000000` (decimal multipliers, as iperf3's); 0 is 0 (no limit
/// where a rate is one). A rate above 0 that rounds to 0 bit/s is refused rather than read as
/// "no limit", its opposite; so is one beyond what 64 bits count, rather than cut to their
/// largest value and shown as the rate asked.
pub fn parse_bits(s: &str) -> Result<u64, String> {
    let not_a_rate = || format!("`{s}` is not a rate in bits per second (e.g. 500K, 100M, 1.5G)");
    let (num, mult) = match s.chars().last().ok_or_else(not_a_rate)? {
        'k' | 'K' => (&s[..s.len() - 1], 1e3),
        'm' | 'M' => (&s[..s.len() - 1], 1e6),
        'g' | 'G' => (&s[..s.len() - 1], 1e9),
        't' | 'T' => (&s[..s.len() - 1], 1e12),
        _ => (s, 1.0),
    };
    let v: f64 = num.parse().map_err(|_| not_a_rate())?;
    if !(v.is_finite() && v >= 0.0) {
        return Err(not_a_rate());
    }
    let bits = (v * mult).round();
    if bits >= u64::MAX as f64 {
        return Err(format!("`{s}` is more bits per second than this counts"));
    }
    if bits == 0.0 && v > 0.0 {
        return Err(format!(
            "`{s}` is less than 1 bit/s (0 means no limit; suffixes K, M, G, T are decimal)"
        ));
    }
    Ok(bits as u64)
}

/// The impairment switches of the sockets one fault applies to.
type Switches = Vec<(SocketAddr, Arc<Impairment>)>;

/// Faults matched to this process's sockets, waiting for the connection to start.
pub struct FaultPlan {
    steps: Vec<(FaultSpec, Switches)>,
}

impl FaultPlan {
    /// Finds the sockets each fault applies to; a usage error if one matches none.
    pub fn new(endpoint: &Endpoint, faults: &[FaultSpec]) -> Result<Self, Failure> {
        if !faults.is_empty() && endpoint.transport() == ri2n::Transport::Tcp {
            return Err(Failure::usage(
                "--fault acts on the UDP transport's sockets, not on --transport tcp's \
                 connections: fail the network itself to test the TCP transport",
            ));
        }
        let locals = endpoint.local_addrs();
        let mut steps = Vec::new();
        for f in faults {
            let targets: Vec<_> = locals
                .iter()
                .filter(|&&a| f.target.matches(a))
                .filter_map(|&a| endpoint.impairment(a).map(|i| (a, i)))
                .collect();
            if targets.is_empty() {
                return Err(Failure::usage(format!(
                    "--fault {}: no local socket has that address (local addresses: {})",
                    f.text,
                    list(&locals)
                )));
            }
            steps.push((f.clone(), targets));
        }
        steps.sort_by_key(|(f, _)| f.after);
        Ok(Self { steps })
    }

    /// Applies each fault at `start + AFTER` from a background thread; `log`: say so on stderr.
    pub fn start(self, start: Instant, log: bool) {
        self.start_with(start, move |t, addr, what| {
            if log {
                crate::progress::clear_line();
                say!("ri2n: fault at {t:.2} s: {addr} {what}");
            }
        });
    }

    /// Applies each fault at `start + AFTER` from a background thread and tells `notice` of
    /// each as it is applied: seconds since `start`, the socket, what was done. For a command
    /// whose own lines (a timeline) must not be broken by a line printed from this thread.
    pub fn start_with(
        self,
        start: Instant,
        mut notice: impl FnMut(f64, SocketAddr, String) + Send + 'static,
    ) {
        if self.steps.is_empty() {
            return;
        }
        let spawned = std::thread::Builder::new()
            .name("ri2n-faults".into())
            .spawn(move || {
                for (f, targets) in self.steps {
                    let at = start + f.after;
                    let now = Instant::now();
                    if at > now {
                        std::thread::sleep(at - now);
                    }
                    for (addr, imp) in &targets {
                        apply(imp, f.action);
                        notice(start.elapsed().as_secs_f64(), *addr, describe(f.action));
                    }
                }
            });
        if let Err(e) = spawned {
            say!("ri2n: warning: cannot start the fault thread: {e}");
        }
    }
}

fn apply(imp: &Impairment, a: Action) {
    match a {
        Action::Down => imp.set_down(true),
        Action::Up => imp.set_down(false),
        Action::Loss(p) => imp.set_loss(p),
        Action::Rate(r) => imp.set_rate(r),
    }
}

fn describe(a: Action) -> String {
    match a {
        Action::Down => "down".into(),
        Action::Up => "up".into(),
        Action::Loss(p) => format!("loss {:.1} %", p * 100.0),
        Action::Rate(None) => "rate cap removed".into(),
        Action::Rate(Some(r)) => format!("rate capped at {}", crate::report::fmt_rate(r as f64)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_specs() {
        let f: FaultSpec = "1.5:127.0.0.2:down".parse().unwrap();
        assert_eq!(f.after, Duration::from_millis(1500));
        assert_eq!(f.target, Target::Ip("127.0.0.2".parse().unwrap()));
        assert_eq!(f.action, Action::Down);
        let f: FaultSpec = "0:127.0.0.2:4000:loss=0.2".parse().unwrap();
        assert_eq!(f.target, Target::Socket("127.0.0.2:4000".parse().unwrap()));
        assert_eq!(f.action, Action::Loss(0.2));
        let f: FaultSpec = "3:::1:rate=100M".parse().unwrap();
        assert_eq!(f.target, Target::Ip("::1".parse().unwrap()));
        assert_eq!(f.action, Action::Rate(Some(100_000_000)));
        let f: FaultSpec = "3:[::1]:5000:rate=0".parse().unwrap();
        assert_eq!(f.target, Target::Socket("[::1]:5000".parse().unwrap()));
        assert_eq!(f.action, Action::Rate(None));
        let f: FaultSpec = "0.5:[::1]:down".parse().unwrap();
        assert_eq!(f.target, Target::Ip("::1".parse().unwrap()));
        let f: FaultSpec = "2:10.0.0.1:loss=5%".parse().unwrap();
        assert_eq!(f.action, Action::Loss(0.05));
        for bad in [
            "",
            "1",
            "x:127.0.0.1:down",
            "-1:127.0.0.1:down",
            "1e19:127.0.0.1:down",
            "1:nothost:down",
            "1:127.0.0.1:sideways",
            "1:127.0.0.1:loss=2",
            "1:127.0.0.1:rate=fast",
            "1:127.0.0.1:rate=0.4",
            "1:127.0.0.1:rate=1e30",
            "1:127.0.0.1:rate=20000000T",
        ] {
            assert!(bad.parse::<FaultSpec>().is_err(), "{bad}");
        }
    }
}
