//! `ri2n recv`: accept one connection and write its byte stream to a file or stdout; exit 0
//! once the sender finished cleanly and everything is written, flushed and (for a file)
//! synced to disk.

use std::fs::File;
use std::io::{self, BufWriter, Read, Write};
use std::time::{Duration, Instant};

use crate::checksum::Checksum;
use crate::error::{self, Failure};
use crate::fault::FaultPlan;
use crate::net;
use crate::progress::Progress;
use crate::report::{bps, LinkSummary, TransferSummary};
use crate::RecvArgs;

const CHUNK: usize = 256 * 1024;

enum Output {
    File(BufWriter<File>, String),
    Stdout(BufWriter<io::StdoutLock<'static>>),
}

impl Output {
    fn writer(&mut self) -> &mut dyn Write {
        match self {
            Output::File(w, _) => w,
            Output::Stdout(w) => w,
        }
    }

    fn name(&self) -> &str {
        match self {
            Output::File(_, n) => n,
            Output::Stdout(_) => "stdout",
        }
    }

    /// Flushes, and syncs a regular file to disk.
    fn close(self) -> io::Result<()> {
        match self {
            Output::File(w, _) => {
                let f = w.into_inner().map_err(|e| e.into_error())?;
                // devices and pipes (/dev/null, a FIFO) cannot be synced
                if f.metadata()?.is_file() {
                    f.sync_all()?;
                }
                Ok(())
            }
            Output::Stdout(mut w) => w.flush(),
        }
    }
}

pub fn run(args: &RecvArgs) -> Result<(), Failure> {
    let mut output = match &args.output {
        Some(p) if p.as_os_str() != "-" => {
            let f = File::create(p)
                .map_err(|e| Failure::io(format!("cannot create {}", p.display()), &e))?;
            Output::File(
                BufWriter::with_capacity(1 << 20, f),
                p.display().to_string(),
            )
        }
        _ => {
            net::enlarge_pipe(1);
            Output::Stdout(BufWriter::with_capacity(1 << 20, io::stdout().lock()))
        }
    };

    let endpoint = net::server_endpoint(&args.listen, args.link.all_links_down_timeout)?;
    let faults = FaultPlan::new(&endpoint, &args.link.fault)?;
    if !args.quiet && crate::progress::stderr_is_terminal() {
        eprintln!(
            "ri2n: listening on {}",
            error::list(&endpoint.local_addrs())
        );
    }
    let mut conn = match endpoint
        .accept_timeout(args.accept_timeout)
        .map_err(|e| Failure::endpoint(e, &[], Duration::ZERO))?
    {
        Some(c) => c,
        None => {
            return Err(Failure::new(
                error::CONNECT,
                format!(
                    "no sender connected within {:.1} s",
                    args.accept_timeout.unwrap_or_default().as_secs_f64()
                ),
            ))
        }
    };
    let start = Instant::now();
    faults.start(start, !args.quiet);
    // nothing to send back: ending our side now lets the close complete as soon as the
    // sender is done
    conn.finish().map_err(|e| Failure::lost(&e))?;

    let mut progress = Progress::new(!args.quiet, "received", None);
    let mut sum = Checksum::default();
    let mut buf = vec![0u8; CHUNK];
    let mut got = 0u64;
    loop {
        let n = match conn.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) => return Err(Failure::lost(&e)),
        };
        if let Err(e) = output.writer().write_all(&buf[..n]) {
            conn.abort(1, "the receiver could not write its output");
            net::linger(&conn, Duration::from_millis(200));
            return Err(Failure::io(
                format!("cannot write to {}", output.name()),
                &e,
            ));
        }
        sum.update(&buf[..n]);
        got += n as u64;
        if progress.due() {
            progress.draw(got, &conn.stats().links, true);
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    let name = output.name().to_owned();
    output
        .close()
        .map_err(|e| Failure::io(format!("cannot write to {name}"), &e))?;
    progress.finish();
    net::linger(&conn, net::LINGER);

    let summary = TransferSummary {
        command: "recv",
        bytes: got,
        seconds,
        goodput_bps: bps(got, seconds),
        checksum: sum.hex(),
        links: LinkSummary::all(&conn.stats().links, true),
    };
    summary.emit(args.quiet, args.json)
}
