//! `ri2n recv`: accept one connection and write its byte stream to a file or stdout; exit 0
//! once the sender finished cleanly and everything is written, flushed and (for a file)
//! synced to disk.
//!
//! A regular output file is written as `FILE.partial` and renamed to `FILE` only on success,
//! so a transfer that fails or is interrupted never leaves a file that looks complete; the
//! error says how many bytes the partial file holds.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::checksum::Checksum;
use crate::error::{self, Failure};
use crate::fault::FaultPlan;
use crate::interrupt;
use crate::monitor::{Direction, Monitor};
use crate::net;
use crate::progress::Progress;
use crate::report::{bps, EventLog, LinkSummary, TransferSummary};
use crate::RecvArgs;

/// The output's buffer: it gathers small pieces, while the connection's whole 64 KiB blocks
/// (the default receive window's), larger than it, go straight to the output without being
/// copied into it.
const OUT_BUFFER: usize = 32 * 1024;

enum Output {
    /// A regular file written under a temporary name (`partial`), renamed to `path` at the end.
    File {
        w: BufWriter<File>,
        partial: PathBuf,
        path: PathBuf,
        /// Its permissions once complete, where those it was made with are not: those of
        /// the file it replaces, or a new file's for one an earlier run left.
        mode: Option<std::fs::Permissions>,
    },
    /// A device or pipe named by the user (`/dev/null`, a FIFO): written directly.
    Device(BufWriter<Counted<File>>, PathBuf),
    /// A FIFO that no reader had opened yet: opening it for writing would wait for one, so it
    /// is opened once a sender comes ([`Output::begin`]), and `--accept-timeout` and an
    /// interrupt still end the wait for a sender.
    Fifo(PathBuf),
    Stdout(BufWriter<Counted<io::StdoutLock<'static>>>),
}

/// A writer that counts the bytes its inner writer took: what went to a device or a pipe,
/// which a failed write's message tells (bytes still in the buffer never went).
struct Counted<W> {
    inner: W,
    taken: u64,
}

impl<W> Counted<W> {
    fn new(inner: W) -> Self {
        Self { inner, taken: 0 }
    }
}

impl<W: Write> Write for Counted<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.taken += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

impl Output {
    /// Opens `path` (`to_stdout`: it names stdout, see [`writes_stdout`]).
    fn open(path: Option<&PathBuf>, to_stdout: bool) -> Result<Self, Failure> {
        let path = path.filter(|_| !to_stdout);
        let Some(path) = path.filter(|p| p.as_os_str() != "-") else {
            net::enlarge_pipe(1);
            return Ok(Output::Stdout(BufWriter::with_capacity(
                OUT_BUFFER,
                Counted::new(io::stdout().lock()),
            )));
        };
        match std::fs::metadata(path).map(|m| m.file_type()) {
            Ok(t) if t.is_socket() => {
                return Err(Failure::new(
                    error::GENERIC,
                    format!(
                        "{} is a socket, which cannot be written as a file: give a file, a \
                         device, a FIFO or - (stdout)",
                        path.display()
                    ),
                ))
            }
            Ok(t) if !t.is_file() => return Output::open_special(path, t.is_fifo()),
            _ => {}
        }
        // `DIR/` that does not exist (yet): the name would lose its slash (`DIR.partial`),
        // and the transfer fail only at its end, when the file cannot take that name
        if path.as_os_str().as_encoded_bytes().ends_with(b"/") {
            return Err(Failure::new(
                error::GENERIC,
                format!(
                    "cannot create {}: it names a directory (it ends with /), and none is \
                     there: give the file's path",
                    path.display()
                ),
            ));
        }
        // a link to a file: the file it points to is replaced, not the link (written beside
        // that file, in its directory); created there when the link dangles, as `cp` does
        let path = ri2n::follow_links(path)
            .map_err(|e| Failure::io(format!("cannot follow {}", path.display()), &e))?;
        let partial = partial_name(&path);
        // a file this one replaces keeps its owner and permissions, as `cp` (writing into
        // it) keeps them, and what arrives is no more readable meanwhile: a private file
        // comes back private, and root receiving into a user's file leaves it theirs. A new
        // file has what the umask gives, also when it takes over a partial file an earlier
        // run left with other permissions. Its owner may write it until it is complete: a
        // read-only one left by a failed transfer could not be taken over by the next
        // receiver of the same user
        use std::os::unix::fs::PermissionsExt;
        let old = std::fs::metadata(&path).ok().filter(|m| m.is_file());
        let (f, made) = create_partial(&partial, old.as_ref())?;
        let writable = |mode: u32| std::fs::Permissions::from_mode(mode | 0o200);
        let cannot =
            |e: io::Error| Failure::io(format!("cannot set the mode of {}", partial.display()), &e);
        let mode = match &old {
            Some(old) => {
                let mode = old.permissions().mode();
                (keep_owner(&f, old).and_then(|()| f.set_permissions(writable(mode))))
                    .map_err(cannot)?;
                Some(mode)
            }
            // made as every new file is (on a file system without permissions too)
            None if made => None,
            None => {
                let mode = new_file_mode();
                match f.set_permissions(writable(mode)) {
                    Ok(()) => Some(mode),
                    // its own file: a file system without permissions (vfat) keeps its own
                    Err(e) if e.kind() == io::ErrorKind::PermissionDenied => None,
                    Err(e) => return Err(cannot(e)),
                }
            }
        };
        Ok(Output::File {
            w: BufWriter::with_capacity(OUT_BUFFER, f),
            partial,
            path,
            mode: mode.map(std::fs::Permissions::from_mode),
        })
    }

