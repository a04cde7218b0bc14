"""What the benchmark harness reports and how it runs its processes: each case a fault a
review found, which the code before its fix got wrong (synthetic inputs: nothing here runs a
benchmark)."""
import os
import signal
import sys
import tempfile
import time
import unittest
from unittest import mock

BENCH = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, BENCH)

from ri2nbench import attacks, common, fault, loopback, scale, tcp  # noqa: E402
from ri2nbench.analysis import BIN  # noqa: E402

MACHINE = {"commit": "abc1234", "dirty": "0", "date_utc": "2026-01-01 00:00 UTC", "nproc": "2",
           "cpu": "cpu", "uname_r": "6.1", "loadavg": "0 0 0", "ri2n": "ri2n 0.1.0",
           "iperf3": "iperf 3.12", "sockperf": "sockperf 3.7"}


def group_members(pgid):
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % pid) as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # fields[0] is the state, fields[2] the process group
        if int(fields[2]) == pgid and fields[0] != "Z":
            out.append(int(pid))
    return out


class ProcsLeftovers(unittest.TestCase):
    def test_stopping_a_pipeline_ends_all_of_it(self):
        """A run started as a shell pipeline (part fast's `ri2n recv ... | b2sum`) that hangs
        is stopped whole. Before, only the shell was, and the pipeline's commands ran on,
        untracked, through the next measurements."""
        procs = common.Procs()
        p = procs.start(["bash", "-c", "set -o pipefail; sleep 30 | cat"])
        pgid = p.pid  # a session (and group) of its own
        try:
            deadline = time.monotonic() + 5
            while len(group_members(pgid)) < 3 and time.monotonic() < deadline:
                time.sleep(0.02)
            self.assertEqual(len(group_members(pgid)), 3, "the premise: the pipeline runs")
            # as a hung run is handled: wait_rusage past its time limit kills it
            rc, cpu = procs.wait_rusage(p, 0.2)
            self.assertEqual(rc, common.KILLED)
            time.sleep(0.2)
            left = group_members(pgid)
            self.assertEqual(left, [], "still running after the harness stopped the run: %s" % (
                ", ".join("%d %s" % (x, common.proc_comm(x)) for x in left)))
        finally:
            try:
                os.killpg(pgid, signal.SIGKILL)  # what this test started, by its group
            except ProcessLookupError:
                pass


def series(levels, seconds=11):
    """levels: [(until_s, Mbit/s)] -> 10 ms bins."""
    out = []
    for k in range(int(seconds / BIN) + 1):
        t = k * BIN
        out.append(next((v for until, v in levels if t < until), 0) * 1e6)
    return out


def events(n):
    ev = [(2, "fault", 1), (4, "fault", 2), (6, "heal", 1), (8, "heal", 2)][:n]
    return [{"t": t, "action": a, "link": l, "t_bench": t + 0.012, "m_before": 0, "m_after": 0.03,
             "m_at": 0, "cmd_ms": 30} for t, a, l in ev]


def ri2n_run(rep, n_events, rc, levels):
    return {"tool": "ri2n", "scenario": "main", "rep": rep, "rc": rc, "meter": "receiver",
            "events": events(n_events), "series_bps": series(levels), "events_ri2n": [],
            "busy_before": 0.0, "error": None if rc == 0 else "connection lost"}


class FaultFailedRun(unittest.TestCase):
    def test_a_run_that_died_mid_scenario_is_reported_not_a_crash(self):
        """A fault run whose tool gave up mid-scenario holds only the events before; the block
        lists it among the failed runs. Before, the report raised IndexError and no block
        could be written while such a run was stored."""
        whole = ri2n_run(0, 4, 0, [(2, 1900), (4, 950), (6, 0), (8, 950), (99, 1900)])
        # ri2n bench gave up while every link was down (t=4-6 s): exit 4, two events ran
        died = ri2n_run(1, 2, 4, [(2, 1900), (4, 950)])
        res = {"part": "fault", "machine": MACHINE, "elapsed_s": 60, "runs": [whole, died],
               "scenarios": dict(fault.SCENARIOS),
               "per_link_cap": {"ri2n": 972e6, "ri2n-tcp": 957e6, "mptcp": 957e6}}
        try:
            block = fault.report_fault(res)
        except IndexError as e:
            self.fail("report_fault raised IndexError (%s) on a run that died after 2 of the "
                      "scenario's 4 events" % e)
        self.assertIn("Runs that did not exit 0", block)


def lat_row(rep):
    failed = {"median_us": None, "p99_us": None, "min_us": None, "rc": 4, "error": "lost"}
    udp = {"median_us": 20.0, "p99_us": 30.0, "min_us": 15.0, "rc": 0}
    return {"rep": rep, "busy_before": 0.0, "ri2n": dict(failed), "ri2n1": dict(failed),
            "udp": dict(udp), "tcp": dict(udp), "ri2n_events": None, "ri2n1_events": None}


