//! The cluster key: `ri2n keygen`, `--key FILE` / `RI2N_KEY_FILE`, and the warning that a
//! channel without a key is neither authenticated nor encrypted.

use std::fs;
use std::io::{self, Write};
use std::net::SocketAddr;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use ri2n::{Key, KeyReadError};

use crate::error::{Failure, GENERIC, USAGE};
use crate::{ChannelOpts, KeygenArgs};

/// Whether stdout is the null device (a key printed there is lost).
fn stdout_is_dev_null() -> bool {
    use std::os::fd::AsFd;
    use std::os::unix::fs::MetadataExt;
    let id = |m: fs::Metadata| (m.dev(), m.rdev(), m.ino());
    let out = io::stdout()
        .as_fd()
        .try_clone_to_owned()
        .map(fs::File::from);
    match (out.and_then(|f| f.metadata()), fs::metadata("/dev/null")) {
        (Ok(out), Ok(null)) => id(out) == id(null),
        _ => false,
    }
}

/// `ri2n keygen`: a new random key, on stdout or in a new file of mode 0600.
pub fn keygen(args: &KeygenArgs) -> Result<(), Failure> {
    let key = Key::generate().map_err(|e| Failure::new(GENERIC, e.to_string()))?;
    let Some(path) = &args.output else {
        // Rust opens /dev/null in place of a closed stdout: the key would be lost unseen
        if stdout_is_dev_null() {
            return Err(Failure::new(
                GENERIC,
                "stdout is /dev/null (or was closed): the key would be lost; write it to a \
                 file with --output FILE",
            ));
        }
        let mut line = key.to_text();
        line.push('\n');
        return io::stdout()
            .write_all(line.as_bytes())
            .map_err(|e| Failure::io("writing the key to stdout", &e));
    };
    // a fresh host has no /etc/ri2n yet: the directory is made private (0700), like the key
    if let Some(dir) = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty() && !d.exists())
    {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| {
                Failure::io(format!("cannot create the directory {}", dir.display()), &e)
            })?;
    }
    if path.is_dir() {
        return Err(Failure::new(
            GENERIC,
            format!(
                "{} is a directory: give the key file's path (such as {})",
                path.display(),
                path.join("cluster.key").display()
            ),
        ));
    }
    // a key file that exists is kept unless --force says to replace it (said before a key
    // is written beside it)
    if !args.force && fs::symlink_metadata(path).is_ok() {
        return Err(exists(path));
    }
    let written = uninterrupted(|| ri2n::write_key_file(&key, path, args.force));
    written.map_err(|e| match e.kind() {
        io::ErrorKind::AlreadyExists => exists(path),
        // the last step, syncing the directory, failed: the new key is in place all the same
        _ if holds(path, &key) => Failure::io(
            format!(
                "the key file {} holds the new key, but it may not survive a crash",
                path.display()
            ),
            &e,
        ),
        _ => Failure::io(format!("cannot write the key file {}", path.display()), &e),
    })
}

/// Runs `f` with SIGINT, SIGTERM and SIGHUP held back until it returns: a key file is
/// written whole and the file it was written to first removed, or neither, however soon the
/// interrupt comes. Without this, one that came while the disk synced left that file behind,
/// holding a key no host uses, under a new random name each time.
fn uninterrupted<T>(f: impl FnOnce() -> T) -> T {
    // SAFETY: signal sets of this function's own, filled before use; the mask is this
    // (the only) thread's, and set back as it was
    unsafe {
        let mut held: libc::sigset_t = std::mem::zeroed();
        let mut before: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut held);
        for signal in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            libc::sigaddset(&mut held, signal);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &held, &mut before);
        let r = f();
        libc::pthread_sigmask(libc::SIG_SETMASK, &before, std::ptr::null_mut());
        r
    }
}

/// Whether the file at `path` holds `key`.
fn holds(path: &Path, key: &Key) -> bool {
    use std::os::unix::fs::OpenOptionsExt;
    // never waits: a FIFO there opens at once without a writer, and is no key file
    let opened = (fs::OpenOptions::new().read(true))
        .custom_flags(libc::O_NONBLOCK)
        .open(path);
    let file = opened
        .ok()
        .filter(|f| f.metadata().is_ok_and(|m| m.is_file()));
    let found = file.and_then(|f| Key::read_from(&f).ok());
    found.is_some_and(|found| found.to_text() == key.to_text())
}

fn exists(path: &Path) -> Failure {
    Failure::new(
        GENERIC,
        format!(
            "{} exists: not replaced (every host of the cluster holds that key; --force \
             replaces it)",
            path.display()
        ),
    )
}

/// The key `--key` (or `RI2N_KEY_FILE`) names, if any.
pub fn load(opts: &ChannelOpts) -> Result<Option<Key>, Failure> {
    let Some(path) = &opts.key else {
        return Ok(None);
    };
    read(path).map(Some)
}

fn read(path: &Path) -> Result<Key, Failure> {
    let cannot = |e: io::Error| {
        // root without CAP_DAC_OVERRIDE, as under contrib/ri2n-tunnel.service, reads only
        // what its permissions let it: a key copied in by a user stays theirs
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        let hint = match (e.kind(), root) {
            (io::ErrorKind::PermissionDenied, true) => {
                " (this process is root without the capability to read others' files, as \
                 under the systemd unit: `chown root` the file)"
            }
            _ => "",
        };
        Failure::new(
            USAGE,
            format!("cannot read the key file {}: {e}{hint}", path.display()),
        )
    };
    let file = fs::File::open(path).map_err(cannot)?;
    let key = Key::read_from(&file).map_err(|e| match e {
        KeyReadError::Io(e) => cannot(e),
        e => Failure::new(USAGE, format!("{}: {e}", path.display())),
    })?;
    if let Ok(meta) = file.metadata() {
        let mode = meta.permissions().mode() & 0o777;
        // what the group and others may do: read the key, or put another in its place
        let may = match (mode & 0o044 != 0, mode & 0o022 != 0) {
            (true, true) => Some("read and change"),
            (true, false) => Some("read"),
            (false, true) => Some("change"),
            (false, false) => None,
        };
        if let Some(may) = may {
            say!(
                "ri2n: warning: other users can {may} the key file {} (mode {mode:04o}); \
                 `chmod 600` it",
                path.display()
            );
        }
    }
    Ok(key)
}

static WARNED: AtomicBool = AtomicBool::new(false);

/// Says once, on stderr, that a channel to or from a non-loopback address runs without a
/// key: neither authenticated nor encrypted.
pub fn warn_if_unprotected(key: &Option<Key>, addrs: &[SocketAddr]) {
    let exposed = addrs.iter().find(|a| !crate::net::is_loopback(a.ip()));
    if key.is_some() || WARNED.load(Ordering::Relaxed) {
        return;
    }
    if let Some(a) = exposed {
        WARNED.store(true, Ordering::Relaxed);
        say!(
            "ri2n: warning: no key (--key FILE or RI2N_KEY_FILE): the channel over {} is \
             neither authenticated nor encrypted; `ri2n keygen` makes a key for every host",
            a.ip()
        );
    }
}
