//! The cluster key: `ri2n keygen`, `--key FILE` / `RI2N_KEY_FILE`, and the warning that a
//! channel without a key is neither authenticated nor encrypted.

use std::fs;
use std::io::{self, Write};
use std::net::SocketAddr;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use ri2n::{Key, KeyReadError};

use crate::error::{Failure, GENERIC, USAGE};
use crate::{ChannelOpts, KeygenArgs};

/// `ri2n keygen`: a new random key, on stdout or in a new file of mode 0600.
pub fn keygen(args: &KeygenArgs) -> Result<(), Failure> {
    let key = Key::generate().map_err(|e| Failure::new(GENERIC, e.to_string()))?;
    let mut line = key.to_text();
    line.push('\n');
    let Some(path) = &args.output else {
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
    // a key file that exists is kept unless --force says to replace it
    if !args.force && fs::symlink_metadata(path).is_ok() {
        return Err(exists(path));
    }
    // --force on a link to the key replaces the key the link points to, not the link
    let target = match fs::canonicalize(path) {
        Ok(real) if args.force => real,
        _ => path.clone(),
    };
    // the key is written in full to a file of its own beside the target, then put in place
    // in one step: a write that fails (disk full, a file size limit) leaves the old key as it
    // was, or no file at all, never an empty or half-written key on every later start
    let temp = write_beside(&target, line.as_bytes())?;
    let placed = if args.force {
        fs::rename(&temp, &target)
    } else {
        // a hard link is made only where no file is: a file that appeared meanwhile is kept
        fs::hard_link(&temp, &target)
    };
    let _ = fs::remove_file(&temp);
    placed.map_err(|e| {
        if e.kind() == io::ErrorKind::AlreadyExists {
            exists(path)
        } else {
            Failure::io(format!("cannot create {}", path.display()), &e)
        }
    })?;
    // the new name is on disk only once its directory is
    if let Some(dir) = target.parent().filter(|d| !d.as_os_str().is_empty()) {
        fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| Failure::io(format!("syncing {}", dir.display()), &e))?;
    }
    Ok(())
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

/// Writes `data` to a new private file beside `target` (same directory, so that it can be
/// renamed or linked to `target`) and returns its name; removes it again if the write fails.
fn write_beside(target: &Path, data: &[u8]) -> Result<std::path::PathBuf, Failure> {
    let name = target.file_name().unwrap_or_default().to_string_lossy();
    let temp = target.with_file_name(format!(".{name}.{}.new", std::process::id()));
    // created with mode 0600 (the umask can only narrow it): never readable by others, not
    // even for a moment
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&temp)
        .map_err(|e| Failure::io(format!("cannot create {}", temp.display()), &e))?;
    let written = file.write_all(data).and_then(|()| file.sync_all());
    if let Err(e) = written {
        let _ = fs::remove_file(&temp);
        return Err(Failure::io(format!("writing {}", target.display()), &e));
    }
    Ok(temp)
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
        if mode & 0o077 != 0 {
            say!(
                "ri2n: warning: the key file {} can be read by other users (mode {mode:04o}); \
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
    let exposed = addrs.iter().find(|a| !a.ip().is_loopback());
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