    /// Opens a device or FIFO (`fifo`) without waiting for a FIFO's reader (its permissions
    /// are checked all the same); a FIFO without one is opened when a sender comes.
    fn open_special(path: &Path, fifo: bool) -> Result<Self, Failure> {
        use std::os::unix::fs::OpenOptionsExt;
        let fail = |e: &io::Error| Failure::io(format!("cannot open {}", path.display()), e);
        let opened = File::options()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(path);
        let f = match opened {
            // a FIFO that nothing reads yet (a device without its hardware says the same)
            Err(e) if fifo && e.raw_os_error() == Some(libc::ENXIO) => {
                return Ok(Output::Fifo(path.to_path_buf()))
            }
            r => r.map_err(|e| fail(&e))?,
        };
        // writes block as usual from here
        // SAFETY: fcntl on a descriptor this function owns; no memory is passed
        if unsafe { libc::fcntl(f.as_raw_fd(), libc::F_SETFL, 0) } != 0 {
            return Err(fail(&io::Error::last_os_error()));
        }
        Ok(Output::Device(
            BufWriter::with_capacity(OUT_BUFFER, Counted::new(f)),
            path.to_path_buf(),
        ))
    }

    /// Where the data goes; only once [`Output::begin`] has succeeded.
    fn writer(&mut self) -> &mut dyn Write {
        match self {
            Output::File { w, .. } => w,
            Output::Device(w, _) => w,
            Output::Stdout(w) => w,
            Output::Fifo(_) => unreachable!("a FIFO is opened when the sender comes (begin)"),
        }
    }

    /// Hands buffered bytes to the output, for a report of what it holds; errors are the
    /// report's to tell.
    fn flush(&mut self) {
        if !matches!(self, Output::Fifo(_)) {
            let _ = self.writer().flush();
        }
    }

    fn name(&self) -> String {
        match self {
            Output::File { partial, .. } => partial.display().to_string(),
            Output::Device(_, p) | Output::Fifo(p) => p.display().to_string(),
            Output::Stdout(_) => "stdout".into(),
        }
    }

