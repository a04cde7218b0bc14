#!/usr/bin/env python3
"""ri2n benchmarks: loopback, lab throughput, fast links, fault timeline, lab latency sweep.

Run through bench/run-all (installs the tools, builds ri2n). Each part writes its raw results to
bench/results/<part>.json and rewrites its own block of docs/BENCHMARKS.md (between the
`<!-- BEGIN part -->` / `<!-- END part -->` markers; the prose around them is kept).

Safety: loopback traffic only on 127.0.0.1/127.0.0.2 (free ports picked at start); lab traffic
only inside the namespaces of one lab whose prefix is unique to this run (ri2nbench-<pid>),
which is torn down on every exit path. Every process started is tracked and ended by its PID;
every loop and wait is bounded in time.
"""
import argparse
import datetime
import json
import os
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RI2N = os.path.join(ROOT, "target", "release", "ri2n")
LAB = os.path.join(ROOT, "lab", "ri2n-lab")
FLOW = os.path.join(HERE, "mptcp_flow.py")
RESULTS = os.path.join(HERE, "results")
DOC = os.path.join(ROOT, "docs", "BENCHMARKS.md")
PLOT = os.path.join(ROOT, "docs", "fault-timeline.png")

DEVNULL = subprocess.DEVNULL
CLK_TCK = os.sysconf("SC_CLK_TCK")

# Payload limits of a tbf-capped link (tbf counts skb->len = IP packet + 14-byte Ethernet header)
WIRE = 1500 + 14
UDP_PAYLOAD = 1500 - 20 - 8  # 1472
TCP_PAYLOAD = 1500 - 20 - 20 - 12  # 1448 (timestamps on)


def udp_limit(mbit):
    return mbit * 1e6 * UDP_PAYLOAD / WIRE


def tcp_limit(mbit):
    return mbit * 1e6 * TCP_PAYLOAD / WIRE


def log(*a):
    print("[%s]" % time.strftime("%H:%M:%S"), *a, file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------
# processes


class Procs:
    """Every process this run starts; ended by PID (SIGTERM, then SIGKILL), never by name."""

    def __init__(self):
        self.live = []

    def start(self, cmd, stdout=DEVNULL, stderr=DEVNULL, **kw):
        p = subprocess.Popen([str(c) for c in cmd], stdin=DEVNULL, stdout=stdout, stderr=stderr,
                             start_new_session=True, **kw)
        self.live.append(p)
        return p

    def stop(self, p, grace=3.0):
        if p.returncode is None and p.poll() is None:
            try:
                os.kill(p.pid, signal.SIGTERM)
                p.wait(grace)
            except subprocess.TimeoutExpired:
                os.kill(p.pid, signal.SIGKILL)
                p.wait(5)
            except ProcessLookupError:
                pass
        if p in self.live:
            self.live.remove(p)

    def stop_all(self):
        for p in reversed(list(self.live)):
            try:
                self.stop(p)
            except Exception as e:  # keep tearing down
                log("stop %d: %s" % (p.pid, e))

    def wait_rusage(self, p, timeout):
        """Waits (bounded) for p; returns (exit code, CPU seconds user+system) via wait4."""
        deadline = time.monotonic() + timeout
        while True:
            pid, status, ru = os.wait4(p.pid, os.WNOHANG)
            if pid == p.pid:
                p.returncode = os.waitstatus_to_exitcode(status)
                if p in self.live:
                    self.live.remove(p)
                return p.returncode, ru.ru_utime + ru.ru_stime
            if time.monotonic() > deadline:
                log("timeout: killing pid %d (%s)" % (p.pid, " ".join(p.args[:6])))
                self.stop(p)
                return None, None
            time.sleep(0.01)


PROCS = Procs()


def run(cmd, check=True, timeout=60, quiet=False):
    r = subprocess.run([str(c) for c in cmd], stdin=DEVNULL, capture_output=True, text=True,
                       timeout=timeout)
    if check and r.returncode != 0:
        raise RuntimeError("%s: exit %d: %s" % (" ".join(map(str, cmd)), r.returncode,
                                                (r.stderr or r.stdout).strip()[-500:]))
    return r.stdout


def stat_cpu(path):
    """A /proc `stat` file's name (comm) and utime+stime in seconds."""
    with open(path) as f:
        head, rest = f.read().rsplit(")", 1)
    fields = rest.split()
    return head.split("(", 1)[1], (int(fields[11]) + int(fields[12])) / CLK_TCK


def proc_cpu(pid):
    """utime+stime of a running process (all its threads), in seconds."""
    return stat_cpu("/proc/%d/stat" % pid)[1]


def thread_cpu(pid):
    """utime+stime of each thread of a running process, in seconds, by "comm-tid"."""
    out = {}
    for tid in os.listdir("/proc/%d/task" % pid):
        try:
            comm, cpu = stat_cpu("/proc/%d/task/%s/stat" % (pid, tid))
            out["%s-%s" % (comm, tid)] = cpu
        except OSError:
            pass  # the thread ended meanwhile
    return out


def proc_comm(pid):
    try:
        with open("/proc/%d/comm" % pid) as f:
            return f.read().strip()
    except OSError:
        return None


def wait_ready(p, what, seconds=0.6):
    time.sleep(seconds)
    if p.poll() is not None:
        raise RuntimeError("%s exited at start (code %s)" % (what, p.returncode))


def free_port(addrs=("127.0.0.1", "127.0.0.2")):
    for _ in range(50):
        port = random.randint(20000, 60000)
        socks = []
        try:
            for a in addrs:
                for kind in (socket.SOCK_DGRAM, socket.SOCK_STREAM):
                    s = socket.socket(socket.AF_INET, kind)
                    socks.append(s)
                    s.bind((a, port))
            return port
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free port")


def cpu_times():
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    return v[3] + v[4], sum(v)  # idle + iowait, total


def cpu_busy(seconds=0.5):
    i0, t0 = cpu_times()
    time.sleep(seconds)
    i1, t1 = cpu_times()
    return 1 - (i1 - i0) / max(1, t1 - t0)


QUIET = {"budget": 30.0, "waited": 0.0}


def wait_quiet(threshold=0.25):
    """The machine is shared: before a measurement, wait (within a budget of QUIET['budget']
    seconds per part) until the CPUs are at most `threshold` busy. Returns the last busy
    fraction, recorded with the run."""
    while True:
        b = cpu_busy(0.5)
        if b <= threshold or QUIET["waited"] >= QUIET["budget"]:
            return round(b, 3)
        QUIET["waited"] += 0.5


# ------------------------------------------------------------------------------------------
# statistics and formatting


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def spread(xs, fmt="%.1f", scale=1.0):
    """'median (min–max, n=N)'"""
    xs = [x * scale for x in xs if x is not None]
    if not xs:
        return "n/a"
    if len(xs) == 1:
        return (fmt % xs[0]) + " (n=1)"
    return "%s (%s–%s, n=%d)" % (fmt % statistics.median(xs), fmt % min(xs), fmt % max(xs), len(xs))


def fit(points):
    """Least squares t = alpha + beta*n on (n, t) points; returns alpha, beta, n_half."""
    n = len(points)
    if n < 2:
        return None, None, None
    sx = sum(p[0] for p in points)
    sy = sum(p[1] for p in points)
    sxx = sum(p[0] * p[0] for p in points)
    sxy = sum(p[0] * p[1] for p in points)
    d = n * sxx - sx * sx
    beta = (n * sxy - sx * sy) / d
    alpha = (sy - beta * sx) / n
    return alpha, beta, (alpha / beta if beta > 0 else None)


# ------------------------------------------------------------------------------------------
# the lab


class Lab:
    def __init__(self, prefix):
        self.prefix = prefix
        self.n = 0
        self.rates = []

    def cmd(self, *args):
        return [LAB, "--prefix", self.prefix] + [str(a) for a in args]

    def ex(self, host, *cmd):
        return self.cmd("exec", host, *cmd)

    def ns(self, host):
        return "%s-%s" % (self.prefix, host)

    def up(self, rates, hosts=2):
        self.down()
        self.n = len(rates)
        self.rates = list(rates)
        run(self.cmd("up", self.n, "--rate", max(rates), "--hosts", hosts), timeout=120)
        for i, r in enumerate(rates, 1):
            if r != max(rates):
                self.set_rate(i, r)

    def down(self):
        run(self.cmd("down"), check=False, timeout=120)

    def set_rate(self, link, mbit):
        # the lab script gives every link the same rate; this is its tbf (lab/ri2n-lab tbf_args)
        # with another rate, on both hosts
        burst = max(mbit * 125, 4 * WIRE)
        for h in "ab":
            run(["tc", "-n", self.ns(h), "qdisc", "replace", "dev", "eth%d" % link, "root", "tbf",
                 "rate", "%dmbit" % mbit, "burst", burst, "latency", "10ms"])

    def qdiscs(self, h):
        return run(["tc", "-n", self.ns(h), "qdisc", "show"])

    def mptcp_setup(self):
        """One subflow per link: limits on both hosts, a `subflow` endpoint for every extra
        link on the client (A). The initial subflow takes link 1."""
        for h in "ab":
            run(["ip", "-n", self.ns(h), "mptcp", "limits", "set", "subflow", self.n,
                 "add_addr_accepted", self.n])
        run(["ip", "-n", self.ns("a"), "mptcp", "endpoint", "flush"])
        for i in range(2, self.n + 1):
            run(["ip", "-n", self.ns("a"), "mptcp", "endpoint", "add", "10.77.%d.1" % i,
                 "dev", "eth%d" % i, "subflow"])
        return {h: run(["ip", "-n", self.ns(h), "mptcp", "limits"]).strip() for h in "ab"} | {
            "endpoints_a": run(["ip", "-n", self.ns("a"), "mptcp", "endpoint", "show"]).strip()}

    def link_bytes(self, h):
        """tx bytes of each ethI of host h."""
        out = json.loads(run(["ip", "-n", self.ns(h), "-s", "-j", "link", "show"]))
        return {d["ifname"]: d["stats64"]["tx"]["bytes"] for d in out
                if d["ifname"].startswith("eth")}

    def mptcp_counters(self, h):
        out = run(["ip", "netns", "exec", self.ns(h), "cat", "/proc/net/netstat"])
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


def cleanup():
    PROCS.stop_all()
    for lab in LABS:
        lab.down()
    for f in list(FAST_FILES):
        try:
            os.remove(f)
        except OSError:
            pass


# ------------------------------------------------------------------------------------------
# tool runners


def parse_sockperf(text):
    def grab(pat):
        m = re.search(pat, text)
        return float(m.group(1)) if m else None

    return {
        "median_us": grab(r"percentile 50\.000 =\s*([\d.]+)"),
        "p99_us": grab(r"percentile 99\.000 =\s*([\d.]+)"),
        "min_us": grab(r"<MIN> observation =\s*([\d.]+)"),
        "mean_us": grab(r"avg-rtt=([\d.]+)"),
        "count": grab(r"Total (\d+) observations"),
    }


def sockperf_pp(prefix_cmd, ip, port, size, seconds, tcp=False):
    """sockperf ping-pong with --full-rtt: every figure is a round-trip time."""
    cmd = prefix_cmd + ["sockperf", "ping-pong", "-i", ip, "-p", port, "-m", size, "-t", seconds,
                        "--full-rtt"] + (["--tcp"] if tcp else [])
    with tempfile.TemporaryFile("w+") as out:
        w0 = time.monotonic()
        p = PROCS.start(cmd, stdout=out, stderr=subprocess.STDOUT)
        rc, _ = PROCS.wait_rusage(p, seconds + 30)
        wall = time.monotonic() - w0
        out.seek(0)
        text = out.read()
    r = parse_sockperf(text)
    r["rc"] = rc
    r["size"] = size
    r["wall_s"] = round(wall, 2)
    if rc != 0 or r["median_us"] is None:
        r["error"] = text[-800:]
    return r


def run_json(cmd, timeout, server_pid=None):
    """Runs a client with --json; returns (doc, rc, client CPU s, server CPU s, wall s, stderr)."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        s0 = proc_cpu(server_pid) if server_pid else None
        w0 = time.monotonic()
        p = PROCS.start(cmd, stdout=out, stderr=err)
        rc, cpu = PROCS.wait_rusage(p, timeout)
        wall = time.monotonic() - w0
        time.sleep(0.3)  # the server finishes its side
        s1 = proc_cpu(server_pid) if server_pid else None
        out.seek(0)
        err.seek(0)
        text, etext = out.read(), err.read()
    try:
        doc = json.loads(text)
    except ValueError:
        doc = None
    return doc, rc, cpu, (s1 - s0 if s0 is not None else None), wall, etext


# ------------------------------------------------------------------------------------------
# part 1: loopback

MULTI_SECONDS = 5


def multi_clients(server_pid, port, n, reverse):
    """`n` `ri2n bench` clients started at once against the server: their aggregate goodput
    and the server's CPU (cores: CPU seconds per second of the clients' run) per thread."""
    cmd = [RI2N, "bench", "--to", "127.0.0.1:%d" % port, "--time", MULTI_SECONDS, "--json"]
    cmd += ["-R"] if reverse else []
    outs = [tempfile.TemporaryFile("w+") for _ in range(n)]
    try:
        t0, w0 = thread_cpu(server_pid), time.monotonic()
        ps = [PROCS.start(cmd, stdout=f) for f in outs]
        rcs = [PROCS.wait_rusage(p, MULTI_SECONDS + 60)[0] for p in ps]
        wall = time.monotonic() - w0
        t1 = thread_cpu(server_pid)
        rates = []
        for f in outs:
            f.seek(0)
            try:
                rates.append(json.loads(f.read())["summary"]["goodput_bps"])
            except (ValueError, KeyError, TypeError):
                rates.append(None)
    finally:
        for f in outs:
            f.close()
    cores = {t: (v - t0.get(t, 0.0)) / wall for t, v in t1.items()}
    ok = all(rc == 0 for rc in rcs) and None not in rates
    return {"clients": n, "rcs": rcs, "rates": rates, "bps": sum(rates) if ok else None,
            "server_cores": sum(cores.values()),
            "driver_cores": sum(v for t, v in cores.items() if t.startswith("ri2n-driver")),
            "threads": {t: round(v, 3) for t, v in cores.items() if v >= 0.01}}



def part_loopback(o):
    res = {"part": "loopback", "runs_latency": [], "runs_throughput": []}
    pr, pu, pt, pi = free_port(), free_port(), free_port(), free_port()
    serve = PROCS.start([RI2N, "serve", "--listen", "127.0.0.1:%d" % pr, "--listen",
                         "127.0.0.2:%d" % pr, "-q"])
    spu = PROCS.start(["sockperf", "server", "-i", "127.0.0.1", "-p", pu])
    spt = PROCS.start(["sockperf", "server", "--tcp", "-i", "127.0.0.1", "-p", pt])
    ips = PROCS.start(["iperf3", "-s", "-B", "127.0.0.1", "-p", pi])
    for p, w in ((serve, "ri2n serve"), (spu, "sockperf udp"), (spt, "sockperf tcp"), (ips, "iperf3")):
        wait_ready(p, w, 0.2)
    time.sleep(0.5)
    res["commands"] = {
        "ri2n_serve": "ri2n serve --listen 127.0.0.1:PORT --listen 127.0.0.2:PORT -q",
        "ri2n_latency": "ri2n bench --to 127.0.0.1:PORT --latency --size 64 --count %d --json" % o.lat_count,
        "ri2n_latency_1link": "ri2n bench --to 127.0.0.1:PORT --local 127.0.0.1 --no-discover --latency --size 64 --count %d --json" % o.lat_count,
        "sockperf_server": "sockperf server [--tcp] -i 127.0.0.1 -p PORT",
        "sockperf_pp": "sockperf ping-pong [--tcp] -i 127.0.0.1 -p PORT -m 64 -t %d --full-rtt" % o.sockperf_time,
        "ri2n_throughput": "ri2n bench --to 127.0.0.1:PORT --time %d --json" % o.time,
        "iperf3_server": "iperf3 -s -B 127.0.0.1 -p PORT",
        "iperf3_throughput": "iperf3 -c 127.0.0.1 -p PORT -t %d --json" % o.time,
    }
    kinds = ["ri2n", "ri2n1", "udp", "tcp"]
    for rep in range(o.lat_reps):
        row = {"rep": rep, "busy_before": wait_quiet()}
        order = kinds[rep % 4:] + kinds[:rep % 4]
        for k in order:
            if k in ("ri2n", "ri2n1"):
                # ri2n1: one link only (diagnostic: does the second link cost latency?)
                one = ["--local", "127.0.0.1", "--no-discover"] if k == "ri2n1" else []
                doc, rc, _, _, _, err = run_json(
                    [RI2N, "bench", "--to", "127.0.0.1:%d" % pr] + one + ["--latency", "--size", 64,
                     "--count", o.lat_count, "--json"], 120)
                row[k + "_events"] = doc and doc.get("events")
                row[k] = {"median_us": doc and doc.get("median_us"),
                          "p99_us": doc and doc.get("p99_us"),
                          "min_us": doc and doc["results"][0].get("min_us"), "rc": rc}
                if rc != 0:
                    row[k]["error"] = err[-500:]
            else:
                row[k] = sockperf_pp([], "127.0.0.1", pu if k == "udp" else pt, 64,
                                     o.sockperf_time, tcp=(k == "tcp"))
        log("loopback latency rep %d: ri2n %s / udp %s / tcp %s us (median RTT)" % (
            rep, row["ri2n"]["median_us"], row["udp"]["median_us"], row["tcp"]["median_us"]))
        res["runs_latency"].append(row)

    # Diagnostic: every process on CPU 0, so no wake-up has to cross to another (idle) CPU;
    # on this kind of VM a cross-CPU wake-up costs tens of µs, which is what makes the
    # unpinned figures bimodal. Separate servers, pinned like their clients.
    res["runs_pinned"] = []
    if (os.cpu_count() or 1) >= 1 and o.pinned_reps > 0:
        prp, pup = free_port(), free_port()
        pserve = PROCS.start(["taskset", "-c", "0", RI2N, "serve", "--listen", "127.0.0.1:%d" % prp,
                              "--listen", "127.0.0.2:%d" % prp, "-q"])
        pspu = PROCS.start(["taskset", "-c", "0", "sockperf", "server", "-i", "127.0.0.1", "-p", pup])
        wait_ready(pserve, "pinned ri2n serve", 0.3)
        wait_ready(pspu, "pinned sockperf", 0.1)
        for rep in range(o.pinned_reps):
            row = {"rep": rep, "busy_before": wait_quiet()}
            doc, rc, _, _, _, err = run_json(
                ["taskset", "-c", "0", RI2N, "bench", "--to", "127.0.0.1:%d" % prp, "--latency",
                 "--size", 64, "--count", o.lat_count, "--json"], 120)
            row["ri2n"] = {"median_us": doc and doc.get("median_us"), "p99_us": doc and doc.get("p99_us"),
                           "min_us": doc and doc["results"][0].get("min_us"), "rc": rc}
            row["udp"] = sockperf_pp(["taskset", "-c", "0"], "127.0.0.1", pup, 64, o.sockperf_time)
            log("pinned latency rep %d: ri2n %s / udp %s us" % (rep, row["ri2n"]["median_us"],
                                                                 row["udp"]["median_us"]))
            res["runs_pinned"].append(row)
        PROCS.stop(pserve)
        PROCS.stop(pspu)

    for rep in range(o.reps):
        row = {"rep": rep, "busy_before": wait_quiet()}
        order = ["ri2n", "iperf3"] if rep % 2 == 0 else ["iperf3", "ri2n"]
        for k in order:
            if k == "ri2n":
                doc, rc, ccpu, scpu, wall, err = run_json(
                    [RI2N, "bench", "--to", "127.0.0.1:%d" % pr, "--time", o.time, "--json"],
                    o.time + 60, serve.pid)
                s = doc["summary"] if doc else {}
                row["ri2n"] = {"bytes": s.get("bytes"), "seconds": s.get("seconds"),
                               "bps": s.get("goodput_bps"),
                               "server_bytes": doc and (doc.get("server") or {}).get("bytes"),
                               "retransmitted_bytes": s.get("retransmitted_bytes"),
                               "events": doc and doc.get("events"),
                               "cpu_client": ccpu, "cpu_server": scpu, "rc": rc}
            else:
                doc, rc, ccpu, scpu, wall, err = run_json(
                    ["iperf3", "-c", "127.0.0.1", "-p", pi, "-t", o.time, "--json"], o.time + 60, ips.pid)
                e = doc["end"]["sum_received"] if doc else {}
                row["iperf3"] = {"bytes": e.get("bytes"), "seconds": e.get("seconds"),
                                 "bps": e.get("bits_per_second"), "cpu_client": ccpu,
                                 "cpu_server": scpu, "rc": rc}
            r = row[k]
            if r["bytes"]:
                r["cpu_s_per_gb"] = (r["cpu_client"] + r["cpu_server"]) / (r["bytes"] / 1e9)
        log("loopback throughput rep %d: ri2n %.2f Gbit/s, iperf3 %.2f Gbit/s" % (
            rep, (row["ri2n"]["bps"] or 0) / 1e9, (row["iperf3"]["bps"] or 0) / 1e9))
        res["runs_throughput"].append(row)
    # Several connections on one endpoint: 1 and 2 clients at once against the one server,
    # the server sending (-R) and receiving; its CPU per thread shows whether its connections
    # run on several cores at once.
    res["runs_multi"] = []
    res["commands"]["ri2n_multi"] = ("N x ri2n bench --to 127.0.0.1:PORT --time %d --json [-R], "
                                     "started at once" % MULTI_SECONDS)
    for rep in range(o.reps):
        row = {"rep": rep, "busy_before": wait_quiet()}
        for direction in ("send", "recv"):
            for n in (1, 2) if rep % 2 == 0 else (2, 1):
                row["%s%d" % (direction, n)] = multi_clients(serve.pid, pr, n, direction == "send")
        log("loopback several connections rep %d: server sends %s, receives %s Gbit/s (1 / 2 clients)" % (
            rep, " / ".join("%.2f" % ((row["send%d" % n].get("bps") or 0) / 1e9) for n in (1, 2)),
            " / ".join("%.2f" % ((row["recv%d" % n].get("bps") or 0) / 1e9) for n in (1, 2))))
        res["runs_multi"].append(row)
    res["serve_comm"] = proc_comm(serve.pid)
    for p in (serve, spu, spt, ips):
        PROCS.stop(p)
    return res


# ------------------------------------------------------------------------------------------
# part 2: lab throughput

TOPOLOGIES = [("2 × 1 Gbit/s", [1000, 1000]), ("4 × 500 Mbit/s", [500] * 4),
              ("1 Gbit/s + 200 Mbit/s", [1000, 200])]


def start_lab_servers(lab, ri2n=True, iperf=True, mptcp_iperf=True):
    s = {}
    if ri2n:
        # the fault part's outages last up to 5 minutes: the server must not give its client
        # up meanwhile (its default is 60 s of every link down)
        cmd = [RI2N, "serve", "-q", "--all-links-down-timeout", "900"]
        for a in lab.b_addrs():
            cmd += ["--listen", a + ":7000"]
        s["ri2n"] = PROCS.start(lab.ex("b", *cmd))
    if iperf:
        s["iperf3"] = PROCS.start(lab.ex("b", "iperf3", "-s", "-p", 5201))
    if mptcp_iperf:
        s["mptcp"] = PROCS.start(lab.ex("b", "mptcpize", "run", "iperf3", "-s", "-p", 5202))
    for k, p in s.items():
        wait_ready(p, k, 0.1)
    time.sleep(0.5)
    return s


def ri2n_lab_client(lab, *extra):
    cmd = [RI2N, "bench", "--to", "10.77.1.2:7000"]
    for a in lab.a_addrs():
        cmd += ["--local", a]
    return lab.ex("a", *(cmd + [str(e) for e in extra]))


def ss_snapshot(lab, delay, box):
    time.sleep(delay)
    try:
        box["ss"] = run(["ip", "netns", "exec", lab.ns("a"), "ss", "-Mni"], check=False, timeout=5)
        box["ss_tcp"] = run(["ip", "netns", "exec", lab.ns("a"), "ss", "-tni", "dst", "10.77.0.0/16"],
                            check=False, timeout=5)
    except Exception as e:
        box["ss"] = "error: %s" % e


def part_lab(o):
    res = {"part": "lab", "topologies": []}
    lab = new_lab(o.prefix)
    for name, rates in TOPOLOGIES:
        log("lab: %s" % name)
        lab.up(rates)
        t = {"name": name, "rates_mbit": rates, "mptcp": lab.mptcp_setup(), "runs": [],
             "qdiscs_a": lab.qdiscs("a")}
        srv = start_lab_servers(lab)
        t["server_comm"] = {k: proc_comm(p.pid) for k, p in srv.items()}
        tools = ["ri2n", "tcp", "mptcp"]
        for rep in range(o.reps):
            row = {"rep": rep}
            for k in tools[rep % 3:] + tools[:rep % 3]:
                busy = wait_quiet()
                b0 = lab.link_bytes("a")
                m0 = lab.mptcp_counters("a")
                box = {}
                th = None
                if k == "ri2n":
                    doc, rc, ccpu, scpu, wall, err = run_json(
                        ri2n_lab_client(lab, "--time", o.time, "--json"), o.time + 60, srv["ri2n"].pid)
                    s = doc["summary"] if doc else {}
                    r = {"bytes": s.get("bytes"), "seconds": s.get("seconds"),
                         "bps": s.get("goodput_bps"),
                         "retransmitted_bytes": s.get("retransmitted_bytes"),
                         "events": doc and doc.get("events"),
                         "shares": [l.get("share") for l in s.get("links", [])]}
                else:
                    cmd = ["iperf3", "-c", "10.77.1.2", "-p", 5201 if k == "tcp" else 5202,
                           "-t", o.time, "--json"]
                    if k == "mptcp":
                        cmd = ["mptcpize", "run"] + cmd
                        th = threading.Thread(target=ss_snapshot, args=(lab, o.time / 2, box))
                        th.start()
                    doc, rc, ccpu, scpu, wall, err = run_json(
                        lab.ex("a", *cmd), o.time + 60, srv["iperf3" if k == "tcp" else "mptcp"].pid)
                    e = doc["end"]["sum_received"] if doc else {}
                    r = {"bytes": e.get("bytes"), "seconds": e.get("seconds"),
                         "bps": e.get("bits_per_second"),
                         "retransmits": doc and doc["end"]["sum_sent"].get("retransmits")}
                if th:
                    th.join(30)
                b1 = lab.link_bytes("a")
                m1 = lab.mptcp_counters("a")
                r.update(rc=rc, cpu_client=ccpu, cpu_server=scpu, busy_before=busy,
                         link_tx_bytes={d: b1[d] - b0[d] for d in sorted(b1)},
                         mptcp_counters={c: m1[c] - m0.get(c, 0) for c in m1
                                         if m1[c] - m0.get(c, 0)})
                if rc != 0:
                    r["error"] = err[-500:]
                if box:
                    r["ss"] = box.get("ss")
                    r["ss_tcp"] = box.get("ss_tcp")
                    r["ss_subflows"] = [int(x) for x in re.findall(r"subflows:(\d+)", box.get("ss") or "")]
                row[k] = r
            log("  rep %d: ri2n %.0f, tcp %.0f, mptcp %.0f Mbit/s" % tuple(
                [rep] + [(row[k]["bps"] or 0) / 1e6 for k in tools]))
            t["runs"].append(row)
        for p in srv.values():
            PROCS.stop(p)
        lab.down()
        res["topologies"].append(t)
    return res


# ------------------------------------------------------------------------------------------
# part 2b: fast links (issue 8): unlimited-rate veth links, where CPU per byte decides

FAST_CONFIGS = [("2 links, MTU 1500", 2, 1500), ("2 links, MTU 9000", 2, 9000),
                ("4 links, MTU 1500", 4, 1500), ("4 links, MTU 9000", 4, 9000)]


def sys_busy():
    """Busy CPU seconds of the whole machine so far (user, nice, system, irq, softirq): counts
    both ends and the kernel work done for them on any thread (veth and bridge forwarding in
    softirq), which per-process accounting misses."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:8]]
    return (v[0] + v[1] + v[2] + v[5] + v[6]) / CLK_TCK


