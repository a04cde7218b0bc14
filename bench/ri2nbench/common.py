"""Paths, processes, measurement helpers, statistics, machine facts, results files and the doc's blocks."""
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


HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # bench/
ROOT = os.path.dirname(HERE)


def default_ri2n():
    """The binary the driver runs unless --ri2n names one: $RI2N, else dist/ri2n of
    $CARGO_TARGET_DIR (relative: to the repository root, where bench/run-all builds), else of
    target/."""
    if os.environ.get("RI2N"):
        return os.path.abspath(os.environ["RI2N"])
    return os.path.join(ROOT, os.environ.get("CARGO_TARGET_DIR") or "target", "dist", "ri2n")


RI2N = default_ri2n()
RI2N_SOURCE = RI2N  # the binary copied at start (RI2N then names the private copy)
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


# The "exit code" of a process the harness killed because it ran past its time (a hang): a
# failure wherever a run's codes are checked, and told from a receiver the run has none of
# (`None`).
KILLED = "killed"


class Procs:
    """Every process this run starts; ended by PID (SIGTERM, then SIGKILL), never by name.
    Each starts a session of its own and is ended with its process group: what it started
    goes with it (a shell pipeline's commands, which a run starts as one process)."""

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
                os.killpg(p.pid, signal.SIGTERM)
                p.wait(grace)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(5)
            except ProcessLookupError:
                pass
        if p in self.live:
            self.live.remove(p)

    def stop_all(self):
        for p in reversed(list(self.live)):
            try:
                self.stop(p)
            except BaseException as e:  # keep tearing down, whatever stopped this one
                log("stop %d: %s" % (p.pid, e))

    def wait_rusage(self, p, timeout):
        """Waits (bounded) for p; returns (exit code, CPU seconds user+system) via wait4, or
        (KILLED, None) when it ran past `timeout` and was killed."""
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
                return KILLED, None
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


class ThreadSampler:
    """The busiest threads of processes that may exit before anyone asks: samples each watched
    process's per-thread CPU every `period` s in a background thread while running (between
    start() and stop()). A thread's figure is its CPU seconds between its first and last sample
    over that span, in cores; a thread at 1.0 is a bottleneck however many cores are idle."""

    def __init__(self, period=0.1):
        self.period, self.pids, self.seen = period, {}, {}
        self.done, self.thread = threading.Event(), None

    def watch(self, name, pid):
        self.pids[name] = pid

    def start(self):
        self.done.clear()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def stop(self):
        self.done.set()
        if self.thread:
            self.thread.join()

    def _run(self):
        while True:
            now = time.monotonic()
            for name, pid in list(self.pids.items()):
                try:
                    threads = thread_cpu(pid)
                except OSError:
                    continue  # exited (or not yet exec'd into its namespace)
                for t, cpu in threads.items():
                    first, _ = self.seen.get((name, t), ((now, cpu), None))
                    self.seen[(name, t)] = (first, (now, cpu))
            if self.done.wait(self.period):
                return

    def top(self, name, n=3, min_span=0.3):
        """The `n` busiest threads of `name`, in cores, busiest first."""
        xs = [(c1 - c0) / (t1 - t0) for (k, _), ((t0, c0), (t1, c1)) in self.seen.items()
              if k == name and t1 - t0 >= min_span]
        return [round(x, 3) for x in sorted(xs, reverse=True)[:n]]


class LoopSampler:
    """The output of `command` (a shell command line) run in a lab host's namespace every
    `period` s, from one shell loop started by start() and ended by samples() (at most
    `seconds`): one text per run."""

    MARK = "=== ri2nbench sample"

    def __init__(self, lab, host, command, period, seconds):
        self.lab, self.host, self.command = lab, host, command
        self.period, self.count = period, max(1, int(seconds / period))
        self.out, self.proc = None, None

    def start(self):
        self.out = tempfile.TemporaryFile("w+")
        loop = "for i in $(seq %d); do %s; echo '%s'; sleep %s; done" % (
            self.count, self.command, self.MARK, self.period)
        self.proc = PROCS.start(self.lab.ex(self.host, "sh", "-c", loop), stdout=self.out)

    def samples(self):
        """Ends the loop; its texts, oldest first (the last may be cut short). Nothing once
        it has ended."""
        if not self.proc:
            return []
        PROCS.stop(self.proc, grace=1.0)
        self.proc = None
        self.out.seek(0)
        text = self.out.read()
        self.out.close()
        return text.split(self.MARK)


