"""Part 1: loopback ping-pong and throughput against sockperf and iperf3, several clients on one server."""
import json
import os
import tempfile
import time

from . import common
from .common import (
    PROCS, busy_line, free_port, log, med, mfacts, odd_summary, proc_comm, proc_cpu, run_json,
    sockperf_pp, spread, thread_cpu, wait_quiet, wait_ready)


MULTI_SECONDS = 5


def multi_clients(server_pid, port, n, reverse):
    """`n` `ri2n bench` clients started at once against the server: their aggregate goodput
    and the server's CPU (cores: CPU seconds per second of the clients' run) per thread."""
    cmd = [common.RI2N, "bench", "--to", "127.0.0.1:%d" % port, "--time", MULTI_SECONDS, "--json"]
    cmd += ["-R"] if reverse else []
    outs = [tempfile.TemporaryFile("w+") for _ in range(n)]
    try:
        t0, p0, w0 = thread_cpu(server_pid), proc_cpu(server_pid), time.monotonic()
        ps = [PROCS.start(cmd, stdout=f) for f in outs]
        rcs = [PROCS.wait_rusage(p, MULTI_SECONDS + 60)[0] for p in ps]
        wall = time.monotonic() - w0
        t1, p1 = thread_cpu(server_pid), proc_cpu(server_pid)
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
            # the whole process's: the per-thread figures miss threads that ended meanwhile
            "server_cores": (p1 - p0) / wall,
            "driver_cores": sum(v for t, v in cores.items() if t.startswith("ri2n-driver")),
            "threads": {t: round(v, 3) for t, v in cores.items() if v >= 0.01}}


def part_loopback(o):
    res = {"part": "loopback", "runs_latency": [], "runs_throughput": []}
    pr, pu, pt, pi = free_port(), free_port(), free_port(), free_port()
    serve = PROCS.start([common.RI2N, "serve", "--listen", "127.0.0.1:%d" % pr, "--listen",
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
                    [common.RI2N, "bench", "--to", "127.0.0.1:%d" % pr] + one + ["--latency", "--size", 64,
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
    # a cross-CPU wake-up is dear on a VM and makes the unpinned figures depend on where
    # the scheduler put each process. Separate servers, pinned like their clients.
    res["runs_pinned"] = []
    if (os.cpu_count() or 1) >= 1 and o.pinned_reps > 0:
        prp, pup = free_port(), free_port()
        pserve = PROCS.start(["taskset", "-c", "0", common.RI2N, "serve", "--listen", "127.0.0.1:%d" % prp,
                              "--listen", "127.0.0.2:%d" % prp, "-q"])
        pspu = PROCS.start(["taskset", "-c", "0", "sockperf", "server", "-i", "127.0.0.1", "-p", pup])
        wait_ready(pserve, "pinned ri2n serve", 0.3)
        wait_ready(pspu, "pinned sockperf", 0.1)
        for rep in range(o.pinned_reps):
            row = {"rep": rep, "busy_before": wait_quiet()}
            doc, rc, _, _, _, err = run_json(
                ["taskset", "-c", "0", common.RI2N, "bench", "--to", "127.0.0.1:%d" % prp, "--latency",
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
                    [common.RI2N, "bench", "--to", "127.0.0.1:%d" % pr, "--time", o.time, "--json"],
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


def report_loopback(res):
    L = [mfacts(res), ""]
    lat = res["runs_latency"]
    L.append("**(a) 64-byte ping-pong, round-trip time (RTT) in µs** — every figure is a full round "
             "trip (sockperf with `--full-rtt`; its default would print RTT/2), median of the "
             "runs' medians (min–max over %d runs of %s round trips each for ri2n, %d s each "
             "for sockperf), all four measured in turn in each run:\n" % (
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
        "not measured" if rm is None else "met" if rm <= 1.3 else "MISSED"))
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
    L.append(busy_line(lat + pin + thr + multi))
    L.append("")
    L += odd_summary([("latency run %d, 2 links" % r["rep"], r.get("ri2n_events")) for r in lat] +
                     [("latency run %d, 1 link" % r["rep"], r.get("ri2n1_events")) for r in lat] +
                     [("throughput run %d" % r["rep"], r["ri2n"].get("events")) for r in thr])
    return "\n".join(L)
