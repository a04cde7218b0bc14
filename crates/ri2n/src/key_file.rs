//! Key files written whole or not at all, private from the first byte: the one way `ri2n
//! keygen`, the C library and the Python package write a cluster key.

use std::ffi::{CString, OsStr, OsString};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::Key;

/// The longest file name Linux's file systems take, in bytes.
const NAME_MAX: usize = 255;

/// Writes `key` to `path` as one line (`ri2n-key-v1:` and 64 hexadecimal digits).
///
/// The key is written and synced to a new file beside `path`, created with mode 0600 (the
/// umask can only narrow it: never readable by others, not even for a moment), and then put
/// in place in one step: renamed over `path` if `replace`, else renamed (or linked) where no
/// file is (`AlreadyExists` if one is). So a write that fails (a full disk, a file size
/// limit) leaves the old key as it was, or no file, never an empty or half-written key that
/// every later start would refuse. The directory is synced last, so the new name is on disk too.
///
/// When replacing, a symbolic link at `path` keeps pointing where it did and the file it
/// names is replaced (created, where the link dangles), as far as [`follow_links`] follows
/// it; only a regular file is replaced (`InvalidInput` for a device, a pipe, a directory).
pub fn write_key_file(key: &Key, path: &Path, replace: bool) -> io::Result<()> {
    let target = match replace {
        true => follow_links(path)?,
        false => path.to_owned(),
    };
    // what the links lead to, and what the kernel's own lookup finds (a link of /proc names
    // no file, `/dev/stdout` a pipe)
    let found = [fs::symlink_metadata(&target), fs::metadata(path)];
    if replace && found.iter().flatten().any(|m| !m.is_file()) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a regular file: a key file takes its place only where a file was",
        ));
    }
    let name = target.file_name().ok_or_else(|| {
        io::Error::new(io::ErrorKind::InvalidInput, "a key file needs a file name")
    })?;
    let (temp, mut file) = create_beside(&target, name)?;
    let mut line = key.to_text();
    line.push('\n');
    let placed = (file.write_all(line.as_bytes()))
        .and_then(|()| file.sync_all())
        .and_then(|()| match replace {
            true => fs::rename(&temp, &target),
            false => place_new(&temp, &target),
        });
    // gone already once renamed
    let _ = fs::remove_file(&temp);
    placed?;
    let dir = target.parent().filter(|d| !d.as_os_str().is_empty());
    // a directory this process may write but not read (a drop box) cannot be opened to sync
    match File::open(dir.unwrap_or(Path::new("."))) {
        Ok(dir) => dir.sync_all(),
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => Ok(()),
        Err(e) => Err(e),
    }
}

/// Gives `temp` the name `target` where no file has it (`AlreadyExists` where one does), in
/// one step: a rename that replaces nothing, or, on a file system without that rename (NFS),
/// a hard link (`temp` is removed by the caller). A file system without hard links (vfat and
/// exFAT, as USB sticks carry) has that rename.
fn place_new(temp: &Path, target: &Path) -> io::Result<()> {
    let c_path = |p: &Path| {
        CString::new(p.as_os_str().as_bytes())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a path with a NUL byte"))
    };
    let (from, to) = (c_path(temp)?, c_path(target)?);
    // SAFETY: two NUL-terminated paths that outlive the call
    let renamed = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            from.as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    if renamed == 0 {
        return Ok(());
    }
    match io::Error::last_os_error() {
        e if matches!(e.raw_os_error(), Some(libc::EINVAL | libc::ENOSYS)) => {
            fs::hard_link(temp, target)
        }
        e => Err(e),
    }
}