class TcpInfoSampler(LoopSampler):
    """What held a transfer's TCP flows back, in their own sender's words: `ss -ti` (Linux's
    tcp_info) of the connections to `port` on one lab host, every `period` s while the transfer
    runs. Its counters run from each connection's start, so the last sample before they close
    holds the transfer up to then (`bytes_acked` says how much of it: a transfer of a second
    or so may end half a period after it): the time each flow had data to send (busy), the
    part of it that it waited for room in its send buffer or for the receiver's window, its
    congestion window and its smallest round trip."""

    FIELDS = {"bytes_acked": r"bytes_acked:(\d+)", "busy_ms": r"busy:(\d+)ms",
              "rwnd_limited_ms": r"rwnd_limited:(\d+)ms", "sndbuf_limited_ms": r"sndbuf_limited:(\d+)ms",
              "cwnd": r"\bcwnd:(\d+)", "mss": r"\bmss:(\d+)", "minrtt_ms": r"minrtt:([\d.]+)"}

    def __init__(self, lab, host, port, period=0.5, seconds=120):
        super().__init__(lab, host, "ss -tinH dport = :%d" % port, period, seconds)

    def stop(self):
        """The summary of the last sample that saw the transfer's flows (those that moved at
        least 1 MB; iperf3's control connection moves less), or None."""
        for sample in reversed(self.samples()):
            flows = [f for f in self.parse(sample) if f.get("bytes_acked", 0) >= 1e6]
            if flows:
                return self.summary(flows)
        return None

    @classmethod
    def parse(cls, sample):
        """One `ss -ti` listing: a dict of FIELDS per connection (its info lines are indented)."""
        conns, cur = [], None
        for line in sample.splitlines():
            if not line.strip():
                continue
            if not line[0].isspace():
                cur = []
                conns.append(cur)
            elif cur is not None:
                cur.append(line)
        out = []
        for lines in conns:
            info = " ".join(lines)
            f = {}
            for k, pat in cls.FIELDS.items():
                m = re.search(pat, info)
                if m:
                    f[k] = float(m.group(1))
            out.append(f)
        return out

    @staticmethod
    def summary(flows):
        def total(k):
            return sum(f.get(k, 0) for f in flows)
        return {"flows": len(flows), "bytes_acked": total("bytes_acked"),
                "busy_ms": total("busy_ms"),
                "sndbuf_limited_ms": total("sndbuf_limited_ms"),
                "rwnd_limited_ms": total("rwnd_limited_ms"),
                "cwnd_bytes": max(f.get("cwnd", 0) * f.get("mss", 0) for f in flows),
                "minrtt_us": min((f["minrtt_ms"] * 1000 for f in flows if "minrtt_ms" in f),
                                 default=None)}


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
        # every round trip of the run, the warm-up's and those outside the measured span
        # included: what the hosts' work during the whole run was for
        "all_count": grab(r"\[Total Run\].*?ReceivedMessages=(\d+)"),
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
        # a run that failed (killed at its time limit, say) may still have printed figures:
        # none of them enters a median or a ratio
        r.update(dict.fromkeys(("median_us", "p99_us", "min_us", "mean_us", "count",
                                "all_count")))
    return r


def failed(run):
    """Whether a transfer's run failed: its sender, or its receiver where it has one
    (`recv_rc`), exited other than 0 or was killed (KILLED)."""
    return run.get("rc") != 0 or run.get("recv_rc") not in (None, 0)


def receiver_failure(rc):
    """What a receiver's exit code `rc` (not 0) says of the run."""
    return "the receiver hung and was killed" if rc == KILLED else "the receiver exited %s" % rc


def exits(run):
    """A failed run's exit codes for the report: the sender's, then the receiver's if known."""
    return run.get("rc") if run.get("recv_rc") is None else "%s/%s" % (run.get("rc"), run.get("recv_rc"))


def tool_json(text):
    """A tool's --json output, or None when it failed: no JSON, or the error document that
    ri2n (`{"command", "error", "exit_code"}`) and iperf3 (`"error"`, with an empty `"end"`)
    print instead of results. Taken as results, its missing fields would end the part and
    keep the failure out of the report's list of failed runs."""
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    return None if isinstance(doc, dict) and "error" in doc else doc


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
    return tool_json(text), rc, cpu, (s1 - s0 if s0 is not None else None), wall, etext


