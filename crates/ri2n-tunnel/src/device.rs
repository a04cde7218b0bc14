//! The TUN interface of `ri2n tunnel`: created with the cluster's name, given the host's
//! address, prefix and MTU, and brought up, with plain ioctls (`libc` has every constant; no
//! crate needed). It is not persistent: the kernel removes it, with its address and route,
//! when this process closes it, however the process ends.
//!
//! Every packet read or written is preceded by a virtio-net header (`IFF_VNET_HDR`): a read
//! may return a TCP segment of up to 64 KB to cut, and a write may hand the kernel many inner
//! TCP segments as one (see `offload`).
//!
//! The interface has one queue per route loop (`IFF_MULTI_QUEUE`, [`Queues`]; with one queue
//! on a host of few CPUs, the peer loop reads it), so flows read from it are served on
//! several cores. The kernel picks the queue of a packet it sends
//! through the interface by the queue on which its flow last came in (its automatic flow
//! steering), so what a host receives for a flow is written to the queue of that flow
//! ([`Queues::for_packet`]): each flow stays on one queue both ways, its packets in order.
//! Until the kernel has such an entry for a flow (before its first packet is written, once
//! the entry expired after a few seconds without one, or beyond the kernel's table size), it
//! picks a queue by its own hash: the flow's first packets written can then move it to
//! another queue while some still wait on the old one, and those may leave out of order.

use std::ffi::c_int;
use std::fs::{File, OpenOptions};
use std::io;
use std::mem;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use etherparse::{IpNumber, Ipv4HeaderSlice};
use smallvec::SmallVec;

use crate::offload::{VnetHeader, PLAIN_HEADER, VNET_HDR_LEN};

/// Packets the interface queues for the daemon to read (the kernel's default for TUN is
/// 500: a few milliseconds of full-size packets at gigabit rates, less than the daemon may
/// wait for a CPU on a busy host, and every packet that overflows it is a loss for the inner
/// flow).
const TX_QUEUE_LEN: i32 = 2000;
/// Most bytes one read returns: a packet may be a large TCP segment (TSO) of up to 64 KB.
const MAX_READ: usize = 1 << 16;

/// An open TUN interface: one IP packet per `read`, one packet or one coalesced run of TCP
/// segments per write.
#[derive(Debug)]
pub struct Tun {
    file: File,
}

impl Tun {
    /// Creates TUN interface `name` with `queues` queues, gives it `address`/`prefix` and
    /// `mtu`, and brings it up; returns the queues, ready for reads and writes.
    pub fn create(
        name: &str,
        address: Ipv4Addr,
        prefix: u8,
        mtu: usize,
        queues: usize,
    ) -> Result<Queues, String> {
        let tuns = (0..queues.max(1))
            .map(|i| Self::attach(name, queues > 1, i == 0))
            .collect::<Result<Vec<_>, _>>()?;
        configure(name, address, prefix, mtu)
            .map_err(|e| format!("cannot configure the interface {name}: {e}"))?;
        Ok(Queues(tuns))
    }

