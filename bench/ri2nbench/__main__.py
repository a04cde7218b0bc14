"""ri2n benchmarks: loopback, lab throughput, fast links, fault timeline, lab latency sweep,
the cost of a key, the tunnel, its cost per peer in a cluster, scaling with the host's cores,
ri2n from C and Python.

Run through bench/run-all (installs the tools the named parts need, builds ri2n where cargo is). Each part writes its raw results to
bench/results/<part>.json and rewrites its own block of docs/BENCHMARKS.md (between the
`<!-- BEGIN part -->` / `<!-- END part -->` markers; the prose around them is kept).

Safety: loopback traffic only on 127.0.0.1 to 127.0.0.4 (free ports picked at start); lab traffic
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
    attacks, bindings, cluster, common, fast, fault, keyed, lab, labctl, loopback, scale, sweep,
    tcp, tunnel)

PARTS = {"loopback": loopback.part_loopback, "lab": lab.part_lab, "fast": fast.part_fast,
         "fault": fault.part_fault, "sweep": sweep.part_sweep, "keyed": keyed.part_keyed,
         "tunnel": tunnel.part_tunnel, "cluster": cluster.part_cluster, "scale": scale.part_scale,
         "bindings": bindings.part_bindings, "tcp": tcp.part_tcp}
REPORTERS = {"loopback": loopback.report_loopback, "lab": lab.report_lab,
             "fast": fast.report_fast, "fault": fault.report_fault,
             "sweep": sweep.report_sweep, "keyed": keyed.report_keyed,
             "tunnel": tunnel.report_tunnel, "cluster": cluster.report_cluster,
             "attacks": attacks.report_attacks,
             "scale": scale.report_scale, "scale-manycore": scale.report_scale,
             "bindings": bindings.report_bindings,
             "tcp": tcp.report_tcp}
# blocks `report` writes too: parts measured elsewhere (attacks: bench/attacks/attacks.py), and
# part scale's results from a many-core host (it names its results by the host: scale.results_name)
REPORT_ONLY = ["attacks", "scale-manycore"]
AFTER_REPORT = {"fault": fault.plot}
# What each part runs besides ri2n, as "command:Debian package" ("-": no package; bench/run-all
# says so instead of installing): those it cannot do without, and those whose absence only
# leaves something out (fast: the perf profile; fault: the plot; tunnel: the MPI job). bench/run-all
# asks for these (--needs) and installs only what the named parts lack.
LAB_TOOLS = ["ip:iproute2", "tc:iproute2"]
NEEDS = {
    "loopback": (["iperf3:iperf3", "sockperf:sockperf", "taskset:util-linux"], []),
    "lab": (LAB_TOOLS + ["ss:iproute2", "iperf3:iperf3", "mptcpize:mptcpize"], []),
    "fast": (LAB_TOOLS + ["iperf3:iperf3", "mptcpize:mptcpize", "b2sum:coreutils"],
             ["perf:linux-perf"]),
    "fault": (LAB_TOOLS + ["ss:iproute2", "iperf3:iperf3", "mptcpize:mptcpize"],
              ["gnuplot:gnuplot-nox"]),
    "sweep": (LAB_TOOLS + ["sockperf:sockperf", "mptcpize:mptcpize"], []),
    "keyed": (LAB_TOOLS + ["cargo:-"], []),
    "tunnel": (LAB_TOOLS + ["ss:iproute2", "iperf3:iperf3", "sockperf:sockperf",
                            "mptcpize:mptcpize"], ["mpirun:openmpi-bin", "mpicc:libopenmpi-dev"]),
    "cluster": (LAB_TOOLS + ["ping:iputils-ping"], []),
    "scale": (LAB_TOOLS + ["iperf3:iperf3", "mptcpize:mptcpize"], ["sockperf:sockperf",
                                                                   "ss:iproute2"]),
    "bindings": (["cargo:-", "cc:gcc", "taskset:util-linux"], []),
    "tcp": (LAB_TOOLS + ["iperf3:iperf3", "mptcpize:mptcpize", "cargo:-"], []),
}


def print_needs(parts):
    """One line per tool the parts run: `required|optional COMMAND PACKAGE` (bench/run-all)."""
    seen = set()
    for kind, i in (("required", 0), ("optional", 1)):
        for p in parts:
            for t in NEEDS[p][i]:
                cmd, pkg = t.split(":")
                if cmd not in seen:
                    seen.add(cmd)
                    print(kind, cmd, pkg)


def update_doc(parts, write=True):
    common.update_doc(parts, REPORTERS, AFTER_REPORT, write)


def cleanup():
    """Ends what the run started and removes what it made. A second signal (Ctrl-C reaches
    this driver, and run-all's trap sends it SIGTERM a moment later) must not cut this short:
    the signals are ignored from here on."""
    for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(s, signal.SIG_IGN)
    common.PROCS.stop_all()
    for lb in labctl.LABS:
        lb.down()
    for f in list(common.FAST_FILES):
        try:
            os.remove(f)
        except OSError:
            pass
    for d in list(common.TEMP_DIRS):
        shutil.rmtree(d, ignore_errors=True)


def parser():
    ap = argparse.ArgumentParser(prog="bench/run-all", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("parts", nargs="*", default=[],
                    help="loopback, lab, fast, fault, sweep, keyed, tunnel, cluster, scale, bindings, tcp (default: "
                         "all), or "
                         "report (rewrite docs/BENCHMARKS.md from bench/results/ without measuring)")
    ap.add_argument("--prefix", default="ri2nbench-%d" % os.getpid(), help="lab prefix")
    ap.add_argument("--tools", metavar="DIR",
                    help="put DIR/bin first in PATH for everything the run starts (a folder made "
                         "by ../shared/lab-tools/pack DIR: ip, tc, iperf3, sockperf, ping, "
                         "mptcpize); default: $RI2N_LAB_TOOLS if set")
    ap.add_argument("--ri2n", metavar="PATH",
                    help="the ri2n binary (default: $RI2N, else dist/ri2n of "
                         "$CARGO_TARGET_DIR, else target/dist/ri2n)")
    ap.add_argument("--needs", action="store_true",
                    help="print the tools the named parts run, one a line (`required|optional "
                         "COMMAND PACKAGE`), and exit (bench/run-all installs from it)")
    ap.add_argument("--reps", type=int, default=3,
                    help="runs per throughput/fault measurement (and per cell of part scale)")
    ap.add_argument("--lat-reps", type=int, default=7, help="loopback latency runs")
    ap.add_argument("--lat-count", type=int, default=20000)
    ap.add_argument("--pinned-reps", type=int, default=3,
                    help="loopback latency runs with every process pinned to CPU 0 (diagnostic)")
    ap.add_argument("--time", type=int, default=10,
                    help="throughput test length (s; part scale: each loopback cell)")
    ap.add_argument("--fast-bytes", type=int, default=1 << 30,
                    help="bytes per transfer on the unlimited-rate links (part fast)")
    ap.add_argument("--piped-bytes", type=int, default=512 << 20,
                    help="bytes per piped transfer on 2 x 1 Gbit/s (part fast)")
    ap.add_argument("--scale-bytes", type=int, default=4 << 30,
                    help="bytes per transfer on the unlimited-rate links of part scale (more than "
                         "part fast's: a many-core host moves 1 GiB in a fraction of a second)")
    ap.add_argument("--sockperf-time", type=int, default=2)
    ap.add_argument("--sweep-reps", type=int, default=3)
    ap.add_argument("--sweep-count", type=int, default=2000)
    ap.add_argument("--sockperf-sweep-time", type=int, default=1)
    ap.add_argument("--no-iperf-check", action="store_true", help="skip the iperf3 0.1 s fault run")
    ap.add_argument("--soak", type=int, default=20,
                    help="fault: ri2n runs of the Figure-4 scenario (missed take-backs are counted)")
    ap.add_argument("--scenarios", help="fault: only these scenarios, comma-separated (of %s)"
                    % ", ".join(fault.SCENARIOS))
    ap.add_argument("--fault-tools", help="fault: only these tools, comma-separated (of %s); "
                    "the stored runs of the others are kept, and the report says from when"
                    % ", ".join(fault.TOOLS))
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
    if o.needs:
        print_needs([p for p in parts if p in NEEDS])
        return 0
    if o.quick:
        o.reps = o.lat_reps = o.sweep_reps = o.pinned_reps = o.soak = 1
        o.time = 3
        o.fast_bytes = o.piped_bytes = o.scale_bytes = 128 << 20
        o.lat_count = 2000
        o.sweep_count = 200
        o.no_doc = True
        common.RESULTS = os.path.join(common.RESULTS, "quick")
    if "report" in parts:
        # with --no-doc the blocks are printed instead: a check that they render
        update_doc([p for p in list(PARTS) + REPORT_ONLY if common.load(p)], not o.no_doc)
        return 0
    needs_root = [p for p in parts if p not in ("loopback", "bindings")]
    if needs_root and os.geteuid() != 0:
        ap.error("parts %s build a namespace lab and need root" % needs_root)
    if not re.match(r"^ri2nbench-[A-Za-z0-9_-]+$", o.prefix):
        ap.error("--prefix must start with ri2nbench-")

    def on_signal(sig, _):
        raise SystemExit(128 + sig)

    for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(s, on_signal)
    tools = o.tools or os.environ.get("RI2N_LAB_TOOLS")
    if tools:
        try:
            common.log("tools: %s first in PATH" % common.use_tools(tools))
        except RuntimeError as e:
            ap.error(str(e))
    common.log("tools: %s" % ", ".join("%s %s" % (t, p or "(none)")
                                       for t, p in common.tool_paths().items()))
    if o.ri2n:
        common.RI2N = common.RI2N_SOURCE = os.path.abspath(o.ri2n)
    # a private copy of the binary: other people's builds may replace target/dist/ri2n
    if not os.access(common.RI2N, os.X_OK):
        ap.error("%s missing: cargo build --profile dist -p ri2n-cli (or name one: --ri2n PATH)"
                 % common.RI2N)
    common.log("ri2n: %s" % common.RI2N)
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
                update_doc([res["part"]])
            common.log("== part %s done in %.0f s" % (p, res["elapsed_s"]))
    finally:
        cleanup()
        shutil.rmtree(tmpdir, ignore_errors=True)
    common.log("all done in %.0f s: %s" % (time.monotonic() - t_all, ", ".join(done)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
