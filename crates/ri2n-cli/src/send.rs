//! `ri2n send`: stream a file or stdin to `ri2n recv`, then wait until the receiver has
//! acknowledged every byte; only then exit 0.

use std::fs::File;
use std::io::{self, Read, Write};
use std::time::{Duration, Instant};

use crate::checksum::Checksum;
use crate::error::Failure;
use crate::fault::FaultPlan;
use crate::net;
use crate::progress::Progress;
use crate::report::{bps, LinkSummary, TransferSummary};
use crate::SendArgs;

const CHUNK: usize = 256 * 1024;

pub fn run(args: &SendArgs) -> Result<(), Failure> {
    let (mut input, total, name): (Box<dyn Read>, Option<u64>, String) = match &args.input {
        Some(p) if p.as_os_str() != "-" => {
            let f = File::open(p)
                .map_err(|e| Failure::io(format!("cannot open {}", p.display()), &e))?;
            let size = f.metadata().ok().filter(|m| m.is_file()).map(|m| m.len());
            (Box::new(f), size, p.display().to_string())
        }
        _ => {
            net::enlarge_pipe(0);
            (Box::new(io::stdin().lock()), None, "stdin".into())
        }
    };

    let endpoint = net::client_endpoint(&args.connect, args.quiet)?;
    let faults = FaultPlan::new(&endpoint, &args.link.fault)?;
    let config = net::connection_config(!args.connect.no_discover, &args.link);
    let mut conn = net::connect(&endpoint, &args.connect, config)?;
    let start = Instant::now();
    faults.start(start, !args.quiet);

    let mut progress = Progress::new(!args.quiet, "sent", total);
    let mut sum = Checksum::default();
    let mut buf = vec![0u8; CHUNK];
    let mut written = 0u64;
    loop {
        let n = match input.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                conn.abort(1, "the sender could not read its input");
                return Err(Failure::io(format!("cannot read {name}"), &e));
            }
        };
        conn.write_all(&buf[..n]).map_err(|e| Failure::lost(&e))?;
        sum.update(&buf[..n]);
        written += n as u64;
        if progress.due() {
            let s = conn.stats();
            progress.draw(written - s.send_buffered.min(written), &s.links, false);
        }
    }
    conn.finish().map_err(|e| Failure::lost(&e))?;
    net::wait_acknowledged(&conn, Duration::from_millis(100), || {
        if progress.due() {
            let s = conn.stats();
            progress.draw(written - s.send_buffered.min(written), &s.links, false);
        }
    })?;
    let seconds = start.elapsed().as_secs_f64();
    progress.finish();
    net::linger(&conn, net::LINGER);

    let summary = TransferSummary {
        command: "send",
        bytes: written,
        seconds,
        goodput_bps: bps(written, seconds),
        checksum: sum.hex(),
        links: LinkSummary::all(&conn.stats().links, false),
    };
    summary.emit(args.quiet, args.json)
}
