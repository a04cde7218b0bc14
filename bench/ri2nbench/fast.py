"""Part 2b: unlimited-rate links, where CPU per byte decides; the piped 2 x 1 Gbit/s case."""
import os
import random
import re
import shutil
import tempfile

from . import common
from .common import (
    PROCS, TcpInfoSampler, ThreadSampler, fast_file, log, mfacts, run, spread, tcp_limit,
    timed_client, tool_json, udp_limit, wait_quiet, wait_ready)
from .labctl import new_lab


FAST_CONFIGS = [("2 links, MTU 1500", 2, 1500), ("2 links, MTU 9000", 2, 9000),
                ("4 links, MTU 1500", 4, 1500), ("4 links, MTU 9000", 4, 9000)]


def ri2n_transfer(lab, src, nbytes, pipe_in=None, pipe_out=None, timeout=120, key=None,
                  transport=None, threads=False, send_threads=None, recv_threads=None,
                  checksum=True):
    """`ri2n recv` on B, `ri2n send` on A of `src` (a file, or `pipe_in` feeding its stdin),
    both with `--key key`, `--transport transport`, `--send-threads send_threads` and
    `--recv-threads recv_threads` if given, and `--no-checksum` unless `checksum`;
    returns goodput, CPU of both
    processes and of the machine, and the sender's summary; with `threads`, also the busiest
    threads of each (ThreadSampler)."""
    port = 7300 + random.randrange(500)
    listen = sum((["--listen", "%s:%d" % (a, port)] for a in lab.b_addrs()), [])
    local = sum((["--local", a] for a in lab.a_addrs()), [])
    if key:
        # (both commands take it: `--key` goes with the addresses everywhere below)
        listen += ["--key", key]
        local += ["--key", key]
    if transport:
        listen += ["--transport", transport]
        local += ["--transport", transport]
    if not checksum:
        listen.append("--no-checksum")
        local.append("--no-checksum")
    for flag, value in (("--send-threads", send_threads), ("--recv-threads", recv_threads)):
        if value:
            listen += [flag, value]
            local += [flag, value]
    out_cmd = [common.RI2N, "recv", "-q", "--json", "-o", "/dev/null"] + listen
    if pipe_out:
        # the receiving application is another process: recv writes to a pipe into it
        # pipefail: the receiver's own failure is the run's, not hidden by the consumer's 0
        out_cmd = ["bash", "-c", "set -o pipefail; %s recv -q %s -o - | %s" % (
            common.RI2N, " ".join(listen), pipe_out)]
    recv = PROCS.start(lab.ex("b", *out_cmd))
    wait_ready(recv, "ri2n recv", 0.3)
    in_cmd = [common.RI2N, "send", "-q", "--json", "--to", "%s:%d" % (lab.b_addrs()[0], port)] + local
    if pipe_in:
        in_cmd = ["sh", "-c", "%s | %s send -q --json --to %s:%d %s" % (
            pipe_in, common.RI2N, lab.b_addrs()[0], port, " ".join(local))]
    else:
        in_cmd += ["-i", src]
    sampler = ThreadSampler() if threads else None
    if sampler:
        sampler.watch("recv", recv.pid)
    rc, scpu, machine, wall, text = timed_client(lab.ex("a", *in_cmd), timeout, sampler)
    rrc, rcpu = PROCS.wait_rusage(recv, 30)
    doc = tool_json(text)
    r = {"rc": rc, "recv_rc": rrc, "cpu_send": scpu, "cpu_recv": rcpu, "cpu_machine": machine,
         "wall_send": wall}
    if sampler:
        r["threads"] = {"send": sampler.top("send"), "recv": sampler.top("recv")}
    if rrc != 0:
        # the sender's figures stand only if the receiver, which checks what arrived, agrees
        r["error"] = common.receiver_failure(rrc)
    elif doc:
        r.update(bytes=doc["bytes"], seconds=doc["seconds"], bps=doc["goodput_bps"],
                 encryption=doc.get("encryption"),
                 datagram=[l.get("max_datagram") for l in doc["links"]],
                 shares=[l.get("share") for l in doc["links"]],
                 lost=sum(l.get("packets_lost") or 0 for l in doc["links"]),
                 send_limits=doc.get("send_limits"))
    return r