def sys_busy():
    """Busy CPU seconds of the whole machine so far (user, nice, system, irq, softirq): counts
    both ends and the kernel work done for them on any thread (veth and bridge forwarding in
    softirq), which per-process accounting misses."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:8]]
    return (v[0] + v[1] + v[2] + v[5] + v[6]) / CLK_TCK


def timed_client(cmd, timeout, sampler=None):
    """Runs the sending side of a transfer; returns its exit code, its CPU seconds, the
    machine's busy CPU seconds meanwhile, the seconds it ran and what it printed. A
    ThreadSampler given watches the client (as "send") and its other processes while it runs."""
    with tempfile.TemporaryFile("w+") as out:
        busy0, w0 = sys_busy(), time.monotonic()
        p = PROCS.start(cmd, stdout=out)
        if sampler:
            sampler.watch("send", p.pid)
            sampler.start()
        try:
            rc, cpu = PROCS.wait_rusage(p, timeout)
        finally:
            if sampler:
                sampler.stop()
        busy1, wall = sys_busy(), time.monotonic() - w0
        out.seek(0)
        return rc, cpu, busy1 - busy0, wall, out.read()


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


def key_file():
    """A new cluster key (`ri2n keygen`) in a directory of its own, removed when the driver
    exits (with the files of `fast_file`)."""
    keydir = tempfile.mkdtemp(prefix="ri2nbench-key-")
    TEMP_DIRS.add(keydir)
    path = os.path.join(keydir, "cluster.key")
    run([RI2N, "keygen", "--output", path])
    return path


TEMP_DIRS = set()


def sh(cmd):
    try:
        return subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=20).stdout.strip()
    except Exception:
        return ""


BUILD = {}  # facts about the ri2n binary, taken when it is copied at start
# the command line's defaults (set by __main__), to tell which options a results file changed
OPTION_DEFAULTS = {}


def head_commit():
    """The checkout's commit without git (a benchmark host may have none): .git/HEAD, the ref
    it names, loose or packed; a worktree's .git is a file naming its git directory."""
    try:
        gd = os.path.join(ROOT, ".git")
        if os.path.isfile(gd):
            with open(gd) as f:
                gd = os.path.join(ROOT, f.read().split("gitdir:", 1)[1].strip())
        with open(os.path.join(gd, "HEAD")) as f:
            head = f.read().strip()
        if not head.startswith("ref:"):
            return head[:7]
        ref = head[4:].strip()
        # a worktree keeps its HEAD, the refs live in the common git directory
        dirs = [gd]
        if os.path.exists(os.path.join(gd, "commondir")):
            with open(os.path.join(gd, "commondir")) as f:
                dirs.append(os.path.join(gd, f.read().strip()))
        for d in dirs:
            if os.path.exists(os.path.join(d, ref)):
                with open(os.path.join(d, ref)) as f:
                    return f.read().strip()[:7]
            if os.path.exists(os.path.join(d, "packed-refs")):
                with open(os.path.join(d, "packed-refs")) as f:
                    for line in f:
                        if line.rstrip().endswith(" " + ref):
                            return line[:7]
    except (OSError, IndexError):
        pass
    return ""


def built_from(version):
    """The commit a binary names in `ri2n --version` ("ri2n 0.1.0 (commit abc1234+dirty)") and
    whether it had uncommitted changes; None for a binary that names none (built outside a
    checkout, or before binaries named theirs)."""
    m = re.search(r"\(commit ([0-9a-f]{7,40})(\+dirty)?\)", version or "")
    return (m.group(1), bool(m.group(2))) if m else None


def build_facts():
    """The commit the measured binary was built from: the one it names itself, which a binary
    built elsewhere (`--ri2n OTHER`) need not share with this checkout; else the checkout's,
    and its files under crates/ not committed."""
    src = RI2N_SOURCE
    facts = {"ri2n_built": sh("date -u -r %s '+%%Y-%%m-%%d %%H:%%M UTC'" % src)}
    built = built_from(sh("%s --version" % src))
    if built:
        commit, dirty = built
        return facts | {"commit": commit, "dirty": "some" if dirty else "0"}
    return facts | {
        "commit": sh("git -C %s rev-parse --short HEAD" % ROOT) or head_commit(),
        "dirty": (sh("git -C %s status --porcelain -- crates Cargo.toml Cargo.lock | wc -l" % ROOT)
                  if shutil.which("git") else ""),
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
        "mptcp_enabled": sh("cat /proc/sys/net/mptcp/enabled"),
        # the lab's namespaces start with it: TCP, MPTCP and inner TCP all run it
        "tcp_congestion_control": sh("cat /proc/sys/net/ipv4/tcp_congestion_control"),
        # and these bound one flow's data in flight (its send buffer, its receive window)
        # and queued below it (TCP small queues): with a tunnel's round trip under load, the
        # rate one flow can reach
        "tcp_wmem": sh("cat /proc/sys/net/ipv4/tcp_wmem").split(),
        "tcp_rmem": sh("cat /proc/sys/net/ipv4/tcp_rmem").split(),
        "tcp_limit_output_bytes": sh("cat /proc/sys/net/ipv4/tcp_limit_output_bytes"),
        "cpu_count": os.cpu_count(),
        "affinity": len(os.sched_getaffinity(0)),
    }


# the outside tools the parts run, whose resolved paths the driver logs and records (a folder
# of packed tools, --tools, puts its own first)
TOOLS = ("ip", "tc", "iperf3", "sockperf", "mptcpize", "ping", "ss")