    /// Opens one queue of interface `name` (the `first` one creates it, and is refused if an
    /// interface of that name exists: another multi-queue opener would join it as more queues
    /// and then give it another address).
    fn attach(name: &str, multi_queue: bool, first: bool) -> Result<Self, String> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC)
            .open("/dev/net/tun")
            .map_err(|e| match e.kind() {
                io::ErrorKind::NotFound => {
                    "no /dev/net/tun on this machine (load the tun module: modprobe tun)".to_owned()
                }
                io::ErrorKind::PermissionDenied => format!(
                    "cannot open /dev/net/tun ({e}): creating the interface {name} needs root or \
                     CAP_NET_ADMIN"
                ),
                _ => format!("cannot open /dev/net/tun: {e}"),
            })?;
        let mut req = ifreq(name);
        let multi = if multi_queue {
            libc::IFF_MULTI_QUEUE
        } else {
            0
        };
        let exclusive = if first { libc::IFF_TUN_EXCL } else { 0 };
        req.ifr_ifru.ifru_flags =
            (libc::IFF_TUN | libc::IFF_NO_PI | libc::IFF_VNET_HDR | multi | exclusive)
                as libc::c_short;
        // SAFETY: TUNSETIFF reads and writes the ifreq it is given, which lives on our stack.
        if unsafe { libc::ioctl(file.as_raw_fd(), libc::TUNSETIFF, &mut req) } < 0 {
            let e = io::Error::last_os_error();
            return Err(match e.raw_os_error() {
                Some(libc::EPERM) => format!(
                    "cannot create the interface {name}: permission denied (needs root or \
                     CAP_NET_ADMIN)"
                ),
                Some(libc::EBUSY) => format!(
                    "cannot create the interface {name}: an interface of that name exists \
                     (another ri2n tunnel on this host? see `ip link show {name}`)"
                ),
                Some(libc::EINVAL) if multi_queue => format!(
                    "cannot create the interface {name} with several queues: an interface of \
                     another kind has that name, or this kernel has no multi-queue TUN (try \
                     --queues 1)"
                ),
                Some(libc::EINVAL) if Path::new("/sys/class/net").join(name).exists() => {
                    format!(
                        "cannot create the interface {name}: an interface of another kind \
                         has that name"
                    )
                }
                Some(libc::EINVAL) => format!("cannot create the interface {name:?}: {e}"),
                _ => format!("cannot create the interface {name}: {e}"),
            });
        }
        // TSO and checksum offload: the kernel hands over large TCP segments and leaves
        // checksums to finish (`offload::carry_whole` sends a segment whole for the peer's
        // kernel to cut and finish; `offload::split` does both here). Without them (an old
        // kernel), reads are one finished packet each, which works as well, only slower.
        let offloads = libc::TUN_F_CSUM | libc::TUN_F_TSO4;
        // SAFETY: TUNSETOFFLOAD takes its argument by value.
        unsafe {
            libc::ioctl(
                file.as_raw_fd(),
                libc::TUNSETOFFLOAD,
                offloads as libc::c_ulong,
            )
        };
        // reads return at once when nothing waits, so the packets waiting are read as a batch
        // (see `wait_readable`); writes to a TUN interface never wait anyway
        // SAFETY: fcntl on a descriptor we own.
        let flags = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETFL) };
        if flags < 0
            || unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0
        {
            return Err(format!(
                "cannot configure the interface {name}: {}",
                io::Error::last_os_error()
            ));
        }
        Ok(Self { file })
    }

    /// Another handle on the interface (a reader and several writers may work at once).
    pub fn try_clone(&self) -> io::Result<Self> {
        Ok(Self {
            file: self.file.try_clone()?,
        })
    }

    /// Waits until a packet can be read.
    pub fn wait_readable(&self) -> io::Result<()> {
        loop {
            if self.poll(-1)? {
                return Ok(());
            }
        }
    }

    /// Whether a packet can be read now, without waiting.
    pub fn is_readable(&self) -> io::Result<bool> {
        self.poll(0)
    }

    /// `poll` on the queue for reading, `timeout_ms` as poll(2) takes it: whether it is
    /// readable (false when interrupted).
    fn poll(&self, timeout_ms: libc::c_int) -> io::Result<bool> {
        let mut fd = libc::pollfd {
            fd: self.file.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one pollfd on our stack.
        match unsafe { libc::poll(&mut fd, 1, timeout_ms) } {
            n if n >= 0 => Ok(n > 0),
            _ => {
                let e = io::Error::last_os_error();
                match e.kind() {
                    io::ErrorKind::Interrupted => Ok(false),
                    _ => Err(e),
                }
            }
        }
    }

    /// Reads one packet into `buf`, behind `headroom` bytes of room (zeros): afterwards `buf`
    /// holds the room and the packet. Returns the packet's virtio-net header, or an error of
    /// kind `WouldBlock` when none is waiting. The packet goes straight into the buffer's
    /// spare memory, which is not cleared first: `buf` may be handed on whole (a large
    /// segment leaves in the buffer it was read into), and a fresh buffer costs no zeroing.
    pub fn read_into(&self, buf: &mut Vec<u8>, headroom: usize) -> io::Result<VnetHeader> {
        buf.clear();
        if buf.capacity() < headroom + MAX_READ {
            // not `reserve`: it would copy the old buffer's bytes along, unused as they are
            *buf = Vec::with_capacity(headroom + MAX_READ);
        }
        buf.resize(headroom, 0);
        let mut header = [0u8; VNET_HDR_LEN];
        let spare = buf.spare_capacity_mut();
        let iov = [
            libc::iovec {
                iov_base: header.as_mut_ptr().cast(),
                iov_len: header.len(),
            },
            libc::iovec {
                iov_base: spare.as_mut_ptr().cast(),
                iov_len: MAX_READ,
            },
        ];
        // SAFETY: both iovecs point into memory we hold mutably for the call (the second into
        // the vector's spare capacity, at least MAX_READ bytes).
        let n = unsafe { libc::readv(self.file.as_raw_fd(), iov.as_ptr(), iov.len() as c_int) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let Some(len) = (n as usize).checked_sub(VNET_HDR_LEN) else {
            return Err(io::Error::other(
                "a read from the interface without its header",
            ));
        };
        // a packet larger than the buffer is cut, and the read still says its whole length
        // (the interface's segments are at most 64 KB, within MAX_READ: never so today)
        let len = len.min(MAX_READ);
        // SAFETY: the read initialised `len` bytes of the spare capacity (at most MAX_READ).
        unsafe { buf.set_len(headroom + len) };
        Ok(VnetHeader::parse(&header))
    }

    /// Writes one IP packet to the interface.
    pub fn write(&self, packet: &[u8]) -> io::Result<()> {
        self.write_parts(&PLAIN_HEADER, std::iter::once(packet))
    }

    /// Writes one large TCP segment: `header`, then `payloads`. Either a coalesced run of
    /// segments (`header` from [`super::offload::merged_header`]: virtio-net, IP and TCP
    /// headers; then each segment's payload), or a segment carried whole (`header` the
    /// virtio-net header from [`super::offload::segment_for_write`]; then the packet).
    pub fn write_merged<'p>(
        &self,
        header: &[u8],
        payloads: impl Iterator<Item = &'p [u8]>,
    ) -> io::Result<()> {
        self.write_parts(header, payloads)
    }

    fn write_parts<'p>(
        &self,
        first: &[u8],
        rest: impl Iterator<Item = &'p [u8]>,
    ) -> io::Result<()> {
        let mut iov: SmallVec<[libc::iovec; 128]> = SmallVec::new();
        let mut len = first.len();
        iov.push(libc::iovec {
            iov_base: first.as_ptr() as *mut _,
            iov_len: first.len(),
        });
        for part in rest {
            len += part.len();
            iov.push(libc::iovec {
                iov_base: part.as_ptr() as *mut _,
                iov_len: part.len(),
            });
        }
        // SAFETY: every iovec points into a slice borrowed for the call; writev only reads.
        let n = unsafe { libc::writev(self.file.as_raw_fd(), iov.as_ptr(), iov.len() as c_int) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        if n as usize != len {
            return Err(io::Error::other("short write to the TUN interface"));
        }
        Ok(())
    }
}

