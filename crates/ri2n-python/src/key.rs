//! `ri2n.Key`: the key a cluster shares, in the text form of `ri2n keygen` (one line,
//! `ri2n-key-v1:` and 64 hex digits) in a file of mode 0600.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

use pyo3::exceptions::{PyOSError, PyUserWarning, PyValueError};
use pyo3::prelude::*;

use crate::errors::os_error;
use crate::wait_on_thread;

/// The key a cluster shares: give every host the same one, and connections between them are
/// mutually authenticated and encrypted; a peer holding another key, or none, is refused
/// (``KeyMismatch``). ``repr()`` never shows the key.
#[pyclass(name = "Key", module = "ri2n", frozen)]
pub struct PyKey {
    pub(crate) key: ri2n::Key,
    /// The file it was read from, named when a peer turns out to hold another key.
    pub(crate) path: Option<PathBuf>,
}

impl PyKey {
    /// Reads the key file at `path`, as `ri2n --key FILE` does.
    pub(crate) fn read(py: Python<'_>, path: PathBuf) -> PyResult<Self> {
        // without the GIL: a FIFO's open waits for its writer, a network file system's read
        // for the server, and the other Python threads run meanwhile; on a thread of its own,
        // so that Ctrl-C ends the wait (the open retries on EINTR and never sees it)
        let reading = path.clone();
        let read = wait_on_thread(
            py,
            "ri2n-key",
            move || {
                let file = fs::File::open(&reading).map_err(ri2n::KeyReadError::Io)?;
                let key = ri2n::Key::read_from(&file)?;
                let mode = file.metadata().ok().map(|m| m.permissions().mode() & 0o777);
                Ok::<_, ri2n::KeyReadError>((key, mode))
            },
            drop,
            |py| py.check_signals(),
        )?;
        let (key, mode) = read.map_err(|e| match e {
            ri2n::KeyReadError::Io(e) => os_error(py, &e, None, Some(&path)),
            e => PyValueError::new_err(format!("{}: {e}", path.display())),
        })?;
        // what the group and others may do: read the key, or put another in its place
        let may = mode.and_then(|mode| match (mode & 0o044 != 0, mode & 0o022 != 0) {
            (true, true) => Some(("read and change", mode)),
            (true, false) => Some(("read", mode)),
            (false, true) => Some(("change", mode)),
            (false, false) => None,
        });
        if let Some((may, mode)) = may {
            let message = format!(
                "other users can {may} the key file {} (mode {mode:04o}); `chmod 600` it",
                path.display()
            );
            // a C string for the warning; a path with a NUL byte could not have been read
            if let Ok(message) = std::ffi::CString::new(message) {
                PyErr::warn(py, &py.get_type::<PyUserWarning>(), &message, 1)?;
            }
        }
        Ok(Self {
            key,
            path: Some(path),
        })
    }
}

#[pymethods]
impl PyKey {
    /// A new random key from the operating system's random source.
    #[staticmethod]
    fn generate() -> PyResult<Self> {
        let key = ri2n::Key::generate().map_err(|e| PyOSError::new_err(e.to_string()))?;
        Ok(Self { key, path: None })
    }

    /// The key in ``text`` (a key file's content, as ``ri2n keygen`` writes it; surrounding
    /// white space is ignored). Raises ``ValueError`` if it is not a key.
    #[staticmethod]
    fn from_text(text: &str) -> PyResult<Self> {
        let key = ri2n::Key::from_text(text).map_err(|e| PyValueError::new_err(e.to_string()))?;
        Ok(Self { key, path: None })
    }

    /// Reads a key file (``ri2n keygen --output FILE``). A missing or unreadable file raises
    /// the ``OSError`` subclass its errno names (``FileNotFoundError``, ``PermissionError``);
    /// content that is not a key raises ``ValueError``. A file other users can read or change
    /// gives a ``UserWarning`` that says which, as ``ri2n`` does.
    #[staticmethod]
    fn from_file(py: Python<'_>, path: PathBuf) -> PyResult<Self> {
        Self::read(py, path)
    }

    /// Writes the key to a new file of mode 0600 in the text form of ``ri2n keygen``. An
    /// existing file is replaced only with ``overwrite=True`` (``FileExistsError`` otherwise):
    /// every host of a cluster holds that key. The key is written whole beside ``path`` and
    /// then put in place: a write that fails (a full disk) raises ``OSError`` and leaves the
    /// old key, or no file.
    #[pyo3(signature = (path, *, overwrite = false))]
    fn save(&self, py: Python<'_>, path: PathBuf, overwrite: bool) -> PyResult<()> {
        py.detach(|| ri2n::write_key_file(&self.key, &path, overwrite))
            .map_err(|e| os_error(py, &e, None, Some(&path)))
    }

    /// The text form: ``ri2n-key-v1:`` and 64 hex digits (the secret itself: keep it so).
    fn to_text(&self) -> String {
        self.key.to_text().to_string()
    }

    /// The file the key was read from, if it was.
    #[getter]
    fn path(&self) -> Option<PathBuf> {
        self.path.clone()
    }

    fn __eq__(&self, other: PyRef<'_, PyKey>) -> bool {
        self.key == other.key
    }

    fn __repr__(&self) -> String {
        match &self.path {
            Some(p) => format!("<ri2n.Key from {}>", p.display()),
            None => "<ri2n.Key>".to_owned(),
        }
    }
}