def timed_client(cmd, timeout):
    """Runs the sending side of a transfer; returns its exit code, its CPU seconds, the
    machine's busy CPU seconds meanwhile and what it printed."""
    with tempfile.TemporaryFile("w+") as out:
        busy0 = sys_busy()
        p = PROCS.start(cmd, stdout=out)
        rc, cpu = PROCS.wait_rusage(p, timeout)
        busy1 = sys_busy()
        out.seek(0)
        return rc, cpu, busy1 - busy0, out.read()


def fast_file(nbytes):
    """A file of random bytes in /dev/shm (memory: reading it costs no disk time)."""
    path = "/dev/shm/ri2nbench-%d-%d.bin" % (os.getpid(), nbytes)
    if not os.path.exists(path):
        with open(path, "wb") as f:
            left = nbytes
            while left:
                n = min(left, 1 << 22)
                f.write(os.urandom(n))
                left -= n
    FAST_FILES.add(path)
    return path


FAST_FILES = set()


def ri2n_transfer(lab, src, nbytes, pipe_in=None, pipe_out=None, timeout=120, key=None):
    """`ri2n recv` on B, `ri2n send` on A of `src` (a file, or `pipe_in` feeding its stdin),
    both with `--key key` if given; returns goodput, CPU of both processes and of the machine,
    and the sender's summary."""
    port = 7300 + random.randrange(500)
    listen = sum((["--listen", "%s:%d" % (a, port)] for a in lab.b_addrs()), [])
    local = sum((["--local", a] for a in lab.a_addrs()), [])
    if key:
        # (both commands take it: `--key` goes with the addresses everywhere below)
        listen += ["--key", key]
        local += ["--key", key]
    out_cmd = [RI2N, "recv", "-q", "--json", "-o", "/dev/null"] + listen
    if pipe_out:
        # the receiving application is another process: recv writes to a pipe into it
        out_cmd = ["sh", "-c", "%s recv -q %s -o - | %s" % (RI2N, " ".join(listen), pipe_out)]
    recv = PROCS.start(lab.ex("b", *out_cmd))
    wait_ready(recv, "ri2n recv", 0.3)
    in_cmd = [RI2N, "send", "-q", "--json", "--to", "%s:%d" % (lab.b_addrs()[0], port)] + local
    if pipe_in:
        in_cmd = ["sh", "-c", "%s | %s send -q --json --to %s:%d %s" % (
            pipe_in, RI2N, lab.b_addrs()[0], port, " ".join(local))]
    else:
        in_cmd += ["-i", src]
    rc, scpu, machine, text = timed_client(lab.ex("a", *in_cmd), timeout)
    rrc, rcpu = PROCS.wait_rusage(recv, 30)
    try:
        doc = json.loads(text)
    except ValueError:
        doc = None
    r = {"rc": rc, "recv_rc": rrc, "cpu_send": scpu, "cpu_recv": rcpu, "cpu_machine": machine}
    if doc:
        r.update(bytes=doc["bytes"], seconds=doc["seconds"], bps=doc["goodput_bps"],
                 encryption=doc.get("encryption"),
                 datagram=[l.get("max_datagram") for l in doc["links"]],
                 shares=[l.get("share") for l in doc["links"]],
                 lost=sum(l["packets_lost"] for l in doc["links"]))
    return r


def iperf_transfer(lab, nbytes, mptcp, pipe_in=None, pipe_out=None, src=None, timeout=120):
    """iperf3 of `nbytes` A→B over one TCP connection (link 1) or MPTCP (every link); the
    sender reads file `src` if given (as `ri2n send -i` does), else sends from memory."""
    port = 5301 + random.randrange(500)
    wrap = ["mptcpize", "run"] if mptcp else []
    scmd = wrap + ["iperf3", "-s", "-1", "-p", port]
    if pipe_out:
        # the received data goes to fd 3, the pipe; iperf3's own output to /dev/null
        scmd = ["sh", "-c", "%s iperf3 -s -1 -p %d -F /dev/fd/3 3>&1 1>/dev/null | %s" % (
            " ".join(wrap), port, pipe_out)]
    srv = PROCS.start(lab.ex("b", *scmd))
    wait_ready(srv, "iperf3 -s", 0.3)
    ccmd = wrap + ["iperf3", "-c", "10.77.1.2", "-p", port, "-n", nbytes, "--json"]
    if src:
        ccmd += ["-F", src]
    if pipe_in:
        ccmd = ["sh", "-c", "%s | %s iperf3 -c 10.77.1.2 -p %d -n %d -F /dev/stdin --json" % (
            pipe_in, " ".join(wrap), port, nbytes)]
    rc, ccpu, machine, text = timed_client(lab.ex("a", *ccmd), timeout)
    src, scpu = PROCS.wait_rusage(srv, 30)
    r = {"rc": rc, "cpu_send": ccpu, "cpu_recv": scpu, "cpu_machine": machine}
    try:
        doc = json.loads(text)
        e = doc["end"]["sum_received"]
        r.update(bytes=e["bytes"], seconds=e["seconds"], bps=e["bits_per_second"],
                 retransmits=doc["end"]["sum_sent"].get("retransmits"))
    except (ValueError, KeyError, TypeError):
        r["error"] = text[-300:]
    return r