/// The interface's queues, each read by a route loop of its own; any of them takes writes.
#[derive(Debug)]
pub struct Queues(Vec<Tun>);

impl Queues {
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// The queue that serves the flow of IPv4 `packet`, whichever way it goes: written to it,
    /// a flow's packets steer the kernel's for the same flow to that queue too.
    pub fn for_packet(&self, packet: &[u8]) -> &Tun {
        &self.0[flow_queue(packet, self.0.len())]
    }

    /// Other handles on the same queues.
    pub fn try_clone(&self) -> io::Result<Self> {
        self.0
            .iter()
            .map(Tun::try_clone)
            .collect::<io::Result<_>>()
            .map(Queues)
    }

    /// Each queue on its own, in order.
    pub fn into_vec(self) -> Vec<Tun> {
        self.0
    }

    /// Queues on files that stand in for the interface (tests of what is written).
    #[cfg(test)]
    pub(crate) fn of_files(files: Vec<File>) -> Self {
        Queues(files.into_iter().map(|file| Tun { file }).collect())
    }
}

/// Which of `queues` queues serves the flow of IPv4 `packet`: both directions of a TCP or
/// UDP flow (addresses and ports, each pair in the same order whichever way the packet goes)
/// land on the same one; other protocols and fragments by their addresses alone; anything
/// that is not IPv4 on the first.
pub(crate) fn flow_queue(packet: &[u8], queues: usize) -> usize {
    if queues <= 1 {
        return 0;
    }
    let Ok(ip) = Ipv4HeaderSlice::from_slice(packet) else {
        return 0;
    };
    let (a, b) = (
        u32::from(ip.source_addr()),
        u32::from(ip.destination_addr()),
    );
    let proto = ip.protocol();
    let ports = (proto == IpNumber::TCP || proto == IpNumber::UDP)
        .then(|| ip.slice().len())
        .filter(|_| !ip.is_fragmenting_payload())
        .and_then(|at| packet.get(at..at + 4))
        .map_or((0, 0), |p| {
            (
                u16::from_be_bytes([p[0], p[1]]),
                u16::from_be_bytes([p[2], p[3]]),
            )
        });
    let (lo, hi) = if (a, ports.0) <= (b, ports.1) {
        ((a, ports.0), (b, ports.1))
    } else {
        ((b, ports.1), (a, ports.0))
    };
    let addresses = u64::from(lo.0) << 32 | u64::from(hi.0);
    let rest = u64::from(lo.1) << 24 | u64::from(hi.1) << 8 | u64::from(proto.0);
    (mix(addresses ^ mix(rest)) % queues as u64) as usize
}

