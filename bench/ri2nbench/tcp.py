"""Part 10: the TCP transport (`--transport tcp`) beside the UDP transport, one TCP connection
and MPTCP; and MuniSocket's own figure, message bandwidth against one TCP connection."""
import json
import os
import random
import shutil

from . import common
from .common import PROCS, fast_file, log, mfacts, run, spread, timed_client, wait_quiet, wait_ready
from .fast import iperf_transfer, rate_cpu_cell, ri2n_transfer, warm_up
from .labctl import new_lab

# ri2n runs with --no-checksum, as iperf3 verifies nothing; "ri2n-tcp-sum" keeps the CLI's
# checksum, to show what it costs
TOOLS = ["ri2n-tcp", "ri2n-tcp-sum", "ri2n-tcp-keyed", "ri2n-udp", "tcp", "mptcp"]
MESSAGE_SIZES = [8 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 2 << 20, 8 << 20]
# (size, bytes per write): messages also written in pieces, as an application that fills a
# smaller buffer at a time sends them
MESSAGE_PIECES = [(2 << 20, 64 << 10)]
MESSAGE_TOOLS = ["ri2n-tcp", "ri2n-udp", "tcp"]


def message_ratio(m, k):
    """Run by run, tool `k`'s message bandwidth over one TCP connection's."""
    return [a / b for a, b in zip(m.get(k, []), m["tcp"]) if a and b]


def size_label(size):
    return "%d KiB" % (size >> 10) if size < 1 << 20 else "%d MiB" % (size >> 20)


def message_label(m):
    """A row's message: its size, and the size of its writes when it was written in pieces."""
    piece = m.get("piece", m["size"])
    if piece == m["size"]:
        return size_label(m["size"])
    return "%s in %s writes" % (size_label(m["size"]), size_label(piece))


def msgbw_binary():
    """examples/msgbw beside the ri2n binary the run was given. Where cargo is at hand and that
    binary is in a cargo build's profile directory (dist, release, debug), the example is built
    there first, with that profile: the figures then come from the same build as the binary's."""
    out = os.path.dirname(os.path.abspath(common.RI2N_SOURCE))
    profile = {"dist": "dist", "release": "release", "debug": "dev"}.get(os.path.basename(out))
    if shutil.which("cargo") and profile:
        run(["cargo", "build", "--profile", profile, "--target-dir", os.path.dirname(out), "-q",
             "-p", "ri2n", "--example", "msgbw"], timeout=900)
    return os.path.join(out, "examples", "msgbw")


def message_run(lab, msgbw, kind, size, count, piece):
    """One client of `msgbw` A→B (`kind`: ri2n-tcp or ri2n-udp over both links, tcp over
    link 1), each message in writes of `piece` bytes."""
    port = 7600 + random.randrange(300)
    if kind == "tcp":
        listen, to, locals_ = ["10.77.1.2:%d" % port], "10.77.1.2:%d" % port, []
    else:
        listen = ["%s:%d" % (a, port) for a in lab.b_addrs()]
        to, locals_ = listen[0], ["%s:0" % a for a in lab.a_addrs()]
    srv = PROCS.start(lab.ex("b", msgbw, "server", kind, *listen), stderr=None)
    wait_ready(srv, "msgbw server", 0.3)
    rc, _, _, _, text = timed_client(
        lab.ex("a", msgbw, "client", kind, to, *locals_, "--", size, count, piece), 120)
    PROCS.wait_rusage(srv, 30)
    try:
        return json.loads(text.strip().splitlines()[-1])["bps"] if rc == 0 else None
    except (ValueError, KeyError, IndexError):
        return None