def profile_ri2n(lab, src):
    """Where ri2n's cycles go: `perf record -a` over one transfer, the top symbols."""
    if not shutil.which("perf"):
        return None
    data = os.path.join(tempfile.gettempdir(), "ri2nbench-%d.perf" % os.getpid())
    port = 7900 + random.randrange(50)
    listen = sum((["--listen", "%s:%d" % (a, port)] for a in lab.b_addrs()), [])
    local = sum((["--local", a] for a in lab.a_addrs()), [])
    recv = PROCS.start(lab.ex("b", RI2N, "recv", "-q", "-o", "/dev/null", *listen))
    wait_ready(recv, "ri2n recv", 0.3)
    try:
        run(["perf", "record", "-a", "-F", "999", "-o", data, "--"] +
            lab.ex("a", RI2N, "send", "-q", "--to", "%s:%d" % (lab.b_addrs()[0], port), *local,
                   "-i", src), timeout=120)
        PROCS.wait_rusage(recv, 30)
        rep = run(["perf", "report", "-i", data, "--no-children", "--sort", "comm,dso,sym",
                   "--stdio", "--percent-limit", "1.5"], timeout=120, check=False)
    finally:
        PROCS.stop(recv)
        if os.path.exists(data):
            os.remove(data)
    rows = []
    for line in rep.splitlines():
        m = re.match(r"\s*([\d.]+)%\s+(\S+)\s+(\S+)\s+\[(.)\]\s+(.*)", line)
        if m:
            rows.append({"pct": float(m.group(1)), "comm": m.group(2), "dso": m.group(3),
                         "kernel": m.group(4) == "k", "sym": m.group(5).strip()})
    return rows[:25]


def part_fast(o):
    res = {"part": "fast", "configs": [], "bytes": o.fast_bytes}
    src = fast_file(o.fast_bytes)
    lab = new_lab(o.prefix)
    res["commands"] = {
        "lab": "lab/ri2n-lab up N --mtu MTU (no --rate: unlimited veth links)",
        "ri2n": "ri2n recv --listen 10.77.I.2:PORT … -o /dev/null; ri2n send --to 10.77.1.2:PORT --local 10.77.I.1 … -i FILE",
        "tcp": "iperf3 -s -1; iperf3 -c 10.77.1.2 -n BYTES -F FILE (one connection, link 1; "
               "reads the same file as ri2n send)",
        "mptcp": "mptcpize run iperf3 … -F FILE (a subflow per link)",
        "piped": "sender: cat FILE | ri2n send …; receiver: ri2n recv -o - | b2sum "
                 "(iperf3: -F /dev/stdin; -F /dev/fd/3 3>&1 | b2sum)",
        "cpu": "machine busy time from /proc/stat during the transfer, per GB moved",
    }
    for name, n, mtu in FAST_CONFIGS:
        log("fast: %s" % name)
        lab.down()
        run(lab.cmd("up", n, "--mtu", mtu), timeout=120)
        lab.n, lab.rates = n, [0] * n
        c = {"name": name, "links": n, "mtu": mtu, "mptcp": lab.mptcp_setup(), "runs": []}
        tools = ["ri2n", "tcp", "mptcp"]

        def transfer(k):
            if k == "ri2n":
                return ri2n_transfer(lab, src, o.fast_bytes)
            return iperf_transfer(lab, o.fast_bytes, mptcp=(k == "mptcp"), src=src)

        # One discarded transfer per tool first: the part's first transfer, right after it
        # wrote its file, ran slow, and in the rotation below it was always ri2n's (2-link MTU
        # 1500 rows of 8 runs: 10.4 Gbit/s median against 11.9 for the others; the warm-ups
        # of later configurations, on fresh labs, are not slow).
        c["warmup"] = {}
        for k in tools:
            wait_quiet()
            c["warmup"][k] = (transfer(k).get("bps") or 0) / 1e9
        log("  warm-up (discarded): %s" % ", ".join(
            "%s %.2f Gbit/s" % (k, v) for k, v in c["warmup"].items()))
        for rep in range(o.reps):
            row = {"rep": rep}
            for k in tools[rep % 3:] + tools[:rep % 3]:
                row["busy_before_" + k] = wait_quiet()
                row[k] = transfer(k)
            log("  rep %d: %s" % (rep, ", ".join(
                "%s %.2f Gbit/s %.2f CPU-s/GB" % (k, (row[k].get("bps") or 0) / 1e9,
                                                  row[k]["cpu_machine"] / (o.fast_bytes / 1e9))
                for k in tools)))
            c["runs"].append(row)
        if n == 2 and mtu == 1500:
            c["profile"] = profile_ri2n(lab, src)
        res["configs"].append(c)
    # the 1 Gbit/s class with the application competing for the CPUs: data piped in from
    # another process and out into a hashing one
    log("fast: 2 x 1 Gbit/s, piped")
    lab.up([1000, 1000])
    c = {"name": "2 × 1 Gbit/s (tbf), piped", "links": 2, "mtu": 1500, "rates_mbit": [1000, 1000],
         "mptcp": lab.mptcp_setup(), "runs": []}
    nbytes = o.piped_bytes
    psrc = fast_file(nbytes)
    # b2sum hashes at ~0.5 GB/s here: it keeps up with 2 Gbit/s but takes half a CPU doing so
    # (sha256sum, at 0.18 GB/s, could not keep up at all)
    feed, sink = "cat %s" % psrc, "b2sum > /dev/null"
    for rep in range(o.reps):
        row = {"rep": rep}
        for k in (["ri2n", "mptcp"] if rep % 2 == 0 else ["mptcp", "ri2n"]):
            row["busy_before_" + k] = wait_quiet()
            if k == "ri2n":
                row[k] = ri2n_transfer(lab, psrc, nbytes, pipe_in=feed, pipe_out=sink)
            else:
                row[k] = iperf_transfer(lab, nbytes, mptcp=True, pipe_in=feed, pipe_out=sink)
        log("  rep %d: ri2n %.0f, mptcp %.0f Mbit/s" % (
            rep, (row["ri2n"].get("bps") or 0) / 1e6, (row["mptcp"].get("bps") or 0) / 1e6))
        c["runs"].append(row)
    res["piped"] = c
    lab.down()
    return res


# ------------------------------------------------------------------------------------------
# part 5: the cost of a key


def part_keyed(o):
    """ri2n without and with a key, in turn, on 2 x 1 Gbit/s (tbf) and on unlimited 2-link
    veth links (MTU 1500): goodput and the machine's CPU per GB; and the handshakes per second
    of the server's CPU, from the engine alone (examples/handshake_rate.rs)."""
    res = {"part": "keyed", "bytes": o.fast_bytes, "configs": []}
    keyfile = os.path.join(tempfile.mkdtemp(prefix="ri2nbench-key-"), "cluster.key")
    run([RI2N, "keygen", "--output", keyfile])
    res["commands"] = {
        "key": "ri2n keygen --output FILE; ri2n recv … --key FILE; ri2n send … --key FILE",
        "lab": "lab/ri2n-lab up 2 --rate 1000, and lab/ri2n-lab up 2 --mtu 1500 (unlimited)",
        "handshakes": "cargo run --release -p ri2n-proto --example handshake_rate 1000",
    }
    src = fast_file(o.fast_bytes)
    lab = new_lab(o.prefix)
    for name, rates in (("2 × 1 Gbit/s (tbf)", [1000, 1000]), ("2 links, unlimited, MTU 1500", None)):
        log("keyed: %s" % name)
        if rates:
            lab.up(rates)
        else:
            lab.down()
            run(lab.cmd("up", 2, "--mtu", 1500), timeout=120)
            lab.n, lab.rates = 2, [0, 0]
        c = {"name": name, "rates_mbit": rates, "runs": []}
        for rep in range(o.reps):
            row = {"rep": rep}
            for k in (["plain", "keyed"] if rep % 2 == 0 else ["keyed", "plain"]):
                row["busy_before_" + k] = wait_quiet()
                row[k] = ri2n_transfer(lab, src, o.fast_bytes,
                                       key=keyfile if k == "keyed" else None)
            log("  rep %d: %s" % (rep, ", ".join(
                "%s %.0f Mbit/s %.2f CPU-s/GB" % (k, (row[k].get("bps") or 0) / 1e6,
                                                  row[k]["cpu_machine"] / (o.fast_bytes / 1e9))
                for k in ("plain", "keyed"))))
            c["runs"].append(row)
        res["configs"].append(c)
    lab.down()
    log("keyed: handshake rate")
    wait_quiet()
    out = run(["cargo", "run", "--release", "-q", "-p", "ri2n-proto", "--example",
               "handshake_rate", "1000"], timeout=900)
    res["handshakes"] = json.loads(out.strip().splitlines()[-1])
    return res


# ------------------------------------------------------------------------------------------
# part 3: fault timeline

SCENARIOS = {
    # name: (seconds, [(t, action, link[, fault kind, default "switch"])])
    "main": (11, [(2, "fault", 1), (4, "fault", 2), (6, "heal", 1), (8, "heal", 2)]),
    "outage1": (6, [(1, "fault", 1), (1, "fault", 2), (2, "heal", 1)]),
    "outage10": (21, [(1, "fault", 1), (1, "fault", 2), (11, "heal", 1)]),
    "outage60": (71, [(1, "fault", 1), (1, "fault", 2), (61, "heal", 1)]),
    "outage300": (311, [(1, "fault", 1), (1, "fault", 2), (301, "heal", 1)]),
    # link 1's cable pulled out of host A (A's eth1 loses carrier) or of host B, for 3 s
    "cable_a": (8, [(1, "fault", 1, "cable a"), (4, "heal", 1)]),
    "cable_b": (8, [(1, "fault", 1, "cable b"), (4, "heal", 1)]),
}
# what each scenario's recovery is: (event index of the heal, how it is named)
RECOVERY_EVENTS = [
    ("main", 2, "Fig. 4, t=6 s: link 1 heals after 2 s with no link (target: 1 link)"),
    ("main", 3, "Fig. 4, t=8 s: link 2 heals (target: 2 links)"),
    ("outage1", 2, "all links down 1 s, then link 1 heals (target: 1 link)"),
    ("outage10", 2, "all links down 10 s, then link 1 heals"),
    ("outage60", 2, "all links down 60 s, then link 1 heals"),
    ("outage300", 2, "all links down 5 min, then link 1 heals"),
    ("cable_a", 1, "link 1's cable out of host A for 3 s (target: 2 links)"),
    ("cable_b", 1, "link 1's cable out of host B for 3 s (target: 2 links)"),
]
BIN = 0.01


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
    stamped it (the lab command itself takes 30-250 ms, mostly before and after the change)."""
    for e in ev_log:
        e["t_bench"] = e["m_at"] - t0
        e["cmd_ms"] = (e["m_after"] - e["m_before"]) * 1000


def uniform_series(rows, total):
    """Spreads each interval's bytes evenly over [start, end) on a BIN grid; bits/s per bin."""
    nb = int(total / BIN) + 1
    acc = [0.0] * nb
    for r in rows:
        s, e, b = r["start"], r["end"], r["bytes"]
        if e <= s:
            continue
        rate = b / (e - s)
        k = int(s / BIN)
        while k < nb and k * BIN < e:
            lo, hi = max(s, k * BIN), min(e, (k + 1) * BIN)
            if hi > lo:
                acc[k] += rate * (hi - lo)
            k += 1
    return [x * 8 / BIN for x in acc]


def recovery(series, t_event, target_bps, t_limit, binw=BIN, window=0.1):
    """Time from t_event to the start of the first bin (at or after the bin holding t_event)
    whose own goodput and the mean goodput of the `window` starting with it are both >= target.
    None if not reached before t_limit."""
    w = max(1, int(round(window / binw)))
    k = int(t_event / binw)
    while k * binw < t_limit and k + w <= len(series):
        if series[k] >= target_bps and sum(series[k:k + w]) / w >= target_bps:
            return max(0.0, k * binw - t_event)
        k += 1
    return None


def longest_stall(series, t_from, t_to, level_bps, binw=BIN):
    """Longest run of consecutive bins below level within [t_from, t_to), in seconds."""
    best = cur = 0
    for k in range(int(t_from / binw), min(len(series), int(t_to / binw) + 1)):
        if series[k] < level_bps:
            cur += 1
            best = max(best, cur)
        else:
            cur = 0
    return best * binw


def analyse(series, events, seconds, per_link_cap, binw=BIN):
    """Failover gaps and recovery times of one run (see docs/BENCHMARKS.md for the rule)."""
    # steady state: from 0.3 s (after start-up) to just before the first fault
    ss_hi = (events[0]["t_bench"] if events else seconds) - 0.05
    k0, k1 = int(0.3 / binw), int(ss_hi / binw)
    ss = statistics.mean(series[k0:k1]) if k1 > k0 else None  # both links, before any fault
    down = set()
    out = []
    times = [e["t_bench"] for e in events] + [seconds]
    for i, e in enumerate(events):
        nxt = times[i + 1]
        if e["action"] == "fault":
            down.add(e["link"])
        else:
            down.discard(e["link"])
        up = 2 - len(down)
        m = {"t": e["t"], "action": e["action"], "link": e["link"], "t_bench": e["t_bench"],
             "links_up": up}
        if up > 0 and nxt - e["t_bench"] > 0.05:
            cap = up * per_link_cap
            # one link: its payload limit; both links: the lower of their limit and what the
            # tool itself carried on both before the first fault (a shortfall there is part 2's
            # figure, not a recovery problem)
            own = ss if (up == 2 and ss) else cap
            target = 0.9 * min(cap, own)
            m["target_bps"] = target
            m["target_is_capacity"] = cap <= own
            m["time_to_90"] = recovery(series, e["t_bench"], target, nxt, binw, max(0.1, binw))
            m["stall"] = longest_stall(series, e["t_bench"], nxt, 0.1 * cap, binw)
            k = int(e["t_bench"] / binw) + 1
            m["min_bin_200ms"] = min(series[k:k + int(round(0.2 / binw))] or [0])
        elif up == 0:
            # time until goodput is zero in every later bin before the next event: not a metric
            m["stall"] = None
        out.append(m)
    return {"steady_bps": ss, "events": out}


def ri2n_fault_run(lab, scenario, srv_pid, reverse=False):
    """One ri2n bench run of `scenario`: A sends (timeline of acknowledged bytes) or, with
    `reverse`, B sends and A's timeline counts the bytes it read (a receiver-side meter)."""
    seconds, events = SCENARIOS[scenario]
    lines = []
    cmd = ri2n_lab_client(lab, "--time", seconds, "--interval", BIN, "--json",
                          *(["--reverse"] if reverse else []))
    with tempfile.TemporaryFile("w+") as out:
        m_launch = time.monotonic()
        p = PROCS.start(cmd, stdout=out, stderr=subprocess.PIPE, text=True, bufsize=1)

        def reader():
            for line in p.stderr:
                lines.append((time.monotonic(), line))

        rt = threading.Thread(target=reader, daemon=True)
        rt.start()
        pat = re.compile(r"^\s*(\d+\.\d+)-(\d+\.\d+)\s")
        # wait (bounded) for a few timeline lines to learn where the bench's t=0 is
        deadline = time.monotonic() + 5
        offs = []
        while time.monotonic() < deadline and len(offs) < 5:
            offs = [m - float(pat.match(l).group(2)) for m, l in list(lines) if pat.match(l)]
            time.sleep(0.005)
        t0_live = min(offs) if offs else m_launch + 0.02
        ev_log = []
        stop = threading.Event()
        et = threading.Thread(target=do_events, args=(lab, t0_live, events, ev_log, stop))
        et.start()
        rc, cpu = PROCS.wait_rusage(p, seconds + 60)
        stop.set()
        et.join(30)
        rt.join(5)
        out.seek(0)
        text = out.read()
    doc = json.loads(text) if text.strip() else None
    rows = doc["intervals"] if doc else []
    # exact offset: the k-th timeline line was printed right after the k-th interval closed
    tl_lines = [m for m, l in lines if pat.match(l)]
    if doc and len(tl_lines) == len(rows):
        t0 = min(m - r["end"] for m, r in zip(tl_lines, rows))
    else:
        t0 = t0_live
    place_events(ev_log, t0)
    total = max([r["end"] for r in rows] + [seconds])
    # A -> B: the server's own timeline of what it read (a receiver-side meter; its t = 0 is
    # when the request arrived, a fraction of a millisecond after the client's) when it sent
    # one; else the client's acknowledged bytes
    timeline = ((doc or {}).get("server") or {}).get("timeline") or []
    meter = "sender"
    if not reverse and timeline:
        meter = "receiver"
        server_rows, prev_t, prev_b = [], 0.0, 0
        for t, b in timeline:
            server_rows.append({"start": prev_t, "end": t, "bytes": b - prev_b})
            prev_t, prev_b = t, b
        rows = server_rows
    elif reverse:
        meter = "receiver"
    series = uniform_series(rows, total)
    return {"tool": "ri2n-rev" if reverse else "ri2n", "scenario": scenario, "rc": rc,
            "meter": meter,
            "cpu_client": cpu,
            "align_s": t0 - t0_live, "events": ev_log, "series_bps": series,
            "events_ri2n": doc and doc.get("events"),
            "summary": doc and {k: v for k, v in doc["summary"].items() if k != "links"},
            "max_interval_s": max([r["end"] - r["start"] for r in rows] or [0]),
            "error": None if rc == 0 else "".join(l for _, l in lines)[-800:]}


