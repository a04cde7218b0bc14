//! The cluster key: `ri2n keygen`, `--key FILE` / `RI2N_KEY_FILE`, and the warning that a
//! channel without a key is neither authenticated nor encrypted.

use std::fs;
use std::io::{self, Write};
use std::net::SocketAddr;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use ri2n::Key;

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
    let mut options = fs::OpenOptions::new();
    // created with mode 0600 (the umask can only narrow it): never readable by others, not
    // even for a moment
    options.write(true).mode(0o600);
    if args.force {
        options.create(true).truncate(true);
    } else {
        options.create_new(true);
    }
    let mut file = options.open(path).map_err(|e| {
        if e.kind() == io::ErrorKind::AlreadyExists {
            Failure::new(
                GENERIC,
                format!(
                    "{} exists: not replaced (every host of the cluster holds that key; \
                     --force replaces it)",
                    path.display()
                ),
            )
        } else {
            Failure::io(format!("cannot create {}", path.display()), &e)
        }
    })?;
    // a replaced file keeps its old mode: make sure it is private too
    file.set_permissions(fs::Permissions::from_mode(0o600))
        .and_then(|()| file.write_all(line.as_bytes()))
        .and_then(|()| file.sync_all())
        .map_err(|e| Failure::io(format!("writing {}", path.display()), &e))
}

/// The key `--key` (or `RI2N_KEY_FILE`) names, if any.
pub fn load(opts: &ChannelOpts) -> Result<Option<Key>, Failure> {
    let Some(path) = &opts.key else {
        return Ok(None);
    };
    read(path).map(Some)
}

fn read(path: &Path) -> Result<Key, Failure> {
    let text = fs::read_to_string(path).map_err(|e| {
        Failure::new(
            USAGE,
            format!("cannot read the key file {}: {e}", path.display()),
        )
    })?;
    let key = Key::from_text(&text)
        .map_err(|e| Failure::new(USAGE, format!("{}: {e}", path.display())))?;
    if let Ok(meta) = fs::metadata(path) {
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            eprintln!(
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
        eprintln!(
            "ri2n: warning: no key (--key FILE or RI2N_KEY_FILE): the channel over {} is \
             neither authenticated nor encrypted; `ri2n keygen` makes a key for every host",
            a.ip()
        );
    }
}