def iperf_transfer(lab, nbytes, mptcp, pipe_in=None, pipe_out=None, src=None, timeout=120,
                   to="10.77.1.2", sampler=None, parallel=1, tcp_info=False):
    """iperf3 of `nbytes` A→B over one TCP connection (to B's address `to`: link 1, or its
    tunnel address), `parallel` of them (the bytes in all), or MPTCP (every link); the sender
    reads file `src` if given (as `ri2n send -i` does), else sends from memory. A
    ThreadSampler given runs while the client does; with `tcp_info`, so does a TcpInfoSampler
    of A's connections (where `ss` is at hand): "tcp_info" in the result."""
    port = 5301 + random.randrange(500)
    wrap = ["mptcpize", "run"] if mptcp else []
    scmd = wrap + ["iperf3", "-s", "-1", "-p", port]
    if pipe_out:
        # the received data goes to fd 3, the pipe; iperf3's own output to /dev/null
        scmd = ["bash", "-c",
                "set -o pipefail; %s iperf3 -s -1 -p %d -F /dev/fd/3 3>&1 1>/dev/null | %s" % (
                    " ".join(wrap), port, pipe_out)]
    srv = PROCS.start(lab.ex("b", *scmd))
    wait_ready(srv, "iperf3 -s", 0.3)
    ccmd = wrap + ["iperf3", "-c", to, "-p", port, "-n", nbytes, "--json"]
    if src:
        ccmd += ["-F", src]
    if parallel > 1:
        ccmd += ["-P", parallel]
    if pipe_in:
        ccmd = ["sh", "-c", "%s | %s iperf3 -c %s -p %d -n %d -F /dev/stdin --json" % (
            pipe_in, " ".join(wrap), to, port, nbytes)]
    info = TcpInfoSampler(lab, "a", port, seconds=timeout) if tcp_info and shutil.which("ss") \
        else None
    if info:
        info.start()
    try:
        rc, ccpu, machine, wall, text = timed_client(lab.ex("a", *ccmd), timeout, sampler)
    finally:
        limits = info.stop() if info else None
    src_rc, scpu = PROCS.wait_rusage(srv, 30)
    r = {"rc": rc, "recv_rc": src_rc, "cpu_send": ccpu, "cpu_recv": scpu, "cpu_machine": machine,
         "wall_send": wall}
    if limits:
        r["tcp_info"] = limits
    if src_rc != 0:
        # as for ri2n: the client's figures stand only if the server that received them ended
        # well (one that hung was killed)
        r["error"] = common.receiver_failure(src_rc)
        return r
    try:
        doc = tool_json(text)
        e = doc["end"]["sum_received"]
        r.update(bytes=e["bytes"], seconds=e["seconds"], bps=e["bits_per_second"],
                 retransmits=doc["end"]["sum_sent"].get("retransmits"))
        # what the sending TCP saw (Linux): its round trip, and the largest windows, its own
        # and the one the receiver offered; a flow whose window over its round trip is its
        # rate is bound by the window, not by a CPU
        senders = [s["sender"] for s in doc["end"].get("streams", [])
                   if "mean_rtt" in s.get("sender", {})]
        if senders:
            r.update(rtt_us=sum(s["mean_rtt"] for s in senders) / len(senders),
                     max_snd_cwnd=max(s.get("max_snd_cwnd", 0) for s in senders),
                     max_snd_wnd=max(s.get("max_snd_wnd", 0) for s in senders))
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
    # as the table's runs: no checksum
    recv = PROCS.start(lab.ex("b", common.RI2N, "recv", "-q", "--no-checksum", "-o", "/dev/null",
                              *listen))
    wait_ready(recv, "ri2n recv", 0.3)
    try:
        run(["perf", "record", "-a", "-F", "999", "-o", data, "--"] +
            lab.ex("a", common.RI2N, "send", "-q", "--no-checksum", "--to",
                   "%s:%d" % (lab.b_addrs()[0], port), *local, "-i", src), timeout=120)
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