def mptcp_fault_run(lab, scenario):
    seconds, events = SCENARIOS[scenario]
    port = 5300
    outf = os.path.join(tempfile.gettempdir(), "ri2nbench-%d-flow.json" % os.getpid())
    if os.path.exists(outf):
        os.unlink(outf)
    recv = PROCS.start(lab.ex("b", sys.executable, FLOW, "recv", "--listen", "10.77.1.2:%d" % port,
                              "--out", outf, "--max-time", seconds + 8),
                       stdout=subprocess.PIPE, text=True)
    line = recv.stdout.readline()  # LISTENING (the recv process bounds itself by --max-time)
    if "LISTENING" not in line:
        raise RuntimeError("mptcp_flow recv did not start")
    b0 = lab.link_bytes("a")
    m0 = lab.mptcp_counters("a")
    send = PROCS.start(lab.ex("a", sys.executable, FLOW, "send", "--to", "10.77.1.2:%d" % port,
                              "--time", seconds), stdout=subprocess.PIPE, text=True)
    line = send.stdout.readline()
    m = re.match(r"T0 ([\d.]+) mptcp=(\S+)", line)
    if not m:
        PROCS.stop(send)
        PROCS.stop(recv)
        raise RuntimeError("mptcp_flow send did not connect: %r" % line)
    t0 = float(m.group(1))
    ev_log = []
    stop = threading.Event()
    et = threading.Thread(target=do_events, args=(lab, t0, events, ev_log, stop))
    et.start()
    box = {}
    st = threading.Thread(target=ss_snapshot, args=(lab, 1.0 - (time.monotonic() - t0), box))
    st.start()
    snaps = []
    sn = threading.Thread(target=ss_series, args=(lab, t0, [e[0] + 0.5 for e in events] + [seconds - 0.3], snaps))
    sn.start()
    rc, cpu = PROCS.wait_rusage(send, seconds + 30)
    rest = send.stdout.read() if send.stdout else ""
    stop.set()
    et.join(30)
    st.join(10)
    sn.join(10)
    rrc, rcpu = PROCS.wait_rusage(recv, 20)
    b1 = lab.link_bytes("a")
    m1 = lab.mptcp_counters("a")
    with open(outf) as f:
        d = json.load(f)
    os.unlink(outf)
    place_events(ev_log, t0)
    series = flow_series(d, t0, seconds)
    return {"tool": "mptcp", "scenario": scenario, "rc": rc, "recv_rc": rrc, "cpu_client": cpu,
            "cpu_server": rcpu, "mptcp_send": m.group(2), "mptcp_recv": d.get("mptcp"),
            "sender_says": rest.strip(), "events": ev_log, "series_bps": series,
            "link_tx_bytes": {k: b1[k] - b0[k] for k in b1},
            "mptcp_counters": {c: m1[c] - m0.get(c, 0) for c in m1 if m1[c] - m0.get(c, 0)},
            "ss_subflows_at_1s": [int(x) for x in re.findall(r"subflows:(\d+)", box.get("ss") or "")],
            "ss": box.get("ss"), "ss_series": snaps}


def flow_series(doc, t0, seconds):
    """mptcp_flow.py's receiver bins (aligned to the monotonic clock) shifted to the sender's
    start t0: bits/s per BIN from 0 to `seconds`."""
    shift = doc["t_first"] - t0
    nb = int(seconds / BIN) + 1
    series = [0.0] * nb
    for i, b in enumerate(doc["bytes"]):
        k = int(round((shift + i * BIN) / BIN))
        if 0 <= k < nb:
            series[k] += b * 8 / BIN
    return series


def tcp_flow_run(lab, client, server_ip, port, seconds, events):
    """One TCP flow (mptcp_flow.py --tcp) from host `client` to server_ip, which must be host
    b's, with the lab's `events` at their times after the sender's connect(): the receiver's
    goodput per 10 ms bin, and each event placed where the lab stamped it."""
    outf = os.path.join(tempfile.gettempdir(), "ri2nbench-%d-tcpflow.json" % os.getpid())
    if os.path.exists(outf):
        os.unlink(outf)
    recv = PROCS.start(lab.ex("b", sys.executable, FLOW, "recv", "--tcp", "--listen",
                              "%s:%d" % (server_ip, port), "--out", outf,
                              "--max-time", seconds + 8),
                       stdout=subprocess.PIPE, text=True)
    if "LISTENING" not in recv.stdout.readline():
        PROCS.stop(recv)
        raise RuntimeError("mptcp_flow recv --tcp did not start")
    send = PROCS.start(lab.ex(client, sys.executable, FLOW, "send", "--tcp", "--to",
                              "%s:%d" % (server_ip, port), "--time", seconds),
                       stdout=subprocess.PIPE, text=True)
    m = re.match(r"T0 ([\d.]+)", send.stdout.readline())
    if not m:
        PROCS.stop(send)
        PROCS.stop(recv)
        raise RuntimeError("mptcp_flow send --tcp did not connect")
    t0 = float(m.group(1))
    ev_log, stop = [], threading.Event()
    et = threading.Thread(target=do_events, args=(lab, t0, events, ev_log, stop))
    et.start()
    rc, _ = PROCS.wait_rusage(send, seconds + 30)
    stop.set()
    et.join(30)
    rrc, _ = PROCS.wait_rusage(recv, 20)
    with open(outf) as f:
        d = json.load(f)
    os.unlink(outf)
    place_events(ev_log, t0)
    return {"rc": rc, "recv_rc": rrc, "events": ev_log,
            "series_bps": flow_series(d, t0, seconds)}


def ss_series(lab, t0, times, out):
    """`ss -tni` of A's subflows (state, rto, retrans, bytes) at t0 + each time, bounded."""
    for t in sorted(set(round(x, 3) for x in times)):
        while time.monotonic() < t0 + t:
            time.sleep(0.01)
            if time.monotonic() > t0 + 60:
                return
        try:
            txt = run(["ip", "netns", "exec", lab.ns("a"), "ss", "-tni", "dst", "10.77.1.2"],
                      check=False, timeout=5)
        except Exception as e:
            txt = "error: %s" % e
        out.append({"t": t, "ss": txt})


def iperf3_fault_run(lab, scenario):
    """iperf3 over MPTCP at its finest interval (0.1 s), receiver side via the server's JSON."""
    seconds, events = SCENARIOS[scenario]
    srv = PROCS.start(lab.ex("b", "mptcpize", "run", "iperf3", "-s", "-1", "-p", 5203, "-i", "0.1", "-J"))
    wait_ready(srv, "iperf3 -s", 0.3)
    cmd = lab.ex("a", "mptcpize", "run", "iperf3", "-c", "10.77.1.2", "-p", 5203, "-t", seconds,
                 "-i", "0.1", "--json", "--get-server-output")
    with tempfile.TemporaryFile("w+") as out:
        m_launch = time.monotonic()
        p = PROCS.start(cmd, stdout=out)
        # iperf3 prints no start time we can read live: its t=0 is taken as launch + 0.05 s
        # (the control connection set-up); this alignment is good to about +-0.05 s
        t0 = m_launch + 0.05
        ev_log = []
        stop = threading.Event()
        et = threading.Thread(target=do_events, args=(lab, t0, events, ev_log, stop))
        et.start()
        rc, cpu = PROCS.wait_rusage(p, seconds + 40)
        stop.set()
        et.join(30)
        out.seek(0)
        text = out.read()
    PROCS.stop(srv)
    doc = json.loads(text) if text.strip() else None
    place_events(ev_log, t0)
    sj = (doc or {}).get("server_output_json") or {}
    src = "server (receiver)" if sj.get("intervals") else "client (sender)"
    ivs = sj.get("intervals") or (doc or {}).get("intervals") or []
    series = [(iv["sum"]["start"], iv["sum"]["end"], iv["sum"]["bits_per_second"]) for iv in ivs]
    nb = int(seconds / 0.1) + 1
    ser = [0.0] * nb
    for a, b, v in series:
        k = int(round(a / 0.1))
        if 0 <= k < nb:
            ser[k] = v
    return {"tool": "iperf3-mptcp-0.1s", "scenario": scenario, "rc": rc, "source": src,
            "events": ev_log, "intervals": series,
            "analysis": analyse(ser, ev_log, seconds, tcp_limit(1000), 0.1)}


def part_fault(o):
    res = {"part": "fault", "runs": [], "scenarios": {k: v for k, v in SCENARIOS.items()},
           "per_link_cap": {"ri2n": udp_limit(1000), "mptcp": tcp_limit(1000)}}
    lab = new_lab(o.prefix)
    lab.up([1000, 1000])
    res["mptcp"] = lab.mptcp_setup()
    srv = start_lab_servers(lab, iperf=False, mptcp_iperf=False)
    scenarios = ["main", "outage1", "outage10", "outage60", "cable_a", "cable_b"]
    if o.long_outage:
        scenarios.append("outage300")
    if o.scenarios:
        scenarios = o.scenarios.split(",")
    res["scenario_order"] = scenarios
    for scenario in scenarios:
        tools = ["ri2n", "ri2n-rev", "mptcp"]
        # the 5-minute outage once per tool; the Figure-4 scenario is ri2n's take-back soak
        reps = 1 if scenario == "outage300" else o.reps
        runs_of = {t: reps for t in tools}
        if scenario == "main":
            runs_of["ri2n"] = max(reps, o.soak)
        order = []
        for rep in range(max(runs_of.values())):
            for tool in (tools if rep % 2 == 0 else tools[::-1]):
                if rep < runs_of[tool]:
                    order.append((rep, tool))
        for rep, tool in order:
            busy = wait_quiet()
            log("fault: %s %s rep %d" % (scenario, tool, rep))
            if tool.startswith("ri2n"):
                r = ri2n_fault_run(lab, scenario, srv["ri2n"].pid, reverse=tool == "ri2n-rev")
            else:
                r = mptcp_fault_run(lab, scenario)
            lab.heal("all")
            time.sleep(1.0)
            r["rep"] = rep
            r["busy_before"] = busy
            cap = res["per_link_cap"]["mptcp" if tool == "mptcp" else "ri2n"]
            r["analysis"] = analyse(r["series_bps"], r["events"], SCENARIOS[scenario][0], cap)
            log("   " + "; ".join("%s%d@%.2f: %s" % (
                m["action"], m["link"], m["t_bench"],
                "n/a" if m.get("time_to_90", "x") == "x" else (
                    "never" if m["time_to_90"] is None else "%.0f ms" % (m["time_to_90"] * 1000)))
                for m in r["analysis"]["events"]))
            res["runs"].append(r)
        if scenario == "main" and not o.no_iperf_check:
            log("fault: main, iperf3 over MPTCP at 0.1 s")
            r = iperf3_fault_run(lab, "main")
            lab.heal("all")
            time.sleep(1.0)
            res["iperf3_check"] = r
    for p in srv.values():
        PROCS.stop(p)
    lab.down()
    return res


# ------------------------------------------------------------------------------------------
# part 4: latency sweep

SWEEP_SIZES = [16, 64, 256, 1024, 4096, 16384, 32768, 65507]


def part_sweep(o):
    res = {"part": "sweep", "runs": [], "sizes": SWEEP_SIZES}
    lab = new_lab(o.prefix)
    lab.up([1000, 1000])
    res["mptcp"] = lab.mptcp_setup()
    srv = start_lab_servers(lab, iperf=False, mptcp_iperf=False)
    srv["udp"] = PROCS.start(lab.ex("b", "sockperf", "server", "-i", "10.77.1.2", "-p", 11111))
    srv["tcp"] = PROCS.start(lab.ex("b", "sockperf", "server", "--tcp", "-i", "10.77.1.2", "-p", 11112))
    srv["mptcp"] = PROCS.start(lab.ex("b", "mptcpize", "run", "sockperf", "server", "--tcp",
                                      "-i", "10.77.1.2", "-p", 11113))
    for k, p in srv.items():
        wait_ready(p, k, 0.1)
    time.sleep(0.5)
    kinds = ["ri2n", "udp", "tcp", "mptcp"]
    for rep in range(o.sweep_reps):
        row = {"rep": rep, "busy_before": wait_quiet()}
        for k in kinds[rep % 4:] + kinds[:rep % 4]:
            if k == "ri2n":
                doc, rc, _, _, _, err = run_json(ri2n_lab_client(
                    lab, "--latency", "--sweep", "--count", o.sweep_count, "--json"), 300)
                row["ri2n"] = {"rc": rc, "results": doc and doc.get("results"),
                               "events": doc and doc.get("events"),
                               "fit": doc and doc.get("fit")}
                if rc != 0:
                    row["ri2n"]["error"] = err[-500:]
            else:
                b0 = lab.link_bytes("a")
                rs = []
                for size in SWEEP_SIZES:
                    pre = lab.ex("a", "mptcpize", "run") if k == "mptcp" else lab.ex("a")
                    rs.append(sockperf_pp(pre, "10.77.1.2", {"udp": 11111, "tcp": 11112,
                                                             "mptcp": 11113}[k],
                                          size, o.sockperf_sweep_time, tcp=(k != "udp")))
                b1 = lab.link_bytes("a")
                row[k] = {"results": rs, "link_tx_bytes": {d: b1[d] - b0[d] for d in b1}}
        log("sweep rep %d done" % rep)
        res["runs"].append(row)
    for p in srv.values():
        PROCS.stop(p)
    lab.down()
    return res


# ------------------------------------------------------------------------------------------
# machine facts and the report


def sh(cmd):
    try:
        return subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=20).stdout.strip()
    except Exception:
        return ""


BUILD = {}  # facts about the ri2n binary, taken when it is copied at start


def build_facts():
    src = os.path.join(ROOT, "target", "release", "ri2n")
    return {
        "commit": sh("git -C %s rev-parse --short HEAD" % ROOT),
        "dirty": sh("git -C %s status --porcelain -- crates Cargo.toml Cargo.lock | wc -l" % ROOT),
        "ri2n_built": sh("date -u -r %s '+%%Y-%%m-%%d %%H:%%M UTC'" % src),
    }


def machine():
    return BUILD | {
        "date_utc": sh("date -u '+%Y-%m-%d %H:%M UTC'"),
        "nproc": sh("nproc"),
        "uname_r": sh("uname -r"),
        "cpu": sh("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-").strip(),
        "loadavg": sh("cut -d' ' -f1-3 /proc/loadavg"),
        "ri2n": sh("%s --version" % RI2N),
        "ri2n_sha256": sh("sha256sum %s | cut -c1-12" % RI2N),
        "iperf3": sh("iperf3 --version | head -1"),
        "sockperf": sh("sockperf --version 2>&1 | grep -m1 version"),
        "mptcp_enabled": sh("sysctl -n net.mptcp.enabled"),
    }


def save(res):
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, res["part"] + ".json"), "w") as f:
        json.dump(res, f, indent=1)


def load(part):
    try:
        with open(os.path.join(RESULTS, part + ".json")) as f:
            return json.load(f)
    except OSError:
        return None


