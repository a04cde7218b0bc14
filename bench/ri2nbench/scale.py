"""Part 8: how ri2n scales with the host's cores: many clients of one `ri2n serve` on loopback,
and the unlimited-rate 2- and 4-link lab against one TCP connection and MPTCP, `ri2n send` and
iperf3 through `ri2n tunnel` alike."""
import json
import os
import re
import tempfile
import time

from . import common
from .common import (
    PROCS, ThreadSampler, busy_line, fast_file, free_port, log, med, mfacts, proc_cpu, spread,
    sys_busy, thread_cpu, tool_json, wait_quiet, wait_ready)
from .fast import iperf_transfer, ri2n_transfer, warm_up
from .labctl import new_lab
from .tunnel import tunnel_up

CLIENTS = (1, 2, 4, 8)
LOOP_LINKS = (2, 4)
LAB_LINKS = (2, 4)
LAB_TOOLS = ("ri2n", "ri2n_keyed", "ri2n_flip", "ri2n_keyed_flip", "ri2n_rflip", "ri2n_tcp", "tcp",
             "mptcp",
             "tunnel", "tunnel_flip", "tunnel_4", "tunnel_wmem")
# ri2n's default gives each link a sending and a receiving thread (lanes) where the process may
# use this many CPUs (`--send-threads auto`, `--recv-threads auto`); the "flip" tools run the
# other setting of both, for the comparison, and "rflip" that of `--recv-threads` alone (which
# kind of lane gives what); "tunnel_flip" runs the tunnel daemons with the other setting of both
LANES_FROM_CPUS = 8
FLIP_FLAGS = ("--send-threads", "--recv-threads")
LAB_NAMES = {"ri2n": "ri2n", "ri2n_keyed": "ri2n, keyed", "ri2n_tcp": "ri2n `--transport tcp`",
             "ri2n_flip": "ri2n, lanes flipped",
             "ri2n_keyed_flip": "ri2n, keyed, lanes flipped",
             "ri2n_rflip": "ri2n, receiving lanes flipped",
             "tcp": "1 TCP connection", "mptcp": "MPTCP",
             "tunnel": "iperf3 through `ri2n tunnel`",
             "tunnel_flip": "iperf3 through `ri2n tunnel`, lanes flipped",
             "tunnel_4": "iperf3 -P 4 through `ri2n tunnel`",
             "tunnel_wmem": "iperf3 through `ri2n tunnel`, send buffer up to 32 MiB"}
# the send buffer iperf3's TCP may grow to in "tunnel_wmem" (A's tcp_wmem maximum, for that
# transfer): whether one flow through the tunnel is bound by its send buffer over the round
# trip under load rather than by a CPU
WIDE_WMEM = 32 << 20
# whose busiest threads the lab part records, per tool
SAMPLED = {"ri2n": ("send", "recv"), "ri2n_keyed": ("send", "recv"),
           "ri2n_flip": ("send", "recv"), "ri2n_keyed_flip": ("send", "recv"),
           "ri2n_rflip": ("send", "recv"),
           "ri2n_tcp": ("send", "recv"), "tunnel": ("a", "b"), "tunnel_flip": ("a", "b"),
           "tunnel_4": ("a", "b"), "tunnel_wmem": ("a", "b")}


def medians_by_place(rows):
    """'a/b/c': the median over `rows` (one list per run) of each place, the first, the
    second, ... (a row shorter than another counts only for its places)."""
    return "/".join("%.2f" % med([r[i] for r in rows if len(r) > i])
                    for i in range(max(map(len, rows))))


def cpu_list(cpus):
    """[0, 1, 2, 5] -> '0-2,5'"""
    out, run_start, prev = [], None, None
    for c in sorted(cpus) + [None]:
        if prev is not None and c == prev + 1:
            prev = c
            continue
        if run_start is not None:
            out.append(str(run_start) if run_start == prev else "%d-%d" % (run_start, prev))
        run_start = prev = c
    return ",".join(out)


def cgroup_cpus(proc="/proc/self"):
    """The CPUs the cgroup quotas over this process allow, as Rust's `available_parallelism`
    counts them (which ri2n's defaults follow): for its group of the CPU controller and each
    group above it, `cpu.max` (cgroup v2) or `cpu.cfs_quota_us` over `cpu.cfs_period_us`
    (v1), rounded down, the tightest of them, at least 1. None where no quota is set."""
    try:
        with open(os.path.join(proc, "cgroup")) as f:
            groups = f.read().splitlines()
        with open(os.path.join(proc, "mountinfo")) as f:
            mounts = [line.split() for line in f]
    except OSError:
        return None
    quota = None
    for line in groups:
        hid, controllers, group = (line.split(":", 2) + ["", ""])[:3]
        v2 = hid == "0" and controllers == ""
        if not v2 and "cpu" not in controllers.split(","):
            continue
        for m in mounts:
            # ID parent major:minor root mount-point options [optional...] - type source super
            if "-" not in m or len(m) < 5:
                continue
            fstype, super_options = m[m.index("-") + 1], m[-1]
            root, point = m[3], m[4]
            if fstype != ("cgroup2" if v2 else "cgroup"):
                continue
            if not v2 and "cpu" not in super_options.split(","):
                continue
            rel = os.path.relpath(group, root) if group.startswith(root) else None
            if rel is None or rel.startswith(".."):
                continue
            path = os.path.normpath(os.path.join(point, rel))
            while True:
                limit = read_quota(path, v2)
                if limit is not None:
                    quota = limit if quota is None else min(quota, limit)
                if path == point or os.path.dirname(path) == path:
                    break
                path = os.path.dirname(path)
            break
    return None if quota is None else max(1, quota)