/// A new private file beside `target` (whose file name is `name`), hidden, and as short as a
/// file name must be whatever `name`'s length: its start names the key it holds, a random
/// part keeps it apart from any other, a file an interrupted write left under another
/// process's name included (a process in a container has the same ID at every start).
fn create_beside(target: &Path, name: &OsStr) -> io::Result<(PathBuf, File)> {
    // a name that is taken is tried again with another random part, a few times: one left
    // over is found once, names taken on purpose in a directory others write are an error
    const TRIES: usize = 8;
    for _ in 0..TRIES {
        let unique = format!(".{:016x}.new", rand::random::<u64>());
        let mut temp_name = OsString::from(".");
        let kept = name.len().min(NAME_MAX - 1 - unique.len());
        temp_name.push(OsStr::from_bytes(&name.as_bytes()[..kept]));
        temp_name.push(unique);
        let temp = target.with_file_name(temp_name);
        let created = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&temp);
        match created {
            Ok(file) => return Ok((temp, file)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
    // not AlreadyExists: that says the key file itself exists
    Err(io::Error::other(format!(
        "no free name for a new file beside it ({TRIES} random names taken)"
    )))
}

/// The name `path`'s chain of symbolic links ends at, whether a file has that name or not
/// (`path` itself when it is no link): where a file written in place of `path`'s goes.
/// Relative targets are taken from the link's directory. A link is followed only where the
/// kernel's `protected_symlinks` rule (see `proc_sys_fs(5)`) lets a lookup follow it: this
/// walk reads the links itself, and the kernel's check would not run. So a link another user
/// put in `/tmp` cannot point a writer, root included, at a file of their choice
/// (`PermissionDenied`).
pub fn follow_links(path: &Path) -> io::Result<PathBuf> {
    // the kernel's own limit on links followed in one lookup
    const MAX_HOPS: usize = 40;
    let mut at = path.to_path_buf();
    for _ in 0..MAX_HOPS {
        let Some(link) = fs::symlink_metadata(&at).ok().filter(|m| m.is_symlink()) else {
            return Ok(at);
        };
        refuse_foreign_link(&at, &link)?;
        let target = fs::read_link(&at)?;
        at = match at.parent() {
            Some(dir) if target.is_relative() => dir.join(target),
            _ => target,
        };
    }
    Err(io::Error::from_raw_os_error(libc::ELOOP))
}

/// The `protected_symlinks` rule: a link in a sticky directory others can write is followed
/// only by its owner, or when the directory's owner owns it.
fn refuse_foreign_link(at: &Path, link: &fs::Metadata) -> io::Result<()> {
    let dir = at.parent().filter(|d| !d.as_os_str().is_empty());
    let dir = fs::metadata(dir.unwrap_or(Path::new(".")))?;
    let shared = dir.mode() & (libc::S_ISVTX | libc::S_IWOTH) == (libc::S_ISVTX | libc::S_IWOTH);
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if shared && link.uid() != me && link.uid() != dir.uid() {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            "a symbolic link another user owns, in a directory others can write: not writing \
             through it",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = (fs::read_dir(dir).unwrap())
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    /// Written private, kept unless replacing, replaced through a link to it, and nothing
    /// else left in the directory.
    #[test]
    fn a_key_file_is_private_kept_or_replaced_whole() {
        let dir = std::env::temp_dir().join(format!("ri2n-key-file-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir(&dir).unwrap();
        let path = dir.join("cluster.key");
        let (first, second) = (Key::generate().unwrap(), Key::generate().unwrap());
        write_key_file(&first, &path, false).unwrap();
        let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let kept = write_key_file(&second, &path, false).unwrap_err();
        assert_eq!(kept.kind(), io::ErrorKind::AlreadyExists);
        assert_eq!(Key::read_from(File::open(&path).unwrap()).unwrap(), first);
        // a replaced file that others could read is private again
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        let link = dir.join("link.key");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        write_key_file(&second, &link, true).unwrap();
        assert!(fs::symlink_metadata(&link).unwrap().is_symlink());
        assert_eq!(Key::read_from(File::open(&path).unwrap()).unwrap(), second);
        let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(names(&dir), ["cluster.key", "link.key"]);
        fs::remove_dir_all(&dir).unwrap();
    }

    /// A name as long as a file name may be is written too. Before, the file beside took
    /// the whole name and some more, and the write failed (`File name too long`) for names
    /// over about 240 bytes.
    #[test]
    fn a_key_file_of_the_longest_name_is_written() {
        let dir = std::env::temp_dir().join(format!("ri2n-key-long-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir(&dir).unwrap();
        let name = "k".repeat(NAME_MAX);
        let path = dir.join(&name);
        let key = Key::generate().unwrap();
        write_key_file(&key, &path, false).unwrap();
        write_key_file(&key, &path, true).unwrap();
        assert_eq!(Key::read_from(File::open(&path).unwrap()).unwrap(), key);
        assert_eq!(names(&dir), [name]);
        fs::remove_dir_all(&dir).unwrap();
    }
}
