"""Part cluster: what `ri2n tunnel` costs per peer, in a namespace cluster of 3 and of 32 hosts
on 2 networks of 1 Gbit/s per port: how soon every daemon has all its peers, whether every
pair of hosts reaches each other through the tunnel, and each daemon's threads, memory and
CPU at rest."""
import os
import shutil
import string
import subprocess
import tempfile
import time

from .common import PROCS, log, mfacts, proc_cpu, spread
from .labctl import new_lab
from .tunnel import tunnel_up

SIZES = [3, 32]
# how long the daemons are watched at rest
REST_S = 10


def host_names(n):
    """The lab's host names: a..z, then aa, ab, ... (lab/ri2n-lab)."""
    letters = string.ascii_lowercase
    return [letters[k] if k < 26 else "a" + letters[k - 26] for k in range(n)]


def link_packets(pid):
    """Packets sent plus received so far on the lab links of the host process `pid` runs in."""
    with open("/proc/%d/net/dev" % pid) as f:
        total = 0
        for line in f:
            name, _, rest = line.partition(":")
            if name.strip().startswith("eth"):
                fields = rest.split()
                total += int(fields[1]) + int(fields[9])
        return total


def reachable_pairs(lab, hosts):
    """Every host pings every other's tunnel address once (the hosts in parallel): the pairs
    that answered, and those that did not."""
    pingers = []
    for i, h in enumerate(hosts, 1):
        targets = " ".join("10.99.0.%d" % j for j in range(1, len(hosts) + 1) if j != i)
        script = "for ip in %s; do ping -q -c 1 -W 3 $ip >/dev/null || echo $ip; done" % targets
        pingers.append((h, subprocess.Popen(lab.ex(h, "sh", "-c", script), stdout=subprocess.PIPE,
                                            text=True)))
    failed = []
    for h, p in pingers:
        out, _ = p.communicate(timeout=300)
        if p.returncode != 0:
            # the pinger itself failed (its host unreachable to the lab): none of its pairs
            # was shown to answer
            failed += ["%s -> 10.99.0.%d" % (h, j) for j in range(1, len(hosts) + 1)
                       if j != hosts.index(h) + 1]
            continue
        failed += ["%s -> %s" % (h, ip) for ip in out.split()]
    return len(hosts) * (len(hosts) - 1) - len(failed), failed


def status_field(pid, name):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(name):
                return int(line.split()[1])
    return 0


def measure(o, n):
    lab = new_lab(o.prefix)
    lab.up([1000, 1000], hosts=n)
    tmpdir = tempfile.mkdtemp(prefix="ri2nbench-cluster-")
    try:
        hosts = host_names(n)
        t0 = time.monotonic()
        daemons, _ = tunnel_up(lab, tmpdir, hosts=hosts, timeout=120)
        connected_s = time.monotonic() - t0
        reached, failed = reachable_pairs(lab, hosts)
        time.sleep(2)
        cpu0 = {h: proc_cpu(d.pid) for h, d in daemons.items()}
        pk0 = {h: link_packets(d.pid) for h, d in daemons.items()}
        time.sleep(REST_S)
        r = {"hosts": n, "connected_s": connected_s, "pairs": n * (n - 1), "reached": reached,
             "unreached": failed[:20],
             "cpu": [(proc_cpu(d.pid) - cpu0[h]) / REST_S for h, d in daemons.items()],
             "link_pps": [(link_packets(d.pid) - pk0[h]) / REST_S for h, d in daemons.items()],
             "threads": [len(os.listdir("/proc/%d/task" % d.pid)) for d in daemons.values()],
             "rss_kib": [status_field(d.pid, "VmRSS:") for d in daemons.values()]}
        log("  %d hosts: connected after %.1f s, %d of %d pairs reached; per daemon at rest: "
            "threads %s, RSS %s MiB, CPU %s %% of a core, link packets/s %s" % (
                n, connected_s, reached, r["pairs"], spread(r["threads"], "%.0f"),
                spread(r["rss_kib"], "%.1f", 1 / 1024), spread(r["cpu"], "%.2f", 100),
                spread(r["link_pps"], "%.0f")))
        for d in daemons.values():
            PROCS.stop(d)
        return r
    finally:
        PROCS.stop_all()
        lab.down()
        shutil.rmtree(tmpdir, ignore_errors=True)


def part_cluster(o):
    res = {"part": "cluster", "sizes": []}
    for n in SIZES:
        log("cluster: %d hosts, 2 networks" % n)
        res["sizes"].append(measure(o, n))
    return res


def report_cluster(res):
    L = [mfacts(res), ""]
    L.append("`lab/ri2n-lab up 2 --hosts N --rate 1000` and a keyed `ri2n tunnel` daemon per host "
             "(every host a peer of every other); each host pings every other's tunnel address "
             "once; then the daemons rest for %d s. Per daemon: median (min–max) over the hosts:\n"
             % REST_S)
    L.append("| hosts | peers each | all connected after | pairs reached | threads | RSS, MiB "
             "| CPU at rest, % of a core | link packets/s at rest (in + out) |")
    L.append("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in res["sizes"]:
        L.append("| %d | %d | %.1f s | %d of %d | %s | %s | %s | %s |" % (
            r["hosts"], r["hosts"] - 1, r["connected_s"], r["reached"], r["pairs"],
            spread(r["threads"], "%.0f"), spread(r["rss_kib"], "%.1f", 1 / 1024),
            spread(r["cpu"], "%.2f", 100), spread(r["link_pps"], "%.0f")))
        if r["unreached"]:
            L.append("")
            L.append("Not reached (first 20): %s" % ", ".join(r["unreached"]))
    return "\n".join(L)