def read_quota(group_dir, v2):
    """The whole CPUs one cgroup's quota allows (None: no quota there)."""
    try:
        if v2:
            with open(os.path.join(group_dir, "cpu.max")) as f:
                limit, period = f.read().split()[:2]
        else:
            with open(os.path.join(group_dir, "cpu.cfs_quota_us")) as f:
                limit = f.read().strip()
            with open(os.path.join(group_dir, "cpu.cfs_period_us")) as f:
                period = f.read().strip()
        limit, period = int(limit), int(period)
    except (OSError, ValueError):
        return None
    return limit // period if limit > 0 and period > 0 else None


def lanes_by_default():
    """Whether ri2n's `--send-threads auto` and `--recv-threads auto` give each link a sending
    and a receiving thread on this host: the CPUs it may use (its affinity mask, and its
    cgroup's quota) are at least LANES_FROM_CPUS."""
    cpus = len(os.sched_getaffinity(0))
    quota = cgroup_cpus()
    return min(cpus, quota if quota is not None else cpus) >= LANES_FROM_CPUS


def host_facts():
    """What the figures depend on: the cores this run may use and their model, the kernel, when,
    from which commit, and which tools (their resolved paths: packed ones or the host's)."""
    aff = os.sched_getaffinity(0)
    m = common.machine()
    return {"cpu_count": os.cpu_count(), "affinity": len(aff), "affinity_cpus": cpu_list(aff),
            "cpu": m["cpu"], "kernel": m["uname_r"], "date_utc": m["date_utc"],
            "commit": m.get("commit"), "dirty": m.get("dirty"), "ri2n": common.RI2N_SOURCE,
            "cgroup_cpus": cgroup_cpus(), "lanes_by_default": lanes_by_default(),
            "flip_flags": list(FLIP_FLAGS),
            "tools": common.tool_paths(), "mptcp_enabled": m["mptcp_enabled"],
            "tcp_congestion_control": m["tcp_congestion_control"]}


def host_line(h):
    quota = h.get("cgroup_cpus")
    held = ", held to %d by its cgroup's CPU quota" % quota if quota is not None else ""
    return ("%s CPUs (os.cpu_count), %s in this run's affinity mask (%s)%s, `%s`, kernel `%s`%s, "
            "%s, commit `%s`" % (h["cpu_count"], h["affinity"], h["affinity_cpus"], held, h["cpu"],
                                 h["kernel"], common.congestion_words(h),
                                 h["date_utc"], h["commit"] or "unknown"))


def loop_addrs(links):
    return ["127.0.0.%d" % i for i in range(1, links + 1)]


