"""The namespace lab, driven only through lab/ri2n-lab, and what the lab parts share."""
import json
import re
import time

from . import common
from .common import LAB, PROCS, run, wait_ready


class Lab:
    """One lab of lab/ri2n-lab. Every namespace, link, rate and fault change goes through that
    script (`up`, `rate`, `fault`, `heal`, `down`), and every look inside a host through its
    `exec`: this class never names a namespace itself."""

    def __init__(self, prefix):
        self.prefix = prefix
        self.n = 0
        self.rates = []

    def cmd(self, *args):
        return [LAB, "--prefix", self.prefix] + [str(a) for a in args]

    def ex(self, host, *cmd):
        return self.cmd("exec", host, *cmd)

    def up(self, rates, hosts=2, mtu=None):
        """A fresh lab of len(rates) links, link i capped at rates[i-1] Mbit/s (0: uncapped)."""
        self.down()
        self.n = len(rates)
        self.rates = list(rates)
        top = max(rates)
        args = ["up", self.n] + (["--rate", top] if top > 0 else []) + ["--hosts", hosts]
        run(self.cmd(*(args + (["--mtu", mtu] if mtu else []))), timeout=120)
        for i, r in enumerate(rates, 1):
            if r != top:
                self.set_rate(i, r)

    def down(self):
        run(self.cmd("down"), check=False, timeout=120)

    def set_rate(self, link, mbit):
        run(self.cmd("rate", link, mbit))
        self.rates[link - 1] = mbit

    def qdiscs(self, h):
        return run(self.ex(h, "tc", "qdisc", "show"))

    def mptcp_setup(self):
        """One subflow per link: limits on both hosts, a `subflow` endpoint for every extra
        link on the client (A). The initial subflow takes link 1."""
        for h in "ab":
            run(self.ex(h, "ip", "mptcp", "limits", "set", "subflow", self.n,
                        "add_addr_accepted", self.n))
        run(self.ex("a", "ip", "mptcp", "endpoint", "flush"))
        for i in range(2, self.n + 1):
            run(self.ex("a", "ip", "mptcp", "endpoint", "add", "10.77.%d.1" % i,
                        "dev", "eth%d" % i, "subflow"))
        return {h: run(self.ex(h, "ip", "mptcp", "limits")).strip() for h in "ab"} | {
            "endpoints_a": run(self.ex("a", "ip", "mptcp", "endpoint", "show")).strip()}

    def link_bytes(self, h):
        """tx bytes of each ethI of host h."""
        out = json.loads(run(self.ex(h, "ip", "-s", "-j", "link", "show")))
        return {d["ifname"]: d["stats64"]["tx"]["bytes"] for d in out
                if d["ifname"].startswith("eth")}

    def mptcp_counters(self, h):
        out = run(self.ex(h, "cat", "/proc/net/netstat"))
        lines = out.splitlines()
        for i in range(0, len(lines) - 1, 2):
            if lines[i].startswith("MPTcpExt:"):
                return dict(zip(lines[i].split()[1:], map(int, lines[i + 1].split()[1:])))
        return {}

    def fault(self, link, *kind):
        return self._timed(self.cmd("fault", link, *(kind or ["switch"])))

    def heal(self, link):
        return self._timed(self.cmd("heal", link))

    @staticmethod
    def _timed(cmd):
        """Runs a fault/heal command; returns monotonic times: before it, after it, and when
        the change took effect (the "at T" the lab prints, Unix time)."""
        before = time.monotonic()
        out = run(cmd)
        after = time.monotonic()
        stamps = re.findall(r" at (\d+\.\d+)$", out, re.M)
        if not stamps:
            raise RuntimeError("%s: no 'at T' in its output: %r" % (" ".join(cmd), out))
        # Unix time -> monotonic, with the offset read now (both clocks tick alike)
        at = float(stamps[-1]) - (time.time() - time.monotonic())
        return before, after, at

    def a_addrs(self):
        return ["10.77.%d.1" % i for i in range(1, self.n + 1)]

    def b_addrs(self):
        return ["10.77.%d.2" % i for i in range(1, self.n + 1)]


LABS = []


def new_lab(prefix):
    lab = Lab(prefix)
    LABS.append(lab)
    return lab


def start_lab_servers(lab, ri2n=True, iperf=True, mptcp_iperf=True, ri2n_tcp=False):
    """Servers in B: `ri2n serve` on port 7000 of each link (`ri2n`), `ri2n serve --transport
    tcp` on port 7001 (`ri2n-tcp`), iperf3 on 5201 and iperf3 over MPTCP on 5202."""
    s = {}
    # the fault part's outages last up to 5 minutes: the server must not give its client
    # up meanwhile (its default is 60 s of every link down)
    ri2n_servers = ([("ri2n", 7000, [])] if ri2n else []) + (
        [("ri2n-tcp", 7001, ["--transport", "tcp"])] if ri2n_tcp else [])
    for key, port, extra in ri2n_servers:
        cmd = [common.RI2N, "serve", "-q", "--all-links-down-timeout", "900"] + extra
        for a in lab.b_addrs():
            cmd += ["--listen", "%s:%d" % (a, port)]
        s[key] = PROCS.start(lab.ex("b", *cmd))
    if iperf:
        s["iperf3"] = PROCS.start(lab.ex("b", "iperf3", "-s", "-p", 5201))
    if mptcp_iperf:
        s["mptcp"] = PROCS.start(lab.ex("b", "mptcpize", "run", "iperf3", "-s", "-p", 5202))
    for k, p in s.items():
        wait_ready(p, k, 0.1)
    time.sleep(0.5)
    return s


def ri2n_lab_client(lab, *extra, to="10.77.1.2:7000"):
    cmd = [common.RI2N, "bench", "--to", to]
    for a in lab.a_addrs():
        cmd += ["--local", a]
    return lab.ex("a", *(cmd + [str(e) for e in extra]))


def ss_snapshot(lab, delay, box):
    time.sleep(delay)
    try:
        box["ss"] = run(lab.ex("a", "ss", "-Mni"), check=False, timeout=5)
        box["ss_tcp"] = run(lab.ex("a", "ss", "-tni", "dst", "10.77.0.0/16"), check=False,
                            timeout=5)
    except Exception as e:
        box["ss"] = "error: %s" % e


def do_events(lab, t0, events, log_out, stop):
    """Runs the scenario's lab commands at t0 + t (monotonic); records when each ran."""
    for t, action, link, *kind in events:
        while time.monotonic() < t0 + t:
            if stop.is_set():
                return
            time.sleep(min(0.002, max(0.0, t0 + t - time.monotonic())))
        kind = kind[0] if kind else "switch"
        b, a, at = (lab.fault(link, *kind.split()) if action == "fault" else lab.heal(link))
        log_out.append({"t": t, "action": action, "link": link, "m_before": b, "m_after": a,
                        "m_at": at})


def place_events(ev_log, t0):
    """Puts each fault/heal on the run's timeline at the moment it took effect, as the lab
    stamped it (the lab command itself takes far longer than the change, mostly before and after it)."""
    for e in ev_log:
        e["t_bench"] = e["m_at"] - t0
        e["cmd_ms"] = (e["m_after"] - e["m_before"]) * 1000