class LoopbackVerdict(unittest.TestCase):
    def test_no_verdict_without_a_measured_ratio(self):
        """No ri2n latency run measured anything: the target is "not measured". Before, it was
        declared MISSED."""
        res = {"part": "loopback", "machine": MACHINE, "elapsed_s": 10,
               "commands": {"ri2n_latency": "ri2n bench --latency --count 20000 --json",
                            "sockperf_pp": "sockperf ping-pong -t 2 --full-rtt",
                            "ri2n_throughput": "ri2n bench --time 10 --json"},
               "runs_latency": [lat_row(r) for r in range(3)], "runs_pinned": [],
               "runs_throughput": [], "runs_multi": []}
        block = loopback.report_loopback(res)
        line = next(l for l in block.splitlines() if l.startswith("Ratio ri2n / UDP"))
        self.assertIn("n/a", line)  # no ratio was measured...
        self.assertNotIn("MISSED", line, "...yet the target is declared missed: %r" % line)
        self.assertIn("not measured", line)


def run(last_recovery, level_mbit):
    # a constant series whose level tells the runs apart in the .dat file
    return {"tool": "ri2n", "scenario": "main", "rep": 0,
            "series_bps": [level_mbit * 1e6] * 20,
            "events": [{"t": 2, "action": "fault", "link": 1}],
            "analysis": {"events": [{"time_to_90": last_recovery}]}}


class PlotMedianRun(unittest.TestCase):
    def test_a_zero_ms_recovery_is_not_ranked_as_never(self):
        """The fault plot draws the run of median recovery; one of 0 ms ranks first. Before, a
        0.0 ranked with the runs that never recovered, and another run was drawn."""
        # recoveries 0, 50 and 100 ms: the median run is the 50 ms one
        res = {"runs": [run(0.0, 100), run(0.05, 200), run(0.10, 300)]}
        with tempfile.TemporaryDirectory() as tmp, \
                mock.patch.object(common, "RESULTS", tmp), \
                mock.patch.object(fault, "PLOT", os.path.join(tmp, "plot.png")), \
                mock.patch.object(fault.shutil, "which", lambda name: None):
            fault.plot(res)
            with open(os.path.join(tmp, "plot", "main-ri2n.dat")) as f:
                level = float(f.readline().split()[1])
        self.assertEqual(level, 200.0, "plotted the run at %.0f Mbit/s (recovery %s), not the "
                         "median one (50 ms, 200 Mbit/s)" % (
                             level, {100: "0 ms", 300: "100 ms"}.get(int(level))))


class MsgbwPath(unittest.TestCase):
    def test_the_example_is_built_beside_the_binary_measured_with_its_profile(self):
        """Part tcp runs examples/msgbw beside the ri2n binary measured (target/dist/ri2n, as
        run-all builds it), built first with that profile into that target directory. Before,
        it was built with --release (target/release/examples) and looked for in target/dist:
        missing, or stale from another build."""
        with tempfile.TemporaryDirectory() as tmp:
            target = os.path.join(tmp, "target")
            os.makedirs(os.path.join(target, "dist"))
            ri2n = os.path.join(target, "dist", "ri2n")
            open(ri2n, "w").close()
            built = []

            def cargo(cmd, **kw):
                # where cargo puts an example: <target-dir>/<profile's directory>/examples
                profile = cmd[cmd.index("--profile") + 1]
                out = os.path.join(cmd[cmd.index("--target-dir") + 1],
                                   {"dev": "debug"}.get(profile, profile), "examples")
                os.makedirs(out, exist_ok=True)
                open(os.path.join(out, "msgbw"), "w").close()
                built.append(os.path.join(out, "msgbw"))
                return ""

            with mock.patch.object(common, "RI2N_SOURCE", ri2n), \
                    mock.patch.object(tcp, "run", cargo), \
                    mock.patch.object(tcp.shutil, "which", lambda name: "/usr/bin/" + name):
                path = tcp.msgbw_binary()
            self.assertEqual(built, [os.path.join(target, "dist", "examples", "msgbw")])
            self.assertEqual(path, built[0])


class AttacksFacts(unittest.TestCase):
    def test_the_block_names_each_builds_commit_and_binary(self):
        """The attacks block compares two builds: it names the commit and the binary's sha256
        of each where the results hold them, and says when a commit was not recorded. Before,
        it named neither build."""
        def results(commit, path):
            return {"ri2n": path, "date_utc": "2026-11-27 07:59 UTC", "nproc": 2, "cpu": "Xeon",
                    "uname_r": "6.1", "commit": commit, "ri2n_sha256": "5ef9c6bde1f5" + "0" * 52,
                    "command": "bench/attacks/attacks.py --ri2n %s" % path,
                    "junk": {"runs": 5, "median_quiet_bps": 8e9, "median_flooded_bps": 7e9,
                             "ratio": 0.875}}

        after, before = results("aaaaaaa", "/tmp/ri2n-new"), results(None, "/tmp/ri2n-old")
        with mock.patch.object(attacks, "load", lambda part: before):
            block = attacks.report_attacks(after)
        first = block.splitlines()[0]
        self.assertIn("after: 2026-11-27 07:59 UTC, commit `aaaaaaa` (binary sha256 5ef9c6bde1f5…)",
                      first)
        self.assertIn("before: 2026-11-27 07:59 UTC, commit not recorded", first)