def warm_up(tools, transfer):
    """One discarded transfer of each tool on a fresh lab; returns their goodputs (Gbit/s)."""
    warmup = {}
    for k in tools:
        wait_quiet()
        warmup[k] = (transfer(k).get("bps") or 0) / 1e9
    log("  warm-up (discarded): %s" % ", ".join(
        "%s %.2f Gbit/s" % (k, v) for k, v in warmup.items()))
    return warmup


def part_fast(o):
    res = {"part": "fast", "configs": [], "bytes": o.fast_bytes}
    src = fast_file(o.fast_bytes)
    lab = new_lab(o.prefix)
    res["commands"] = {
        "lab": "lab/ri2n-lab up N --mtu MTU (no --rate: unlimited veth links)",
        "ri2n": "ri2n recv --no-checksum --listen 10.77.I.2:PORT … -o /dev/null; ri2n send "
                "--no-checksum --to 10.77.1.2:PORT --local 10.77.I.1 … -i FILE (no checksum, "
                "as iperf3 verifies nothing; part tcp measures its cost)",
        "tcp": "iperf3 -s -1; iperf3 -c 10.77.1.2 -n BYTES -F FILE (one connection, link 1; "
               "reads the same file as ri2n send)",
        "mptcp": "mptcpize run iperf3 … -F FILE (a subflow per link)",
        "piped": "sender: cat FILE | ri2n send …; receiver: ri2n recv -o - | b2sum "
                 "(iperf3: -F /dev/stdin; -F /dev/fd/3 3>&1 | b2sum)",
        "cpu": "machine busy time from /proc/stat during the transfer, per GB moved",
    }
    for name, n, mtu in FAST_CONFIGS:
        log("fast: %s" % name)
        lab.up([0] * n, mtu=mtu)
        c = {"name": name, "links": n, "mtu": mtu, "mptcp": lab.mptcp_setup(), "runs": []}
        tools = ["ri2n", "tcp", "mptcp"]

        def transfer(k):
            if k == "ri2n":
                return ri2n_transfer(lab, src, o.fast_bytes, checksum=False)
            return iperf_transfer(lab, o.fast_bytes, mptcp=(k == "mptcp"), src=src)

        # One discarded transfer per tool first: the part's first transfer, right after it
        # wrote its file, ran slow, and in the rotation below it was always ri2n's.
        c["warmup"] = warm_up(tools, transfer)
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
    # the receiving application hashes what it reads: b2sum, fast enough to keep up with
    # 2 Gbit/s while taking a good part of a CPU (sha256sum is too slow for it)
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
             "forwarding on any thread) per GB moved. ri2n with `--no-checksum` (iperf3 verifies "
             "nothing).\n" % (gb, len(res["configs"][0]["runs"])))
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
                 "`b2sum`; %.2f GB per run, %d runs:\n" % (res.get("options", {}).get("piped_bytes", 0) / 1e9, len(runs)))
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
    bad = [(c["name"], r["rep"], k, common.exits(r[k]), r[k].get("error"))
           for c in res["configs"] + ([res["piped"]] if res.get("piped") else [])
           for r in c["runs"] for k in ("ri2n", "tcp", "mptcp") if k in r and common.failed(r[k])]
    if bad:
        L.append("")
        L.append("Runs that failed (configuration, run, tool, exit code: the sender's, then the receiver's where known): %s." % bad)
    return "\n".join(L)
