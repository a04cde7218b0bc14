"""The rules that turn stored measurements into published figures (bench/ri2nbench), checked
on made-up series whose right answer is known, and on the stored results where a figure's
count can be told from them. Run by crates/ri2n-lab-tests/tests/bench_tooling.rs, or:
`python3 -m unittest discover -s bench/tests`."""
import json
import os
import re
import sys
import unittest

BENCH = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, BENCH)

from ri2nbench import loopback  # noqa: E402
from ri2nbench.analysis import BIN, analyse, recovery  # noqa: E402

MBIT = 1e6


class Recovery(unittest.TestCase):
    def test_a_stall_right_after_a_fault_is_the_gap(self):
        # two links at 1900 Mbit/s until a fault late in bin 203; nothing for the next four
        # bins, a catch-up burst, then one link's 950. The bin holding the fault, mostly
        # two-link traffic, and the burst after the stall made this read 0 ms.
        series = [1900 * MBIT] * 204 + [0.0] * 4 + [4000 * MBIT] + [950 * MBIT] * 300
        t_fault = 2.0396
        events = [{"t": 2, "t_bench": t_fault, "action": "fault", "link": 1}]
        gap = analyse(series, events, 5.0, 972 * MBIT)["events"][0]["time_to_90"]
        # back at the start of bin 208 (2.08 s), the first past the stall
        self.assertAlmostEqual(gap, 2.08 - t_fault, places=6)

    def test_an_event_on_a_bin_edge_starts_at_that_bin(self):
        series = [0.0] * 200 + [1000 * MBIT] * 50
        self.assertAlmostEqual(recovery(series, 2.0, 900 * MBIT, 2.5), 0.0, places=9)
        self.assertAlmostEqual(recovery(series, 1.99, 900 * MBIT, 2.5), 0.01, places=9)

    def test_never_back_before_the_limit_is_none(self):
        series = [0.0] * 300
        self.assertIsNone(recovery(series, 1.0, 900 * MBIT, 2.5))
        self.assertEqual(BIN, 0.01)


class BusyLine(unittest.TestCase):
    def test_the_loopback_busy_line_counts_every_measured_run(self):
        with open(os.path.join(BENCH, "results", "loopback.json")) as f:
            res = json.load(f)
        recorded = [r for k in ("runs_latency", "runs_pinned", "runs_throughput", "runs_multi")
                    for r in res.get(k) or [] if r.get("busy_before") is not None]
        self.assertTrue(res.get("runs_pinned"), "the stored part has pinned runs")
        block = loopback.report_loopback(res)
        m = re.search(r"CPUs busy just before each measurement.*?n=(\d+)\)", block)
        self.assertIsNotNone(m, "no busy line in the block")
        self.assertEqual(int(m.group(1)), len(recorded))


if __name__ == "__main__":
    unittest.main()
