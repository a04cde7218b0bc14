//! A wildcard listen address on a host with no address of its family: the header promises
//! `EADDRNOTAVAIL`, the errno a bind to such an address gives. (The library's own error for
//! it carries no system errno, and it came out as `EIO`, the errno of a bug in ri2n.)
//!
//! A host without addresses is a network namespace of the test's own, with `lo` down: it
//! needs root, and is skipped with a word without it (failing where `CI` is set).

use std::ffi::{CStr, CString};

use ri2n_ffi::{ri2n_endpoint_free, ri2n_endpoint_server, ri2n_last_error};

#[test]
fn a_wildcard_with_no_address_of_its_family_is_eaddrnotavail() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        assert!(
            std::env::var_os("CI").is_none(),
            "needs root (a network namespace)"
        );
        eprintln!("skipped: needs root (a network namespace)");
        return;
    }
    let results = std::thread::spawn(|| {
        // SAFETY: moves this thread alone into a new network namespace, which has only `lo`,
        // down, so no address at all; the namespace ends with the thread.
        assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNET) }, 0, "unshare");
        ["0.0.0.0:7000", "[::]:7000"].map(|listen| {
            let listen = CString::new(listen).unwrap();
            let addrs = [listen.as_ptr()];
            // SAFETY: one valid C string in a valid array; no key file.
            let ep = unsafe { ri2n_endpoint_server(addrs.as_ptr(), 1, std::ptr::null()) };
            let errno = std::io::Error::last_os_error().raw_os_error();
            // SAFETY: the library's last error is a valid C string of this thread.
            let words = unsafe { CStr::from_ptr(ri2n_last_error()) }
                .to_string_lossy()
                .into_owned();
            let made = !ep.is_null();
            // SAFETY: NULL or an endpoint this call made, freed once.
            unsafe { ri2n_endpoint_free(ep) };
            (made, errno, words)
        })
    })
    .join()
    .unwrap();
    for (made, errno, words) in results {
        assert!(!made, "an endpoint without any address");
        assert_eq!(errno, Some(libc::EADDRNOTAVAIL), "{words}");
        assert!(words.contains("no interface has an address"), "{words}");
    }
}
