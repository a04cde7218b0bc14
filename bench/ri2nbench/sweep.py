"""Part 4: ping-pong over message sizes in the lab, with alpha/beta/n-half fits."""
import time

from .common import (
    PROCS, busy_line, fit, log, mfacts, odd_summary, run_json, sockperf_pp, spread, udp_limit,
    wait_quiet, wait_ready)
from .labctl import new_lab, ri2n_lab_client, start_lab_servers


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
            # the smallest size's own figure: none if that one failed
            h0.append(pts[0][1] if pts and pts[0][0] == sizes[0] else None)
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
        shares.append(" / ".join("%.1f" % (lt[d] / 1e6) for d in sorted(lt)))
    L.append("")
    L.append("MPTCP sweep, MB sent by A on each link (eth1 / eth2 …), per run: %s." % "; ".join(shares))
    L.append("")
    L.append(busy_line(runs))
    L.append("")
    L += odd_summary([("sweep run %d" % r["rep"], r["ri2n"].get("events")) for r in runs])
    bad = [(k, x["size"], x.get("rc")) for r in runs for k, _ in tools if k != "ri2n"
           for x in r[k]["results"] if x.get("error")]
    if bad:
        L.append("sockperf runs without a result: %s." % bad)
    return "\n".join(L)