class BuildCommit(unittest.TestCase):
    def facts_of(self, version_line):
        with tempfile.TemporaryDirectory() as d:
            binary = os.path.join(d, "ri2n")
            with open(binary, "w") as f:
                f.write("#!/bin/sh\necho '%s'\n" % version_line)
            os.chmod(binary, 0o755)
            with mock.patch.object(common, "RI2N_SOURCE", binary):
                return common.build_facts()

    def test_a_block_names_the_commit_the_binary_was_built_from(self):
        """A binary built elsewhere (`--ri2n OTHER`) is credited to the commit it names, not to
        this checkout's. Before, every block named the checkout's commit."""
        facts = self.facts_of("ri2n 0.1.0 (commit 0123abc+dirty)")
        self.assertEqual((facts["commit"], facts["dirty"]), ("0123abc", "some"))
        machine = dict(MACHINE, commit=facts["commit"], dirty=facts["dirty"])
        line = common.mfacts({"machine": machine, "part": "fast"})
        self.assertIn("commit `0123abc` plus some uncommitted file(s) under crates/", line)
        facts = self.facts_of("ri2n 0.1.0 (commit 89abcde)")
        self.assertEqual((facts["commit"], facts["dirty"]), ("89abcde", "0"))

    def test_a_binary_that_names_no_commit_is_credited_to_the_checkout(self):
        facts = self.facts_of("ri2n 0.1.0")
        self.assertEqual(facts["commit"], common.head_commit())


class LanesDefault(unittest.TestCase):
    def fake_host(self, d, groups, mounts, files):
        proc = os.path.join(d, "proc")
        os.makedirs(proc)
        with open(os.path.join(proc, "cgroup"), "w") as f:
            f.write("\n".join(groups) + "\n")
        with open(os.path.join(proc, "mountinfo"), "w") as f:
            f.write("\n".join(m % {"d": d} for m in mounts) + "\n")
        for path, text in files.items():
            os.makedirs(os.path.dirname(os.path.join(d, path)), exist_ok=True)
            with open(os.path.join(d, path), "w") as f:
                f.write(text)
        return proc

    def test_a_cgroup_quota_counts_as_ri2n_counts_it(self):
        """ri2n chooses its lanes from the CPUs its cgroup quota allows too (Rust's
        available_parallelism); the scale part decided from the affinity mask alone, so on a
        16-CPU container held to 4 it labelled lanes on where ri2n ran them off."""
        with tempfile.TemporaryDirectory() as d:
            proc = self.fake_host(
                d, ["0::/jobs/bench"],
                ["41 31 0:38 / %(d)s/cg rw,relatime - cgroup2 cgroup2 rw"],
                {"cg/jobs/cpu.max": "400000 100000\n", "cg/jobs/bench/cpu.max": "max 100000\n"})
            self.assertEqual(scale.cgroup_cpus(proc), 4)
            with mock.patch.object(scale, "cgroup_cpus", lambda: 4), \
                    mock.patch.object(os, "sched_getaffinity", lambda pid: set(range(16))):
                self.assertFalse(scale.lanes_by_default())
        with tempfile.TemporaryDirectory() as d:
            proc = self.fake_host(
                d, ["4:cpu,cpuacct:/box", "0::/"],
                ["32 31 0:29 / %(d)s/cpu rw,relatime - cgroup cgroup rw,cpu,cpuacct"],
                {"cpu/box/cpu.cfs_quota_us": "250000\n", "cpu/box/cpu.cfs_period_us": "100000\n",
                 "cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"})
            self.assertEqual(scale.cgroup_cpus(proc), 2)

    def test_no_quota_leaves_the_affinity_mask(self):
        with tempfile.TemporaryDirectory() as d:
            proc = self.fake_host(
                d, ["0::/"], ["41 31 0:38 / %(d)s/cg rw,relatime - cgroup2 cgroup2 rw"],
                {"cg/cpu.max": "max 100000\n"})
            self.assertIsNone(scale.cgroup_cpus(proc))
            with mock.patch.object(scale, "cgroup_cpus", lambda: None), \
                    mock.patch.object(os, "sched_getaffinity", lambda pid: set(range(16))):
                self.assertTrue(scale.lanes_by_default())


if __name__ == "__main__":
    unittest.main()