    /// The name the output has once complete.
    fn final_name(&self) -> String {
        match self {
            Output::File { path, .. } | Output::Device(_, path) | Output::Fifo(path) => {
                path.display().to_string()
            }
            Output::Stdout(_) => "stdout".into(),
        }
    }

    /// Where the bytes received so far are, for a failure message.
    fn kept(&mut self, bytes: u64) -> String {
        self.flush();
        match self {
            Output::File { partial, .. } => {
                format!(
                    "{bytes} bytes received, kept in {} (incomplete)",
                    partial.display()
                )
            }
            Output::Device(_, p) | Output::Fifo(p) => {
                format!("{bytes} bytes received, written to {}", p.display())
            }
            Output::Stdout(_) => format!("{bytes} bytes received, written to stdout"),
        }
    }

    /// A sender came: a `FILE.partial` that an earlier receiver left is emptied for this
    /// transfer, and a FIFO is opened once a reader has it open. `gone` says why to stop
    /// waiting for that reader (the connection ended, an interrupt).
    fn begin(&mut self, gone: &dyn Fn() -> Option<Failure>) -> Result<(), Failure> {
        match self {
            Output::File { w, partial, .. } => (w.get_ref().set_len(0))
                .map_err(|e| Failure::io(format!("cannot empty {}", partial.display()), &e)),
            Output::Fifo(path) => {
                let f = open_fifo_for_reader(path, gone)?;
                let w = BufWriter::with_capacity(OUT_BUFFER, Counted::new(f));
                *self = Output::Device(w, path.clone());
                Ok(())
            }
            Output::Device(..) | Output::Stdout(_) => Ok(()),
        }
    }

    /// A regular file's `FILE.partial`, where what arrives is written until it is complete.
    fn partial(&self) -> Option<&Path> {
        match self {
            Output::File { partial, .. } => Some(partial),
            _ => None,
        }
    }

    /// Removes a regular file's `FILE.partial` while it holds nothing: a receiver that never
    /// got a sender leaves no file behind.
    fn discard_empty(self) {
        if let Output::File { w, partial, .. } = self {
            // removed while still locked: a receiver that opens the name meanwhile is
            // refused, not left writing a file that no longer has a name
            let empty = w.get_ref().metadata().is_ok_and(|m| m.len() == 0);
            if empty && w.buffer().is_empty() {
                let _ = std::fs::remove_file(&partial);
            }
            drop(w);
        }
    }

    /// What the output holds after a failed write, in words: a regular file's size on disk
    /// (what a full disk let through), else how much went to it (`handed`: how much was
    /// handed to the file's buffer, where its size cannot be read).
    fn holds(&mut self, handed: u64) -> String {
        self.flush();
        let went = match self {
            Output::File { partial, .. } => match std::fs::metadata(partial) {
                Ok(m) => return format!("it holds the first {} bytes", m.len()),
                Err(_) => handed,
            },
            Output::Device(w, _) => w.get_ref().taken,
            Output::Stdout(w) => w.get_ref().taken,
            Output::Fifo(_) => 0,
        };
        format!("{went} bytes went to it before")
    }

