//! How the library's own threads are scheduled beside the application's.

/// Puts the calling thread under Linux's `SCHED_BATCH` policy: woken by an arrival or a
/// timer, it still runs at once on an idle CPU and keeps its fair share of a busy one, but it
/// no longer preempts the thread running there; it waits until that thread sleeps or its time
/// slice ends (a scheduler tick).
///
/// The UDP driver thread takes it, and the TCP transport's reader threads. Each of them is
/// woken for every batch that arrives; preempting the thread running there (this process's
/// application, or on one host the peer's sender, whose own system call delivered the batch)
/// only made them take turns, each switch one more wake-up, where letting the running thread
/// finish its call lets the woken one find more work at once. This gave more goodput for less
/// CPU per byte (UDP: item 13 of "What looked wrong" in docs/BENCHMARKS.md at commit
/// 085a7a3; TCP transport: BENCHMARKS.md §10). The cost: under full load a woken thread may
/// wait up to a tick, against failure detection that takes tens of milliseconds (the TCP
/// transport's watch thread, which declares links dead, keeps the default policy; so do its
/// writers, which would leave a link idle meanwhile).
pub(crate) fn yield_to_busy_threads() {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: `param` is a valid `sched_param` for the call's duration; pid 0 is this thread.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) } != 0 {
        let e = std::io::Error::last_os_error();
        tracing::debug!(error = %e, "thread keeps the default scheduling policy");
    }
}
