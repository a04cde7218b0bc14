"""A sockperf run that failed (killed at its time limit, or exited other than 0) keeps none of
its figures, the round trips of the whole run (`all_count`) included: part 6 divides the tunnel
daemons' CPU by them, and a failed run's "daemons' CPU per round trip" was published beside
round-trip figures that left that run out (synthetic inputs: nothing here runs sockperf)."""
import os
import sys
import unittest
from unittest import mock

BENCH = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, BENCH)

from ri2nbench import common, tunnel  # noqa: E402

# what sockperf prints when it is stopped (it catches the signal and prints its statistics)
SOCKPERF_TEXT = """sockperf: == version #3.7-no.git ==
sockperf: [Total Run] RunTime=2.100 sec; Warm up time=400 msec; SentMessages=30000; ReceivedMessages=29999
sockperf: ========= Printing statistics for Server No: 0
sockperf: [Valid Duration] RunTime=1.550 sec; SentMessages=22000; ReceivedMessages=22000
sockperf: ====> avg-rtt=70.1 (std-dev=10.2)
sockperf: Summary: Round trip is 70.1 usec
sockperf: Total 22000 observations; each percentile contains 220.00 observations
sockperf: ---> percentile 99.000 =  120.0
sockperf: ---> percentile 50.000 =   68.0
sockperf: ---> <MIN> observation =   50.0
"""


class FakeProc:
    pid = 424242


def fake_start(rc_by_call):
    calls = []

    def start(cmd, stdout=None, stderr=None, **kw):
        stdout.write(SOCKPERF_TEXT)
        stdout.flush()
        calls.append(cmd)
        return FakeProc()

    def wait(p, timeout):
        return rc_by_call[len(calls) - 1], 0.1

    return start, wait


class SockperfFailedRun(unittest.TestCase):
    def test_a_failed_run_keeps_no_round_trip_count(self):
        start, wait = fake_start([common.KILLED])
        with mock.patch.object(common.PROCS, "start", start), \
                mock.patch.object(common.PROCS, "wait_rusage", wait):
            r = common.sockperf_pp([], "127.0.0.1", 11111, 64, 2)
        self.assertIsNone(r["median_us"], "the premise: a failed run's median is blanked")
        self.assertIsNone(r["all_count"], "a killed sockperf run still carries all_count=%s, "
                          "which part 6 divides the daemons' CPU by" % r["all_count"])

    def test_the_tunnel_cpu_per_round_trip_leaves_a_failed_run_out(self):
        # run 1 through the tunnel fails (killed), the other two measure; every direct run ok
        rcs = [0, 0, common.KILLED, 0, 0, 0]
        start, wait = fake_start(rcs)
        cpu = iter(range(100))
        o = mock.Mock(reps=3, sockperf_time=2)
        daemons = {"a": FakeProc(), "b": FakeProc()}
        with mock.patch.object(common.PROCS, "start", start), \
                mock.patch.object(common.PROCS, "wait_rusage", wait), \
                mock.patch.object(tunnel, "wait_quiet", lambda: 0.0), \
                mock.patch.object(tunnel, "proc_cpu", lambda pid: float(next(cpu))):
            rows = tunnel.latency_runs(mock.Mock(ex=lambda *a: []), daemons, o)
        rtts = [r["tunnel"]["median_us"] for r in rows if r["tunnel"]["median_us"] is not None]
        cpus = [r["daemon_cpu_us"] for r in rows if r.get("daemon_cpu_us") is not None]
        self.assertEqual(len(rtts), 2, "the premise: the failed run's RTT is left out")
        line = tunnel.daemon_cpu(rows)
        self.assertEqual(len(cpus), len(rtts), "daemons' CPU per round trip counts %d runs, the "
                         "RTT it is published beside %d: %r" % (len(cpus), len(rtts), line))


if __name__ == "__main__":
    unittest.main()