def use_tools(folder):
    """Puts FOLDER/bin (made by ../shared/lab-tools/pack) first in PATH, for every process
    this run starts, lab/ri2n-lab included."""
    b = os.path.join(os.path.abspath(folder), "bin")
    if not os.path.isdir(b):
        raise RuntimeError("%s: no such folder (make it with ../shared/lab-tools/pack %s)" % (b, folder))
    path = os.environ.get("PATH", "").split(os.pathsep)
    os.environ["PATH"] = os.pathsep.join([b] + [d for d in path if d != b])
    return b


def tool_paths():
    return {t: shutil.which(t) for t in TOOLS}


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


def command_line(res):
    """The command that produced a results file: `bench/run-all PARTS` and every option that
    differed from its default (the lab prefix aside)."""
    o = res.get("options")
    if o is None:
        # not recorded: the part of the results, under the name it is run by
        parts = [{"scale-manycore": "scale"}.get(res["part"], res["part"])]
        o = {}
    else:
        # none named: `bench/run-all` ran them all
        parts = o.get("parts") or []
    words = ["bench/run-all"] + list(parts)
    for k, v in o.items():
        if k in ("parts", "prefix", "no_doc") or k not in OPTION_DEFAULTS:
            continue
        if v != OPTION_DEFAULTS[k]:
            flag = "--" + k.replace("_", "-")
            # a path in the checkout (--tools, --ri2n) as the reader would type it
            if isinstance(v, str) and v.startswith(ROOT + os.sep):
                v = os.path.relpath(v, ROOT)
            words += [flag] if v is True else [] if v is False else [flag, str(v)]
    return " ".join(words)


def congestion_words(facts):
    """', TCP congestion control `bbr`' for the facts of a run that recorded it, else '';
    then the most one flow's send buffer and receive window may hold, and TCP small queues'
    bound, where recorded."""
    cc = facts.get("tcp_congestion_control")
    words = ", TCP congestion control `%s`" % cc if cc else ""
    try:
        mb = lambda x: "%g MiB" % (int(x) / (1 << 20))  # noqa: E731
        words += " (send buffer up to %s, receive buffer up to %s, TCP small queues %s)" % (
            mb(facts["tcp_wmem"][2]), mb(facts["tcp_rmem"][2]),
            mb(facts["tcp_limit_output_bytes"]))
    except (KeyError, IndexError, ValueError):
        pass
    return words


def mfacts(res):
    """A block's first line: when, where (CPUs and their model), from which commit, by which
    command."""
    m = res["machine"]
    dirty = (" plus %s uncommitted file(s) under crates/" % m["dirty"]
             if m["dirty"] not in ("", "0") else "")
    return ("**Measured %s on %s CPUs (`nproc`), `%s`, commit `%s`%s** by `%s`. Kernel `%s`%s, "
            "load average at the start %s; %s (binary sha256 %s…, built %s); %s; %s. The part "
            "took %.0f s." % (
                m["date_utc"], m["nproc"], m["cpu"], m["commit"], dirty, command_line(res),
                m["uname_r"], congestion_words(m), m["loadavg"], m["ri2n"], m.get("ri2n_sha256"),
                m.get("ri2n_built"), m["iperf3"], m["sockperf"], res.get("elapsed_s", 0)))


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
    return ("CPUs busy just before each measurement (the driver waits up to 30 s per part for "
            "at most 25 %%): %s." % spread(b, "%.0f %%", 100))


def per_run(values):
    """Each run's value, or one value "in every run" when they are all alike."""
    values = list(values)
    if values and all(v == values[0] for v in values):
        return "%s in every run" % values[0]
    return "; ".join(map(str, values)) or "n/a"


def fmt_ms(x):
    return "never" if x is None else "%.0f" % (x * 1000)


def update_doc(parts, reporters, after=None, write=True):
    """Rewrites each part's block of docs/BENCHMARKS.md from its results file with
    `reporters[part](res)`; then calls `after[part](res)` where given (the fault plot). With
    write=False the blocks go to stdout and nothing is written."""
    if not os.path.exists(DOC):
        log("no %s: not updated" % DOC)
        return
    with open(DOC) as f:
        text = f.read()
    for part in parts:
        res = load(part)
        if not res:
            continue
        block = reporters[part](res)
        if not write:
            print("<!-- BEGIN %s -->\n%s\n<!-- END %s -->" % (part, block, part))
            continue
        b, e = "<!-- BEGIN %s -->" % part, "<!-- END %s -->" % part
        if b in text and e in text:
            pre, rest = text.split(b, 1)
            _, post = rest.split(e, 1)
            text = pre + b + "\n" + block + "\n" + e + post
        else:
            log("markers for %s missing in %s" % (part, DOC))
        if after and part in after:
            after[part](res)
    if write:
        with open(DOC, "w") as f:
            f.write(text)
