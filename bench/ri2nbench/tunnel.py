"""Part 6: `ri2n tunnel` on 3 hosts and 2 networks of 1 Gbit/s per port."""
import json
import os
import re
import shutil
import tempfile
import threading
import time

from . import common
from .common import (
    KILLED, LAB, PROCS, ROOT, fmt_ms, log, mfacts, proc_cpu, run, run_json, sockperf_pp, spread,
    wait_quiet)
from .labctl import do_events, new_lab
from .analysis import BIN, analyse
from .fault import tcp_flow_run


TUNNEL_HOSTS = "abc"


def tunnel_up(lab, tmpdir, carry="datagrams", hosts=TUNNEL_HOSTS, timeout=30, links=2, extra=()):
    """Key, cluster file and a daemon per host of `hosts` (the lab's host names, in its order,
    host i being 10.77.LINK.i) on the lab's first `links` links, with `--carry CARRY` and the
    options `extra`; waits until every daemon has all its peers."""
    key = os.path.join(tmpdir, "cluster.key")
    run([common.RI2N, "keygen", "--output", key, "--force"])
    text = 'key = "%s"\n' % key
    for i, h in enumerate(hosts, 1):
        addrs = ", ".join('"10.77.%d.%d"' % (link, i) for link in range(1, links + 1))
        text += '\n[[host]]\nname = "%s"\naddress = "10.99.0.%d"\nlinks = [%s]\n' % (h, i, addrs)
    cfg = os.path.join(tmpdir, "cluster.toml")
    with open(cfg, "w") as f:
        f.write(text)
    logs, daemons = {}, {}
    for h in hosts:
        logs[h] = os.path.join(tmpdir, "tunnel-%s.log" % h)
        daemons[h] = PROCS.start(lab.ex(h, common.RI2N, "tunnel", "--config", cfg, "--carry", carry,
                                        *extra),
                                 stderr=open(logs[h], "w"))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(sum(line.endswith(" connected") for line in open(logs[h]).read().splitlines())
               >= len(hosts) - 1 for h in hosts):
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
# runs of the MPI job through the tunnel (issue: zero hangs in at least 10)
MPI_REPS = 10
# the lab test's schedule (crates/ri2n-lab-tests/tests/tunnel.rs), in the job's own seconds
MPI_EVENTS = [(6.0, "fault", 1, "switch"), (12.0, "heal", 1), (16.0, "fault", 1, "switch"),
              (16.0, "fault", 2, "switch"), (36.0, "heal", "all")]
# when (the job's seconds) each host's inner TCP and daemon are looked at if the job has not
# moved since the heal: while a backed-off timeout of inner TCP would hold it
MPI_LOOKS = [38.0, 41.0, 46.0, 56.0]


def mpi_job(lab, tmpdir, btl, oob, logs=None):
    """The lab test's MPI job (tests/mpi/check.c, one rank per host, mpirun in host a) with
    Open MPI's TCP transport on `btl` and its control traffic on `oob`, through MPI_EVENTS.
    With `logs` (each tunnel daemon's log file, by host), what each daemon logged during the
    job goes with its result, and for a job that stood still longer than the partition, what
    the hosts looked like after the heal (MPI_LOOKS)."""
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
    log_from = {h: os.path.getsize(f) for h, f in (logs or {}).items()}
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
    # looked at only while the job stands still after the heal, so as not to disturb the others
    looks, heal = [], MPI_EVENTS[-1][0]
    for t in MPI_LOOKS if logs else ():
        while time.monotonic() < t0 + t and p.poll() is None:
            time.sleep(0.01)
        out.seek(0)
        moved = any(float(m) > heal + 0.5 for m in re.findall(r"progress t=([\d.]+)", out.read()))
        if p.poll() is not None or moved:
            break
        looks.append(look_at_hosts(lab, time.monotonic() - t0))
    # the limit counts from the job's start, as the report says, not from the last event
    rc, _ = PROCS.wait_rusage(p, max(0.0, t0 + MPI_SECONDS + 120 - time.monotonic()))
    wall = time.monotonic() - t0
    if rc == KILLED:
        end_mpi_leftovers(lab)
    out.seek(0)
    err.seek(0)
    text, etext = out.read(), err.read()
    ranks = re.findall(r"rank (\d+): iterations (\d+), checked MB (\d+), longest iteration "
                       r"([\d.]+) s, at ([\d.]+) s", text)
    progress = [(float(t), int(i)) for t, i in re.findall(r"progress t=([\d.]+) iterations=(\d+)", text)]
    r = {"rc": rc, "ok": "result: ok" in text, "wall_s": wall, "progress": progress,
         "ranks": [{"rank": int(r), "iterations": int(i), "mb": int(m), "longest_s": float(l),
                    "longest_at": float(a)} for r, i, m, l, a in ranks],
         "stderr": etext[-1500:] if rc != 0 else ""}
    if logs:
        r["daemon_logs"] = {}
        for h, f in logs.items():
            with open(f) as lf:
                lf.seek(log_from[h])
                r["daemon_logs"][h] = lf.read()[-3000:]
        if looks:
            r["looks"] = looks
    return r