def part_tcp(o):
    """Bulk transfers on 2 x 1 Gbit/s (tbf) and unlimited 2-link veth links; then message
    bandwidth for 8 KiB to 8 MiB messages on 2 x 1 Gbit/s."""
    res = {"part": "tcp", "bytes": o.fast_bytes, "configs": [], "messages": []}
    res["commands"] = {
        "ri2n": "ri2n recv --no-checksum --transport tcp|udp --listen 10.77.I.2:PORT … "
                "-o /dev/null; ri2n send --no-checksum --transport tcp|udp --to 10.77.1.2:PORT "
                "--local 10.77.I.1 … -i FILE (\"checksummed\": without --no-checksum)",
        "tcp": "iperf3 -c 10.77.1.2 -n BYTES -F FILE (one connection, link 1)",
        "mptcp": "mptcpize run iperf3 … -F FILE (a subflow per link)",
        "messages": "examples/msgbw server|client ri2n-tcp|ri2n-udp|tcp … -- SIZE COUNT [PIECE]: one "
                    "message (in one write, or in writes of PIECE bytes), a 1-byte answer, the next "
                    "message (MuniSocket's effective bandwidth)",
    }
    msgbw = msgbw_binary()
    keyfile = common.key_file()
    src = fast_file(o.fast_bytes)
    lab = new_lab(o.prefix)
    for name, rates in (("2 × 1 Gbit/s (tbf)", [1000, 1000]), ("2 links, unlimited, MTU 1500", None)):
        log("tcp: %s" % name)
        lab.up(rates or [0, 0], mtu=None if rates else 1500)
        c = {"name": name, "rates_mbit": rates, "mptcp": lab.mptcp_setup(), "runs": []}

        def transfer(k):
            if k == "ri2n-tcp-keyed":
                return ri2n_transfer(lab, src, o.fast_bytes, transport="tcp", key=keyfile,
                                     checksum=False)
            if k.startswith("ri2n"):
                return ri2n_transfer(lab, src, o.fast_bytes, transport=k.split("-")[1],
                                     checksum=k.endswith("-sum"))
            return iperf_transfer(lab, o.fast_bytes, mptcp=(k == "mptcp"), src=src)

        c["warmup"] = warm_up(TOOLS, transfer)
        for rep in range(o.reps):
            row = {"rep": rep}
            for k in TOOLS[rep % len(TOOLS):] + TOOLS[:rep % len(TOOLS)]:
                row["busy_before_" + k] = wait_quiet()
                row[k] = transfer(k)
            log("  rep %d: %s" % (rep, ", ".join(
                "%s %.2f Gbit/s %.2f CPU-s/GB" % (k, (row[k].get("bps") or 0) / 1e9,
                                                  row[k]["cpu_machine"] / (o.fast_bytes / 1e9))
                for k in TOOLS)))
            c["runs"].append(row)
        res["configs"].append(c)
    log("tcp: messages on 2 x 1 Gbit/s")
    lab.up([1000, 1000])
    for size, piece in [(s, s) for s in MESSAGE_SIZES] + MESSAGE_PIECES:
        # about 0.5 s of one link per run, at least 20 messages
        count = max(20, int(60e6 / size))
        m = {"size": size, "piece": piece, "count": count, **{k: [] for k in MESSAGE_TOOLS}}
        for rep in range(o.reps):
            for k in MESSAGE_TOOLS[rep % 3:] + MESSAGE_TOOLS[:rep % 3]:
                wait_quiet()
                m[k].append(message_run(lab, msgbw, k, size, count, piece))
        log("  %s: %s Mbit/s; ratios to tcp %s" % (message_label(m), ", ".join(
            "%s %s" % (k, spread([x / 1e6 for x in m[k] if x], "%.0f")) for k in MESSAGE_TOOLS),
            ", ".join(spread(message_ratio(m, k), "%.2f") for k in MESSAGE_TOOLS[:2])))
        res["messages"].append(m)
    lab.down()
    return res


def cpu_ratios(runs, k):
    """Per run, tool k's machine CPU per GB over one TCP connection's."""
    return [(r[k]["cpu_machine"] / r[k]["bytes"]) / (r["tcp"]["cpu_machine"] / r["tcp"]["bytes"])
            for r in runs if r.get(k, {}).get("bytes") and r["tcp"].get("bytes")]


def report_tcp(res):
    L = [mfacts(res), ""]
    gb = res["bytes"] / 1e9
    n = len(res["configs"][0]["runs"]) if res["configs"] else 0
    L.append("%.2f GB A→B per run, each tool in turn, median (min–max) of %d runs; CPU: the "
             "whole machine's busy time during the transfer per GB. ri2n with `--no-checksum` "
             "(iperf3 verifies nothing), except \"checksummed\".\n" % (gb, n))
    L.append("| links | ri2n, TCP transport | same, checksummed | same, keyed | ri2n, UDP transport | one TCP connection | MPTCP | TCP transport / MPTCP | its CPU per GB / TCP's (checksummed) | keyed / not |")
    L.append("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for c in res["configs"]:
        runs = c["runs"]
        ratio = [r["ri2n-tcp"]["bps"] / r["mptcp"]["bps"] for r in runs
                 if r["ri2n-tcp"].get("bps") and r["mptcp"].get("bps")]
        keyed = [r["ri2n-tcp-keyed"]["bps"] / r["ri2n-tcp"]["bps"] for r in runs
                 if r.get("ri2n-tcp-keyed", {}).get("bps") and r["ri2n-tcp"].get("bps")]
        L.append("| %s | %s | %s | %s | %s | %s | %s | **%s** | **%s** (%s) | **%s** |" % (
            c["name"], *(rate_cpu_cell(runs, k, "Mbit/s") for k in TOOLS),
            spread(ratio, "%.2f"), spread(cpu_ratios(runs, "ri2n-tcp"), "%.2f"),
            spread(cpu_ratios(runs, "ri2n-tcp-sum"), "%.2f"), spread(keyed, "%.2f")))
    L.append("")
    L.append("CPU per GB ÷ one TCP connection's, per run, UDP transport: %s." % "; ".join(
        "%s %s" % (c["name"], spread(cpu_ratios(c["runs"], "ri2n-udp"), "%.2f"))
        for c in res["configs"]))
    if res.get("messages"):
        L.append("")
        L.append("Message bandwidth on 2 × 1 Gbit/s (`%s`), Mbit/s, median (min–max):\n"
                 % res["commands"]["messages"])
        L.append("| message | ri2n, TCP transport, 2 links | ri2n, UDP transport, 2 links | "
                 "one TCP connection, 1 link | TCP transport / TCP | UDP transport / TCP |")
        L.append("| --- | --- | --- | --- | --- | --- |")
        for m in res["messages"]:
            label = message_label(m)
            cells = [spread([x / 1e6 for x in m.get(k, []) if x], "%.0f") for k in MESSAGE_TOOLS]
            L.append("| %s | %s | %s | %s | **%s** | %s |" % (
                label, *cells, spread(message_ratio(m, "ri2n-tcp"), "%.2f"),
                spread(message_ratio(m, "ri2n-udp"), "%.2f")))
    bad = [(c["name"], r["rep"], k, common.exits(r[k])) for c in res["configs"] for r in c["runs"]
           for k in TOOLS if k in r and common.failed(r[k])]
    if bad:
        L.append("")
        L.append("Runs that failed (configuration, run, tool, exit code: the sender's, then the receiver's where known): %s." % bad)
    return "\n".join(L)
