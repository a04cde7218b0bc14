//! Key files written whole or not at all, private from the first byte: the one way `ri2n
//! keygen`, the C library and the Python package write a cluster key.

use std::ffi::{OsStr, OsString};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::Key;

/// The longest file name Linux's file systems take, in bytes.
const NAME_MAX: usize = 255;

/// Writes `key` to `path` as one line (`ri2n-key-v1:` and 64 hexadecimal digits).
///
/// The key is written and synced to a new file beside `path`, created with mode 0600 (the
/// umask can only narrow it: never readable by others, not even for a moment), and then put
/// in place in one step: renamed over `path` if `replace` (a symbolic link at `path` keeps
/// pointing at the key it names, which is replaced), else linked where no file is
/// (`AlreadyExists` if one is). So a write that fails (a full disk, a file size limit) leaves
/// the old key as it was, or no file, never an empty or half-written key that every later
/// start would refuse. The directory is synced last, so the new name is on disk too.
pub fn write_key_file(key: &Key, path: &Path, replace: bool) -> io::Result<()> {
    // two writers in one process never share the file beside
    static WRITES: AtomicU64 = AtomicU64::new(0);
    let target = match fs::canonicalize(path) {
        Ok(real) if replace => real,
        _ => path.to_owned(),
    };
    let name = target.file_name().ok_or_else(|| {
        io::Error::new(io::ErrorKind::InvalidInput, "a key file needs a file name")
    })?;
    // hidden, and as short as a file name must be (255 bytes) whatever the key file's own:
    // its start names the key it holds, the process and count keep it unique
    let unique = format!(
        ".{}.{}.new",
        std::process::id(),
        WRITES.fetch_add(1, Ordering::Relaxed)
    );
    let mut temp_name = OsString::from(".");
    let kept = name.len().min(NAME_MAX - 1 - unique.len());
    temp_name.push(OsStr::from_bytes(&name.as_bytes()[..kept]));
    temp_name.push(unique);
    let temp = target.with_file_name(temp_name);
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&temp)?;
    let mut line = key.to_text();
    line.push('\n');
    let placed = (file.write_all(line.as_bytes()))
        .and_then(|()| file.sync_all())
        .and_then(|()| match replace {
            true => fs::rename(&temp, &target),
            false => fs::hard_link(&temp, &target),
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