def mfacts(res):
    m = res["machine"]
    return ("Measured %s on %s CPU(s) (`nproc`), CPU `%s`, kernel `%s`, load average at start %s; "
            "ri2n `%s` (binary sha256 %s…, built %s from the work tree at commit `%s`%s); %s; %s. Part took %.0f s.\n" % (
                m["date_utc"], m["nproc"], m["cpu"], m["uname_r"], m["loadavg"], m["ri2n"],
                m.get("ri2n_sha256"), m.get("ri2n_built"),
                m["commit"], " plus %s uncommitted file(s) under crates/" % m["dirty"]
                if m["dirty"] not in ("", "0") else "", m["iperf3"], m["sockperf"],
                res.get("elapsed_s", 0)))


def odd_events(evs):
    """ri2n link-state changes other than the start-up ones (in runs without any fault, each
    one is a false alarm)."""
    return ["%.3f s L%d %s" % (e["t"], e["link"], e["event"]) for e in (evs or [])
            if e["event"] not in ("validating -> up", "added")]


def odd_summary(items):
    """items: (label, events) → one line per run that had false alarms."""
    out = []
    for label, evs in items:
        odd = odd_events(evs)
        if odd:
            downs = sum(1 for x in odd if x.endswith("-> down") or x.endswith("-> degraded"))
            out.append("  - %s: %d link(s) demoted (%s%s)" % (label, downs, ", ".join(odd[:4]),
                                                              ", …" if len(odd) > 4 else ""))
    if not out:
        return ["No ri2n link changed state during these fault-free runs."]
    return ["ri2n link-state changes during these fault-free runs (false alarms: no fault was "
            "injected; ri2n's `events`, t from the connection's start):"] + out


def busy_line(rows):
    b = [r.get("busy_before") for r in rows if r.get("busy_before") is not None]
    if not b:
        return ""
    return ("The machine is shared: before each measurement the driver waits (at most 30 s per "
            "part) for the CPUs to be at most 25 %% busy; busy fraction just before the runs: %s."
            % spread(b, "%.0f %%", 100))


def report_loopback(res):
    L = [mfacts(res), ""]
    lat = res["runs_latency"]
    L.append("**(a) 64-byte ping-pong, round-trip time (RTT) in µs** — every figure is a full round "
             "trip (sockperf with `--full-rtt`; its default would print RTT/2), median of the "
             "runs' medians (min–max over %d runs of %s round trips each for ri2n, %d s each "
             "for sockperf), all three measured in turn in each run:\n" % (
                 len(lat), res["commands"]["ri2n_latency"].split("--count ")[1].split()[0],
                 int(res["commands"]["sockperf_pp"].split("-t ")[1].split()[0])))
    L.append("| transport | median RTT | p99 RTT | min RTT |")
    L.append("| --- | --- | --- | --- |")
    for k, name in (("ri2n", "ri2n (2 loopback links)"), ("ri2n1", "ri2n, one link (`--local 127.0.0.1 --no-discover`)"),
                    ("udp", "UDP (sockperf)"), ("tcp", "TCP (sockperf)")):
        if not all(k in r for r in lat):
            continue
        L.append("| %s | %s | %s | %s |" % (name, spread([r[k]["median_us"] for r in lat]),
                                          spread([r[k]["p99_us"] for r in lat]),
                                          spread([r[k]["min_us"] for r in lat])))
    ratios = [r["ri2n"]["median_us"] / r["udp"]["median_us"] for r in lat
              if r["ri2n"]["median_us"] and r["udp"]["median_us"]]
    ratios99 = [r["ri2n"]["p99_us"] / r["udp"]["p99_us"] for r in lat
                if r["ri2n"]["p99_us"] and r["udp"]["p99_us"]]
    rm = med(ratios)
    L.append("")
    L.append("Ratio ri2n / UDP (per run, same run): median RTT **%s**, p99 %s. Target ≤ 1.3×: **%s**." % (
        spread(ratios, "%.2f×"), spread(ratios99, "%.2f×"),
        "met" if rm is not None and rm <= 1.3 else "MISSED"))
    pin = res.get("runs_pinned") or []
    if pin:
        pr = [r["ri2n"]["median_us"] / r["udp"]["median_us"] for r in pin
              if r["ri2n"]["median_us"] and r["udp"]["median_us"]]
        L.append("")
        L.append("Diagnostic, every process pinned to CPU 0 (`taskset -c 0` on servers and clients, "
                 "so no wake-up crosses CPUs), %d runs: ri2n median RTT %s µs (p99 %s), UDP %s µs "
                 "(p99 %s); ratio %s." % (
                     len(pin), spread([r["ri2n"]["median_us"] for r in pin]),
                     spread([r["ri2n"]["p99_us"] for r in pin]),
                     spread([r["udp"]["median_us"] for r in pin]),
                     spread([r["udp"]["p99_us"] for r in pin]), spread(pr, "%.2f×")))
    L.append("")
    thr = res["runs_throughput"]
    L.append("**(b) Throughput and CPU time**, %d runs of %s s each, ri2n over two loopback links "
             "(127.0.0.1 and 127.0.0.2) vs iperf3 over one TCP connection; CPU = user+system "
             "time of the client (wait4 rusage) plus the server (/proc/PID/stat delta), per GB "
             "(10⁹ bytes) delivered:\n" % (len(thr), res["commands"]["ri2n_throughput"].split("--time ")[1].split()[0]))
    L.append("| transport | goodput (Gbit/s) | client CPU (s) | server CPU (s) | CPU s per GB |")
    L.append("| --- | --- | --- | --- | --- |")
    for k, name in (("ri2n", "ri2n bench (2 links)"), ("iperf3", "iperf3 TCP")):
        L.append("| %s | %s | %s | %s | %s |" % (
            name, spread([r[k]["bps"] for r in thr], "%.2f", 1e-9),
            spread([r[k]["cpu_client"] for r in thr], "%.2f"),
            spread([r[k]["cpu_server"] for r in thr], "%.2f"),
            spread([r[k].get("cpu_s_per_gb") for r in thr], "%.2f")))
    g = [r["ri2n"]["bps"] / r["iperf3"]["bps"] for r in thr if r["ri2n"]["bps"] and r["iperf3"]["bps"]]
    c = [r["ri2n"]["cpu_s_per_gb"] / r["iperf3"]["cpu_s_per_gb"] for r in thr
         if r["ri2n"].get("cpu_s_per_gb") and r["iperf3"].get("cpu_s_per_gb")]
    L.append("")
    L.append("Per run, ri2n / iperf3: goodput %s, CPU per GB %s." % (spread(g, "%.2f×"), spread(c, "%.2f×")))
    L.append("")
    multi = res.get("runs_multi") or []
    if multi:
        L.append("**(c) Several connections on one endpoint**: 1 and 2 `ri2n bench` clients at once "
                 "against the one `ri2n serve`, %d s, %d runs; aggregate goodput, and the server's "
                 "CPU in cores (CPU seconds per second; the clients run on the same CPUs): in "
                 "all, on its driver thread, and on its busiest two threads:\n" % (MULTI_SECONDS, len(multi)))
        L.append("| the server | clients | aggregate goodput (Gbit/s) | server cores | driver thread | busiest two threads |")
        L.append("| --- | --- | --- | --- | --- | --- |")
        for d, name in (("send", "sends (`-R`)"), ("recv", "receives")):
            for n in (1, 2):
                rows = [r["%s%d" % (d, n)] for r in multi]
                top2 = [sorted(x["threads"].values(), reverse=True)[:2] for x in rows]
                L.append("| %s | %d | %s | %s | %s | %s |" % (
                    name, n, spread([x["bps"] for x in rows], "%.2f", 1e-9),
                    spread([x["server_cores"] for x in rows], "%.2f"),
                    spread([x["driver_cores"] for x in rows], "%.2f"),
                    ", ".join("/".join("%.2f" % v for v in t) for t in top2)))
            r2 = [r["%s2" % d]["bps"] / r["%s1" % d]["bps"] for r in multi
                  if r["%s2" % d]["bps"] and r["%s1" % d]["bps"]]
            L.append("| %s | 2 / 1 | %s× | | | |" % (name, spread(r2, "%.2f")))
        L.append("")
    L.append(busy_line(lat + thr + multi))
    L.append("")
    L += odd_summary([("latency run %d, 2 links" % r["rep"], r.get("ri2n_events")) for r in lat] +
                     [("latency run %d, 1 link" % r["rep"], r.get("ri2n1_events")) for r in lat] +
                     [("throughput run %d" % r["rep"], r["ri2n"].get("events")) for r in thr])
    return "\n".join(L)


def report_lab(res):
    L = [mfacts(res), ""]
    L.append("| topology | capacity ri2n / TCP (Mbit/s) | ri2n bench | iperf3, 1 TCP connection | iperf3 over MPTCP | MPTCP bytes per link (A's tx, share) |")
    L.append("| --- | --- | --- | --- | --- | --- |")
    notes = []
    for t in res["topologies"]:
        rates = t["rates_mbit"]
        cu, ct = sum(udp_limit(r) for r in rates), sum(tcp_limit(r) for r in rates)
        runs = t["runs"]

        def cell(k, cap):
            b = [r[k]["bps"] for r in runs]
            return "%s Mbit/s = **%s %%**" % (spread(b, "%.0f", 1e-6),
                                              spread([x / cap if x else None for x in b], "%.0f", 100))
        shares = []
        for r in runs:
            lt = r["mptcp"]["link_tx_bytes"]
            tot = sum(lt.values()) or 1
            shares.append("/".join("%.0f" % (100 * lt[d] / tot) for d in sorted(lt)))
        L.append("| %s | %.0f / %.0f | %s | %s | %s | %s %% |" % (
            t["name"], cu / 1e6, ct / 1e6, cell("ri2n", cu), cell("tcp", ct), cell("mptcp", ct),
            ", ".join(shares)))
        sf = [r["mptcp"].get("ss_subflows") for r in runs]
        joins = [r["mptcp"]["mptcp_counters"].get("MPJoinSynAckRx", 0) for r in runs]
        rs = [r["ri2n"].get("shares") for r in runs]
        notes.append("- %s: MPTCP `ss -Mni` at mid-run, `subflows:` (joined subflows besides the first) per MPTCP socket %s; "
                     "MPJoinSynAckRx per run %s (iperf3 opens 2 MPTCP connections, control and data); "
                     "ri2n's per-link shares of the stream bytes %s; single-link TCP limit %.0f Mbit/s." % (
                         t["name"], sf, joins,
                         ["/".join("%.2f" % x for x in s) for s in rs if s], tcp_limit(max(rates)) / 1e6))
    L.append("")
    L += notes
    rows = [r[k] for t in res["topologies"] for r in t["runs"] for k in ("ri2n", "tcp", "mptcp")]
    L.append("")
    L.append(busy_line(rows))
    L.append("")
    L += odd_summary([("%s, run %d" % (t["name"], r["rep"]), r["ri2n"].get("events"))
                      for t in res["topologies"] for r in t["runs"]])
    cpu = []
    for t in res["topologies"]:
        for k in ("ri2n", "tcp", "mptcp"):
            v = [(r[k]["cpu_client"] or 0) + (r[k]["cpu_server"] or 0) for r in t["runs"]
                 if r[k].get("cpu_client") is not None and r[k].get("cpu_server") is not None]
            cpu.append("%s %s: %s" % (t["name"], k, spread(v, "%.1f")))
    L.append("")
    L.append("CPU seconds (client + server processes, not the kernel's softirq work on other "
             "threads) per %s s run: %s." % (res["options"]["time"], "; ".join(cpu)))
    return "\n".join(L)


def rate_cpu_cell(runs, k, unit):
    """`tool k`'s goodput and the machine's CPU seconds per GB over `runs`, as a table cell."""
    fmt, scale = {"Gbit/s": ("%.2f", 1e-9), "Mbit/s": ("%.0f", 1e-6)}[unit]
    b = [r[k].get("bps") for r in runs]
    cpu = [r[k]["cpu_machine"] / (r[k]["bytes"] / 1e9) if r[k].get("bytes") else None
           for r in runs]
    return "%s %s, %s CPU-s/GB" % (spread(b, fmt, scale), unit, spread(cpu, "%.2f"))


def report_fast(res):
    L = [mfacts(res), ""]
    gb = res["bytes"] / 1e9
    L.append("**(a) Unlimited-rate lab links** (veth through a bridge per link, no tbf): %.2f GB "
             "A→B per run, median (min–max) of %d runs per tool, the tools in turn in each run, "
             "after one discarded warm-up transfer of each tool on the fresh lab. "
             "CPU: the whole machine's busy time during the transfer (both ends, and the kernel's "
             "forwarding on any thread) per GB moved.\n" % (gb, len(res["configs"][0]["runs"])))
    L.append("| links | ri2n | 1 TCP connection | MPTCP | ri2n / MPTCP goodput | ri2n / TCP CPU per GB | ri2n datagram |")
    L.append("| --- | --- | --- | --- | --- | --- | --- |")
    for c in res["configs"]:
        runs = c["runs"]
        ratio = [r["ri2n"].get("bps") / r["mptcp"]["bps"] if r["ri2n"].get("bps") and r["mptcp"].get("bps")
                 else None for r in runs]
        cpu_ratio = [(r["ri2n"]["cpu_machine"] / r["ri2n"]["bytes"]) / (r["tcp"]["cpu_machine"] / r["tcp"]["bytes"])
                     if r["ri2n"].get("bytes") and r["tcp"].get("bytes") else None for r in runs]
        sizes = sorted({d for r in runs for d in (r["ri2n"].get("datagram") or [])})
        L.append("| %s | %s | %s | %s | **%s×** | **%s×** | %s |" % (
            c["name"], rate_cpu_cell(runs, "ri2n", "Gbit/s"), rate_cpu_cell(runs, "tcp", "Gbit/s"),
            rate_cpu_cell(runs, "mptcp", "Gbit/s"), spread(ratio, "%.2f"),
            spread(cpu_ratio, "%.2f"), "/".join(map(str, sizes))))
    L.append("")
    # how the sender spread the stream over the links: on unlimited links the CPU, not a
    # link, is the limit, so an uneven split is no loss of rate, but it should be seen
    if any(r["ri2n"].get("shares") for c in res["configs"] for r in c["runs"]):
        L.append("ri2n's per-link shares of the stream bytes, per run (the sender's `--json`): %s.\n" % "; ".join(
            "%s: %s" % (c["name"], ", ".join(
                "/".join("%.2f" % x for x in r["ri2n"]["shares"]) if r["ri2n"].get("shares") else "n/a"
                for r in c["runs"])) for c in res["configs"]))
    prof = next((c.get("profile") for c in res["configs"] if c.get("profile")), None)
    if prof:
        L.append("**(b) Where ri2n's cycles go** (2 links, MTU 1500, `perf record -a` over one "
                 "transfer; share of all samples of the machine, idle included; symbols above 1.5 %):\n")
        L.append("| share | thread | where | symbol |")
        L.append("| --- | --- | --- | --- |")
        for p in prof:
            L.append("| %.1f %% | %s | %s | `%s` |" % (p["pct"], p["comm"],
                                                   "kernel" if p["kernel"] else p["dso"], p["sym"]))
        L.append("")
    c = res.get("piped")
    if c:
        runs = c["runs"]
        cu = sum(udp_limit(r) for r in c["rates_mbit"])
        ct = sum(tcp_limit(r) for r in c["rates_mbit"])
        L.append("**(c) 2 × 1 Gbit/s (tbf) with the application competing for the CPUs**: the "
                 "sender reads from a pipe fed by `cat`, the receiver writes into a pipe to "
                 "`b2sum` (about half a CPU at this rate); %.2f GB per run, %d runs:\n" % (res.get("options", {}).get("piped_bytes", 0) / 1e9, len(runs)))
        L.append("| tool | goodput | share of payload capacity | CPU-s per GB (machine) |")
        L.append("| --- | --- | --- | --- |")
        for k, cap in (("ri2n", cu), ("mptcp", ct)):
            b = [r[k].get("bps") for r in runs]
            cpu = [r[k]["cpu_machine"] / (r[k]["bytes"] / 1e9) if r[k].get("bytes") else None
                   for r in runs]
            L.append("| %s | %s Mbit/s | %s %% | %s |" % (
                {"ri2n": "ri2n send/recv", "mptcp": "iperf3 over MPTCP"}[k],
                spread(b, "%.0f", 1e-6), spread([x / cap if x else None for x in b], "%.1f", 100),
                spread(cpu, "%.2f")))
        ratio = [r["ri2n"]["bps"] / r["mptcp"]["bps"] for r in runs
                 if r["ri2n"].get("bps") and r["mptcp"].get("bps")]
        L.append("")
        L.append("ri2n / MPTCP per run: %s." % ", ".join("%.3f" % x for x in ratio))
    bad = [(c["name"], r["rep"], k, r[k].get("rc"), r[k].get("error"))
           for c in res["configs"] + ([res["piped"]] if res.get("piped") else [])
           for r in c["runs"] for k in ("ri2n", "tcp", "mptcp") if k in r and r[k].get("rc") != 0]
    if bad:
        L.append("")
        L.append("Runs that failed: %s." % bad)
    return "\n".join(L)


