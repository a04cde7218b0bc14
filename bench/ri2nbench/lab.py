"""Part 2: lab throughput on rate-limited links, ri2n against one TCP connection and MPTCP."""
import re
import threading

from .common import (
    PROCS, busy_line, log, mfacts, odd_summary, per_run, proc_comm, run_json, spread, tcp_limit,
    udp_limit, wait_quiet)
from .labctl import new_lab, ri2n_lab_client, ss_snapshot, start_lab_servers


TOPOLOGIES = [("2 × 1 Gbit/s", [1000, 1000]), ("4 × 500 Mbit/s", [500] * 4),
              ("1 Gbit/s + 200 Mbit/s", [1000, 200])]


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
        sf = [",".join(map(str, r["mptcp"].get("ss_subflows") or [])) or "none" for r in runs]
        joins = [str(r["mptcp"]["mptcp_counters"].get("MPJoinSynAckRx", 0)) for r in runs]
        rs = ["/".join("%.2f" % x for x in r["ri2n"]["shares"]) for r in runs
              if r["ri2n"].get("shares")]

        def cpu(k):
            return spread([(r[k]["cpu_client"] or 0) + (r[k]["cpu_server"] or 0) for r in runs
                           if r[k].get("cpu_client") is not None
                           and r[k].get("cpu_server") is not None], "%.1f")
        notes.append("- %s: MPTCP subflows %s, MPJoinSynAckRx %s; ri2n's shares %s; CPU-s: "
                     "ri2n %s, TCP %s, MPTCP %s." % (
                         t["name"], per_run(sf), per_run(joins), per_run(rs), cpu("ri2n"),
                         cpu("tcp"), cpu("mptcp")))
    L.append("")
    L.append("Per topology: MPTCP's joined subflows per socket at mid-run (`ss -Mni` "
             "`subflows:`, besides the first) and its MPJoinSynAckRx per run (iperf3 opens 2 "
             "MPTCP connections, control and data); ri2n's per-link shares of the stream; CPU "
             "seconds per %s s run of the client and server processes (without the kernel's "
             "softirq work on other threads):" % res["options"]["time"])
    L += notes
    rows = [r[k] for t in res["topologies"] for r in t["runs"] for k in ("ri2n", "tcp", "mptcp")]
    L.append("")
    L.append(busy_line(rows))
    L += odd_summary([("%s, run %d" % (t["name"], r["rep"]), r["ri2n"].get("events"))
                      for t in res["topologies"] for r in t["runs"]])
    return "\n".join(L)