def look_at_hosts(lab, t):
    """At `t` s of an MPI job: each host's inner TCP connections through the tunnel (`ss`: their
    retransmission timer, back-off and losses) and its daemon's status."""
    look = {"t": round(t, 2)}
    for h in TUNNEL_HOSTS:
        look[h] = {
            "ss": run(lab.ex(h, "ss", "-tinoe", "dst", "10.99.0.0/24"), check=False, timeout=10),
            "status": run(lab.ex(h, common.RI2N, "tunnel", "status", "--json", "--name", h),
                          check=False, timeout=10)}
    return look


def end_mpi_leftovers(lab):
    """After a hung job was killed: ends the Open MPI daemons and ranks this job started in
    the lab's hosts (by PID, found in each host's namespace), so the next run starts clean."""
    for h in TUNNEL_HOSTS:
        ns = "%s-%s" % (lab.prefix, h)
        for pid in run(["ip", "netns", "pids", ns], check=False).split():
            try:
                with open("/proc/%s/comm" % pid) as f:
                    comm = f.read().strip()
            except OSError:
                continue
            if comm in ("check", "orted", "prted", "mpirun"):
                log("  ending %s (pid %s) left in host %s by the hung job" % (comm, pid, h))
                try:
                    os.kill(int(pid), 9)
                except OSError:
                    pass


# payload capacity of one 1 Gbit/s link for TCP: 1448 payload bytes per 1514-byte frame (a
# 1500-byte packet less 52 bytes of IP+TCP with timestamps), what one TCP connection carries on
# it; the tunnel's own encapsulation (ri2n's 39 bytes per packet, inner TCP's headers once per
# 64 KB segment) counts against it
TUNNEL_LINK_CAP = 1e9 * 1448 / 1514
# a switch dies and heals under a TCP flow through the tunnel
TUNNEL_FAILOVER = (8, [(3.0, "fault", 1, "switch"), (5.0, "heal", 1)])


def failover_analysis(r):
    """When a failover run's flow was back after the fault and after the heal (analysis.py)."""
    return analyse(r["series_bps"], r["events"], TUNNEL_FAILOVER[0], TUNNEL_LINK_CAP)
# the busy-poll window of the second set of latency runs (µs): none, the daemons' packet
# threads sleep as soon as they run out of work (the first set has the default window)
BUSY_POLL_US = 0