/// splitmix64's finaliser: every bit of the flow's key moves every bit of the queue's pick.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl AsRawFd for Tun {
    fn as_raw_fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }
}

fn ifreq(name: &str) -> libc::ifreq {
    // SAFETY: ifreq is plain data (a name and a union of integers and addresses); all zeros
    // is a valid value of every field.
    let mut req: libc::ifreq = unsafe { mem::zeroed() };
    for (dst, &b) in req
        .ifr_name
        .iter_mut()
        .zip(name.as_bytes().iter().take(libc::IFNAMSIZ - 1))
    {
        *dst = b as libc::c_char;
    }
    req
}

fn sockaddr(ip: Ipv4Addr) -> libc::sockaddr {
    let sin = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: 0,
        sin_addr: libc::in_addr {
            s_addr: u32::from(ip).to_be(),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: sockaddr_in and sockaddr have the same size; the kernel reads it as the family
    // says.
    unsafe { mem::transmute::<libc::sockaddr_in, libc::sockaddr>(sin) }
}

fn ioctl(fd: &OwnedFd, request: libc::c_ulong, req: &mut libc::ifreq) -> io::Result<()> {
    // SAFETY: every SIOC[GS]IF* request used here reads or writes the ifreq it is given.
    if unsafe { libc::ioctl(fd.as_raw_fd(), request as _, req as *mut libc::ifreq) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Address, netmask, MTU and up, through an IPv4 datagram socket (the kernel adds the
/// prefix's route itself).
fn configure(name: &str, address: Ipv4Addr, prefix: u8, mtu: usize) -> io::Result<()> {
    // SAFETY: socket(2) returns a new descriptor or -1.
    let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw` is a descriptor we own from here on.
    let sock = unsafe { OwnedFd::from_raw_fd(raw) };
    let mut req = ifreq(name);
    req.ifr_ifru.ifru_addr = sockaddr(address);
    ioctl(&sock, libc::SIOCSIFADDR, &mut req)?;
    let mask = Ipv4Addr::from(u32::MAX << (32 - u32::from(prefix)));
    req.ifr_ifru.ifru_netmask = sockaddr(mask);
    ioctl(&sock, libc::SIOCSIFNETMASK, &mut req)?;
    req.ifr_ifru.ifru_mtu = mtu as c_int;
    ioctl(&sock, libc::SIOCSIFMTU, &mut req)?;
    // ifr_qlen shares the union with ifr_ifindex
    req.ifr_ifru.ifru_ifindex = TX_QUEUE_LEN;
    ioctl(&sock, libc::SIOCSIFTXQLEN, &mut req)?;
    ioctl(&sock, libc::SIOCGIFFLAGS, &mut req)?;
    // SAFETY: SIOCGIFFLAGS just filled the flags member of the union.
    let flags = unsafe { req.ifr_ifru.ifru_flags };
    req.ifr_ifru.ifru_flags = flags | (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
    ioctl(&sock, libc::SIOCSIFFLAGS, &mut req)
}

#[cfg(test)]
mod tests {
    use super::flow_queue;

    /// An unfragmented IPv4 packet of protocol `proto` from `src`:`sport` to `dst`:`dport`
    /// (the ports where TCP and UDP have theirs).
    fn packet(proto: u8, src: [u8; 4], sport: u16, dst: [u8; 4], dport: u16) -> Vec<u8> {
        fragment(proto, src, sport, dst, dport, 0)
    }

    /// The same with `flags_offset` as its flags and fragment offset.
    fn fragment(
        proto: u8,
        src: [u8; 4],
        sport: u16,
        dst: [u8; 4],
        dport: u16,
        flags_offset: u16,
    ) -> Vec<u8> {
        let mut p = vec![0x45, 0, 0, 44, 0, 1];
        p.extend_from_slice(&flags_offset.to_be_bytes());
        p.extend_from_slice(&[64, proto, 0, 0]);
        p.extend_from_slice(&src);
        p.extend_from_slice(&dst);
        p.extend_from_slice(&sport.to_be_bytes());
        p.extend_from_slice(&dport.to_be_bytes());
        p.resize(44, 0);
        p
    }

    const A: [u8; 4] = [10, 99, 0, 1];
    const B: [u8; 4] = [10, 99, 0, 2];

    #[test]
    fn both_directions_of_a_flow_share_a_queue() {
        for proto in [6, 17] {
            for port in 40000..40064 {
                let out = packet(proto, A, port, B, 5201);
                let back = packet(proto, B, 5201, A, port);
                assert_eq!(flow_queue(&out, 4), flow_queue(&back, 4), "port {port}");
            }
        }
    }

    #[test]
    fn flows_spread_over_every_queue() {
        let mut per_queue = [0; 4];
        for port in 40000..40064 {
            per_queue[flow_queue(&packet(6, A, port, B, 5201), 4)] += 1;
        }
        // 64 flows: each queue far from empty (16 each if even)
        assert!(per_queue.iter().all(|&n| n >= 6), "{per_queue:?}");
    }

    #[test]
    fn fragments_and_other_protocols_go_by_their_addresses() {
        // a fragment after the first has no ports: all of a datagram's fragments together
        let first = fragment(17, A, 4000, B, 5000, 0x2000);
        let later = fragment(17, A, 1234, B, 5678, 0x0010);
        assert_eq!(flow_queue(&first, 8), flow_queue(&later, 8));
        let icmp = packet(1, A, 1, B, 2);
        let icmp_back = packet(1, B, 3, A, 4);
        assert_eq!(flow_queue(&icmp, 8), flow_queue(&icmp_back, 8));
    }

    #[test]
    fn anything_but_ipv4_and_one_queue_take_the_first() {
        let mut v6 = packet(6, A, 1, B, 2);
        v6[0] = 0x60;
        assert_eq!(flow_queue(&v6, 4), 0);
        assert_eq!(flow_queue(&[0x45, 0, 0], 4), 0);
        assert_eq!(flow_queue(&packet(6, A, 1, B, 2), 1), 0);
    }
}