    /// Flushes, syncs a regular file to disk and gives it its final name (that synced too).
    fn complete(self) -> io::Result<()> {
        match self {
            Output::File {
                w,
                partial,
                path,
                mode,
            } => {
                let f = w.into_inner().map_err(|e| e.into_error())?;
                if let Some(mode) = mode {
                    f.set_permissions(mode)?;
                }
                f.sync_all()?;
                std::fs::rename(&partial, &path)?;
                // the new name is on disk only once its directory is; one this process may
                // write but not read (a drop box) cannot be opened to sync, and the file has
                // its name all the same
                let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
                match File::open(dir.unwrap_or(Path::new("."))) {
                    Ok(dir) => dir.sync_all(),
                    Err(e) if e.kind() == io::ErrorKind::PermissionDenied => Ok(()),
                    Err(e) => Err(e),
                }
            }
            Output::Device(w, _) => w.into_inner().map(drop).map_err(|e| e.into_error()),
            Output::Fifo(_) => Ok(()),
            Output::Stdout(mut w) => w.flush(),
        }
    }
}

/// `FILE.partial`: FILE's name and `.partial`, the name cut short where both would pass the
/// longest file name (255 bytes).
fn partial_name(path: &Path) -> PathBuf {
    use std::os::unix::ffi::OsStrExt;
    const NAME_MAX: usize = 255;
    const SUFFIX: &str = ".partial";
    let name = path.file_name().map_or(&[][..], |n| n.as_bytes());
    let mut partial = name[..name.len().min(NAME_MAX - SUFFIX.len())].to_vec();
    partial.extend_from_slice(SUFFIX.as_bytes());
    path.with_file_name(std::ffi::OsStr::from_bytes(&partial))
}

/// The permissions a file this process creates gets: 0666 less the umask.
fn new_file_mode() -> u32 {
    // umask(2) only sets it: read by setting a narrower one for a moment (a file another
    // thread makes in that moment is only the more private)
    // SAFETY: umask has no preconditions and cannot fail
    let umask = unsafe { libc::umask(0o077) };
    // SAFETY: as above
    unsafe { libc::umask(umask) };
    0o666 & !umask
}

/// Gives `f` the owner and group of `old`, the file it will replace. Only root may give a
/// file away, and a user may give it only a group of theirs: where the change is not this
/// process's to make, `f` stays its own, as any file it creates.
fn keep_owner(f: &File, old: &std::fs::Metadata) -> io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    match std::os::unix::fs::fchown(f, Some(old.uid()), Some(old.gid())) {
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => Ok(()),
        r => r,
    }
}

/// Creates `partial` for writing (and says so: `true`), or takes a file left there by an
/// earlier run (emptied once a sender comes), only while no other process writes it: two
/// receivers given the same `--output` (on other ports) would otherwise write into one file,
/// each finishing with the other's bytes mixed in. The lock (`flock`) goes with the open
/// file, so it ends with the process however that ends, and a file an interrupted run left
/// is taken over. The file locked must still be the one the name holds: a receiver that
/// finished meanwhile renamed its file to FILE, and writing on into it would spoil that
/// complete file.
///
/// Where it replaces a file (`old`), it is made readable by its owner alone, until
/// [`Output::open`] has given it that file's owner and permissions: in a setgid directory it
/// is made with the directory's group, and a member of that group who opened it in between
/// could read all that arrives.
///
/// A `partial` that is a symbolic link, or a file with other names, is refused rather than
/// emptied: in a directory others can write (`/tmp`), either would let them point a receiver,
/// root's too, at a file of their choice, which it would empty and fill. So is one that
/// belongs to another user than this process's and `old`'s owner: they could have opened it
/// beforehand, and read or change through that all that arrives.
fn create_partial(
    partial: &Path,
    old: Option<&std::fs::Metadata>,
) -> Result<(File, bool), Failure> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let context = || format!("cannot create {}", partial.display());
    let open = |make: bool| {
        File::options()
            .write(true)
            .create_new(make)
            .mode(if old.is_some() { 0o600 } else { 0o666 })
            // a FIFO left under the name must not hold the receiver in its open
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(partial)
    };
    // made, else taken (it was there), else made again (it went in between), once
    let mut opened = open(true).map(|f| (f, true));
    for _ in 0..2 {
        opened = match opened {
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => open(false).map(|f| (f, false)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => open(true).map(|f| (f, true)),
            r => r,
        };
    }
    let not_ours = |what: &str| {
        Failure::new(
            error::GENERIC,
            format!(
                "{} {what}: not writing through it; remove it, or give another --output",
                partial.display()
            ),
        )
    };
    let (f, made) = match opened {
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(not_ours("is a symbolic link"))
        }
        r => r.map_err(|e| Failure::io(context(), &e))?,
    };
    let meta = f.metadata().map_err(|e| Failure::io(context(), &e))?;
    if !meta.is_file() {
        return Err(not_ours("is not a regular file"));
    }
    if meta.nlink() > 1 {
        return Err(not_ours("has other names (hard links)"));
    }
    // SAFETY: geteuid has no preconditions
    let me = unsafe { libc::geteuid() };
    if meta.uid() != me && old.is_none_or(|o| o.uid() != meta.uid()) {
        return Err(not_ours(&format!(
            "belongs to another user (uid {})",
            meta.uid()
        )));
    }
    // writes block as usual from here
    // SAFETY: fcntl on a descriptor this function owns; no memory is passed
    unsafe { libc::fcntl(f.as_raw_fd(), libc::F_SETFL, 0) };
    // SAFETY: flock on a descriptor this function owns; no memory is passed
    let locked = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0;
    // a file system without locks (ENOLCK, EOPNOTSUPP) is written as before locks were taken
    if !locked && io::Error::last_os_error().kind() == io::ErrorKind::WouldBlock {
        return Err(Failure::new(
            error::GENERIC,
            format!(
                "{} is being written by another process (another ri2n recv with this \
                 --output?): give this one another --output",
                partial.display()
            ),
        ));
    }
    let named = std::fs::symlink_metadata(partial).ok();
    if named.is_none_or(|n| (n.dev(), n.ino()) != (meta.dev(), meta.ino())) {
        return Err(Failure::new(
            error::GENERIC,
            format!(
                "{} was renamed or replaced while this recv opened it (another recv with \
                 this --output finishing?): try again",
                partial.display()
            ),
        ));
    }
    // emptied only once a sender comes (`Output::begin`): a receiver that gets none leaves
    // what an earlier one kept
    Ok((f, made))
}