def loop_clients(server, port, links, n, seconds, key):
    """`n` `ri2n bench` clients started at once against `server`, each from one local address
    per link: their aggregate goodput (the sum of what each reports), the server's CPU in
    cores (its utime+stime delta over the clients' wall time), the clients' and the whole
    machine's."""
    cmd = [common.RI2N, "bench", "--to", "127.0.0.1:%d" % port, "--time", seconds, "--json"]
    cmd += sum((["--local", a] for a in loop_addrs(links)), [])
    cmd += ["--key", key] if key else []
    outs = [(tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")) for _ in range(n)]
    try:
        s0, t0, b0 = proc_cpu(server.pid), thread_cpu(server.pid), sys_busy()
        w0 = time.monotonic()
        ps = [PROCS.start(cmd, stdout=o, stderr=e) for o, e in outs]
        waited = [PROCS.wait_rusage(p, seconds + 60) for p in ps]
        wall = time.monotonic() - w0
        s1, t1, b1 = proc_cpu(server.pid), thread_cpu(server.pid), sys_busy()
        docs, errs = [], []
        for o, e in outs:
            o.seek(0)
            e.seek(0)
            docs.append(tool_json(o.read()))
            errs.append(e.read()[-300:])
    finally:
        for o, e in outs:
            o.close()
            e.close()
    rcs = [w[0] for w in waited]
    rates = [d["summary"]["goodput_bps"] if d and d.get("summary") else None for d in docs]
    ok = all(rc == 0 for rc in rcs) and None not in rates
    threads = sorted(((v - t0.get(t, 0.0)) / wall for t, v in t1.items()), reverse=True)
    r = {"clients": n, "rcs": rcs, "rates": rates, "bps": sum(rates) if ok else None,
         "wall_s": round(wall, 3),
         "links_up": [sum(1 for l in d["summary"].get("links", []) if l.get("came_up"))
                      if d and d.get("summary") else None for d in docs],
         "retransmitted_bytes": sum((d["summary"].get("retransmitted_bytes") or 0)
                                    for d in docs if d and d.get("summary")),
         "server_cores": (s1 - s0) / wall,
         "server_top_threads": [round(x, 3) for x in threads[:3]],
         "client_cores": sum(w[1] or 0 for w in waited) / wall,
         "machine_cores": (b1 - b0) / wall}
    if not ok:
        r["errors"] = [e for rc, e in zip(rcs, errs) if rc != 0]
    return r


def measure_loopback(o, res, keyfile):
    """Every server up at once (2 and 4 links, with and without a key), so that each run
    measures every cell in turn."""
    servers = {}
    for links in LOOP_LINKS:
        for keyed in (False, True):
            port = free_port(loop_addrs(links))
            cmd = [common.RI2N, "serve", "-q"] + sum(
                (["--listen", "%s:%d" % (a, port)] for a in loop_addrs(links)), [])
            cmd += ["--key", keyfile] if keyed else []
            servers[(links, keyed)] = (PROCS.start(cmd), port)
    for (links, keyed), (p, _) in servers.items():
        wait_ready(p, "ri2n serve (%d links%s)" % (links, ", keyed" if keyed else ""), 0.2)
    time.sleep(0.3)
    configs = list(servers)
    for rep in range(o.reps):
        order = configs[rep % len(configs):] + configs[:rep % len(configs)]
        for links, keyed in order:
            p, port = servers[(links, keyed)]
            line = []
            for n in (CLIENTS if rep % 2 == 0 else CLIENTS[::-1]):
                busy = wait_quiet()
                r = loop_clients(p, port, links, n, o.time, keyfile if keyed else None)
                r.update(rep=rep, links=links, keyed=keyed, busy_before=busy)
                res["loopback"].append(r)
                line.append("%d: %.2f Gbit/s %.2f cores" % (n, (r["bps"] or 0) / 1e9,
                                                            r["server_cores"]))
                if r["bps"] is None:
                    log("    failed: rc %s: %s" % (r["rcs"], r.get("errors")))
            log("  loopback rep %d, %d links%s: %s" % (rep, links, ", keyed" if keyed else "",
                                                       "; ".join(line)))
    for p, _ in servers.values():
        PROCS.stop(p)


def measure_lab(o, res, keyfile):
    src = fast_file(o.scale_bytes)
    lab = new_lab(o.prefix)
    try:
        lab_runs(o, res, keyfile, src, lab)
    finally:
        lab.down()


def lab_runs(o, res, keyfile, src, lab):
    """Each link count of LAB_LINKS in turn on `lab`: the warm-up, then the runs."""
    for n in LAB_LINKS:
        log("scale: lab, %d unlimited links, MTU 1500" % n)
        lab.up([0] * n, mtu=1500)
        c = {"links": n, "mtu": 1500, "mptcp": lab.mptcp_setup(), "runs": []}

        def transfer(k):
            if k.startswith("ri2n"):
                flip = rflip = None
                if k.endswith("flip"):
                    rflip = "off" if lanes_by_default() else "on"
                    flip = rflip if k.endswith("_flip") else None
                return ri2n_transfer(lab, src, o.scale_bytes, threads=True, checksum=False,
                                     key=keyfile if k.startswith("ri2n_keyed") else None,
                                     transport="tcp" if k == "ri2n_tcp" else None,
                                     send_threads=flip, recv_threads=rflip)
            if k == "tunnel":
                return tunnel_transfer(lab, n, src, o.scale_bytes)
            if k == "tunnel_flip":
                setting = "off" if lanes_by_default() else "on"
                return tunnel_transfer(lab, n, src, o.scale_bytes,
                                       extra=[x for f in FLIP_FLAGS for x in (f, setting)])
            if k == "tunnel_4":
                # 4 flows, which the daemons' route loops share out by queue
                return tunnel_transfer(lab, n, None, o.scale_bytes, parallel=4)
            if k == "tunnel_wmem":
                return tunnel_transfer(lab, n, src, o.scale_bytes, wmem=WIDE_WMEM)
            return iperf_transfer(lab, o.scale_bytes, mptcp=(k == "mptcp"), src=src,
                                  tcp_info=True)

        # as in part fast: one discarded transfer of each tool on the fresh lab
        c["warmup"] = warm_up(LAB_TOOLS, transfer)
        for rep in range(o.reps):
            row = {"rep": rep}
            turn = rep % len(LAB_TOOLS)
            for k in LAB_TOOLS[turn:] + LAB_TOOLS[:turn]:
                row["busy_before_" + k] = wait_quiet()
                m0 = lab.mptcp_counters("a") if k == "mptcp" else None
                row[k] = transfer(k)
                if m0 is not None:
                    # that MPTCP really opened a subflow per link (iperf3 opens two
                    # connections, control and data: 2 × (links - 1) joins)
                    m1 = lab.mptcp_counters("a")
                    row[k]["mptcp_joins"] = m1.get("MPJoinSynAckRx", 0) - m0.get("MPJoinSynAckRx", 0)
            log("  rep %d: %s" % (rep, ", ".join(
                "%s %.2f Gbit/s %.2f CPU-s/GB" % (k, (row[k].get("bps") or 0) / 1e9,
                                                  cpu_per_gb(row[k]) or 0) for k in LAB_TOOLS)))
            c["runs"].append(row)
        res["lab"].append(c)


def tunnel_transfer(lab, links, src, nbytes, parallel=1, extra=(), wmem=None):
    """iperf3 (`parallel` flows) from A to B's tunnel address through `ri2n tunnel` daemons on
    both hosts (keyed, over the lab's `links` links, as many interface queues as they choose
    on this host, with the options `extra`), started for this transfer and stopped after it:
    their CPU is in the machine's, their busiest threads while iperf3 sent in "threads", A's
    queues in "queues", the packets each dropped in "dropped" (its status: a datagram the
    sender's queue had no room for, or one the receiver got incomplete, is a loss inner TCP
    retransmits). With `wmem`, A's TCP send buffers may grow to that many bytes for this
    transfer (its namespace's tcp_wmem maximum, put back after)."""
    # the key and the daemons' logs go with the transfer
    with tempfile.TemporaryDirectory(prefix="ri2nbench-tunnel-") as tmp:
        daemons, logs = tunnel_up(lab, tmp, hosts="ab", links=links, extra=extra)
        queues = re.search(r", (\d+) queues?\)", open(logs["a"]).read())
        sampler = ThreadSampler()
        for h, d in daemons.items():
            sampler.watch(h, d.pid)
        wmem_was = set_wmem_max(lab, wmem) if wmem else None
        waits = TunnelStatusSampler(lab, "a")
        waits.start()
        try:
            r = iperf_transfer(lab, nbytes, mptcp=False, src=src, to="10.99.0.2",
                               sampler=sampler, parallel=parallel, tcp_info=True)
            r["waits"] = waits.stop()
            r["send_limits"] = (r["waits"] or {}).get("send_limits")
            r["threads"] = {h: sampler.top(h) for h in daemons}
            r["queues"] = int(queues.group(1)) if queues else None
            counts = {h: tunnel_counts(lab, h) for h in daemons}
            r["dropped"] = {h: c[0] for h, c in counts.items()}
            r["links_lost"] = {h: c[1] for h, c in counts.items()}
            if wmem:
                r["wmem_max"] = wmem
            return r
        finally:
            waits.samples()  # ends its loop if the transfer failed
            if wmem_was:
                set_wmem_max(lab, wmem_was)
            for d in daemons.values():
                PROCS.stop(d)


class TunnelStatusSampler(common.LoopSampler):
    """Where inner TCP's packets waited in the sending daemon while a transfer ran: its status
    (`ri2n tunnel status --json`, sampled by the daemon each second) every half second, of
    the samples in which its links sent 100 Mbit/s or more: the most queued for the peer, the
    most in flight on its links together, their windows together and their round trips; and
    what held its connections back between the first and the last of those samples (their
    `send_limits`, seconds, summed over the peers), where the daemon reports it."""

    def __init__(self, lab, host, seconds=120):
        super().__init__(lab, host, "%s tunnel status --json --name %s" % (common.RI2N, host),
                         0.5, seconds)

    def stop(self):
        rows = []
        for text in self.samples():
            try:
                peers = json.loads(text)["peers"]
            except (ValueError, KeyError, TypeError):
                continue
            links = [l for p in peers for l in p.get("links", [])]
            if sum(l.get("send_mbit") or 0 for l in links) < 100:
                continue
            rows.append({"queued": sum(p.get("queued_bytes", 0) for p in peers),
                         "in_flight": sum(l.get("in_flight_bytes", 0) for l in links),
                         "window": sum(l.get("window_bytes", 0) for l in links),
                         "rtt_us": [l["rtt_us"] for l in links if l.get("rtt_us")],
                         "held": held_by(peers)})
        if not rows:
            return None
        first, last = rows[0]["held"], rows[-1]["held"]
        return {"samples": len(rows), "queued_max": max(r["queued"] for r in rows),
                "in_flight_max": max(r["in_flight"] for r in rows),
                "window": med([r["window"] for r in rows]),
                "rtt_us": med([x for r in rows for x in r["rtt_us"]]),
                "send_limits": first and last and {f: last[f] - first[f] for f in last}}


def held_by(peers):
    """The `send_limits` of the connected peers of a tunnel status, summed field by field;
    None if the daemon reports none (an older build)."""
    held = [p["send_limits"] for p in peers if p.get("send_limits")]
    return {f: sum(h[f] for h in held) for f in held[0]} if held else None


def set_wmem_max(lab, nbytes):
    """Sets the most a TCP send buffer of host A may grow to (its namespace's tcp_wmem
    maximum); returns what it was."""
    path = "/proc/sys/net/ipv4/tcp_wmem"
    was = common.run(lab.ex("a", "cat", path), timeout=10).split()
    common.run(lab.ex("a", "sh", "-c", "echo '%s %s %d' > %s" % (was[0], was[1], nbytes, path)),
               timeout=10)
    return int(was[2])


def tunnel_counts(lab, host):
    """From the status of the tunnel daemon on `host`, over all its peers: the packets it
    dropped, and the ri2n packets its links declared lost (and sent again); None for what it
    did not answer."""
    text = common.run(lab.ex(host, common.RI2N, "tunnel", "status", "--json", "--name", host),
                      check=False, timeout=10)
    try:
        peers = json.loads(text)["peers"]
        dropped = sum(peer["packets_dropped"] for peer in peers)
    except (ValueError, KeyError, TypeError):
        return None, None
    lost = [link.get("packets_lost") for peer in peers for link in peer.get("links", [])]
    return dropped, (None if None in lost else sum(lost))


def results_name():
    """Where a run's results go: a host with lanes by default (a many-core server) keeps its own
    file and block, so that its figures and the 2-CPU host's stand side by side."""
    return "scale-manycore" if lanes_by_default() else "scale"


def part_scale(o):
    res = {"part": results_name(), "host": host_facts(), "loopback": [], "lab": [],
           "bytes": o.scale_bytes, "seconds": o.time}
    log("scale: host: %s" % host_line(res["host"]))
    print("host: %s" % host_line(res["host"]), flush=True)
    print("tools: %s" % ", ".join("%s %s" % (t, p or "(none)")
                                  for t, p in res["host"]["tools"].items()), flush=True)
    res["commands"] = {
        "key": "ri2n keygen --output FILE; --key FILE on both ends (keyed)",
        "serve": "ri2n serve -q --listen 127.0.0.1:PORT … --listen 127.0.0.L:PORT [--key FILE] "
                 "(L = 2 or 4; one server per links × key, all up for the whole part)",
        "clients": "N x ri2n bench --to 127.0.0.1:PORT --local 127.0.0.1 … --local 127.0.0.L "
                   "--time %d --json [--key FILE], started at once" % o.time,
        "server_cpu": "utime+stime of the serve process (/proc/PID/stat) over the clients' "
                      "wall time",
        "lab": "lab/ri2n-lab up L --mtu 1500 (no --rate: unlimited veth links), L = 2 and 4",
        "ri2n": "ri2n recv --no-checksum --listen 10.77.I.2:PORT … -o /dev/null; ri2n send "
                "--no-checksum --to 10.77.1.2:PORT --local 10.77.I.1 … -i FILE [--key FILE on "
                "both] (no checksum, as iperf3 verifies nothing; part tcp measures its cost)",
        "tcp": "iperf3 -s -1; iperf3 -c 10.77.1.2 -n BYTES -F FILE (one connection, link 1)",
        "ri2n_flip": "the same ri2n recv/send with --send-threads and --recv-threads on both: "
                     "off where ri2n's default gives each link a sending and a receiving thread "
                     "(%d or more CPUs), else on" % LANES_FROM_CPUS,
        "ri2n_rflip": "the same with --recv-threads alone flipped",
        "ri2n_tcp": "the same ri2n recv/send with --transport tcp on both (issue 45's transport: "
                    "a TCP connection per link)",
        "mptcp": "mptcpize run iperf3 … -F FILE (a subflow per link)",
        "tunnel": "ri2n tunnel --config FILE on A and B (one keyed cluster file, every lab "
                  "link); iperf3 -c 10.99.0.2 -n BYTES -F FILE through it",
        "tunnel_flip": "the same with --send-threads and --recv-threads both on (off where "
                       "they are on by default: from %d CPUs)" % LANES_FROM_CPUS,
        "tunnel_4": "the same daemons (their default number of interface queues); iperf3 -c "
                    "10.99.0.2 -n BYTES -P 4 (4 flows, from memory) through them",
        "tunnel_wmem": "the same as tunnel, with A's tcp_wmem maximum at %d bytes for the "
                       "transfer (echo into /proc/sys/net/ipv4/tcp_wmem in A's namespace)"
                       % WIDE_WMEM,
        "dropped": "ri2n tunnel status --json --name HOST on A and B after each transfer: the "
                   "packets_dropped of its peers, and the packets_lost of their links",
        "waits": "tunnel transfers: ri2n tunnel status --json --name a every 0.5 s while the "
                 "client ran; of the samples whose links sent 100 Mbit/s or more, the largest "
                 "queued_bytes and sum of in_flight_bytes, and the medians of the summed "
                 "window_bytes and of the links' rtt_us",
        "tcp_info": "iperf3 transfers, where ss is at hand: ss -tinH dport = :PORT in A's "
                    "namespace every 0.5 s while the client ran (its CPU counts in the "
                    "machine's); of the last listing with the transfer's flows (1 MB or more "
                    "acknowledged), their busy, sndbuf_limited and rwnd_limited times "
                    "(summed), the largest cwnd × mss and the smallest minrtt",
        "cpu": "lab: machine busy time from /proc/stat during the transfer, per GB moved",
        "threads": "lab: each thread's utime+stime (/proc/PID/task/TID/stat) sampled every "
                   "0.1 s while the sender ran, over the span it was seen, in cores; the 3 "
                   "busiest of ri2n send and recv, or of each tunnel daemon",
    }
    keyfile = common.key_file()
    log("scale: loopback, one ri2n serve, %s clients at once, %d s each" % (
        "/".join(map(str, CLIENTS)), o.time))
    measure_loopback(o, res, keyfile)
    try:
        measure_lab(o, res, keyfile)
    except Exception as e:  # a host without namespaces or MPTCP: keep the loopback figures
        res["lab_error"] = "%s: %s" % (type(e).__name__, e)
        log("scale: the lab part failed: %s" % res["lab_error"])
    print("\n".join(tables(res, brief=True)), flush=True)
    return res


def cpu_per_gb(r):
    return r["cpu_machine"] / (r["bytes"] / 1e9) if r.get("bytes") and r.get("cpu_machine") else None


def ratio(a, b):
    return a / b if a and b else None


def tables(res, brief):
    """The part's figures and ratios. brief: medians only (what the part prints at its end);
    else median (min–max, n) as everywhere in docs/BENCHMARKS.md."""
    def cell(xs, fmt, scale=1.0):
        if brief:
            m = med([x * scale if x is not None else None for x in xs])
            return "n/a" if m is None else fmt % m
        return spread(xs, fmt, scale)

    L = []
    loop = res["loopback"]
    if loop:
        L.append("")
        L.append("Loopback, one `ri2n serve`, N `ri2n bench` clients at once for %d s: aggregate "
                 "goodput (Gbit/s) / the server's CPU (cores); %d run(s) per cell:" % (
                     res["seconds"], max(r["rep"] for r in loop) + 1))
        L.append("")
        L.append("| links | key | %s | %d ÷ 1 clients |" % (
            " | ".join("%d client%s" % (n, "s" if n > 1 else "") for n in CLIENTS), CLIENTS[-1]))
        L.append("| --- | --- |%s --- |" % (" --- |" * len(CLIENTS)))
        for links in LOOP_LINKS:
            for keyed in (False, True):
                rows = {n: [r for r in loop if r["links"] == links and r["keyed"] == keyed
                            and r["clients"] == n] for n in CLIENTS}
                cells = ["%s / %s" % (cell([r["bps"] for r in rows[n]], "%.2f", 1e-9),
                                      cell([r["server_cores"] for r in rows[n]], "%.2f"))
                         for n in CLIENTS]
                top = {r["rep"]: r["bps"] for r in rows[CLIENTS[-1]]}
                one = {r["rep"]: r["bps"] for r in rows[1]}
                L.append("| %d | %s | %s | **%s** |" % (
                    links, "yes" if keyed else "no", " | ".join(cells),
                    cell([ratio(top.get(k), one.get(k)) for k in one], "%.2f×")))
        # same run, same cell but for the key / the links
        per = {(r["rep"], r["links"], r["keyed"], r["clients"]): r["bps"] for r in loop}
        keyr = [ratio(v, per.get((rep, links, False, n))) for (rep, links, keyed, n), v in per.items()
                if keyed]
        linkr = [ratio(v, per.get((rep, 2, keyed, n))) for (rep, links, keyed, n), v in per.items()
                 if links == 4]
        ups = sorted({u for r in loop for u in r["links_up"] if u is not None})
        L.append("")
        L.append("Links that came up per client: %s. Per run and cell, keyed ÷ unkeyed goodput "
                 "%s; 4 ÷ 2 links %s. In the %d-client cells, the server's "
                 "busiest threads and the whole machine (cores): %s." % (
                     "/".join(map(str, ups)) or "n/a", cell(keyr, "%.2f×"), cell(linkr, "%.2f×"),
                     CLIENTS[-1], "; ".join(
                         "%d links%s %s" % (links, ", keyed" if keyed else "", ", ".join(
                             "%s, machine %.1f" % ("/".join("%.2f" % x for x in r["server_top_threads"]),
                                                  r["machine_cores"])
                             for r in loop if r["links"] == links and r["keyed"] == keyed
                             and r["clients"] == CLIENTS[-1]))
                         for links in LOOP_LINKS for keyed in (False, True))))
    labs = res["lab"]
    names = dict(LAB_NAMES)
    lanes = res["host"].get("lanes_by_default")
    # runs before receiving lanes flipped the sending ones alone
    flags = res["host"].get("flip_flags", ["--send-threads"])
    for k in ("ri2n_flip", "ri2n_keyed_flip"):
        names[k] = "%s %s" % (names[k].split(",")[0] + (", keyed," if "keyed" in k else ","),
                              " ".join("`%s %s`" % (f, "off" if lanes else "on") for f in flags))
    names["ri2n_rflip"] = "ri2n, `--recv-threads %s`" % ("off" if lanes else "on")
    names["tunnel_flip"] = "iperf3 through `ri2n tunnel %s`" % " ".join(
        "%s %s" % (f, "off" if lanes else "on") for f in FLIP_FLAGS)
    # which ri2n tools ran with a thread per link, and which without
    on, off = ("ri2n", "ri2n_flip") if lanes else ("ri2n_flip", "ri2n")
    # and with receiving lanes, and without (sending lanes as by default)
    r_on, r_off = ("ri2n", "ri2n_rflip") if lanes else ("ri2n_rflip", "ri2n")
    t_on, t_off = ("tunnel", "tunnel_flip") if lanes else ("tunnel_flip", "tunnel")
    # the tools every run measured (results from before the tunnel joined the part lack it)
    tools = [k for k in LAB_TOOLS if all(k in r for c in labs for r in c["runs"])]
    if labs:
        L.append("")
        L.append("Unlimited-rate lab, MTU 1500, %.2f GB A→B per transfer: goodput (Gbit/s), the "
                 "machine's CPU-s per GB; %d run(s), the tools in turn:" % (
                     res["bytes"] / 1e9, len(labs[0]["runs"])))
        L.append("")
        # (heading, numerator, denominator, bold): within each run, for the tools measured
        ratios = [(h, a, b, bold) for h, a, b, bold in (
            ("ri2n ÷ MPTCP", "ri2n", "mptcp", True),
            ("keyed ÷ unkeyed", "ri2n_keyed", "ri2n", False),
            ("lanes on ÷ off" if len(flags) > 1 else "send threads on ÷ off", on, off, False),
            ("same, keyed", on.replace("ri2n", "ri2n_keyed"), off.replace("ri2n", "ri2n_keyed"),
             False),
            ("receiving lanes on ÷ off", r_on, r_off, False),
            ("TCP transport ÷ MPTCP", "ri2n_tcp", "mptcp", True),
            ("tunnel ÷ MPTCP", "tunnel", "mptcp", True),
            ("tunnel, lanes on ÷ off", t_on, t_off, False),
            ("tunnel, 4 flows ÷ 1", "tunnel_4", "tunnel", False),
            ("tunnel, 32 MiB send buffer ÷ default", "tunnel_wmem", "tunnel", False))
            if a in tools and b in tools]
        L.append("| links | %s | %s |" % (" | ".join(names[k] for k in tools),
                                         " | ".join(h for h, _, _, _ in ratios)))
        L.append("| --- |%s" % (" --- |" * (len(tools) + len(ratios))))
        for c in labs:
            runs = c["runs"]
            cells = ["%s, %s" % (cell([r[k].get("bps") for r in runs], "%.2f", 1e-9),
                                 cell([cpu_per_gb(r[k]) for r in runs], "%.2f"))
                     for k in tools]
            for _, a, b, bold in ratios:
                x = cell([ratio(r[a].get("bps"), r[b].get("bps")) for r in runs], "%.2f×")
                cells.append("**%s**" % x if bold else x)
            L.append("| %d | %s |" % (c["links"], " | ".join(cells)))
        L.append("")
        L.append("MPTCP subflows joined per transfer (A's MPJoinSynAckRx; iperf3 opens a control "
                 "and a data connection, so 2 × (links − 1) when every link is used): %s." % "; ".join(
                     "%d links %s" % (c["links"], ", ".join(str(r["mptcp"].get("mptcp_joins", "n/a"))
                                                            for r in c["runs"])) for c in labs))
        by = {c["links"]: c for c in labs}
        if 2 in by and 4 in by:
            def m(c, k):
                return med([r[k].get("bps") for r in c["runs"]])
            L.append("")
            L.append("4 ÷ 2 links (ratio of the medians, separate labs): %s." % ", ".join(
                "%s %s×" % (names[k], "n/a" if ratio(m(by[4], k), m(by[2], k)) is None
                            else "%.2f" % ratio(m(by[4], k), m(by[2], k))) for k in tools))
        cores = []
        for c in labs:
            for k in tools:
                xs = [r[k]["cpu_machine"] / r[k]["wall_send"] for r in c["runs"]
                      if r[k].get("wall_send") and r[k].get("cpu_machine") is not None]
                cores.append("%d links %s %s" % (c["links"], names[k], cell(xs, "%.1f")))
        # losses inside the path: inner TCP's retransmissions, and what the daemons dropped
        lost = []
        for c in labs:
            for k in tools:
                if k.startswith("ri2n"):
                    continue
                retr = [r[k].get("retransmits") for r in c["runs"]]
                drops = ["%s/%s" % (r[k]["dropped"].get("a"), r[k]["dropped"].get("b"))
                         for r in c["runs"] if r[k].get("dropped")]
                # (results from before the links' losses were read lack them)
                links_lost = ["%s/%s" % (r[k]["links_lost"].get("a"), r[k]["links_lost"].get("b"))
                              for r in c["runs"] if r[k].get("links_lost")]
                lost.append("%d links %s %s%s%s" % (
                    c["links"], names[k], cell(retr, "%.0f"),
                    ", dropped (A/B) %s" % ", ".join(drops) if drops else "",
                    "; its links lost (A/B) %s" % ", ".join(links_lost) if links_lost else ""))
        # whether a TCP flow was bound by its window: window ÷ round trip against its rate
        windows = []
        for c in labs:
            for k in tools:
                runs = [r[k] for r in c["runs"] if r[k].get("rtt_us")]
                if runs:
                    windows.append("%d links %s %s µs, %s MB, %s MB" % (
                        c["links"], names[k], cell([x["rtt_us"] for x in runs], "%.0f"),
                        cell([x["max_snd_cwnd"] for x in runs], "%.2f", 1e-6),
                        cell([x["max_snd_wnd"] for x in runs], "%.2f", 1e-6)))
        if windows:
            L.append("")
            L.append("iperf3's sender (each flow's TCP; with -P 4 the mean round trip and the "
                     "largest windows of its flows): mean round trip, largest congestion window, "
                     "largest window the receiver offered: %s." % "; ".join(windows))
        # what held the TCP flows back, as their sender saw it
        limits = []
        for c in labs:
            for k in tools:
                runs = [r[k]["tcp_info"] for r in c["runs"]
                        if (r[k].get("tcp_info") or {}).get("busy_ms")]
                # how much of the transfer the last listing covered (stored since it was kept)
                covered = [r[k]["tcp_info"]["bytes_acked"] / r[k]["bytes"] for r in c["runs"]
                           if (r[k].get("tcp_info") or {}).get("bytes_acked") and r[k].get("bytes")]
                if runs:
                    limits.append("%d links %s %s, %s, %s MB, %s µs%s" % (
                        c["links"], names[k],
                        cell([x["sndbuf_limited_ms"] / x["busy_ms"] for x in runs], "%.0f %%", 100),
                        cell([x["rwnd_limited_ms"] / x["busy_ms"] for x in runs], "%.0f %%", 100),
                        cell([x["cwnd_bytes"] for x in runs], "%.2f", 1e-6),
                        cell([x["minrtt_us"] for x in runs], "%.0f"),
                        " (covering %s of the bytes)" % cell(covered, "%.0f %%", 100)
                        if covered else ""))
        waits = []
        for c in labs:
            for k in tools:
                runs = [r[k]["waits"] for r in c["runs"] if r[k].get("waits")]
                if runs:
                    waits.append("%d links %s %s, %s, %s MB, %s µs" % (
                        c["links"], names[k],
                        cell([x["queued_max"] for x in runs], "%.2f", 1e-6),
                        cell([x["in_flight_max"] for x in runs], "%.2f", 1e-6),
                        cell([x["window"] for x in runs], "%.2f", 1e-6),
                        cell([x["rtt_us"] for x in runs], "%.0f")))
        if waits:
            L.append("")
            L.append("Where the tunnel's packets waited in the sending daemon (its status every "
                     "0.5 s while it sent): the most queued for the peer (MB), the most in "
                     "flight on its links together (MB), their congestion windows together, "
                     "their round trips: %s." % "; ".join(waits))
        if limits:
            L.append("")
            L.append("What held iperf3's TCP back, in its own account (`ss -ti` on A every 0.5 s, "
                     "the flows' counters in the last listing taken while they ran: a transfer "
                     "of a second or so ends up to 0.5 s after it): the share of the time it had data "
                     "to send that it waited for room in its send buffer, and for the "
                     "receiver's window (the rest: its congestion window or pacing); its "
                     "congestion window; its smallest round trip: %s." % "; ".join(limits))
        # what held ri2n's own senders back, in their account (`send --json`'s send_limits)
        def shares_of(runs, *fields):
            return [sum(x[f] for f in fields) / sum(x.values()) for x in runs]

        held = []
        for c in labs:
            for k in tools:
                runs = [r[k]["send_limits"] for r in c["runs"]
                        if sum((r[k].get("send_limits") or {}).values()) > 0]
                if runs:
                    held.append("%d links %s %s, %s, %s, %s" % (
                        c["links"], names[k],
                        cell(shares_of(runs, "sending"), "%.0f %%", 100),
                        cell(shares_of(runs, "congestion_window", "pacing"), "%.0f %%", 100),
                        cell(shares_of(runs, "peer_window"), "%.0f %%", 100),
                        cell(shares_of(runs, "send_buffer"), "%.0f %%", 100)))
        if held:
            L.append("")
            L.append("What held ri2n's sender back, in its own account (`send --json`'s "
                     "`send_limits`; through the tunnel, the sending daemon's status between "
                     "its first and last busy sample): of the time it was busy, the share it "
                     "sent at its own pace (its CPU the bound), waited for its links' "
                     "congestion windows or pacing, for the receiver's window, and for "
                     "acknowledgements to free its send buffer: %s." % "; ".join(held))
        L.append("")
        links_read = any(r[k].get("links_lost") for c in labs for r in c["runs"] for k in tools)
        L.append("iperf3's retransmissions per transfer, and the packets each tunnel daemon "
                 "dropped (its status: a datagram its send queue had no room for, or one that "
                 "arrived incomplete; each run)%s: %s." % (
                     " and the ri2n packets its links declared lost and sent again"
                     if links_read else "", "; ".join(lost)))
        queues = sorted({r[k].get("queues") for c in labs for r in c["runs"]
                         for k in ("tunnel", "tunnel_flip", "tunnel_4", "tunnel_wmem") if k in r}
                        - {None})
        if queues:
            L.append("")
            L.append("Interface queues of each tunnel daemon (its default on this host, one per "
                     "4 CPUs): %s." % "/".join(map(str, queues)))
        sampled = []
        for c in labs:
            for k in tools:
                for who in SAMPLED.get(k, ()):
                    tops = [r[k]["threads"][who] for r in c["runs"]
                            if r[k].get("threads", {}).get(who)]
                    if tops:
                        sampled.append("%d links %s %s %s" % (
                            c["links"], names[k], who, medians_by_place(tops)))
        # where ri2n's bytes went: whether each link's threads had work
        shares = []
        for c in labs:
            for k in tools:
                per_run = [r[k]["shares"] for r in c["runs"]
                           if r[k].get("shares") and None not in r[k]["shares"]]
                if per_run:
                    shares.append("%d links %s %s" % (c["links"], names[k],
                                                      medians_by_place(per_run)))
        if sampled:
            L.append("")
            L.append("The busiest threads while the sender ran (cores, medians of the runs by "
                     "rank; a thread near 1.0 is what bounds the rate): %s." % "; ".join(sampled)
                     + (" Each link's share of the bytes ri2n sent (the sender's `--json`, "
                        "medians of the runs by link): %s." % "; ".join(shares) if shares else ""))
        L.append("")
        L.append("The machine's busy cores while the sender ran (its busy CPU-s over the "
                 "sender's wall time, connection set-up and close included): %s." % "; ".join(cores))
    return L


def report_scale(res):
    h = res["host"]
    L = [mfacts(res), ""]
    L.append("Host: %s. Tools: %s." % (host_line(h), ", ".join(
        "`%s`" % (p or "%s (none)" % t) for t, p in h["tools"].items())))
    L += tables(res, brief=False)
    bad = ["loopback %d links%s %d clients run %d: rc %s" % (
        r["links"], " keyed" if r["keyed"] else "", r["clients"], r["rep"], r["rcs"])
        for r in res["loopback"] if r["bps"] is None]
    bad += ["lab %d links run %d %s: rc %s/%s" % (c["links"], r["rep"], k, r[k].get("rc"),
                                                  r[k].get("recv_rc"))
            for c in res["lab"] for r in c["runs"] for k in LAB_TOOLS if k in r
            if r[k].get("rc") != 0 or r[k].get("recv_rc") not in (None, 0)]
    if res.get("lab_error"):
        L.append("")
        L.append("The lab was not measured on this host: %s." % res["lab_error"])
    L.append("")
    # the loopback cells' and the lab transfers' (each lab row holds one per tool)
    lab_busy = [{"busy_before": r.get("busy_before_" + k)}
                for c in res["lab"] for r in c["runs"] for k in LAB_TOOLS]
    L.append(busy_line(res["loopback"] + lab_busy))
    if bad:
        L.append("")
        L.append("Runs that failed: %s." % "; ".join(bad))
    return "\n".join(L)