def report_keyed(res):
    L = [mfacts(res), ""]
    gb = res["bytes"] / 1e9
    L.append("ri2n send/recv of %.2f GB A→B per run without a key and with one (`--key`), in turn, "
             "median (min–max) of %d runs. CPU: the whole machine's busy time during the "
             "transfer (both ends) per GB moved.\n" % (gb, len(res["configs"][0]["runs"])))
    L.append("| links | without a key | with a key | goodput with / without | CPU per GB with / without | cipher |")
    L.append("| --- | --- | --- | --- | --- | --- |")
    for c in res["configs"]:
        runs = c["runs"]
        ratio = [r["keyed"]["bps"] / r["plain"]["bps"] for r in runs
                 if r["keyed"].get("bps") and r["plain"].get("bps")]
        cpu_ratio = [(r["keyed"]["cpu_machine"] / r["keyed"]["bytes"]) /
                     (r["plain"]["cpu_machine"] / r["plain"]["bytes"]) for r in runs
                     if r["keyed"].get("bytes") and r["plain"].get("bytes")]
        ciphers = sorted({str(r["keyed"].get("encryption")) for r in runs})
        L.append("| %s | %s | %s | **%s** | %s | %s |" % (
            c["name"], rate_cpu_cell(runs, "plain", "Mbit/s"), rate_cpu_cell(runs, "keyed", "Mbit/s"), spread(ratio, "%.3f"),
            spread(cpu_ratio, "%.2f"), ", ".join(ciphers)))
    h = res.get("handshakes")
    if h:
        L.append("")
        L.append("Handshakes a server completes per second of its own CPU (`%s`: client and "
                 "server endpoints in one process, datagrams in memory, only the server's calls "
                 "timed; median of 5 runs of 1000 handshakes each, the server holding every "
                 "connection it accepted):\n" % res["commands"]["handshakes"])
        L.append("| | server CPU per handshake | handshakes per server CPU-second | both sides on one CPU |")
        L.append("| --- | --- | --- | --- |")
        for k, name in (("plain", "without a key"), ("keyed", "with a key (Noise NNpsk0, X25519)")):
            x = h[k]
            L.append("| %s | %.1f µs | %.0f | %.0f /s |" % (
                name, x["server_us_per_handshake"], x["server_handshakes_per_s"],
                x["both_sides_handshakes_per_s"]))
    bad = [(c["name"], r["rep"], k, r[k].get("rc")) for c in res["configs"] for r in c["runs"]
           for k in ("plain", "keyed") if r[k].get("rc") != 0]
    if bad:
        L.append("")
        L.append("Runs that failed: %s." % bad)
    return "\n".join(L)


def fmt_ms(x):
    return "never" if x is None else "%.0f" % (x * 1000)


def report_fault(res):
    L = [mfacts(res), ""]
    runs = res["runs"]

    def metric(tool, scen, idx, key):
        vals = []
        for r in runs:
            if r["tool"] == tool and r["scenario"] == scen:
                ev = r["analysis"]["events"][idx]
                vals.append(ev.get(key))
        return vals

    def cell(vals):
        if not vals:
            return "n/a"
        never = sum(1 for v in vals if v is None)
        got = [v for v in vals if v is not None]
        s = spread(got, "%.0f", 1000) if got else ""
        if never:
            s = (s + "; " if s else "") + "not reached in %d of %d" % (never, len(vals))
        return s

    L.append("Milliseconds, median (min–max, n runs); rule above. \"stall\" = longest run of "
             "10 ms bins below 10 % of the surviving/healed capacity.\n")
    meters = sorted({r.get("meter", "sender") for r in runs if r.get("tool") == "ri2n"})
    a2b = ("B, the server, counts the bytes it read per interval (a receiver-side meter)"
           if meters == ["receiver"] else "its timeline counts acknowledged bytes")
    L.append("Recovery (\"time to 90 %%\" after the heal) and failover. ri2n A→B: A sends, %s; "
             "ri2n B→A: `bench --reverse`, A counts the bytes it read (a receiver-side meter); "
             "MPTCP: receiver-side meter.\n" % a2b)
    L.append("| scenario, event | ri2n A→B | ri2n B→A | MPTCP | ri2n A→B: longest stall | MPTCP: longest stall |")
    L.append("| --- | --- | --- | --- | --- | --- |")
    rows = [("main", 0, "Fig. 4, t=2 s: link 1's switch dies (failover gap, target: link 2)")]
    rows += RECOVERY_EVENTS
    worst = []
    for scen, idx, name in rows:
        if not any(r["scenario"] == scen for r in runs):
            continue
        L.append("| %s | %s | %s | %s | %s | %s |" % (
            name, cell(metric("ri2n", scen, idx, "time_to_90")),
            cell(metric("ri2n-rev", scen, idx, "time_to_90")),
            cell(metric("mptcp", scen, idx, "time_to_90")),
            cell(metric("ri2n", scen, idx, "stall")), cell(metric("mptcp", scen, idx, "stall"))))
        if idx > 0 or scen != "main":
            worst += [v for t in ("ri2n", "ri2n-rev") for v in metric(t, scen, idx, "time_to_90")]
    L.append("")
    if worst:
        slow = [v for v in worst if v is None or v > 0.2]
        L.append("- ri2n recovery, every run of every scenario above (both directions): %d runs, "
                 "slowest %s; %d above 200 ms or never." % (
                     len(worst), "never" if None in worst else "%.0f ms" % (max(worst) * 1000),
                     len(slow)))
    # after a total outage: how soon data flows again at all (first 10 ms bin above 10 % of one
    # link), besides the 90 % rule, which also waits for the link's window to open up
    def first_data(r, idx):
        e = r["events"][idx]
        cap = res["per_link_cap"]["mptcp" if r["tool"] == "mptcp" else "ri2n"]
        s = r["series_bps"]
        k0 = int(e["t_bench"] / BIN)
        for k in range(k0, len(s)):
            if s[k] >= 0.1 * cap:
                return max(0.0, k * BIN - e["t_bench"])
        return None

    fd_rows = []
    for scen, idx, name in RECOVERY_EVENTS:
        if scen.startswith("outage") and any(r["scenario"] == scen for r in runs):
            fd_rows.append("| %s | %s |" % (name, " | ".join(
                cell([first_data(r, idx) for r in runs if r["tool"] == t and r["scenario"] == scen])
                for t in ("ri2n", "ri2n-rev", "mptcp"))))
    if fd_rows:
        L.append("")
        L.append("Data flowing again after a total outage (first 10 ms bin above 10 % of one "
                 "link's capacity), ms:\n")
        L.append("| scenario | ri2n A→B | ri2n B→A | MPTCP |")
        L.append("| --- | --- | --- | --- |")
        L += fd_rows
        L.append("")
    soak = [r for r in runs if r["tool"] == "ri2n" and r["scenario"] == "main"]
    if soak:
        missed = [r["rep"] for r in soak
                  if any(r["analysis"]["events"][i].get("time_to_90") is None for i in (2, 3))]
        L.append("- Figure-4 take-back soak: %d ri2n runs; a healed link not taken back (90 %% "
                 "not reached before the next event or the end) in %d%s." % (
                     len(soak), len(missed), " (runs %s)" % missed if missed else ""))
    dips = {t: [r["analysis"]["events"][0].get("min_bin_200ms") for r in runs
                if r["tool"] == t and r["scenario"] == "main"] for t in ("ri2n", "mptcp")}
    L.append("- Lowest 10 ms goodput in the 200 ms after link 1's switch died (t=2 s, main): "
             "ri2n %s Mbit/s, MPTCP %s Mbit/s." % (spread(dips["ri2n"], "%.0f", 1e-6),
                                                   spread(dips["mptcp"], "%.0f", 1e-6)))
    det, back = [], []
    for r in runs:
        if not r["tool"].startswith("ri2n") or not r.get("events_ri2n"):
            continue
        evs = r["events_ri2n"]
        f = [e for e in r["events"] if e["action"] == "fault" and e["link"] == 1][0]
        d = [x["t"] for x in evs if x["link"] == 0 and x["t"] >= f["t_bench"] - 0.01
             and ("-> down" in x["event"] or "-> degraded" in x["event"])]
        if d and r["scenario"] == "main":
            det.append(d[0] - f["t_bench"])
        h = [e for e in r["events"] if e["action"] == "heal" and e["link"] == 1][0]
        u = [x["t"] for x in evs if x["link"] == 0 and x["t"] >= h["t_bench"] - 0.01 and x["event"].endswith("-> up")]
        if u:
            back.append((r["scenario"], u[0] - h["t_bench"]))
    if det:
        L.append("- ri2n declared link 1 degraded/down %s ms after its switch died (its own "
                 "`events`, main scenario)." % spread(det, "%.0f", 1000))
    for sc, name in (("main", "after 2 s with no link (main, t=6 s)"), ("outage1", "after the 1 s outage"),
                     ("outage10", "after the 10 s outage"), ("outage60", "after the 60 s outage"),
                     ("outage300", "after the 5-minute outage"),
                     ("cable_a", "after its cable was back in host A"),
                     ("cable_b", "after its cable was back in host B")):
        v = [b for s_, b in back if s_ == sc]
        if v:
            L.append("- ri2n took link 1 back up %s ms after it healed %s." % (spread(v, "%.0f", 1000), name))
    for tool in ("ri2n", "mptcp"):
        ss = [r["analysis"]["steady_bps"] for r in runs if r["tool"] == tool and r["scenario"] == "main"]
        tg = [r["analysis"]["events"][3].get("target_bps") for r in runs
              if r["tool"] == tool and r["scenario"] == "main"]
        L.append("- %s: two-link goodput before the first fault %s Mbit/s (capacity %.0f); the "
                 "two-link recovery target was %s Mbit/s." % (
                     tool, spread(ss, "%.0f", 1e-6), 2 * res["per_link_cap"][tool] / 1e6,
                     spread(tg, "%.0f", 1e-6)))
    mp = [r for r in runs if r["tool"] == "mptcp"]
    if mp:
        L.append("- MPTCP really ran (TCP_IS_MPTCP on both ends: %s); `subflows:` (joined subflows "
                 "besides the first) at t=1 s (`ss -Mni` in A): %s; A's tx bytes per link in the main scenario: %s." % (
                     sorted(set("%s/%s" % (r["mptcp_send"], r["mptcp_recv"]) for r in mp)),
                     sorted(set(str(r["ss_subflows_at_1s"]) for r in mp)),
                     [r["link_tx_bytes"] for r in mp if r["scenario"] == "main"][:1]))
    nojoin = ["%s run %d (A's tx bytes per link %s)" % (r["scenario"], r["rep"], r["link_tx_bytes"])
              for r in mp if not r["ss_subflows_at_1s"]]
    if nojoin:
        L.append("- MPTCP runs whose second subflow was not up at t=1 s (no `subflows:` in "
                 "`ss -Mni`): %s." % "; ".join(nojoin))
    cmds = [r["events"] for r in runs if r["events"]]
    cm = [e["cmd_ms"] for ev in cmds for e in ev if "cmd_ms" in e]
    if cm:
        L.append("- `ri2n-lab fault`/`heal` took %s ms per command." % spread(cm, "%.0f"))
    al = [r.get("align_s") for r in runs if r["tool"] == "ri2n" and r.get("align_s") is not None]
    if al:
        L.append("- ri2n timeline alignment: live estimate vs exact offset differed by %s ms." % spread(al, "%.1f", 1000))
    mi = [r.get("max_interval_s") for r in runs if r["tool"] == "ri2n" and r["scenario"] == "main"]
    if mi:
        L.append("- Longest ri2n timeline interval in the main scenario (the writer blocked while "
                 "no link was up): %s s." % spread(mi, "%.2f"))
    ic = res.get("iperf3_check")
    if ic:
        s = []
        for m in ic["analysis"]["events"]:
            if "time_to_90" in m:
                s.append("%s of link %d at %.2f s: %s" % (
                    m["action"], m["link"], m["t_bench"],
                    "back to 90 %% after %s ms" % fmt_ms(m["time_to_90"]) if m["time_to_90"] is not None
                    else "not back to 90 %% (%.0f Mbit/s) before the next event" % (m["target_bps"] / 1e6)))
        L.append("- Cross-check, iperf3 over MPTCP at its finest interval (0.1 s; iperf3 3.12 refuses "
                 "`-i 0.01`: \"invalid report interval (min = 0.1, max = 60 seconds)\"), %s intervals, "
                 "one run, exit %s: %s." % (ic["source"], ic["rc"], "; ".join(s)))
    L.append("- " + busy_line(runs))
    errs = [(r["tool"], r["scenario"], r["rep"], r.get("error") or r.get("rc")) for r in runs
            if r.get("rc") not in (0,)]
    if errs:
        L.append("- Runs that did not exit 0: %s" % errs)
    return "\n".join(L)


def report_sweep(res):
    L = [mfacts(res), ""]
    sizes = res["sizes"]
    runs = res["runs"]
    tools = [("ri2n", "ri2n (2 links)"), ("udp", "UDP (sockperf)"), ("tcp", "TCP (sockperf)"),
             ("mptcp", "MPTCP (mptcpize sockperf --tcp)")]

    def rtt(run, k, size):
        if k == "ri2n":
            rs = run["ri2n"]["results"] or []
            want = 65536 if size == 65507 else size
            for x in rs:
                if x["size"] == want:
                    return x["median_us"]
            return None
        for x in run[k]["results"]:
            if x["size"] == size:
                return x["median_us"]
        return None

    L.append("Median RTT in µs per message size (median over %d runs; ri2n's 64 KiB point is "
             "65536 B, sockperf's 65507 B, the largest UDP datagram):\n" % len(runs))
    L.append("| size (B) | " + " | ".join(n for _, n in tools) + " |")
    L.append("| ---: | " + " | ".join("---" for _ in tools) + " |")
    for s in sizes:
        L.append("| %d | %s |" % (s, " | ".join(spread([rtt(r, k, s) for r in runs], "%.0f")
                                                  for k, _ in tools)))
    L.append("")
    L.append("Fit of the one-way time t = RTT/2 = α + β·n (least squares on the per-size medians "
             "of each run, sizes %d B–64 KiB, the same sizes for every transport), then median "
             "(min–max) over the runs:\n" % sizes[0])
    L.append("| transport | α (µs) | 1/β (Mbit/s) | n½ = α/β (bytes) | measured half-RTT at %d B (µs) |" % sizes[0])
    L.append("| --- | --- | --- | --- | --- |")
    for k, name in tools:
        a, inv, nh, h0 = [], [], [], []
        for r in runs:
            pts = [(s if not (k == "ri2n" and s == 65507) else 65536, rtt(r, k, s)) for s in sizes]
            pts = [(n, t / 2) for n, t in pts if t is not None]
            al, be, nhf = fit(pts)
            if al is None:
                continue
            a.append(al)
            inv.append(8 / be if be > 0 else None)  # bytes/µs → Mbit/s
            nh.append(nhf)
            h0.append(pts[0][1] if pts else None)
        L.append("| %s | %s | %s | %s | %s |" % (name, spread(a, "%.1f"), spread(inv, "%.0f"),
                                                spread(nh, "%.0f"), spread(h0, "%.1f")))
    own = [r["ri2n"]["fit"] for r in runs if r["ri2n"].get("fit")]
    if own:
        L.append("")
        L.append("ri2n's own fit (`bench --latency --sweep`, every power of two 1 B–1 MiB), "
                 "median (min–max): α %s µs, 1/β %s Mbit/s, n½ %s bytes." % (
                     spread([f.get("alpha_us") for f in own], "%.1f"),
                     spread([f.get("bandwidth_bps") for f in own], "%.0f", 1e-6),
                     spread([f.get("n_half_bytes") for f in own], "%.0f")))
        big = [x for r in runs for x in (r["ri2n"]["results"] or []) if x["size"] == 1048576]
        if big:
            L.append("ri2n's 1 MiB ping-pong: median RTT %s µs, i.e. %s Mbit/s each way (2 links: "
                     "%.0f Mbit/s UDP payload limit)." % (
                         spread([x["median_us"] for x in big], "%.0f"),
                         spread([1048576 * 8 / (x["median_us"] / 2) for x in big], "%.0f"),
                         2 * udp_limit(1000) / 1e6))
    shares = []
    for r in runs:
        lt = r["mptcp"]["link_tx_bytes"]
        shares.append({d: lt[d] for d in sorted(lt)})
    L.append("")
    L.append("MPTCP sweep, A's tx bytes per link per run: %s." % shares)
    L.append("")
    L.append(busy_line(runs))
    L.append("")
    L += odd_summary([("sweep run %d" % r["rep"], r["ri2n"].get("events")) for r in runs])
    bad = [(k, x["size"], x.get("rc")) for r in runs for k, _ in tools if k != "ri2n"
           for x in r[k]["results"] if x.get("error")]
    if bad:
        L.append("sockperf runs without a result: %s." % bad)
    return "\n".join(L)