/// Whether the data goes to stdout: `--output -` (or none), or a name for the very file
/// stdout is (`/dev/stdout`, `/dev/fd/1`, the file stdout was redirected to). Not when that
/// file is `/dev/null`: data thrown away cannot mix with the summary (`--output /dev/null`
/// from a script whose own stdout goes there too, as the benchmarks run it).
pub fn writes_stdout(args: &RecvArgs) -> bool {
    use std::os::fd::AsFd;
    use std::os::unix::fs::MetadataExt;
    let Some(path) = args.output.as_ref().filter(|p| p.as_os_str() != "-") else {
        return true;
    };
    let id = |m: &std::fs::Metadata| (m.dev(), m.ino());
    let out = io::stdout().as_fd().try_clone_to_owned().map(File::from);
    let null = std::fs::metadata("/dev/null").ok().map(|m| id(&m));
    match (std::fs::metadata(path), out.and_then(|f| f.metadata())) {
        (Ok(a), Ok(b)) => id(&a) == id(&b) && Some(id(&a)) != null,
        _ => false,
    }
}

pub fn run(args: &RecvArgs) -> Result<(), Failure> {
    let to_stdout = writes_stdout(args);
    if args.json && to_stdout {
        return Err(Failure::usage(
            "--json prints its summary on stdout, which would carry the data: write the data \
             to a file (--output FILE) or leave --json out",
        ));
    }
    interrupt::install();
    // everything that can fail before a sender comes is done before the output is touched:
    // a FILE.partial that an earlier run left (what arrived before it failed) stays as it
    // was when this one cannot start (a wrong key, a port in use: another recv on it)
    // one transfer: a second sender is refused at once (the server is full), not taken
    // into a connection nobody reads until the first ends
    let endpoint = net::server_endpoint_with(
        &args.listen,
        &args.key,
        args.link.all_links_down_timeout,
        net::Application::File,
        |cfg| cfg.with_max_connections(1),
    )?;
    // also while the transfer runs: a second sender with another key learns why it was
    // refused, and so does the operator here
    let refusals = net::RefusalLog::start(&endpoint, "ri2n recv");
    let result = receive(args, &endpoint, to_stdout);
    net::close_after_failure(&endpoint, &result);
    drop(refusals);
    result
}