def latency_runs(lab, daemons, o):
    """o.reps 64-byte UDP ping-pongs from host a to b through the tunnel and directly on link
    1, with the CPU the daemons of a and b used during the one through the tunnel per round
    trip of that whole run (µs): the CPU is read around the whole sockperf process, so the
    round trips are those of its whole run too, warm-up included, not the fewer it measured."""
    rows = []
    for rep in range(o.reps):
        wait_quiet()
        c0 = sum(proc_cpu(daemons[h].pid) for h in "ab")
        row = {"tunnel": sockperf_pp(lab.ex("a"), "10.99.0.2", 11111, 64, o.sockperf_time)}
        cpu = sum(proc_cpu(daemons[h].pid) for h in "ab") - c0
        if row["tunnel"].get("all_count"):
            row["daemon_cpu_us"] = cpu / row["tunnel"]["all_count"] * 1e6
        row["link"] = sockperf_pp(lab.ex("a"), "10.77.1.2", 11111, 64, o.sockperf_time)
        rows.append(row)
    return rows


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
        r["analysis"] = failover_analysis(r)
        log("  failover rep %d: %s" % (rep, ", ".join(
            "%s at %.2f s: %s ms" % (e["action"], e["t_bench"], fmt_ms(e.get("time_to_90")))
            for e in r["analysis"]["events"])))
        res["failover"].append(r)
    # round trip through the tunnel and directly on link 1 (64-byte UDP ping-pong)
    res["latency"] = latency_runs(lab, daemons, o)
    # every link down under an idle and a moving connection
    outage = 10 if o.quick else 60
    res["partition"] = []
    for rep in range(1 if o.quick else 2):
        wait_quiet()
        r = tunnel_partition(lab, tmpdir, outage)
        log("  partition %d s, rep %d: iperf3 exit %s, data again %s s after the heal; idle "
            "connection %s" % (outage, rep, r["rc"], r["resume_s"], r["idle"]))
        res["partition"].append(r)
    # an MPI job through a dead switch and a 20 s partition, MPI_REPS times: a hang in any
    # run is what counts
    if shutil.which("mpirun") and shutil.which("mpicc"):
        res["mpi_tunnel"] = []
        for rep in range(1 if o.quick else MPI_REPS):
            wait_quiet()
            r = mpi_job(lab, tmpdir, "ri2n0", "ri2n0", logs)
            res["mpi_tunnel"].append(r)
            log("  MPI through the tunnel, run %d: exit %s, %s, wall %.0f s" % (
                rep + 1, r["rc"], "result ok" if r["ok"] else "NO RESULT", r["wall_s"]))
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
    # the round trip again with the daemons' other busy-poll window (`--busy-poll`)
    for p in daemons.values():
        PROCS.stop(p)
    daemons, logs = tunnel_up(lab, tmpdir, extra=["--busy-poll", str(BUSY_POLL_US)])
    res["latency_busy_poll"] = {"busy_poll_us": BUSY_POLL_US,
                                "runs": latency_runs(lab, daemons, o)}
    for p in srv.values():
        PROCS.stop(p)
    for p in daemons.values():
        PROCS.stop(p)
    # the same MPI job on the plain networks: Open MPI on both interfaces, no ri2n
    if shutil.which("mpirun") and shutil.which("mpicc"):
        wait_quiet()
        res["mpi_plain"] = [mpi_job(lab, tmpdir, "eth1,eth2", "eth1")]
        log("  MPI on the plain networks: %s" % {k: res["mpi_plain"][0][k] for k in ("rc", "ok", "ranks")})
    res["daemon_logs"] = {h: open(logs[h]).read()[-3000:] for h in TUNNEL_HOSTS}
    res["commands"] = {
        "tunnel": "iperf3 -c 10.99.0.2 -t %d (host a to b through ri2n0)" % o.time,
        "mptcp": "mptcpize run iperf3 -c 10.77.1.2 -p 5202 -t %d (one subflow per network)" % o.time,
        "tcp": "iperf3 -c 10.77.1.2 -t %d (network 1 only)" % o.time,
        "failover": "bench/mptcp_flow.py send --tcp --to 10.99.0.2:5310 --time 8 (receiver: "
                    "recv --tcp, 10 ms bins); switch 1 dies at 3 s, heals at 5 s",
        "latency": "sockperf ping-pong -m 64 --full-rtt -t %d to 10.99.0.2 and to 10.77.1.2 "
                   "(ri2n tunnel's default busy-poll window); again with ri2n tunnel --busy-poll "
                   "%d" % (o.sockperf_time, BUSY_POLL_US),
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


def added_rtt(rows):
    """Each latency run's round trip through the tunnel minus the direct one (µs)."""
    return [r["tunnel"]["median_us"] - r["link"]["median_us"]
            if r["tunnel"]["median_us"] and r["link"]["median_us"] else None for r in rows]


def daemon_cpu(rows):
    """The daemons' CPU per round trip, for latency rows that measured it."""
    cpu = [r["daemon_cpu_us"] for r in rows if r.get("daemon_cpu_us") is not None]
    return "; the daemons' CPU per round trip %s µs" % spread(cpu, "%.0f") if cpu else ""


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
        # a failed run is left out (spread counts n), never taken as 0
        bps = [r[k]["bps"] for r in runs]
        retr = [r[k]["retransmits"] for r in runs]
        cpu = ""
        if k == "tunnel":
            cpu = spread([sum(r[k]["cpu_daemons"].values()) / r[k]["bytes"] * 1e9
                          if r[k]["bytes"] else None for r in runs], "%.2f")
        L.append("| %s | %s | %s | %s |" % (name, spread(bps, "%.0f", 1e-6), spread(retr, "%.0f"), cpu))
    ratio = [r["tunnel"]["bps"] / r["mptcp"]["bps"]
             if r["tunnel"]["bps"] and r["mptcp"]["bps"] else None for r in runs]
    share = [r["tunnel"]["bps"] / cap if r["tunnel"]["bps"] else None for r in runs]
    L.append("")
    L.append("Tunnel / MPTCP per run: **%s** (target ≥ 1). Tunnel / payload capacity of the two "
             "links for TCP (1448 bytes per 1514-byte frame, %.0f Mbit/s): **%s** (target ≥ 97 %%)."
             % (spread(ratio, "%.3f×"), cap / 1e6, spread(share, "%.1f %%", 100)))
    fo = res["failover"]
    for r in fo:
        # made again from the stored goodput: the figures follow the rule in force
        r["analysis"] = failover_analysis(r)
    if fo:
        L.append("")
        L.append("**Switch 1 dies at 3 s and heals at 5 s** under one TCP flow through the tunnel "
                 "(`bench/mptcp_flow.py --tcp`, the receiver counting what it reads per 10 ms; "
                 "events placed where the lab stamped them). Rule as in part 3: the flow is back "
                 "at the start of the first 10 ms bin that starts at or after the event and whose "
                 "own goodput and whose 100 ms average are both ≥ the target: after the fault 90 %% of the surviving link (%.0f "
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
        L.append("**64-byte UDP round trip** (sockperf `--full-rtt`), µs, with the daemons' "
                 "default busy-poll window: through the tunnel %s, directly on network 1 %s "
                 "(median of each run's median), tunnel minus direct per run **%s**%s." % (
                     spread([r["tunnel"]["median_us"] for r in lat]),
                     spread([r["link"]["median_us"] for r in lat]),
                     spread(added_rtt(lat)),
                     daemon_cpu(lat)))
        busy = res.get("latency_busy_poll")
        if busy and busy["runs"]:
            runs = busy["runs"]
            how = ("without busy polling" if busy["busy_poll_us"] == 0
                   else "busy polling for %d µs" % busy["busy_poll_us"])
            L.append("With the daemons %s (`--busy-poll %d`): through the tunnel %s, "
                     "directly %s, tunnel minus direct per run **%s**%s." % (
                         how, busy["busy_poll_us"],
                         spread([r["tunnel"]["median_us"] for r in runs]),
                         spread([r["link"]["median_us"] for r in runs]),
                         spread(added_rtt(runs)),
                         daemon_cpu(runs)))
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
                 "dead from 16 s to 36 s. A run that has not ended %d s after its clock started is "
                 "killed and counted as hung; median (min–max) of the runs that ended:"
                 % (MPI_SECONDS, MPI_SECONDS + 120))
        L.append("")
        L.append("| network | runs | exit 0 | results checked ok | hung | iterations per second before the faults | iterations | longest iteration (the job stood still) | its start | wall time |")
        L.append("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for name, runs in (("through the tunnel (ri2n0)", mt),
                           ("plain networks, Open MPI on both (eth1, eth2)", mp)):
            if not runs:
                continue
            # None: a hung run of results stored before KILLED named them
            ended = [r for r in runs if r["rc"] not in (None, KILLED)]

            def rate(r):
                before = [(t, i) for t, i in r["progress"] if t <= 6.0]
                # none: the run reported no progress before the faults (not a rate of 0)
                return before[-1][1] / before[-1][0] if before else None

            def worst(r):
                return max(r["ranks"], key=lambda x: x["longest_s"]) if r["ranks"] else None
            done = [r for r in ended if worst(r)]
            L.append("| %s | %d | %d | %d | %d | %s | %s | %s | %s | %s |" % (
                name, len(runs), sum(1 for r in ended if r["rc"] == 0),
                sum(1 for r in runs if r["ok"]), len(runs) - len(ended),
                spread([rate(r) for r in ended], "%.0f") if ended else "–",
                spread([r["ranks"][0]["iterations"] for r in done], "%.0f") if done else "–",
                spread([worst(r)["longest_s"] for r in done], "%.1f s") if done else "–",
                spread([worst(r)["longest_at"] for r in done], "%.1f s") if done else "–",
                spread([r["wall_s"] for r in ended], "%.0f s") if ended else "–"))
        still = [i for i, r in enumerate(mt or []) if r.get("looks")]
        if still:
            L.append("")
            L.append("Run%s %s through the tunnel had not moved %.1f s after the heal; what each "
                     "host's inner TCP (`ss -tinoe`) and daemon (`tunnel status`) showed then is "
                     "kept with %s in `bench/results/tunnel.json` (`mpi_tunnel[N].looks`)." % (
                         "s" if len(still) > 1 else "", ", ".join(str(i + 1) for i in still),
                         MPI_LOOKS[0] - MPI_EVENTS[-1][0], "them" if len(still) > 1 else "it"))
    carry = res.get("carry") or {}
    if carry:
        L.append("")
        L.append("**How IP packets ride** (`ri2n tunnel --carry`): each as one unreliable "
                 "datagram (the default) or as a reliable, ordered message (ri2n retransmits "
                 "under inner TCP). iperf3 from host a to b; median (min–max) of %d runs:" % len(
                     next(iter(carry.values()))))
        L.append("")
        L.append("| carry | goodput, Mbit/s | inner TCP retransmissions | switch 1 dead 3–5 s: mean Mbit/s | back ≥ %.0f after the fault | its inner TCP retransmissions | every switch dead 3–6 s: data again after the heal | its inner TCP retransmissions |" % (0.9 * TUNNEL_LINK_CAP / 1e6))
        L.append("| --- | --- | --- | --- | --- | --- | --- | --- |")
        # a run whose iperf3 failed (no intervals) is left out (spread counts n); 99 s is a
        # run that measured and never recovered
        for name, rows in carry.items():
            def during(r):
                xs = [x[1] for x in r["failover"].get("intervals") or [] if 3.0 <= x[0] < 5.0]
                return sum(xs) / len(xs) if xs else None

            def back(r):
                if not r["failover"].get("intervals"):
                    return None
                for x in r["failover"]["intervals"]:
                    if x[0] >= 3.0 and x[1] >= 0.9 * TUNNEL_LINK_CAP:
                        return x[0] + 0.1 - 3.0
                return 99.0
            resume = [None if not r["outage"].get("intervals") else
                      r["outage"]["resume_s"] if r["outage"]["resume_s"] is not None else 99.0
                      for r in rows]

            def retransmits(k):
                return spread([r[k]["retransmits"] for r in rows], "%.0f")
            L.append("| %s | %s | %s | %s | %s | %s | %s | %s |" % (
                name, spread([r["rate"]["bps"] for r in rows], "%.0f", 1e-6),
                retransmits("rate"), spread([during(r) for r in rows], "%.0f", 1e-6),
                spread([back(r) for r in rows], "%.1f s"), retransmits("failover"),
                spread(resume, "%.1f s"), retransmits("outage")))
        L.append("")
        L.append("(99 s: never within the run. Recovery counted in whole 0.1 s intervals of "
                 "iperf3's clock, which starts a moment after the faults' (iperf3's start-up, "
                 "under 0.2 s): a figure may fall short of the true time by that moment; the "
                 "failover above times the datagram mode in 10 ms bins. An outage of "
                 "every link costs inner TCP its retransmission timeouts during the outage, 3 "
                 "in 3 s, even when nothing is lost.)")
    L.append("")
    L.append("Commands: " + "; ".join("%s: `%s`" % kv for kv in res["commands"].items()) + ".")
    return "\n".join(L)