def plot(res):
    """docs/fault-timeline.png: the main scenario and the 10 s outage, ri2n and MPTCP."""
    d = os.path.join(RESULTS, "plot")
    os.makedirs(d, exist_ok=True)
    files = {}
    for scen in ("main", "outage10"):
        for tool in ("ri2n", "mptcp"):
            rs = [r for r in res["runs"] if r["tool"] == tool and r["scenario"] == scen]
            if not rs:
                continue
            # the run whose last recovery is the median one
            key = lambda r: (r["analysis"]["events"][-1].get("time_to_90") or 99)
            r = sorted(rs, key=key)[len(rs) // 2]
            fn = os.path.join(d, "%s-%s.dat" % (scen, tool))
            with open(fn, "w") as f:
                for k, v in enumerate(r["series_bps"]):
                    f.write("%.3f %.1f\n" % ((k + 0.5) * BIN, v / 1e6))
            files[(scen, tool)] = (fn, r)
    gp = os.path.join(d, "fault-timeline.gp")
    with open(gp, "w") as f:
        f.write('set terminal pngcairo size 1400,900 font "sans,11"\nset output "%s"\n' % PLOT)
        f.write("set multiplot layout 2,1\nset grid\nset ylabel 'goodput (Mbit/s, 10 ms bins)'\n"
                "set xlabel 'time (s)'\nset yrange [0:2300]\nset key tmargin center horizontal\n")
        for scen, title in (("main", "2 x 1 Gbit/s: link 1 switch dies at 2 s, link 2 at 4 s; link 1 back at 6 s, link 2 at 8 s"),
                            ("outage10", "2 x 1 Gbit/s: both switches die at 1 s, link 1 back at 11 s (10 s outage)")):
            f.write("unset arrow\n")
            ev = files.get((scen, "ri2n"), files.get((scen, "mptcp")))
            if ev:
                for e in ev[1]["events"]:
                    f.write("set arrow from %.3f,0 to %.3f,2300 nohead dt 2 lc rgb '#888888'\n" % (e["t"], e["t"]))
            f.write("set title '%s'\n" % title)
            f.write("set xrange [0:%d]\n" % SCENARIOS[scen][0])
            pl = []
            if (scen, "ri2n") in files:
                pl.append("'%s' using 1:2 with steps lw 1.5 lc rgb '#1f77b4' title 'ri2n bench (sender, acknowledged)'" % files[(scen, "ri2n")][0])
            if (scen, "mptcp") in files:
                pl.append("'%s' using 1:2 with steps lw 1.5 lc rgb '#d62728' title 'MPTCP, 2 subflows (receiver)'" % files[(scen, "mptcp")][0])
            pl.append("%.1f with lines dt 3 lc rgb '#2ca02c' title '2 links, UDP payload limit'" % (2 * udp_limit(1000) / 1e6))
            f.write("plot " + ", ".join(pl) + "\n")
        f.write("unset multiplot\n")
    r = subprocess.run(["gnuplot", gp], capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        log("gnuplot failed: %s" % r.stderr[-500:])


REPORTERS = {"loopback": report_loopback, "lab": report_lab, "fast": report_fast,
             "fault": report_fault, "sweep": report_sweep, "keyed": report_keyed}


def update_doc(parts):
    if not os.path.exists(DOC):
        log("no %s: not updated" % DOC)
        return
    with open(DOC) as f:
        text = f.read()
    for part in parts:
        res = load(part)
        if not res:
            continue
        block = REPORTERS[part](res)
        b, e = "<!-- BEGIN %s -->" % part, "<!-- END %s -->" % part
        if b in text and e in text:
            pre, rest = text.split(b, 1)
            _, post = rest.split(e, 1)
            text = pre + b + "\n" + block + "\n" + e + post
        else:
            log("markers for %s missing in %s" % (part, DOC))
        if part == "fault":
            plot(res)
    with open(DOC, "w") as f:
        f.write(text)


# ------------------------------------------------------------------------------------------


# ------------------------------------------------------------------------------------------
# part tunnel (issue 12): `ri2n tunnel` on 3 hosts and 2 networks of 1 Gbit/s per port

TUNNEL_HOSTS = "abc"


def tunnel_up(lab, tmpdir, carry="datagrams"):
    """Key, cluster file and a daemon per host (`--carry CARRY`); waits until every daemon has
    both peers."""
    key = os.path.join(tmpdir, "cluster.key")
    run([RI2N, "keygen", "--output", key, "--force"])
    text = 'key = "%s"\n' % key
    for i, h in enumerate(TUNNEL_HOSTS, 1):
        text += '\n[[host]]\nname = "%s"\naddress = "10.99.0.%d"\nlinks = ["10.77.1.%d", "10.77.2.%d"]\n' % (
            h, i, i, i)
    cfg = os.path.join(tmpdir, "cluster.toml")
    with open(cfg, "w") as f:
        f.write(text)
    logs, daemons = {}, {}
    for h in TUNNEL_HOSTS:
        logs[h] = os.path.join(tmpdir, "tunnel-%s.log" % h)
        daemons[h] = PROCS.start(lab.ex(h, RI2N, "tunnel", "--config", cfg, "--carry", carry),
                                 stderr=open(logs[h], "w"))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if all(open(logs[h]).read().count(" connected (") >= 2 for h in TUNNEL_HOSTS):
            return daemons, logs
        time.sleep(0.1)
    raise RuntimeError("tunnel daemons did not connect: %s" % {h: open(logs[h]).read() for h in logs})


def iperf_run(lab, client, server_ip, port, seconds, mptcp=False, interval=None, events=()):
    cmd = ["iperf3", "-c", server_ip, "-p", port, "-t", seconds, "--json"]
    if interval:
        cmd += ["-i", interval]
    if mptcp:
        cmd = ["mptcpize", "run"] + cmd
    stop = threading.Event()
    ev_log = []
    th = None
    if events:
        t0 = time.monotonic()
        th = threading.Thread(target=do_events, args=(lab, t0, events, ev_log, stop))
        th.start()
    doc, rc, cpu, _, wall, err = run_json(lab.ex(client, *cmd), seconds + 60)
    stop.set()
    if th:
        th.join(30)
    e = doc["end"]["sum_received"] if doc else {}
    r = {"bps": e.get("bits_per_second"), "bytes": e.get("bytes"), "rc": rc,
         "retransmits": doc and doc["end"]["sum_sent"].get("retransmits"), "cpu_client": cpu}
    if interval and doc:
        r["intervals"] = [[round(i["sum"]["start"], 3), i["sum"]["bits_per_second"]]
                          for i in doc["intervals"]]
        # when the sender retransmitted, and its window then: what a stall looked like
        r["retransmits_at"] = [[round(i["sum"]["start"], 3), i["sum"].get("retransmits"),
                                (i.get("streams") or [{}])[0].get("snd_cwnd")]
                               for i in doc["intervals"] if i["sum"].get("retransmits")]
    if rc != 0:
        r["error"] = err[-500:] or (doc or {}).get("error")
    return r


# an idle TCP connection through an outage: the client connects, is echoed once, sleeps, and
# then times one more echo (its JSON result on stdout)
IDLE_PY = r"""
import json, socket, sys, time
if sys.argv[1] == "server":
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", int(sys.argv[2])))
    s.listen(1)
    c, _ = s.accept()
    while True:
        d = c.recv(100)
        if not d:
            break
        c.sendall(d)
else:
    c = socket.create_connection((sys.argv[2], int(sys.argv[3])), timeout=10)
    c.sendall(b"hello")
    c.recv(100)
    time.sleep(float(sys.argv[4]))
    c.settimeout(60)
    t = time.monotonic()
    try:
        c.sendall(b"again")
        d = c.recv(100)
        print(json.dumps({"ok": d == b"again", "echo_s": time.monotonic() - t}))
    except OSError as e:
        print(json.dumps({"ok": False, "error": str(e), "after_s": time.monotonic() - t}))
"""


def first_data_after(intervals, t):
    """Seconds from t to the end of the first interval starting at or after t that moved data
    (None if none did)."""
    step = intervals[1][0] - intervals[0][0] if len(intervals) > 1 else 0.2
    for start, bps in intervals:
        if start >= t - 1e-6 and bps > 0:
            return start + step - t
    return None


def tunnel_partition(lab, tmpdir, outage, t_fault=5.0):
    """Every link down for `outage` s under an idle and a moving TCP connection (host a to b
    through the tunnel)."""
    script = os.path.join(tmpdir, "idle.py")
    with open(script, "w") as f:
        f.write(IDLE_PY)
    srv = PROCS.start(lab.ex("b", "python3", script, "server", 5301))
    time.sleep(0.5)
    out = tempfile.TemporaryFile("w+")
    idle = PROCS.start(lab.ex("a", "python3", script, "client", "10.99.0.2", 5301,
                              t_fault + outage + 1.0), stdout=out)
    heal = t_fault + outage
    r = iperf_run(lab, "a", "10.99.0.2", 5201, heal + 10, interval=0.2,
                  events=[(t_fault, "fault", 1, "switch"), (t_fault, "fault", 2, "switch"),
                          (heal, "heal", "all")])
    PROCS.wait_rusage(idle, 70)
    out.seek(0)
    try:
        r["idle"] = json.loads(out.read())
    except ValueError:
        r["idle"] = {"ok": False, "error": "no result"}
    PROCS.stop(srv)
    r["outage"] = outage
    r["resume_s"] = first_data_after(r.get("intervals") or [], heal)
    return r


MPI_SECONDS = 42
# the lab test's schedule (crates/ri2n-lab-tests/tests/tunnel.rs), in the job's own seconds
MPI_EVENTS = [(6.0, "fault", 1, "switch"), (12.0, "heal", 1), (16.0, "fault", 1, "switch"),
              (16.0, "fault", 2, "switch"), (36.0, "heal", "all")]


def mpi_job(lab, tmpdir, btl, oob):
    """The lab test's MPI job (tests/mpi/check.c, one rank per host, mpirun in host a) with
    Open MPI's TCP transport on `btl` and its control traffic on `oob`, through MPI_EVENTS."""
    program = os.path.join(tmpdir, "check")
    if not os.path.exists(program):
        run(["mpicc", "-O2", "-o", program,
             os.path.join(ROOT, "crates/ri2n-lab-tests/tests/mpi/check.c")], timeout=120)
    agent = os.path.join(tmpdir, "agent")
    with open(agent, "w") as f:
        f.write('#!/bin/sh\nexec %s --prefix %s agent "$@"\n' % (LAB, lab.prefix))
    os.chmod(agent, 0o755)
    hostfile = os.path.join(tmpdir, "hostfile")
    with open(hostfile, "w") as f:
        f.write("".join("%s slots=1\n" % h for h in TUNNEL_HOSTS))
    cmd = [agent, "a", "mpirun", "--hostfile", hostfile, "-np", 3, "--map-by", "node",
           "--mca", "plm_rsh_agent", agent, "--mca", "plm_rsh_no_tree_spawn", 1,
           "--mca", "pml", "ob1", "--mca", "btl", "tcp,self", "--mca", "btl_tcp_if_include", btl,
           "--mca", "oob_tcp_if_include", oob, program, MPI_SECONDS]
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    out, err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
    p = PROCS.start(cmd, stdout=out, stderr=err, env=env)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and p.poll() is None:
        out.seek(0)
        if "progress" in out.read():
            break
        time.sleep(0.05)
    t0 = time.monotonic() - 1.0  # the first progress line comes a second into the job
    ev_log, stop = [], threading.Event()
    do_events(lab, t0, MPI_EVENTS, ev_log, stop)
    rc, _ = PROCS.wait_rusage(p, MPI_SECONDS + 120)
    wall = time.monotonic() - t0
    out.seek(0)
    err.seek(0)
    text, etext = out.read(), err.read()
    ranks = re.findall(r"rank (\d+): iterations (\d+), checked MB (\d+), longest iteration "
                       r"([\d.]+) s, at ([\d.]+) s", text)
    progress = [(float(t), int(i)) for t, i in re.findall(r"progress t=([\d.]+) iterations=(\d+)", text)]
    return {"rc": rc, "ok": "result: ok" in text, "wall_s": wall, "progress": progress,
            "ranks": [{"rank": int(r), "iterations": int(i), "mb": int(m), "longest_s": float(l),
                       "longest_at": float(a)} for r, i, m, l, a in ranks],
            "stderr": etext[-1500:] if rc != 0 else ""}


# payload capacity of one 1 Gbit/s link for TCP: 1448 payload bytes per 1514-byte frame (a
# 1500-byte packet less 52 bytes of IP+TCP with timestamps), what one TCP connection carries on
# it; the tunnel's own encapsulation (ri2n's 39 bytes per packet, inner TCP's headers once per
# 64 KB segment) counts against it
TUNNEL_LINK_CAP = 1e9 * 1448 / 1514
# a switch dies and heals under a TCP flow through the tunnel
TUNNEL_FAILOVER = (8, [(3.0, "fault", 1, "switch"), (5.0, "heal", 1)])


def part_tunnel(o):
    res = {"part": "tunnel", "runs": [], "failover": [], "latency": []}
    lab = new_lab(o.prefix)
    lab.up([1000, 1000], hosts=3)
    res["mptcp"] = lab.mptcp_setup()
    tmpdir = tempfile.mkdtemp(prefix="ri2nbench-tunnel-")
    daemons, logs = tunnel_up(lab, tmpdir)
    srv = {"iperf3": PROCS.start(lab.ex("b", "iperf3", "-s", "-p", 5201)),
           "mptcp": PROCS.start(lab.ex("b", "mptcpize", "run", "iperf3", "-s", "-p", 5202)),
           "sockperf": PROCS.start(lab.ex("b", "sockperf", "server", "-i", "0.0.0.0", "-p", 11111))}
    time.sleep(1)
    tools = ["tunnel", "mptcp", "tcp"]
    for rep in range(o.reps):
        row = {"rep": rep}
        for k in tools[rep % 3:] + tools[:rep % 3]:
            row["busy_before_" + k] = wait_quiet()
            c0 = {h: proc_cpu(daemons[h].pid) for h in "ab"}
            if k == "tunnel":
                r = iperf_run(lab, "a", "10.99.0.2", 5201, o.time)
            else:
                r = iperf_run(lab, "a", "10.77.1.2", 5202 if k == "mptcp" else 5201, o.time,
                              mptcp=k == "mptcp")
            c1 = {h: proc_cpu(daemons[h].pid) for h in "ab"}
            if k == "tunnel":
                r["cpu_daemons"] = {h: c1[h] - c0[h] for h in "ab"}
            row[k] = r
        log("  rep %d: tunnel %.0f, mptcp %.0f, tcp (one link) %.0f Mbit/s" % tuple(
            [rep] + [(row[k]["bps"] or 0) / 1e6 for k in tools]))
        res["runs"].append(row)
    # a switch dies and heals under a TCP flow through the tunnel, measured by the receiver
    # in 10 ms bins (iperf3 reports no more often than every 0.1 s) with the fault part's rule
    seconds, events = TUNNEL_FAILOVER
    for rep in range(o.reps):
        wait_quiet()
        r = tcp_flow_run(lab, "a", "10.99.0.2", 5310, seconds, events)
        r["analysis"] = analyse(r["series_bps"], r["events"], seconds, TUNNEL_LINK_CAP)
        log("  failover rep %d: %s" % (rep, ", ".join(
            "%s at %.2f s: %s ms" % (e["action"], e["t_bench"], fmt_ms(e.get("time_to_90")))
            for e in r["analysis"]["events"])))
        res["failover"].append(r)
    # round trip through the tunnel and directly on link 1 (64-byte UDP ping-pong)
    for rep in range(o.reps):
        wait_quiet()
        row = {"tunnel": sockperf_pp(lab.ex("a"), "10.99.0.2", 11111, 64, o.sockperf_time),
               "link": sockperf_pp(lab.ex("a"), "10.77.1.2", 11111, 64, o.sockperf_time)}
        res["latency"].append(row)
    # every link down under an idle and a moving connection
    outage = 10 if o.quick else 60
    res["partition"] = []
    for rep in range(1 if o.quick else 2):
        wait_quiet()
        r = tunnel_partition(lab, tmpdir, outage)
        log("  partition %d s, rep %d: iperf3 exit %s, data again %s s after the heal; idle "
            "connection %s" % (outage, rep, r["rc"], r["resume_s"], r["idle"]))
        res["partition"].append(r)
    # an MPI job through a dead switch and a 20 s partition
    if shutil.which("mpirun") and shutil.which("mpicc"):
        wait_quiet()
        res["mpi_tunnel"] = mpi_job(lab, tmpdir, "ri2n0", "ri2n0")
        log("  MPI through the tunnel: %s" % {k: res["mpi_tunnel"][k] for k in ("rc", "ok", "ranks")})
    # how IP packets ride: datagrams (the default) against reliable messages
    res["carry"] = {}
    for carry in ("datagrams", "messages"):
        for p in daemons.values():
            PROCS.stop(p)
        daemons, logs = tunnel_up(lab, tmpdir, carry)
        rows = []
        for rep in range(o.reps):
            wait_quiet()
            row = {"rate": iperf_run(lab, "a", "10.99.0.2", 5201, o.time),
                   "failover": iperf_run(lab, "a", "10.99.0.2", 5201, 8, interval=0.1,
                                         events=[(3.0, "fault", 1, "switch"), (5.0, "heal", 1)]),
                   "outage": iperf_run(lab, "a", "10.99.0.2", 5201, 10, interval=0.2,
                                       events=[(3.0, "fault", 1, "switch"),
                                               (3.0, "fault", 2, "switch"), (6.0, "heal", "all")])}
            row["outage"]["resume_s"] = first_data_after(row["outage"].get("intervals") or [], 6.0)
            log("  carry %s rep %d: %.0f Mbit/s, data again %s s after a 3 s outage" % (
                carry, rep, (row["rate"]["bps"] or 0) / 1e6, row["outage"]["resume_s"]))
            rows.append(row)
        res["carry"][carry] = rows
    for p in srv.values():
        PROCS.stop(p)
    for p in daemons.values():
        PROCS.stop(p)
    # the same MPI job on the plain networks: Open MPI on both interfaces, no ri2n
    if shutil.which("mpirun") and shutil.which("mpicc"):
        wait_quiet()
        res["mpi_plain"] = mpi_job(lab, tmpdir, "eth1,eth2", "eth1")
        log("  MPI on the plain networks: %s" % {k: res["mpi_plain"][k] for k in ("rc", "ok", "ranks")})
    res["daemon_logs"] = {h: open(logs[h]).read()[-3000:] for h in TUNNEL_HOSTS}
    res["commands"] = {
        "tunnel": "iperf3 -c 10.99.0.2 -t %d (host a to b through ri2n0)" % o.time,
        "mptcp": "mptcpize run iperf3 -c 10.77.1.2 -p 5202 -t %d (one subflow per network)" % o.time,
        "tcp": "iperf3 -c 10.77.1.2 -t %d (network 1 only)" % o.time,
        "failover": "bench/mptcp_flow.py send --tcp --to 10.99.0.2:5310 --time 8 (receiver: "
                    "recv --tcp, 10 ms bins); switch 1 dies at 3 s, heals at 5 s",
        "latency": "sockperf ping-pong -m 64 --full-rtt -t %d to 10.99.0.2 and to 10.77.1.2" % o.sockperf_time,
        "partition": "iperf3 -c 10.99.0.2 -t %d -i 0.2 and an idle TCP connection (echoed once "
                     "before, timed once after); every switch dead from 5 s to %d s" % (
                         5 + outage + 10, 5 + outage),
        "mpi": "mpirun -np 3 --map-by node --mca pml ob1 --mca btl tcp,self --mca "
               "btl_tcp_if_include ri2n0 (plain: eth1,eth2) --mca oob_tcp_if_include ri2n0 "
               "(plain: eth1) check %d (tests/mpi/check.c); switch 1 dead 6-12 s, every switch "
               "dead 16-36 s" % MPI_SECONDS,
        "carry": "ri2n tunnel --carry datagrams|messages; iperf3 -c 10.99.0.2 -t %d; -t 8 -i 0.1 "
                 "with switch 1 dead 3-5 s; -t 10 -i 0.2 with every switch dead 3-6 s" % o.time,
    }
    lab.down()
    shutil.rmtree(tmpdir, ignore_errors=True)
    return res


def report_tunnel(res):
    L = [mfacts(res), ""]
    runs = res["runs"]
    cap = 2 * TUNNEL_LINK_CAP
    L.append("3 hosts (`lab/ri2n-lab up 2 --hosts 3 --rate 1000`), 2 networks, 1 Gbit/s tbf per "
             "port; a `ri2n tunnel` daemon per host (keyed); TCP from host a to host b. Median "
             "(min–max) of %d runs, the tools taking turns:\n" % len(runs))
    L.append("| what | goodput, Mbit/s | TCP retransmissions | daemon CPU-s per GB (a + b) |")
    L.append("| --- | --- | --- | --- |")
    for k, name in (("tunnel", "iperf3 through the tunnel (both networks)"),
                    ("mptcp", "iperf3 over kernel MPTCP (`mptcpize`, both networks)"),
                    ("tcp", "iperf3 over TCP on network 1 only")):
        bps = [r[k]["bps"] or 0 for r in runs]
        retr = [r[k]["retransmits"] or 0 for r in runs]
        cpu = ""
        if k == "tunnel":
            cpu = spread([sum(r[k]["cpu_daemons"].values()) / max(r[k]["bytes"] or 1, 1) * 1e9
                          for r in runs], "%.2f")
        L.append("| %s | %s | %s | %s |" % (name, spread(bps, "%.0f", 1e-6), spread(retr, "%.0f"), cpu))
    ratio = [(r["tunnel"]["bps"] or 0) / (r["mptcp"]["bps"] or 1) for r in runs]
    share = [(r["tunnel"]["bps"] or 0) / cap for r in runs]
    L.append("")
    L.append("Tunnel / MPTCP per run: **%s** (target ≥ 1). Tunnel / payload capacity of the two "
             "links for TCP (1448 bytes per 1514-byte frame, %.0f Mbit/s): **%s** (target ≥ 90 %%)."
             % (spread(ratio, "%.3f×"), cap / 1e6, spread(share, "%.1f %%", 100)))
    fo = res["failover"]
    if fo and "analysis" in fo[0]:
        L.append("")
        L.append("**Switch 1 dies at 3 s and heals at 5 s** under one TCP flow through the tunnel "
                 "(`bench/mptcp_flow.py --tcp`, the receiver counting what it reads per 10 ms; "
                 "events placed where the lab stamped them). Rule as in part 3: the flow is back "
                 "at the start of the first 10 ms bin whose own goodput and whose 100 ms average "
                 "are both ≥ the target: after the fault 90 %% of the surviving link (%.0f "
                 "Mbit/s), after the heal 90 %% of both links or of the flow's own rate before the "
                 "fault if lower. Mbit/s and ms:" % (0.9 * TUNNEL_LINK_CAP / 1e6))
        L.append("")
        L.append("| run | 0.3–3 s | 3–5 s (one link) | 5.5–8 s | back after the fault | back after "
                 "the heal (target) | longest stall after the fault |")
        L.append("| --- | --- | --- | --- | --- | --- | --- |")
        for i, r in enumerate(fo):
            se = r["series_bps"]

            def mean(a, b):
                xs = se[int(a / BIN):int(b / BIN)]
                return sum(xs) / len(xs) / 1e6 if xs else 0
            ev = r["analysis"]["events"]
            fault = next((e for e in ev if e["action"] == "fault"), {})
            heal = next((e for e in ev if e["action"] == "heal"), {})
            L.append("| %d | %.0f | %.0f | %.0f | %s | %s (%.0f) | %s |" % (
                i + 1, mean(0.3, 3.0), mean(3.0, 5.0), mean(5.5, 8.0),
                fmt_ms(fault.get("time_to_90")), fmt_ms(heal.get("time_to_90")),
                (heal.get("target_bps") or 0) / 1e6, fmt_ms(fault.get("stall"))))
        fails = [e.get("time_to_90") for r in fo for e in r["analysis"]["events"]
                 if e["action"] == "fault"]
        heals = [e.get("time_to_90") for r in fo for e in r["analysis"]["events"]
                 if e["action"] == "heal"]
        L.append("")
        L.append("Back after the fault within 100 ms in %d of %d runs; after the heal within "
                 "200 ms in %d of %d." % (
                     sum(1 for x in fails if x is not None and x <= 0.1), len(fails),
                     sum(1 for x in heals if x is not None and x <= 0.2), len(heals)))
    lat = res["latency"]
    if lat:
        L.append("")
        L.append("**64-byte UDP round trip** (sockperf `--full-rtt`), µs: through the tunnel %s, "
                 "directly on network 1 %s (median of each run's median)." % (
                     spread([r["tunnel"]["median_us"] or 0 for r in lat]),
                     spread([r["link"]["median_us"] or 0 for r in lat])))
    part = res.get("partition") or []
    if part:
        L.append("")
        L.append("**Every link down for %d s** under two TCP connections through the tunnel, "
                 "one moving data (iperf3, 0.2 s intervals) and one idle (echoed before the "
                 "outage and once after the heal):" % part[0]["outage"])
        L.append("")
        L.append("| run | moving: iperf3 exit (0: no reset) | moving: data again after the heal | idle: echo after the heal |")
        L.append("| --- | --- | --- | --- |")
        for i, r in enumerate(part):
            idle = r.get("idle") or {}
            L.append("| %d | %s | %s | %s |" % (
                i + 1, r["rc"], "%.1f s" % r["resume_s"] if r["resume_s"] is not None else "never",
                "%.3f s" % idle["echo_s"] if idle.get("ok") else "failed: %s" % idle.get("error")))
        L.append("")
        L.append("(Counted in whole 0.2 s intervals, the one holding the heal included.)")
    mt, mp = res.get("mpi_tunnel"), res.get("mpi_plain")
    if mt or mp:
        L.append("")
        L.append("**An MPI job through faults** (Open MPI, `tests/mpi/check.c`: allreduce, "
                 "broadcast, ring exchange and all-to-all with every result checked, one rank "
                 "per host, %d s of its own clock); switch 1 dead from 6 s to 12 s, every switch "
                 "dead from 16 s to 36 s:" % MPI_SECONDS)
        L.append("")
        L.append("| network | exit, result | iterations a second before the faults | iterations | longest iteration (the job stood still) | wall time |")
        L.append("| --- | --- | --- | --- | --- | --- |")
        for name, r in (("through the tunnel (ri2n0)", mt), ("plain networks, Open MPI on both (eth1, eth2)", mp)):
            if not r:
                continue
            before = [i for t, i in r["progress"] if t <= 6.0]
            rate = before[-1] / max(t for t, i in r["progress"] if t <= 6.0) if before else 0
            worst = max(r["ranks"], key=lambda x: x["longest_s"]) if r["ranks"] else None
            L.append("| %s | %s, %s | %.0f | %s | %s | %.0f s |" % (
                name, r["rc"], "ok" if r["ok"] else "**no result**", rate,
                r["ranks"][0]["iterations"] if r["ranks"] else "–",
                "%.1f s from %.1f s" % (worst["longest_s"], worst["longest_at"]) if worst else "–",
                r["wall_s"]))
    carry = res.get("carry") or {}
    if carry:
        L.append("")
        L.append("**How IP packets ride** (`ri2n tunnel --carry`): each as one unreliable "
                 "datagram (the default) or as a reliable, ordered message (ri2n retransmits "
                 "under inner TCP). iperf3 from host a to b; median (min–max) of %d runs:" % len(
                     next(iter(carry.values()))))
        L.append("")
        L.append("| carry | goodput, Mbit/s | inner TCP retransmissions | switch 1 dead 3–5 s: mean Mbit/s | back ≥ 816 after the fault | its inner TCP retransmissions | every switch dead 3–6 s: data again after the heal | its inner TCP retransmissions |")
        L.append("| --- | --- | --- | --- | --- | --- | --- | --- |")
        for name, rows in carry.items():
            def during(r):
                xs = [x[1] for x in r["failover"].get("intervals") or [] if 3.0 <= x[0] < 5.0]
                return sum(xs) / len(xs) if xs else 0

            def back(r):
                for x in r["failover"].get("intervals") or []:
                    if x[0] >= 3.0 and x[1] >= 816e6:
                        return x[0] + 0.1 - 3.0
                return 99.0
            resume = [r["outage"]["resume_s"] if r["outage"]["resume_s"] is not None else 99.0
                      for r in rows]
            def retransmits(k):
                return spread([r[k]["retransmits"] or 0 for r in rows], "%.0f")
            L.append("| %s | %s | %s | %s | %s | %s | %s | %s |" % (
                name, spread([r["rate"]["bps"] or 0 for r in rows], "%.0f", 1e-6),
                retransmits("rate"), spread([during(r) for r in rows], "%.0f", 1e-6),
                spread([back(r) for r in rows], "%.1f s"), retransmits("failover"),
                spread(resume, "%.1f s"), retransmits("outage")))
        L.append("")
        L.append("(99 s: never within the run. Recovery counted in whole intervals. An outage of "
                 "every link costs inner TCP its retransmission timeouts during the outage, 3 "
                 "in 3 s, even when nothing is lost.)")
    L.append("")
    L.append("Commands: " + "; ".join("%s: `%s`" % kv for kv in res["commands"].items()) + ".")
    return "\n".join(L)


REPORTERS["tunnel"] = report_tunnel

PARTS = {"loopback": part_loopback, "lab": part_lab, "fast": part_fast, "fault": part_fault,
         "sweep": part_sweep, "keyed": part_keyed, "tunnel": part_tunnel}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
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
                    % ", ".join(SCENARIOS))
    ap.add_argument("--long-outage", action="store_true",
                    help="fault: also a 5-minute total outage (one run per tool, ~16 min)")
    ap.add_argument("--quick", action="store_true",
                    help="smoke test: 1 run each, 3 s throughput; results go to bench/results/quick "
                         "and docs/BENCHMARKS.md is not touched")
    ap.add_argument("--no-doc", action="store_true", help="do not rewrite docs/BENCHMARKS.md")
    o = ap.parse_args()
    parts = o.parts or list(PARTS)
    for p in parts:
        if p not in PARTS and p != "report":
            ap.error("unknown part %r" % p)
    global RESULTS
    if o.quick:
        o.reps = o.lat_reps = o.sweep_reps = o.pinned_reps = o.soak = 1
        o.time = 3
        o.fast_bytes = o.piped_bytes = 128 << 20
        o.lat_count = 2000
        o.sweep_count = 200
        o.no_doc = True
        RESULTS = os.path.join(RESULTS, "quick")
    if "report" in parts:
        update_doc([p for p in PARTS if load(p)])
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
    global RI2N
    if not os.access(RI2N, os.X_OK):
        ap.error("%s missing: cargo build --release -p ri2n-cli" % RI2N)
    tmpdir = tempfile.mkdtemp(prefix="ri2nbench-")
    BUILD.update(build_facts())
    shutil.copy2(RI2N, os.path.join(tmpdir, "ri2n"))
    RI2N = os.path.join(tmpdir, "ri2n")
    t_all = time.monotonic()
    done = []
    try:
        for p in parts:
            t0 = time.monotonic()
            QUIET["waited"] = 0.0
            log("== part %s" % p)
            m = machine()
            res = PARTS[p](o)
            res["machine"] = m
            res["elapsed_s"] = time.monotonic() - t0
            res["quiet_wait_s"] = QUIET["waited"]
            res["options"] = vars(o)
            save(res)
            done.append(p)
            if not o.no_doc:
                update_doc([p])
            log("== part %s done in %.0f s" % (p, res["elapsed_s"]))
    finally:
        cleanup()
        shutil.rmtree(tmpdir, ignore_errors=True)
    log("all done in %.0f s: %s" % (time.monotonic() - t_all, ", ".join(done)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
