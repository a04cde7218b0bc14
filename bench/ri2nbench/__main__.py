"""ri2n benchmarks: loopback, lab throughput, fast links, fault timeline, lab latency sweep,
the cost of a key, the tunnel.

Run through bench/run-all (installs the tools, builds ri2n). Each part writes its raw results to
bench/results/<part>.json and rewrites its own block of docs/BENCHMARKS.md (between the
`<!-- BEGIN part -->` / `<!-- END part -->` markers; the prose around them is kept).

Safety: loopback traffic only on 127.0.0.1/127.0.0.2 (free ports picked at start); lab traffic
only inside the namespaces of one lab whose prefix is unique to this run (ri2nbench-<pid>),
which is torn down on every exit path. Every process started is tracked and ended by its PID;
every loop and wait is bounded in time.
"""
import argparse
import os
import re
import shutil
import signal
import sys
import tempfile
import time

if __package__ in (None, ""):
    # run as `python3 bench/ri2nbench`: make the package importable by its name
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ri2nbench import (  # noqa: E402
    attacks, common, fast, fault, keyed, lab, labctl, loopback, sweep, tunnel)

PARTS = {"loopback": loopback.part_loopback, "lab": lab.part_lab, "fast": fast.part_fast,
         "fault": fault.part_fault, "sweep": sweep.part_sweep, "keyed": keyed.part_keyed,
         "tunnel": tunnel.part_tunnel}
REPORTERS = {"loopback": loopback.report_loopback, "lab": lab.report_lab,
             "fast": fast.report_fast, "fault": fault.report_fault,
             "sweep": sweep.report_sweep, "keyed": keyed.report_keyed,
             "tunnel": tunnel.report_tunnel, "attacks": attacks.report_attacks}
# parts measured elsewhere, whose blocks `report` writes too (attacks: bench/attacks/attacks.py)
REPORT_ONLY = ["attacks"]
AFTER_REPORT = {"fault": fault.plot}


def update_doc(parts, write=True):
    common.update_doc(parts, REPORTERS, AFTER_REPORT, write)


def cleanup():
    common.PROCS.stop_all()
    for lb in labctl.LABS:
        lb.down()
    for f in list(common.FAST_FILES):
        try:
            os.remove(f)
        except OSError:
            pass


def parser():
    ap = argparse.ArgumentParser(prog="bench/run-all", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("parts", nargs="*", default=[],
                    help="loopback, lab, fast, fault, sweep, keyed, tunnel (default: all), or report (rewrite "
                         "docs/BENCHMARKS.md from bench/results/ without measuring)")
    ap.add_argument("--prefix", default="ri2nbench-%d" % os.getpid(), help="lab prefix")
    ap.add_argument("--reps", type=int, default=3, help="runs per throughput/fault measurement")
    ap.add_argument("--lat-reps", type=int, default=7, help="loopback latency runs")
    ap.add_argument("--lat-count", type=int, default=20000)
    ap.add_argument("--pinned-reps", type=int, default=3,
                    help="loopback latency runs with every process pinned to CPU 0 (diagnostic)")
    ap.add_argument("--time", type=int, default=10, help="throughput test length (s)")
    ap.add_argument("--fast-bytes", type=int, default=1 << 30,
                    help="bytes per transfer on the unlimited-rate links (part fast)")
    ap.add_argument("--piped-bytes", type=int, default=512 << 20,
                    help="bytes per piped transfer on 2 x 1 Gbit/s (part fast)")
    ap.add_argument("--sockperf-time", type=int, default=2)
    ap.add_argument("--sweep-reps", type=int, default=3)
    ap.add_argument("--sweep-count", type=int, default=2000)
    ap.add_argument("--sockperf-sweep-time", type=int, default=1)
    ap.add_argument("--no-iperf-check", action="store_true", help="skip the iperf3 0.1 s fault run")
    ap.add_argument("--soak", type=int, default=20,
                    help="fault: ri2n runs of the Figure-4 scenario (missed take-backs are counted)")
    ap.add_argument("--scenarios", help="fault: only these scenarios, comma-separated (of %s)"
                    % ", ".join(fault.SCENARIOS))
    ap.add_argument("--long-outage", action="store_true",
                    help="fault: also a 5-minute total outage (one run per tool, ~16 min)")
    ap.add_argument("--quick", action="store_true",
                    help="smoke test: 1 run each, 3 s throughput; results go to bench/results/quick "
                         "and docs/BENCHMARKS.md is not touched")
    ap.add_argument("--no-doc", action="store_true",
                    help="do not rewrite docs/BENCHMARKS.md (report: print the blocks instead)")
    return ap


def main():
    ap = parser()
    # what a results file's options are compared with, to write the command that produced it
    common.OPTION_DEFAULTS.update(vars(ap.parse_args([])))
    o = ap.parse_args()
    parts = o.parts or list(PARTS)
    for p in parts:
        if p not in PARTS and p != "report":
            ap.error("unknown part %r" % p)
    if o.quick:
        o.reps = o.lat_reps = o.sweep_reps = o.pinned_reps = o.soak = 1
        o.time = 3
        o.fast_bytes = o.piped_bytes = 128 << 20
        o.lat_count = 2000
        o.sweep_count = 200
        o.no_doc = True
        common.RESULTS = os.path.join(common.RESULTS, "quick")
    if "report" in parts:
        # with --no-doc the blocks are printed instead: a check that they render
        update_doc([p for p in list(PARTS) + REPORT_ONLY if common.load(p)], not o.no_doc)
        return 0
    needs_root = [p for p in parts if p != "loopback"]
    if needs_root and os.geteuid() != 0:
        ap.error("parts %s build a namespace lab and need root" % needs_root)
    if not re.match(r"^ri2nbench-[A-Za-z0-9_-]+$", o.prefix):
        ap.error("--prefix must start with ri2nbench-")

    def on_signal(sig, _):
        raise SystemExit(128 + sig)

    for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(s, on_signal)
    # a private copy of the binary: other people's builds may replace target/release/ri2n
    if not os.access(common.RI2N, os.X_OK):
        ap.error("%s missing: cargo build --release -p ri2n-cli" % common.RI2N)
    tmpdir = tempfile.mkdtemp(prefix="ri2nbench-")
    common.BUILD.update(common.build_facts())
    shutil.copy2(common.RI2N, os.path.join(tmpdir, "ri2n"))
    common.RI2N = os.path.join(tmpdir, "ri2n")
    t_all = time.monotonic()
    done = []
    try:
        for p in parts:
            t0 = time.monotonic()
            common.QUIET["waited"] = 0.0
            common.log("== part %s" % p)
            m = common.machine()
            res = PARTS[p](o)
            res["machine"] = m
            res["elapsed_s"] = time.monotonic() - t0
            res["quiet_wait_s"] = common.QUIET["waited"]
            res["options"] = vars(o)
            common.save(res)
            done.append(p)
            if not o.no_doc:
                update_doc([p])
            common.log("== part %s done in %.0f s" % (p, res["elapsed_s"]))
    finally:
        cleanup()
        shutil.rmtree(tmpdir, ignore_errors=True)
    common.log("all done in %.0f s: %s" % (time.monotonic() - t_all, ", ".join(done)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
