//! A one-line progress display on stderr, redrawn in place, only when stderr is a terminal:
//! bytes, rate, a bar and ETA when the size is known, and a compact per-link summary.

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::report::{fmt_bytes, fmt_duration_short, fmt_rate, LinkMeter};

/// Whether a progress line is on screen (so an error message starts on a clean line).
static LINE_SHOWN: AtomicBool = AtomicBool::new(false);

/// How often the line is redrawn.
const PERIOD: Duration = Duration::from_millis(200);

/// Erases the progress line, if one is shown.
pub fn clear_line() {
    if LINE_SHOWN.swap(false, Ordering::Relaxed) {
        let mut e = std::io::stderr().lock();
        let _ = write!(e, "\r\x1b[2K");
        let _ = e.flush();
    }
}

/// Whether stderr is a terminal (progress and colours are shown only then).
pub fn stderr_is_terminal() -> bool {
    std::io::stderr().is_terminal()
}

/// The width of the terminal on stderr, asked of the terminal itself (shells do not export
/// `COLUMNS`); else `COLUMNS`; else 80.
fn width() -> usize {
    let mut size: libc::winsize = unsafe { std::mem::zeroed() };
    // SAFETY: TIOCGWINSZ fills the winsize we pass; it fails harmlessly on a non-terminal.
    let asked = unsafe { libc::ioctl(2, libc::TIOCGWINSZ, &mut size) } == 0;
    Some(usize::from(size.ws_col))
        .filter(|&w| asked && w >= 20)
        .or_else(|| {
            std::env::var("COLUMNS")
                .ok()
                .and_then(|c| c.parse::<usize>().ok())
                .filter(|&w| w >= 20)
        })
        .unwrap_or(80)
}

/// Progress of a transfer, redrawn at most every 200 ms.
pub struct Progress {
    enabled: bool,
    start: Instant,
    last: Option<Instant>,
    label: &'static str,
    total: Option<u64>,
    meter: LinkMeter,
    last_bytes: u64,
    /// When `last_bytes` last grew.
    last_growth: Instant,
    rate_bps: f64,
}

/// No progress for this long is shown as a stall.
const STALL: Duration = Duration::from_secs(1);

impl Progress {
    /// A display for `label` ("sent", "received") of `total` bytes if known; drawn only if
    /// `enabled` and stderr is a terminal.
    pub fn new(enabled: bool, label: &'static str, total: Option<u64>) -> Self {
        Self {
            enabled: enabled && stderr_is_terminal(),
            start: Instant::now(),
            last: None,
            label,
            total,
            meter: LinkMeter::default(),
            last_bytes: 0,
            last_growth: Instant::now(),
            rate_bps: 0.0,
        }
    }

    /// Whether a redraw is due (cheap; call it often).
    pub fn due(&self) -> bool {
        self.enabled && self.last.is_none_or(|t| t.elapsed() >= PERIOD)
    }

    /// Redraws with `bytes` done and the connection's link statistics; `incoming`: rate the
    /// links by bytes received rather than sent.
    pub fn draw(&mut self, bytes: u64, links: &[ri2n::LinkStats], incoming: bool) {
        if !self.enabled {
            return;
        }
        let now = Instant::now();
        let since = self.last.unwrap_or(self.start);
        let dt = now.duration_since(since).as_secs_f64();
        if dt > 0.0 {
            let inst = (bytes - self.last_bytes.min(bytes)) as f64 * 8.0 / dt;
            // smooth a little so the ETA does not jump around
            self.rate_bps = if self.last.is_none() {
                inst
            } else {
                0.6 * inst + 0.4 * self.rate_bps
            };
        }
        self.last = Some(now);
        if bytes > self.last_bytes {
            self.last_growth = now;
        }
        self.last_bytes = bytes;
        let mut line = format!("{} {}", self.label, fmt_bytes(bytes));
        if let Some(total) = self.total.filter(|&t| t > 0) {
            let frac = (bytes as f64 / total as f64).min(1.0);
            let filled = (frac * 20.0).round() as usize;
            line += &format!(
                " / {} {:3.0}% [{}{}]",
                fmt_bytes(total),
                frac * 100.0,
                "#".repeat(filled),
                "-".repeat(20 - filled)
            );
        }
        line += &format!(" {}", fmt_rate(self.rate_bps));
        let stalled = now.duration_since(self.last_growth);
        if stalled >= STALL {
            line += &format!(" STALLED {}", fmt_duration_short(stalled.as_secs_f64()));
        } else if let Some(total) = self.total {
            if self.rate_bps > 0.0 && bytes < total {
                let eta = (total - bytes) as f64 * 8.0 / self.rate_bps;
                line += &format!(" ETA {}", fmt_duration_short(eta));
            }
        }
        let rates = self.meter.sample(now, links);
        if !rates.is_empty() {
            line += " |";
            for r in rates {
                let bps = if incoming { r.recv_bps } else { r.sent_bps };
                line += &format!(" L{} {} {}", r.id, r.state, fmt_rate_compact(bps));
            }
        }
        let line: String = line.chars().take(width() - 1).collect();
        let mut e = std::io::stderr().lock();
        let _ = write!(e, "\r\x1b[2K{line}");
        let _ = e.flush();
        LINE_SHOWN.store(true, Ordering::Relaxed);
    }

    /// Removes the line (before the summary is printed).
    pub fn finish(&mut self) {
        if self.enabled {
            clear_line();
        }
    }
}

/// `980M`, `1.2G`, `35k`: a rate in few characters.
fn fmt_rate_compact(bps: f64) -> String {
    if bps >= 1e9 {
        format!("{:.1}G", bps / 1e9)
    } else if bps >= 1e6 {
        format!("{:.0}M", bps / 1e6)
    } else if bps >= 1e3 {
        format!("{:.0}k", bps / 1e3)
    } else {
        format!("{bps:.0}")
    }
}