/// The transfer of [`run`] on `endpoint`: waits for the sender, writes what it sends.
fn receive(args: &RecvArgs, endpoint: &ri2n::Endpoint, to_stdout: bool) -> Result<(), Failure> {
    let faults = FaultPlan::new(endpoint, &args.link.fault)?;
    let mut output = Output::open(args.output.as_ref(), to_stdout)?;
    if let Output::File { partial, .. } = &output {
        interrupt::remove_on_interrupt(partial.clone());
    }
    // also where stderr is no terminal: a script that gave port 0 learns the port so
    if !args.quiet {
        say!(
            "ri2n: listening on {}",
            error::list(&endpoint.local_addrs())
        );
    }
    let (conn, monitor, start) = match accept(args, endpoint, faults) {
        Ok(started) => started,
        Err(f) => {
            output.discard_empty();
            return Err(f);
        }
    };
    // a FIFO's reader is awaited only while the sender is there and no interrupt came
    let output_name = output.name();
    let gone = || {
        let waited = format!("while {output_name} had no reader (nothing written)");
        if let Some(signal) = interrupt::caught() {
            return Some(interrupt::failure(signal, &waited));
        }
        let reason = conn.close_reason()?;
        Some(Failure::new(
            error::LOST,
            format!("connection lost: {reason}; {waited}"),
        ))
    };
    if let Err(f) = output.begin(&gone) {
        conn.abort(
            1,
            &format!("the receiver could not ready its output: {}", f.message),
        );
        monitor.finish();
        return Err(f);
    }

    let mut sum = (!args.no_checksum).then(Checksum::default);
    // the connection's receive blocks come over as they are (no copy), and this one's memory
    // goes back for later ones
    let mut chunk = ri2n::Bytes::new();
    let mut got = 0u64;
    loop {
        let n = match conn.read_chunk(&mut chunk) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) => {
                monitor.finish();
                let kept = output.kept(got);
                if let Some(signal) = interrupt::caught() {
                    return Err(interrupt::failure(signal, &format!("after {kept}")));
                }
                let cause = conn
                    .close_reason()
                    .map_or_else(|| e.to_string(), |r| r.to_string());
                return Err(Failure::new(
                    error::LOST,
                    format!("connection lost: {cause}; {kept}"),
                ));
            }
        };
        if let Err(e) = output.writer().write_all(&chunk) {
            // the sender has more acknowledged than this: say what is really in the output
            let holds = output.holds(got);
            conn.abort(
                1,
                &format!("the receiver could not write its output ({e}); {holds}"),
            );
            monitor.finish();
            return Err(Failure::io(
                format!("cannot write to {} ({holds})", output.name()),
                &e,
            ));
        }
        if let Some(sum) = &mut sum {
            sum.update(&chunk);
        }
        got += n as u64;
        monitor.set(got);
    }
    let seconds = start.elapsed().as_secs_f64();
    let name = output.name();
    let complete = format!("with all {got} bytes written to {}", output.final_name());
    let partial = output.partial().map(Path::to_path_buf);
    if let Err(e) = output.complete() {
        // the sender waits for our end of the stream: it must learn that none comes, and why
        conn.abort(
            1,
            &format!("the receiver could not complete its output {name} ({e})"),
        );
        monitor.finish();
        // as after a failed write, what the partial file holds (a full disk took less than
        // arrived; a failed rename, all of it)
        let holds = (partial.as_deref())
            .and_then(|p| Some((p, std::fs::metadata(p).ok()?.len())))
            .map_or(String::new(), |(p, len)| {
                format!(
                    "; {} holds the first {len} of the {got} bytes received",
                    p.display()
                )
            });
        let mut failure = Failure::io(format!("cannot complete {name}"), &e);
        failure.message.push_str(&holds);
        return Err(failure);
    }
    // our side ends only now, with the output complete: the sender waits for this before it
    // reports success, so a failure of the output until here reached it as an abort
    // an interrupt in the last steps (a long sync) aborts the connection: exit as
    // interrupted, with the output complete, not as a lost connection or a success
    let interrupted = |signal| interrupt::failure(signal, &complete);
    // a finish that fails loses nothing: everything arrived, up to the sender's end of
    // stream, and the output is complete; the sender ended the connection since (one that
    // does not wait for this end, as `ri2n send` does), or an interrupt did (told below)
    if conn.finish().is_ok() {
        net::linger(&conn, net::LINGER);
    }
    let events = monitor.finish();
    if let Some(signal) = interrupt::caught() {
        return Err(interrupted(signal));
    }

    crate::report::warn_links_never_up(&conn.stats().links, args.quiet);
    let summary = TransferSummary {
        command: "recv",
        bytes: got,
        seconds,
        goodput_bps: bps(got, seconds),
        checksum: sum.map(|s| s.hex()),
        encryption: crate::report::encryption(&conn.stats()),
        send_threads: endpoint.send_threads(),
        recv_threads: endpoint.recv_threads(),
        links: LinkSummary::all(&conn.stats().links, true),
        link_events: events.events,
        dropped: crate::report::dropped(&endpoint.dropped_datagrams()),
        send_limits: None,
    };
    summary.emit(args.quiet, args.json)
}

