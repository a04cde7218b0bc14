//! `ri2n send`: stream a file or stdin to `ri2n recv`, then wait until the receiver has
//! acknowledged every byte and ended its side (its output complete); only then exit 0.

use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use ri2n::{Connection, Endpoint};

use crate::checksum::Checksum;
use crate::error::Failure;
use crate::fault::FaultPlan;
use crate::interrupt;
use crate::monitor::{Direction, Monitor};
use crate::net;
use crate::progress::Progress;
use crate::report::{bps, EventLog, LinkSummary, TransferSummary};
use crate::SendArgs;

/// Bytes read before they are handed to the connection, whole (no copy): large enough that
/// the connection takes each as one piece of its send buffer, and that reading costs few
/// system calls.
const CHUNK: usize = 1024 * 1024;
/// Bytes read (and summed) per `read` call: summed right after the read, while they are still
/// in the core's cache (1 MiB of L2 on the hosts measured), the sum costs no second trip to
/// memory.
const READ_STEP: usize = 256 * 1024;
/// How often a sender waiting for an idle input looks whether the connection ended.
const IDLE_LOOK: Duration = Duration::from_millis(100);

/// Replaces the contents of `buf` with up to [`CHUNK`] bytes of `fd`, read [`READ_STEP`] at
/// a time and added to `sum` (if any) as they come. Stops early after a short read, or, for
/// an input that may stay idle (`idle`: not a regular file), when it has nothing more ready:
/// a pipe's writer has no more, and what came is sent rather than held back waiting for the
/// rest. Returns the bytes read (0 at the end of the input). Such an input is waited for,
/// while `conn` lives, only before the first byte ([`wait_input`]).
fn read_chunk(
    fd: BorrowedFd<'_>,
    buf: &mut Vec<u8>,
    mut sum: Option<&mut Checksum>,
    idle: Option<&Connection>,
) -> io::Result<usize> {
    buf.clear();
    buf.reserve(CHUNK);
    while buf.len() < CHUNK {
        let start = buf.len();
        match idle {
            Some(conn) if start == 0 => wait_input(fd, conn)?,
            // a full step read, and the writer quiet since: the step goes now
            Some(_) if !input_ready(fd, 0)? => break,
            _ => {}
        }
        match read_into(fd, buf, READ_STEP.min(CHUNK - start)) {
            Ok(0) => break,
            Ok(n) => {
                if let Some(sum) = sum.as_deref_mut() {
                    sum.update(&buf[start..]);
                }
                if n < READ_STEP {
                    break;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            // what was read before the error is lost with the transfer, which fails
            Err(e) => return Err(e),
        }
    }
    Ok(buf.len())
}

/// Waits until `fd` has something to read (or its end, or an error, which the read then
/// reports), looking every [`IDLE_LOOK`] whether `conn` ended meanwhile: a receiver gone,
/// aborted, or unreachable past the links' timeout then ends the transfer though the input
/// stays open and quiet (`tail -f log | ri2n send`). A read would wait until the input next
/// produced bytes, and nothing would be said meanwhile.
fn wait_input(fd: BorrowedFd<'_>, conn: &Connection) -> io::Result<()> {
    while !input_ready(fd, IDLE_LOOK.as_millis() as libc::c_int)? {
        if let Some(reason) = conn.close_reason() {
            return Err(io::Error::other(reason));
        }
    }
    Ok(())
}

/// Whether `fd` has something to read (or its end, or an error) within `timeout_ms`; false
/// too when a signal cut the wait short.
fn input_ready(fd: BorrowedFd<'_>, timeout_ms: libc::c_int) -> io::Result<bool> {
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one live pollfd for the duration of the call.
    let n = unsafe { libc::poll(&mut p, 1, timeout_ms) };
    if n < 0 {
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
    Ok(n > 0)
}

/// Appends up to `max` bytes from `fd` to `buf`, straight into its memory: a buffer the
/// connection handed back is empty, and filling it with zeros before each read would be one
/// more pass over every byte sent.
fn read_into(fd: BorrowedFd<'_>, buf: &mut Vec<u8>, max: usize) -> io::Result<usize> {
    buf.reserve(max);
    let len = buf.len();
    // SAFETY: read(2) writes at most `max` bytes into the spare capacity reserved above (which
    // `buf` owns and nothing else refers to) and returns how many it wrote.
    let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().add(len).cast(), max) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the `n` bytes after the first `len` were just written by the kernel, so they
    // are initialized, and `len + n <= capacity`.
    unsafe { buf.set_len(len + n as usize) };
    Ok(n as usize)
}

/// A regular file as the input: its size and modification time when it was opened, and
/// where reading began (a file given as stdin may have been read in part before).
#[derive(Clone, Copy)]
struct InputFile {
    len: u64,
    start: u64,
    modified: Option<SystemTime>,
}

impl InputFile {
    /// `fd`'s, if it is a regular file.
    fn of(fd: BorrowedFd<'_>) -> Option<Self> {
        let mut f = File::from(fd.try_clone_to_owned().ok()?);
        let meta = f.metadata().ok().filter(|m| m.is_file())?;
        let start = io::Seek::stream_position(&mut f).unwrap_or(0);
        Some(Self {
            len: meta.len(),
            start,
            modified: meta.modified().ok(),
        })
    }

    /// The bytes to send.
    fn left(&self) -> u64 {
        self.len.saturating_sub(self.start)
    }
}

/// The input file's size when it was opened and now, if it ended before that size and is
/// now smaller: it was cut short while it was read (a log rotated, a file rewritten), and
/// what was read is neither the file as it was nor as it is, as `tar` warns. A file that
/// reads shorter than its size (those of /sys) is not smaller afterwards.
fn shrank(input: BorrowedFd<'_>, file: Option<InputFile>, written: u64) -> Option<(u64, u64)> {
    let was = file.filter(|f| written < f.left())?.len;
    let now = File::from(input.try_clone_to_owned().ok()?)
        .metadata()
        .ok()?
        .len();
    (now < was).then_some((was, now))
}

/// What became of the input file while it was read, as far as its end shows.
enum Change {
    /// Not written meanwhile, or only grown: the bytes sent are the file's first bytes now.
    None,
    /// Written meanwhile, and its first bytes, read again, are no longer those sent (or it
    /// is shorter): rewritten in place (`cat new > file`, an editor saving over it, a log
    /// copied and truncated), and what was read is neither the file as it was nor as it is.
    Rewritten,
    /// Written meanwhile, with no checksum of the bytes sent to compare (--no-checksum).
    Unverified,
}

/// Whether the input file (`input`, opened as `file`) changed while its `written` bytes
/// were read, other than by growing at its end: if its modification time moved, its first
/// `written` bytes (from where reading began) are read again and their checksum compared
/// with `sent`'s, that of the bytes sent.
fn change(
    input: BorrowedFd<'_>,
    file: Option<InputFile>,
    written: u64,
    sent: Option<&Checksum>,
) -> Change {
    use std::os::unix::fs::FileExt;
    let Some(file) = file else {
        return Change::None;
    };
    let Ok(f) = input.try_clone_to_owned().map(File::from) else {
        return Change::None;
    };
    let modified = f.metadata().ok().and_then(|m| m.modified().ok());
    if modified.is_none() || modified == file.modified {
        return Change::None;
    }
    let Some(sent) = sent else {
        return Change::Unverified;
    };
    let mut now = Checksum::default();
    let mut buf = vec![0u8; CHUNK];
    let (mut at, end) = (file.start, file.start + written);
    while at < end {
        let want = buf.len().min((end - at) as usize);
        match f.read_at(&mut buf[..want], at) {
            Ok(0) => return Change::Rewritten,
            Ok(n) => {
                now.update(&buf[..n]);
                at += n as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            // unreadable now: what was sent cannot be told from what is there
            Err(_) => return Change::Rewritten,
        }
    }
    match now.value() == sent.value() {
        true => Change::None,
        false => Change::Rewritten,
    }
}

pub fn run(args: &SendArgs) -> Result<(), Failure> {
    interrupt::install();
    let (input, name): (Box<dyn AsFd>, String) = match &args.input {
        Some(p) if p.as_os_str() != "-" => {
            let f = File::open(p)
                .map_err(|e| Failure::io(format!("cannot open {}", p.display()), &e))?;
            // said before connecting: a directory opens, and only its first read fails
            if f.metadata().is_ok_and(|m| m.is_dir()) {
                let e = io::Error::from(io::ErrorKind::IsADirectory);
                return Err(Failure::io(format!("cannot read {}", p.display()), &e));
            }
            (Box::new(f), p.display().to_string())
        }
        _ => {
            net::enlarge_pipe(0);
            (Box::new(io::stdin()), "stdin".into())
        }
    };
    // a file given as stdin (`< FILE`) too: its size shows the progress, and its being cut
    // short while it is read is caught, as with --input
    let file = InputFile::of(input.as_fd());

    let endpoint = net::client_endpoint(&args.connect, &args.key, args.quiet)?;
    let result = transfer(args, &endpoint, input, file, &name);
    net::close_after_failure(&endpoint, &result);
    result
}

/// The transfer of [`run`] on `endpoint`: connects, sends `input` (`name`; `file` where it is
/// a regular file), waits for the receiver's end.
fn transfer(
    args: &SendArgs,
    endpoint: &Endpoint,
    input: Box<dyn AsFd>,
    file: Option<InputFile>,
    name: &str,
) -> Result<(), Failure> {
    let faults = FaultPlan::new(endpoint, &args.link.fault)?;
    let config = net::connection_config(&args.connect, &args.link, net::Application::File);
    let conn = Arc::new(net::connect(endpoint, &args.connect, config)?);
    interrupt::abort_on_interrupt(conn.clone());
    let start = Instant::now();
    faults.start(start, !args.quiet);
    let monitor = Monitor::start(
        conn.clone(),
        Direction::Sending,
        Progress::new(!args.quiet, "sent", file.map(|f| f.left())),
        EventLog::new(start, !args.quiet),
    )?;
    // what went wrong, with how far the transfer got
    let lost = |e: &io::Error, written: u64, monitor: Monitor| {
        monitor.finish();
        let acked = written.saturating_sub(conn.stats().send_buffered);
        let done = format!("after {written} bytes written, {acked} acknowledged by the receiver");
        if let Some(signal) = interrupt::raised() {
            return interrupt::failure(signal, &done);
        }
        let cause = conn
            .close_reason()
            .map_or_else(|| e.to_string(), |r| r.to_string());
        Failure::new(
            crate::error::LOST,
            format!("connection lost: {cause}; {done}"),
        )
    };
    // The sending thread reads the input itself. A reader thread of its own (until
    // 2026-11-25) made the bytes cross to the other core before the connection copied them
    // into datagrams: reading here, the copy finds them in this core's cache, for less CPU
    // per byte and no less goodput (item 15 of "What looked wrong" in docs/BENCHMARKS.md at
    // commit 085a7a3).
    let mut sum = (!args.no_checksum).then(Checksum::default);
    let mut buf = Vec::new();
    let mut written = 0u64;
    let idle = file.is_none().then_some(&*conn);
    loop {
        let n = match read_chunk(input.as_fd(), &mut buf, sum.as_mut(), idle) {
            // the end of the input, unless a signal to this process came first: the same
            // signal may have ended the program feeding it, and then the data did not end
            Ok(0) => match interrupt::raised() {
                None => match shrank(input.as_fd(), file, written) {
                    None => match change(input.as_fd(), file, written, sum.as_ref()) {
                        Change::None => break,
                        Change::Unverified => {
                            say!(
                                "ri2n: warning: {name} was written to while it was read; with \
                                 --no-checksum whether the bytes sent are its first bytes now \
                                 was not checked"
                            );
                            break;
                        }
                        Change::Rewritten => {
                            conn.abort(
                                1,
                                "the sender's input file was rewritten while it was read",
                            );
                            monitor.finish();
                            return Err(Failure::new(
                                crate::error::GENERIC,
                                format!(
                                    "{name} was rewritten while it was read (its first bytes \
                                     are no longer those sent): the transfer was aborted after \
                                     {written} bytes, which are neither the file as it was nor \
                                     as it is"
                                ),
                            ));
                        }
                    },
                    Some((was, now)) => {
                        conn.abort(1, "the sender's input file shrank while it was read");
                        monitor.finish();
                        return Err(Failure::new(
                            crate::error::GENERIC,
                            format!(
                                "{name} shrank from {was} to {now} bytes while it was read: the \
                                 transfer was aborted after {written} bytes, which are neither \
                                 the file as it was nor as it is"
                            ),
                        ));
                    }
                },
                Some(signal) => {
                    let why = format!("interrupted by {}", interrupt::name(signal));
                    conn.abort(signal as u64, &why);
                    let ended = io::Error::new(io::ErrorKind::Interrupted, why);
                    return Err(lost(&ended, written, monitor));
                }
            },
            Ok(n) => n as u64,
            // the connection ended while the input was idle
            Err(e) if conn.close_reason().is_some() => return Err(lost(&e, written, monitor)),
            Err(e) => {
                conn.abort(1, "the sender could not read its input");
                monitor.finish();
                return Err(Failure::io(format!("cannot read {name}"), &e));
            }
        };
        // handed to the connection whole (no copy), which hands back an empty buffer with
        // the memory of one it no longer needs: the next read's
        if let Err(e) = conn.write_buf(&mut buf) {
            return Err(lost(&e, written, monitor));
        }
        written += n;
        monitor.set(written);
    }
    if let Err(e) = conn.finish() {
        return Err(lost(&e, written, monitor));
    }
    // exit 0 only once the receiver acknowledged every byte and the end of the stream
    if let Err(e) = conn.wait_acknowledged(None) {
        return Err(lost(&e, written, monitor));
    }
    let seconds = start.elapsed().as_secs_f64();
    // The receiver ends its side of the connection once what arrived is written out (and
    // synced): until then its output can still fail (a full disk, a pipe whose reader died)
    // with data the transport acknowledged, and that must not end in an exit 0 here.
    let mut nothing = [0u8; 1];
    loop {
        match (&*conn).read(&mut nothing) {
            Ok(0) => break,
            // nothing is expected back; what comes is let go
            Ok(_) => continue,
            Err(e) => return Err(lost(&e, written, monitor)),
        }
    }
    net::linger(&conn, net::LINGER);
    let events = monitor.finish();
    // an interrupt in the last steps aborted the connection: exit as interrupted, not with
    // the abort blamed on the receiver
    if let Some(signal) = interrupt::caught() {
        return Err(interrupt::failure(
            signal,
            &format!("after all {written} bytes were delivered"),
        ));
    }
    // every byte was acknowledged, but a receiver that then aborts (e.g. `ri2n serve`, which
    // takes only benchmark clients) or vanishes did not take the data
    if let Some(reason) = conn.close_reason() {
        return Err(Failure::new(
            crate::error::LOST,
            format!(
                "the receiver acknowledged all {written} bytes but did not end the transfer \
                 cleanly: {reason}"
            ),
        ));
    }

    crate::report::warn_links_never_up(&conn.stats().links, args.quiet);
    let summary = TransferSummary {
        command: "send",
        bytes: written,
        seconds,
        goodput_bps: bps(written, seconds),
        checksum: sum.map(|s| s.hex()),
        encryption: crate::report::encryption(&conn.stats()),
        send_threads: endpoint.send_threads(),
        recv_threads: endpoint.recv_threads(),
        links: LinkSummary::all(&conn.stats().links, false),
        link_events: events.events,
        dropped: crate::report::dropped(&endpoint.dropped_datagrams()),
        send_limits: crate::report::send_limits(&conn.stats()),
    };
    summary.emit(args.quiet, args.json)
}
