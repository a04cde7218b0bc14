//! The cluster file of `ri2n tunnel`: one TOML file, copied unchanged to every host, that
//! names the key, the port, the TUN interface and every host with its tunnel address and its
//! address on each network. Every error names the file and, where it can, the line.

use std::collections::HashMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr};
use std::ops::Range;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use toml::Spanned;

/// Default UDP port on every link address.
pub const DEFAULT_PORT: u16 = 7400;
/// Default TUN interface name.
pub const DEFAULT_INTERFACE: &str = "ri2n0";
/// Default prefix length of the tunnel addresses.
pub const DEFAULT_PREFIX: u8 = 24;
/// Longest host name: it goes into the status socket's path, which a Unix socket address
/// holds in 108 bytes.
const MAX_NAME: usize = 64;

/// A checked cluster description.
#[derive(Debug, Clone, PartialEq)]
pub struct Cluster {
    /// The key file (a relative path in the file is relative to the file's directory).
    pub key: PathBuf,
    /// The line that names it, for the errors of reading it.
    pub key_line: usize,
    pub port: u16,
    pub interface: String,
    pub prefix: u8,
    pub hosts: Vec<Host>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Host {
    pub name: String,
    /// Its address on the tunnel interface.
    pub address: Ipv4Addr,
    /// Its address on each network, one per link.
    pub links: Vec<IpAddr>,
}

impl Host {
    /// The families of its link addresses: `Some(true)` IPv4 alone, `Some(false)` IPv6
    /// alone, None both.
    fn only_family(&self) -> Option<bool> {
        let v4 = self.links.iter().any(IpAddr::is_ipv4);
        let v6 = self.links.iter().any(IpAddr::is_ipv6);
        (v4 != v6).then_some(v4)
    }
}

/// What is wrong with a cluster file: `FILE:LINE: message`, or `FILE: message`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub file: PathBuf,
    pub line: Option<usize>,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(line) => write!(f, "{}:{line}: {}", self.file.display(), self.message),
            None => write!(f, "{}: {}", self.file.display(), self.message),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCluster {
    key: Spanned<PathBuf>,
    #[serde(default)]
    port: Option<Spanned<u16>>,
    #[serde(default)]
    interface: Option<Spanned<String>>,
    #[serde(default)]
    prefix: Option<Spanned<u8>>,
    #[serde(default, rename = "host")]
    hosts: Vec<Spanned<RawHost>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHost {
    name: Spanned<String>,
    // read as text and parsed here, so that an error names the field and what it takes
    address: Spanned<String>,
    links: Spanned<Vec<Spanned<String>>>,
}

impl Cluster {
    /// Reads and checks the cluster file at `path`.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            file: path.to_owned(),
            line: None,
            message: format!("cannot read the configuration: {e}"),
        })?;
        Self::parse(path, &text)
    }

    /// Checks the text of the cluster file `path`.
    pub fn parse(path: &Path, text: &str) -> Result<Self, ConfigError> {
        // every host's fields are looked up by line: one pass over the text, not one each
        let newlines: Vec<usize> = (text.bytes().enumerate())
            .filter(|&(_, b)| b == b'\n')
            .map(|(i, _)| i)
            .collect();
        let line_of = |offset: usize| newlines.partition_point(|&nl| nl < offset) + 1;
        let at = |span: Option<Range<usize>>, message: String| ConfigError {
            file: path.to_owned(),
            line: span.map(|s| line_of(s.start)),
            message,
        };
        let raw: RawCluster = toml::from_str(text).map_err(|e| {
            let message = e.message().trim().replace('\n', " ");
            // a field missing at the top is the whole file's error, spanning all of it or
            // none of it: no line is to blame
            let whole = |s: &Range<usize>| s.start == 0 && (s.end == 0 || s.end >= text.len());
            let span = e.span().filter(|s| !whole(s));
            let line = (span.clone()).and_then(|s| text.lines().nth(line_of(s.start) - 1));
            at(span, explain_toml_error(text, line, message))
        })?;

        let mut key = raw.key.get_ref().clone();
        if key.as_os_str().is_empty() {
            return Err(at(Some(raw.key.span()), "key: the path is empty".into()));
        }
        if key.is_relative() {
            if let Some(dir) = path.parent() {
                key = dir.join(key);
            }
        }
        let port = match raw.port {
            Some(p) if *p.get_ref() == 0 => {
                return Err(at(Some(p.span()), "port: must be 1 to 65535".into()))
            }
            Some(p) => p.into_inner(),
            None => DEFAULT_PORT,
        };
        let interface = match raw.interface {
            Some(i) => {
                let name = i.get_ref();
                // IFNAMSIZ is 16 with the terminating NUL, where the kernel's copy of a name
                // with a NUL in it ends; it refuses '/', blanks, ".", "..", and "all" and
                // "default" (the names of /proc/sys/net/*/conf's settings for every
                // interface), and makes "%d" the first free number (another name than the
                // one the daemon would then configure). Its blanks are bytes, its `isspace`
                // taking 0xA0 for one too: a character whose UTF-8 holds that byte ("à")
                if name.is_empty()
                    || name.len() > 15
                    || [".", "..", "all", "default"].contains(&name.as_str())
                    || name.contains(|c: char| "/:%".contains(c) || c.is_whitespace())
                    || name.contains(char::is_control)
                    || name.bytes().any(|b| b == 0xA0)
                {
                    return Err(at(
                        Some(i.span()),
                        format!(
                            "interface: {name:?} is not a valid interface name (1 to 15 \
                             bytes, no '/', ':', '%', blanks or control characters, no \
                             character whose UTF-8 holds the byte 0xA0 such as 'à', not \
                             \".\", \"..\", \"all\" or \"default\")"
                        ),
                    ));
                }
                i.into_inner()
            }
            None => DEFAULT_INTERFACE.to_owned(),
        };
        let prefix = match raw.prefix {
            // a network shorter than a /8 spans several /8 blocks of the Internet's address
            // space: a typo (8 for 24, 1 for 31), whose route would take their traffic
            Some(p) if !(8..=30).contains(p.get_ref()) => {
                return Err(at(Some(p.span()), "prefix: must be 8 to 30".into()))
            }
            Some(p) => p.into_inner(),
            None => DEFAULT_PREFIX,
        };
        if raw.hosts.len() < 2 {
            return Err(at(
                None,
                format!(
                    "{} [[host]] entries: a tunnel needs at least 2 hosts",
                    raw.hosts.len()
                ),
            ));
        }

        let mut names: HashMap<&str, usize> = HashMap::new();
        let mut addresses: HashMap<Ipv4Addr, usize> = HashMap::new();
        // each link address: its host and line
        let mut link_addresses: HashMap<IpAddr, (&str, usize)> = HashMap::new();
        let mask = u32::MAX << (32 - prefix);
        let mut network: Option<u32> = None;
        let mut hosts: Vec<Host> = Vec::with_capacity(raw.hosts.len());
        let mut first_with_only: [Option<usize>; 2] = [None, None];
        for h in &raw.hosts {
            let h = h.get_ref();
            let line_of_span = |s: Range<usize>| line_of(s.start);
            let name = h.name.get_ref();
            // it names the daemon's status socket, a file: `status::socket_path`
            let name_char = |c: char| c.is_ascii_alphanumeric() || "-_.".contains(c);
            // nor with '-', which `--name` would take for an option
            if name.is_empty()
                || name.len() > MAX_NAME
                || name.starts_with(['.', '-'])
                || !name.chars().all(name_char)
            {
                return Err(at(
                    Some(h.name.span()),
                    format!(
                        "name: \"{name}\" must be 1 to {MAX_NAME} letters, digits, '-', '_' \
                         or '.', not starting with '.' or '-'"
                    ),
                ));
            }
            if let Some(&first) = names.get(name.as_str()) {
                return Err(at(
                    Some(h.name.span()),
                    format!("two hosts are named \"{name}\" (the first on line {first})"),
                ));
            }
            names.insert(name, line_of_span(h.name.span()));

            let address = parse_tunnel_address(h.address.get_ref())
                .map_err(|m| at(Some(h.address.span()), format!("address: {m}")))?;
            if let Some(&first) = addresses.get(&address) {
                return Err(at(
                    Some(h.address.span()),
                    format!(
                        "two hosts have the tunnel address {address} (the first on line {first})"
                    ),
                ));
            }
            addresses.insert(address, line_of_span(h.address.span()));
            let bits = u32::from(address);
            let host_bits = bits & !mask;
            if host_bits == 0 || host_bits == !mask {
                return Err(at(
                    Some(h.address.span()),
                    format!(
                        "address: {address} is the network or broadcast address of its /{prefix}"
                    ),
                ));
            }
            match network {
                None => network = Some(bits & mask),
                Some(n) if n != bits & mask => {
                    return Err(at(
                        Some(h.address.span()),
                        format!(
                            "address: {address} is not in the /{prefix} network of the first \
                             host's address ({})",
                            Ipv4Addr::from(n)
                        ),
                    ))
                }
                Some(_) => {}
            }

            let links = h.links.get_ref();
            if links.is_empty() || links.len() > ri2n::MAX_LINKS {
                return Err(at(
                    Some(h.links.span()),
                    format!(
                        "links: host \"{name}\" lists {} addresses; it needs 1 to {}",
                        links.len(),
                        ri2n::MAX_LINKS
                    ),
                ));
            }
            let mut host_links = Vec::with_capacity(links.len());
            for l in links {
                let ip: IpAddr = l.get_ref().parse().map_err(|_| {
                    at(
                        Some(l.span()),
                        format!(
                            "links: \"{}\" is not an IP address (each link is the host's \
                             IPv4 or IPv6 address on one network)",
                            l.get_ref()
                        ),
                    )
                })?;
                // IPv4's reserved block 240/4 holds the broadcast address, which any
                // machine can bind: every host would take it for its own; 0.0.0.0/8 ("this
                // network") is no destination a datagram can be sent to
                let reserved =
                    matches!(ip, IpAddr::V4(v4) if v4.octets()[0] >= 240 || v4.octets()[0] == 0);
                if ip.is_unspecified() || ip.is_multicast() || reserved {
                    return Err(at(
                        Some(l.span()),
                        format!("links: {ip} cannot be a host's address"),
                    ));
                }
                let mapped = match ip {
                    IpAddr::V6(v6) => v6.to_ipv4_mapped(),
                    IpAddr::V4(_) => None,
                };
                if let Some(v4) = mapped {
                    // the same address as the IPv4 one: written so, it would slip past the
                    // checks of duplicates, of the tunnel network and of the families
                    return Err(at(
                        Some(l.span()),
                        format!("links: {ip} is an IPv4 address written as IPv6: write {v4}"),
                    ));
                }
                if matches!(ip, IpAddr::V6(v6) if v6.segments()[0] & 0xffc0 == 0xfe80) {
                    // such an address means something only with its interface, which the
                    // file cannot give: it could be neither bound nor reached
                    return Err(at(
                        Some(l.span()),
                        format!(
                            "links: {ip} is an IPv6 link-local address, which needs an \
                             interface; give the host a global or unique-local address"
                        ),
                    ));
                }
                match link_addresses.get(&ip) {
                    Some(&(owner, _)) if owner == name => {
                        return Err(at(
                            Some(l.span()),
                            format!("links: host \"{name}\" lists {ip} twice"),
                        ))
                    }
                    Some(&(owner, first)) => {
                        return Err(at(
                            Some(l.span()),
                            format!(
                                "links: {ip} is listed by host \"{owner}\" (line {first}) and \
                                 by host \"{name}\": a link address belongs to one host"
                            ),
                        ))
                    }
                    None => {}
                }
                // the interface's route would take the links' own traffic into the tunnel
                // (or the link network's route the tunnel's traffic past it)
                if let (IpAddr::V4(v4), Some(n)) = (ip, network) {
                    if u32::from(v4) & mask == n {
                        return Err(at(
                            Some(l.span()),
                            format!(
                                "links: {ip} is inside the tunnel network {}/{prefix}: give the \
                                 tunnel addresses a network of their own, apart from every link's",
                                Ipv4Addr::from(n)
                            ),
                        ));
                    }
                }
                link_addresses.insert(ip, (name, line_of_span(l.span())));
                host_links.push(ip);
            }
            let host = Host {
                name: name.clone(),
                address,
                links: host_links,
            };
            // a link joins addresses of one family: two hosts without one cannot connect,
            // which takes a host of IPv4 links alone and one of IPv6 links alone (the first
            // of each is remembered: a file of thousands of hosts is checked at once)
            // (by index: 0 for IPv4 alone, 1 for IPv6 alone)
            let index = |v4: bool| usize::from(!v4);
            let only = host.only_family();
            let other = only.and_then(|v4| first_with_only[index(!v4)]);
            if let Some(v4) = only {
                first_with_only[index(v4)].get_or_insert(hosts.len());
            }
            if let Some(other) = other.map(|i| &hosts[i]) {
                return Err(at(
                    Some(h.links.span()),
                    format!(
                        "links: hosts \"{}\" and \"{name}\" have no link addresses of the same \
                         family (IPv4 or IPv6): they could not reach each other",
                        other.name
                    ),
                ));
            }
            hosts.push(host);
        }
        Ok(Self {
            key,
            key_line: line_of(raw.key.span().start),
            port,
            interface,
            prefix,
            hosts,
        })
    }

    /// This host's position in `hosts`: the one named `name`, else the one that owns one of
    /// its link addresses (an address a socket can bind here).
    /// The hosts that list a link address of this machine (one of its interfaces', see
    /// `here::Addresses`).
    pub fn hosts_here(&self) -> Vec<usize> {
        let here = crate::here::Addresses::now();
        (0..self.hosts.len())
            .filter(|&i| self.hosts[i].links.iter().any(|&ip| here.has(ip)))
            .collect()
    }

    pub fn find_self(&self, name: Option<&str>) -> Result<usize, String> {
        if let Some(name) = name {
            return self
                .hosts
                .iter()
                .position(|h| h.name == name)
                .ok_or_else(|| format!("no host is named \"{name}\" in the configuration"));
        }
        let mine = self.hosts_here();
        match mine.as_slice() {
            [i] => Ok(*i),
            [] => Err(
                "none of the hosts' link addresses is an address of this machine: add it \
                       to the file as a [[host]] (its name, tunnel address and address on each \
                       network), or, if it is listed but its link addresses are not up yet, say \
                       which host it is with --name (the daemon then starts, and takes each \
                       address up as it appears)"
                    .into(),
            ),
            _ => {
                let loopback = (mine.iter())
                    .flat_map(|&i| self.hosts[i].links.iter().map(move |a| (i, a)))
                    .find(|(_, a)| a.is_loopback());
                let why = loopback.map_or_else(String::new, |(i, a)| {
                    format!(
                        " ({a} of {} is a loopback address, which every machine has)",
                        self.hosts[i].name
                    )
                });
                Err(format!(
                    "this machine owns link addresses of several hosts ({}){why}; name this \
                     host with --name",
                    mine.iter()
                        .map(|&i| self.hosts[i].name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
            }
        }
    }
}

/// A host's tunnel address, or what is wrong with it: the interface takes a unicast IPv4
/// address that routes through it (the kernel refuses multicast and the reserved block, a
/// loopback address never leaves the machine, and 0.0.0.0/8 is "this network").
fn parse_tunnel_address(text: &str) -> Result<Ipv4Addr, String> {
    let address: Ipv4Addr = text.parse().map_err(|_| match text.parse::<IpAddr>() {
        Ok(IpAddr::V6(_)) => format!(
            "{text} is IPv6: the tunnel carries IPv4, and each host's tunnel address is an \
             IPv4 address (its links may be IPv6)"
        ),
        _ => format!("\"{text}\" is not an IPv4 address (such as 10.99.0.1)"),
    })?;
    let what = match address.octets()[0] {
        0 => Some("in 0.0.0.0/8 (\"this network\")"),
        127 => Some("a loopback address, which never leaves this machine"),
        224..=239 => Some("a multicast address"),
        240..=255 => Some("in the reserved block 240.0.0.0/4"),
        _ => None,
    };
    match what {
        Some(what) => Err(format!(
            "{address} is {what}: give the hosts unicast addresses of a private network, \
             such as 10.99.0.0/24"
        )),
        None => Ok(address),
    }
}

/// Whether `line` holds an address outside quotes and comments: `links = ["10.0.1.1",
/// 10.0.2.1]` (one added to a list), `address = 10.99.0.1 # "node1"`, or one address a line
/// of a links array written over several lines.
fn unquoted_address(line: &str) -> bool {
    let value = line.split_once('=').map_or(line, |(_, v)| v);
    let mut bare = String::new();
    let mut quote = None;
    for c in value.chars() {
        match quote {
            Some(q) if c == q => quote = None,
            Some(_) => {}
            None if c == '"' || c == '\'' => quote = Some(c),
            None if c == '#' => break,
            None => bare.push(c),
        }
    }
    (bare.split(|c: char| c == ',' || c == '[' || c == ']' || c.is_whitespace()))
        .any(|t| t.parse::<IpAddr>().is_ok())
}

/// The TOML parser's `message` about `line` with a hint where it comes from a common slip:
/// an address not in quotes, `[host]` for `[[host]]`, or a key of the whole file written
/// after the first `[[host]]` (which makes it that host's).
fn explain_toml_error(text: &str, line: Option<&str>, message: String) -> String {
    let field = line.and_then(|l| l.split('=').next()).map(str::trim);
    // TOML quotes strings in " or '
    let quoted = line.is_some_and(|l| l.contains(['"', '\'']));
    if matches!(field, Some("address" | "links")) && !quoted || line.is_some_and(unquoted_address) {
        return format!(
            "{message}: addresses are written in quotes, such as address = \"10.99.0.1\" and \
             links = [\"10.0.1.1\", \"10.0.2.1\"]"
        );
    }
    let single_table = text.lines().any(|l| l.trim() == "[host]");
    // two or more [host] tables are one table given twice; one alone is a table where a
    // list of them is expected
    if single_table && (message.contains("duplicate key") || message.contains("a sequence")) {
        return format!("{message}: each host is a [[host]] entry (two brackets), not [host]");
    }
    if message.starts_with("missing field `key`") {
        return format!(
            "{message}: the file names the cluster's key at its top, before the first \
             [[host]], such as key = \"cluster.key\" (a path relative to this file; make the key \
             with `ri2n keygen`)"
        );
    }
    let top_level = ["key", "port", "interface", "prefix"];
    if (top_level.iter()).any(|k| message.starts_with(&format!("unknown field `{k}`"))) {
        return format!(
            "{message}: key, port, interface and prefix go at the top of the file, before \
             the first [[host]] (below it they are that host's)"
        );
    }
    message
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A cluster file of two hosts (the tunnel's tests add hosts to it).
    pub(crate) const GOOD: &str = r#"
key = "cluster.key"
port = 7500

[[host]]
name = "node1"
address = "10.99.0.1"
links = ["10.0.1.1", "10.0.2.1"]

[[host]]
name = "node2"
address = "10.99.0.2"
links = ["10.0.1.2", "10.0.2.2"]
"#;

    fn parse(text: &str) -> Result<Cluster, ConfigError> {
        Cluster::parse(Path::new("/etc/ri2n/cluster.toml"), text)
    }

    fn error(text: &str) -> String {
        parse(text).unwrap_err().to_string()
    }

    #[test]
    fn a_good_file_with_defaults() {
        let c = parse(GOOD).unwrap();
        assert_eq!(c.key, Path::new("/etc/ri2n/cluster.key"));
        assert_eq!(
            (c.port, c.interface.as_str(), c.prefix),
            (7500, "ri2n0", 24)
        );
        assert_eq!(c.hosts.len(), 2);
        assert_eq!(c.hosts[1].name, "node2");
        assert_eq!(c.hosts[1].address, Ipv4Addr::new(10, 99, 0, 2));
        assert_eq!(
            c.hosts[1].links,
            [
                "10.0.1.2".parse::<IpAddr>().unwrap(),
                "10.0.2.2".parse().unwrap()
            ]
        );
        assert_eq!(c.find_self(Some("node2")), Ok(1));
        assert!(c.find_self(Some("node9")).is_err());
    }

    #[test]
    fn errors_name_the_line() {
        assert_eq!(
            error(&GOOD.replace("10.99.0.2", "10.99.0.1")),
            "/etc/ri2n/cluster.toml:12: two hosts have the tunnel address 10.99.0.1 (the first on line 7)"
        );
        assert_eq!(
            error(&GOOD.replace("\"10.0.2.2\"", "\"10.0.1.1\"")),
            "/etc/ri2n/cluster.toml:13: links: 10.0.1.1 is listed by host \"node1\" (line 8) \
             and by host \"node2\": a link address belongs to one host"
        );
        assert_eq!(
            error(&GOOD.replace("\"10.0.2.2\"", "\"10.0.1.2\"")),
            "/etc/ri2n/cluster.toml:13: links: host \"node2\" lists 10.0.1.2 twice"
        );
        assert_eq!(
            error(&GOOD.replace("node2", "node1")),
            "/etc/ri2n/cluster.toml:11: two hosts are named \"node1\" (the first on line 6)"
        );
        assert!(error(&GOOD.replace("10.99.0.2", "10.99.0.300"))
            .starts_with("/etc/ri2n/cluster.toml:12: "));
        assert_eq!(
            error(&GOOD.replace("\"10.0.2.2\"]", "\"fe80::2\"]")),
            "/etc/ri2n/cluster.toml:13: links: fe80::2 is an IPv6 link-local address, which \
             needs an interface; give the host a global or unique-local address"
        );
        assert_eq!(
            error(&GOOD.replace("\"10.0.2.2\"]", "\"::ffff:10.0.1.1\"]")),
            "/etc/ri2n/cluster.toml:13: links: ::ffff:10.0.1.1 is an IPv4 address written as \
             IPv6: write 10.0.1.1"
        );
        assert!(error(&GOOD.replace("port = 7500", "port = 0"))
            .starts_with("/etc/ri2n/cluster.toml:3: port"));
        assert!(error(&GOOD.replace("port = 7500", "prot = 7500"))
            .starts_with("/etc/ri2n/cluster.toml:3: "));
        assert!(error(&GOOD.replace("10.99.0.2", "10.98.0.2")).contains("not in the /24 network"));
        for bad in [
            "a/b",
            "ri2n%d",
            ".",
            "..",
            "",
            "all",
            "default",
            "lo\\u0000",
            "a\\tb",
            "rià0",
        ] {
            let e = error(&GOOD.replace("port = 7500", &format!("interface = \"{bad}\"")));
            assert!(e.contains("not a valid interface name"), "{bad}: {e}");
        }
        // a host's name names its status socket, a file
        for bad in [
            "a/b",
            "../x",
            ".hidden",
            "-node2",
            "node 2",
            &"n".repeat(65),
        ] {
            let e = error(&GOOD.replace("\"node2\"", &format!("\"{bad}\"")));
            assert!(
                e.starts_with("/etc/ri2n/cluster.toml:11: name: "),
                "{bad}: {e}"
            );
        }
        assert!(parse(&GOOD.replace("\"node2\"", "\"rack-1.node_2\"")).is_ok());
        // two hosts that share no address family could not connect
        assert_eq!(
            error(&GOOD.replace("[\"10.0.1.2\", \"10.0.2.2\"]", "[\"fd00::2\"]")),
            "/etc/ri2n/cluster.toml:13: links: hosts \"node1\" and \"node2\" have no link \
             addresses of the same family (IPv4 or IPv6): they could not reach each other"
        );
        assert!(parse(&GOOD.replace("\"10.0.2.2\"]", "\"fd00::2\"]")).is_ok());
        // a host of both families reaches each; one of each alone does not reach the other
        let third =
            "\n[[host]]\nname = \"node3\"\naddress = \"10.99.0.3\"\nlinks = [\"10.0.1.3\"]\n";
        let mixed = GOOD.replace("\"10.0.1.1\", \"10.0.2.1\"", "\"10.0.1.1\", \"fd00::1\"");
        let mixed = mixed.replace("[\"10.0.1.2\", \"10.0.2.2\"]", "[\"fd00::2\"]") + third;
        assert_eq!(
            error(&mixed),
            "/etc/ri2n/cluster.toml:18: links: hosts \"node2\" and \"node3\" have no link \
             addresses of the same family (IPv4 or IPv6): they could not reach each other"
        );
        // no line of the file is to blame for a field it lacks
        assert!(
            error(&GOOD.replace("key = \"cluster.key\"", ""))
                .starts_with("/etc/ri2n/cluster.toml: missing field `key`: the file names"),
            "{}",
            error(&GOOD.replace("key = \"cluster.key\"", ""))
        );
        // a host lacking a field: its [[host]] line is to blame
        let nameless = GOOD.replace("name = \"node2\"\n", "");
        assert!(error(&nameless).starts_with("/etc/ri2n/cluster.toml:10: missing field `name`"));
        assert_eq!(parse(GOOD).unwrap().key_line, 2);
        let one_host = &GOOD[..GOOD.find("[[host]]\nname = \"node2\"").unwrap()];
        assert!(error(one_host).contains("at least 2 hosts"));
        for e in [
            error("key = "),
            error(&GOOD.replace("port = 7500", "port = \"x\"")),
        ] {
            assert!(!e.contains('\n'), "one line: {e}");
        }
    }

    /// Two hosts with links on loopback are both this machine's (every machine's): the error
    /// says why, not only that it cannot tell.
    #[test]
    fn hosts_found_here_by_loopback_links_are_named_so() {
        let c = parse(
            &GOOD
                .replace("10.0.1.1", "127.0.0.1")
                .replace("10.0.1.2", "127.0.0.2"),
        )
        .unwrap();
        assert_eq!(c.hosts_here(), [0, 1]);
        let e = c.find_self(None).unwrap_err();
        assert!(
            e.contains("several hosts (node1, node2) (127.0.0.1 of node1 is a loopback address"),
            "{e}"
        );
    }

    /// A prefix of a typo's length, and tunnel or link addresses that no interface could use,
    /// are refused where they stand, saying why.
    #[test]
    fn addresses_the_tunnel_cannot_use_are_refused() {
        for p in [0, 1, 7, 31] {
            let e = error(&GOOD.replace("port = 7500", &format!("prefix = {p}")));
            assert_eq!(
                e, "/etc/ri2n/cluster.toml:3: prefix: must be 8 to 30",
                "{p}"
            );
        }
        assert!(parse(&GOOD.replace("port = 7500", "prefix = 16")).is_ok());
        // a /8 is taken, and here it holds the links
        let e = error(&GOOD.replace("port = 7500", "prefix = 8"));
        assert!(e.contains("inside the tunnel network 10.0.0.0/8"), "{e}");
        // the first host's address is on line 7
        for (bad, why) in [
            ("127.0.0.2", "a loopback address"),
            ("0.0.0.1", "this network"),
            ("224.0.0.1", "a multicast address"),
            ("255.255.255.1", "reserved block"),
            ("fd99::1", "is IPv6: the tunnel carries IPv4"),
            ("10.99.0", "is not an IPv4 address"),
        ] {
            let text = GOOD
                .replace("10.99.0.1", bad)
                .replace("10.99.0.2", &bad.replace(".1", ".2").replace("::1", "::2"));
            let e = error(&text);
            assert!(
                e.starts_with("/etc/ri2n/cluster.toml:7: address: ") && e.contains(why),
                "{bad}: {e}"
            );
        }
        for bad in [
            "255.255.255.255",
            "240.0.0.1",
            "0.0.0.0",
            "0.0.0.1",
            "224.0.0.9",
            "::",
        ] {
            let e = error(&GOOD.replace("\"10.0.2.2\"]", &format!("\"{bad}\"]")));
            assert_eq!(
                e,
                format!("/etc/ri2n/cluster.toml:13: links: {bad} cannot be a host's address")
            );
        }
        let e = error(&GOOD.replace("\"10.0.2.2\"]", "\"10.0.2\"]"));
        assert!(
            e.starts_with("/etc/ri2n/cluster.toml:13: links: \"10.0.2\" is not an IP address"),
            "{e}"
        );
    }

    /// Two slips TOML itself does not explain: `[host]` for `[[host]]`, and a key of the
    /// whole file written below a host (which makes it that host's).
    #[test]
    fn common_toml_slips_are_explained() {
        let single = GOOD.replace("[[host]]", "[host]");
        assert!(
            error(&single).contains("each host is a [[host]] entry (two brackets), not [host]"),
            "{}",
            error(&single)
        );
        // one host written so (the file then refused for its one host): the same hint
        let first = GOOD.replacen("[[host]]", "[host]", 1);
        let only = &first[..first.find("[[host]]").unwrap()];
        assert!(
            error(only).contains("each host is a [[host]] entry (two brackets), not [host]"),
            "{}",
            error(only)
        );
        let late_port = GOOD.replace("port = 7500\n", "") + "port = 7500\n";
        let e = error(&late_port);
        assert!(
            e.contains("unknown field `port`")
                && e.contains("go at the top of the file, before the first [[host]]"),
            "{e}"
        );
        // an unknown field of a host's own gets no such hint
        let e = error(&GOOD.replace("address = \"10.99.0.2\"", "adress = \"10.99.0.2\""));
        assert!(
            e.contains("unknown field `adress`") && !e.contains("top"),
            "{e}"
        );
        // addresses without quotes; also beside one in quotes, or before a comment that
        // quotes (before, a quote anywhere on the line kept the hint back)
        for (from, to) in [
            ("\"10.99.0.2\"", "10.99.0.2"),
            ("[\"10.0.1.2\", \"10.0.2.2\"]", "[10.0.1.2, 10.0.2.2]"),
            ("[\"10.0.1.2\", \"10.0.2.2\"]", "[\"10.0.1.2\", 10.0.2.2]"),
            ("\"10.99.0.2\"", "10.99.0.2 # \"node2\""),
        ] {
            let e = error(&GOOD.replace(from, to));
            assert!(
                e.starts_with("/etc/ri2n/cluster.toml:1")
                    && e.contains("addresses are written in quotes"),
                "{e}"
            );
        }
    }

    /// TOML literal strings ('...') are quotes too: a line that holds addresses in them and
    /// has another slip (a missing comma) is not told to put its addresses in quotes, as it
    /// was before.
    #[test]
    fn single_quoted_addresses_are_not_told_to_be_quoted() {
        let e = error(&GOOD.replace(
            "links = [\"10.0.1.2\", \"10.0.2.2\"]",
            "links = ['10.0.1.2' '10.0.2.2']",
        ));
        assert!(
            e.starts_with("/etc/ri2n/cluster.toml:13: ") && !e.contains("written in quotes"),
            "{e}"
        );
    }

    /// Addresses without quotes in a links array written over several lines (one address a
    /// line) get the hint too. Before, only a slip on the `links = [` line did, and this one
    /// TOML's "invalid float" alone.
    #[test]
    fn unquoted_addresses_in_a_multiline_links_array_get_the_quotes_hint() {
        let e = error(&GOOD.replace(
            "[\"10.0.1.2\", \"10.0.2.2\"]",
            "[\n  10.0.1.2,\n  10.0.2.2,\n]",
        ));
        assert!(
            e.starts_with("/etc/ri2n/cluster.toml:14: ") && e.contains("written in quotes"),
            "{e}"
        );
    }
}
