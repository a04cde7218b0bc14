//! For unit tests that need a network namespace of their own (root): a route or an address
//! no test may add to the host's.

/// Runs `f` on a thread moved alone into a new network namespace, with `lo` up: its sockets
/// live there, and so does `ip`, which `f` runs with the arguments it gives (forked from
/// that thread). Without root the test is skipped with a word, or fails where `CI` is set.
pub(crate) fn in_new_netns(f: impl FnOnce(&dyn Fn(&[&str])) + Send + 'static) {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        assert!(
            std::env::var_os("CI").is_none(),
            "needs root (a network namespace)"
        );
        eprintln!("skipped: needs root (a network namespace)");
        return;
    }
    std::thread::spawn(|| {
        // SAFETY: moves this thread alone into a new network namespace; the thread ends
        // with the test, and the namespace with it.
        assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNET) }, 0, "unshare");
        let ip = |args: &[&str]| {
            let done = std::process::Command::new("ip").args(args).status();
            assert!(done.is_ok_and(|s| s.success()), "ip {args:?}");
        };
        ip(&["link", "set", "lo", "up"]);
        f(&ip);
    })
    .join()
    .unwrap();
}