/// How often a FIFO's open is tried while no reader has it.
const FIFO_READER_POLL: Duration = Duration::from_millis(20);

/// Opens the FIFO `path` for writing once a reader has it open. A blocking open would wait
/// inside `open()`, where a sender that gave up could never end the wait: it is tried without
/// blocking until it succeeds or `gone` names a reason to stop.
fn open_fifo_for_reader(path: &Path, gone: &dyn Fn() -> Option<Failure>) -> Result<File, Failure> {
    use std::os::unix::fs::OpenOptionsExt;
    let fail = |e: &io::Error| Failure::io(format!("cannot open {}", path.display()), e);
    loop {
        let opened = File::options()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(path);
        match opened {
            Ok(f) => {
                // writes block as usual from here
                // SAFETY: fcntl on a descriptor this function owns; no memory is passed
                if unsafe { libc::fcntl(f.as_raw_fd(), libc::F_SETFL, 0) } != 0 {
                    return Err(fail(&io::Error::last_os_error()));
                }
                return Ok(f);
            }
            // no reader yet
            Err(e) if e.raw_os_error() == Some(libc::ENXIO) => {
                if let Some(why) = gone() {
                    return Err(why);
                }
                std::thread::sleep(FIFO_READER_POLL);
            }
            Err(e) => return Err(fail(&e)),
        }
    }
}

/// Waits for the sender (at most `--accept-timeout`) and starts receiving from it: its
/// connection, the monitor of its progress and events, and when it began.
fn accept(
    args: &RecvArgs,
    endpoint: &ri2n::Endpoint,
    faults: FaultPlan,
) -> Result<(Arc<ri2n::Connection>, Monitor, Instant), Failure> {
    let accepted = (endpoint.accept_timeout(args.accept_timeout))
        .map_err(|e| Failure::endpoint(e, &[], Duration::ZERO))?;
    let Some(conn) = accepted else {
        return Err(Failure::new(
            error::CONNECT,
            format!(
                "no sender connected within {:.1} s",
                args.accept_timeout.unwrap_or_default().as_secs_f64()
            ),
        ));
    };
    let conn = Arc::new(conn);
    interrupt::abort_on_interrupt(conn.clone());
    let start = Instant::now();
    faults.start(start, !args.quiet);
    let monitor = Monitor::start(
        conn.clone(),
        Direction::Receiving,
        Progress::new(!args.quiet, "received", None),
        EventLog::new(start, !args.quiet),
    )?;
    Ok((conn, monitor, start))
}
