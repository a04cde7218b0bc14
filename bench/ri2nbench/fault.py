"""Part 3: the fault timeline (RI2N/UDP Figure 4) and all-links outages, ri2n (UDP and TCP
transports) against MPTCP."""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

from . import common
from .common import (
    FLOW, PLOT, PROCS, busy_line, fmt_ms, log, mfacts, run, spread, tcp_limit, tool_json,
    udp_limit, wait_quiet, wait_ready)
from .labctl import (
    do_events, new_lab, place_events, ri2n_lab_client, ss_snapshot, start_lab_servers)
from .analysis import BIN, analyse, flow_series, uniform_series


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
# the tools timed, in the order a run takes them: ri2n A->B, B->A, the TCP transport A->B, MPTCP
TOOLS = ["ri2n", "ri2n-rev", "ri2n-tcp", "mptcp"]
TOOL_NAMES = {"ri2n": "ri2n A→B", "ri2n-rev": "ri2n B→A", "ri2n-tcp": "ri2n TCP transport A→B",
              "mptcp": "MPTCP"}


def link_cap(res, tool):
    """The payload limit of one link for `tool`: TCP's for MPTCP and the TCP transport."""
    caps = res["per_link_cap"]
    return caps.get(tool, caps["mptcp" if tool == "mptcp" else "ri2n"])


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


def ri2n_fault_run(lab, scenario, reverse=False, tcp=False):
    """One ri2n bench run of `scenario`: A sends (timeline of acknowledged bytes) or, with
    `reverse`, B sends and A's timeline counts the bytes it read (a receiver-side meter);
    `tcp`: A sends over the TCP transport (to the server on port 7001)."""
    seconds, events = SCENARIOS[scenario]
    lines = []
    extra = ["--reverse"] if reverse else []
    if tcp:
        extra += ["--transport", "tcp"]
    cmd = ri2n_lab_client(lab, "--time", seconds, "--interval", BIN, "--json", *extra,
                          to="10.77.1.2:%d" % (7001 if tcp else 7000))
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
    doc = tool_json(text)
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
    return {"tool": "ri2n-tcp" if tcp else "ri2n-rev" if reverse else "ri2n",
            "scenario": scenario, "rc": rc,
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
            txt = run(lab.ex("a", "ss", "-tni", "dst", "10.77.1.2"), check=False, timeout=5)
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
    doc = tool_json(text)
    place_events(ev_log, t0)
    sj = (doc or {}).get("server_output_json") or {}
    src = "server (receiver)" if sj.get("intervals") else "client (sender)"
    ivs = sj.get("intervals") or (doc or {}).get("intervals") or []
    series = [(iv["sum"]["start"], iv["sum"]["end"], iv["sum"]["bits_per_second"]) for iv in ivs]
    r = {"tool": "iperf3-mptcp-0.1s", "scenario": scenario, "rc": rc, "source": src,
         "events": ev_log, "intervals": series}
    r["analysis"] = iperf3_analysis(r, seconds)
    return r


def iperf3_analysis(r, seconds):
    """The failover analysis of an iperf3 run, from its 0.1 s intervals."""
    nb = int(seconds / 0.1) + 1
    ser = [0.0] * nb
    for a, b, v in r["intervals"]:
        k = int(round(a / 0.1))
        if 0 <= k < nb:
            ser[k] = v
    return analyse(ser, r["events"], seconds, tcp_limit(1000), 0.1)


def reanalyse(res):
    """Every run's failover and recovery times made again from its stored goodput and events,
    so that the published figures follow the rule of analysis.py in force, not the one of the
    day they were measured."""
    for r in res["runs"]:
        seconds = res["scenarios"][r["scenario"]][0]
        r["analysis"] = analyse(r["series_bps"], r["events"], seconds, link_cap(res, r["tool"]))
    ic = res.get("iperf3_check")
    if ic:
        ic["analysis"] = iperf3_analysis(ic, res["scenarios"][ic["scenario"]][0])


def part_fault(o):
    res = {"part": "fault", "runs": [], "scenarios": {k: v for k, v in SCENARIOS.items()},
           "per_link_cap": {"ri2n": udp_limit(1000), "ri2n-tcp": tcp_limit(1000),
                            "mptcp": tcp_limit(1000)}}
    tools = o.fault_tools.split(",") if o.fault_tools else TOOLS
    unknown = [t for t in tools if t not in TOOLS]
    if unknown:
        raise SystemExit("fault: unknown tool(s) %s (of %s)" % (", ".join(unknown), ", ".join(TOOLS)))
    lab = new_lab(o.prefix)
    lab.up([1000, 1000])
    res["mptcp"] = lab.mptcp_setup()
    srv = start_lab_servers(lab, ri2n="ri2n" in tools or "ri2n-rev" in tools, iperf=False,
                            mptcp_iperf=False, ri2n_tcp="ri2n-tcp" in tools)
    scenarios = ["main", "outage1", "outage10", "outage60", "cable_a", "cable_b"]
    if o.long_outage:
        scenarios.append("outage300")
    if o.scenarios:
        scenarios = o.scenarios.split(",")
    res["scenario_order"] = scenarios
    for scenario in scenarios:
        # the 5-minute outage once per tool; the Figure-4 scenario is ri2n's take-back soak
        reps = 1 if scenario == "outage300" else o.reps
        runs_of = {t: reps for t in tools}
        if scenario == "main" and "ri2n" in tools:
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
                r = ri2n_fault_run(lab, scenario, reverse=tool == "ri2n-rev",
                                   tcp=tool == "ri2n-tcp")
            else:
                r = mptcp_fault_run(lab, scenario)
            lab.heal("all")
            time.sleep(1.0)
            r["rep"] = rep
            r["busy_before"] = busy
            cap = link_cap(res, tool)
            r["analysis"] = analyse(r["series_bps"], r["events"], SCENARIOS[scenario][0], cap)
            log("   " + "; ".join("%s%d@%.2f: %s" % (
                m["action"], m["link"], m["t_bench"],
                "n/a" if m.get("time_to_90", "x") == "x" else (
                    "never" if m["time_to_90"] is None else "%.0f ms" % (m["time_to_90"] * 1000)))
                for m in r["analysis"]["events"]))
            res["runs"].append(r)
        if scenario == "main" and not o.no_iperf_check and "mptcp" in tools:
            log("fault: main, iperf3 over MPTCP at 0.1 s")
            r = iperf3_fault_run(lab, "main")
            lab.heal("all")
            time.sleep(1.0)
            res["iperf3_check"] = r
    for p in srv.values():
        PROCS.stop(p)
    lab.down()
    if o.fault_tools:
        keep_earlier_runs(res, common.load("fault"), tools)
    return res


def keep_earlier_runs(res, earlier, tools):
    """A run of some tools only (`--fault-tools`) replaces their runs in the stored results and
    keeps the other tools' runs from `earlier`, with where and when those were measured
    (`earlier_runs`: each tool kept and the block header of the run it comes from)."""
    if not earlier:
        return
    kept = [r for r in earlier["runs"] if r["tool"] not in tools]
    if not kept:
        return
    from_before = {}
    for e in earlier.get("earlier_runs", []):
        for t in e["tools"]:
            from_before[t] = e["facts"]
    facts = common.mfacts(earlier)
    by_facts = {}
    for t in sorted({r["tool"] for r in kept}):
        by_facts.setdefault(from_before.get(t, facts), []).append(t)
    res["earlier_runs"] = [{"tools": ts, "facts": f} for f, ts in by_facts.items()]
    res["runs"] = kept + res["runs"]
    if "iperf3_check" in earlier and "mptcp" not in tools:
        res["iperf3_check"] = earlier["iperf3_check"]


def mb_per_link(tx):
    return " / ".join("%s %.1f" % (d, tx[d] / 1e6) for d in sorted(tx))


def event_of(r, idx):
    """The analysis of event `idx` of run `r`, or None where the run ended before it (its tool
    died mid-scenario: the run is listed among those that did not exit 0)."""
    evs = r["analysis"]["events"]
    return evs[idx] if -len(evs) <= idx < len(evs) else None


def link_events(L, runs, transport):
    """Lines on when `transport` ("ri2n": the UDP transport, both directions, or "ri2n-tcp")
    declared link 1 down and took it back, from its own `events`."""
    det, back = [], []
    for r in runs:
        if r["tool"] not in (transport, transport + "-rev") or not r.get("events_ri2n"):
            continue
        evs = r["events_ri2n"]
        f = next((e for e in r["events"] if e["action"] == "fault" and e["link"] == 1), None)
        h = next((e for e in r["events"] if e["action"] == "heal" and e["link"] == 1), None)
        if f is None:
            continue
        d = [x["t"] for x in evs if x["link"] == 0 and x["t"] >= f["t_bench"] - 0.01
             and ("-> down" in x["event"] or "-> degraded" in x["event"])]
        if d and r["scenario"] == "main":
            det.append(d[0] - f["t_bench"])
        if h is None:
            continue
        u = [x["t"] for x in evs if x["link"] == 0 and x["t"] >= h["t_bench"] - 0.01 and x["event"].endswith("-> up")]
        if u:
            back.append((r["scenario"], u[0] - h["t_bench"]))
    who = "ri2n" if transport == "ri2n" else "The TCP transport"
    if det:
        L.append("- %s declared link 1 degraded/down %s ms after its switch died (its own "
                 "`events`, main scenario)." % (who, spread(det, "%.0f", 1000)))
    took = []
    for sc, name in (("main", "after 2 s with no link (main, t=6 s)"), ("outage1", "after 1 s"),
                     ("outage10", "after 10 s"), ("outage60", "after 60 s"),
                     ("outage300", "after 5 minutes"), ("cable_a", "its cable back in host A"),
                     ("cable_b", "in host B")):
        v = [b for s_, b in back if s_ == sc]
        if v:
            took.append("%s %s" % (name, spread(v, "%.0f", 1000)))
    if took:
        L.append("- %s took link 1 back up (its own `events`) this many ms after it healed: %s."
                 % (who, "; ".join(took)))


def report_fault(res):
    reanalyse(res)
    L = [mfacts(res), ""]
    for e in res.get("earlier_runs", []):
        L += ["The runs of %s are kept from an earlier run of this part: %s" % (
            ", ".join(TOOL_NAMES.get(t, t) for t in e["tools"]), e["facts"]), ""]
    runs = res["runs"]

    def metric(tool, scen, idx, key):
        vals = []
        for r in runs:
            ev = event_of(r, idx) if r["tool"] == tool and r["scenario"] == scen else None
            if ev is not None:
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
    tcp_note = ("; ri2n TCP transport A→B: `bench --transport tcp` against `serve --transport "
                "tcp`, B counts the bytes it read (a receiver-side meter), its target TCP's "
                "payload limit, as MPTCP's" if any(r["tool"] == "ri2n-tcp" for r in runs) else "")
    L.append("Recovery (\"time to 90 %%\" after the heal) and failover. ri2n A→B: A sends, %s; "
             "ri2n B→A: `bench --reverse`, A counts the bytes it read (a receiver-side meter)%s; "
             "MPTCP: receiver-side meter.\n" % (a2b, tcp_note))
    tools = [t for t in TOOLS if any(r["tool"] == t for r in runs)]
    stalls = [t for t in tools if t != "ri2n-rev"]
    L.append("| scenario, event | %s | %s |" % (
        " | ".join(TOOL_NAMES[t] for t in tools),
        " | ".join("%s: longest stall" % TOOL_NAMES[t] for t in stalls)))
    L.append("|" + " --- |" * (1 + len(tools) + len(stalls)))
    rows = [("main", 0, "Fig. 4, t=2 s: link 1's switch dies (failover gap, target: link 2)")]
    rows += RECOVERY_EVENTS
    worst = {"ri2n": [], "ri2n-tcp": []}
    for scen, idx, name in rows:
        if not any(r["scenario"] == scen for r in runs):
            continue
        L.append("| %s | %s | %s |" % (
            name, " | ".join(cell(metric(t, scen, idx, "time_to_90")) for t in tools),
            " | ".join(cell(metric(t, scen, idx, "stall")) for t in stalls)))
        if idx > 0 or scen != "main":
            worst["ri2n"] += [v for t in ("ri2n", "ri2n-rev") for v in metric(t, scen, idx, "time_to_90")]
            worst["ri2n-tcp"] += metric("ri2n-tcp", scen, idx, "time_to_90")
    L.append("")
    for key, what in (("ri2n", "ri2n recovery, every heal of every run of every scenario above "
                               "(both directions)"),
                      ("ri2n-tcp", "The TCP transport's recovery, every heal of every run of "
                                   "every scenario above")):
        w = worst[key]
        if w:
            slow = [v for v in w if v is None or v > 0.2]
            # a run of the main scenario heals twice: these are heals, not runs
            L.append("- %s: %d heals, slowest %s; %d above 200 ms or never." % (
                what, len(w), "never" if None in w else "%.0f ms" % (max(w) * 1000), len(slow)))
    # after a total outage: how soon data flows again at all (first 10 ms bin above 10 % of one
    # link), besides the 90 % rule, which also waits for the link's window to open up
    def first_data(r, idx):
        if idx >= len(r["events"]):
            return None
        e = r["events"][idx]
        cap = link_cap(res, r["tool"])
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
                for t in tools)))
    if fd_rows:
        L.append("")
        L.append("Data flowing again after a total outage (first 10 ms bin above 10 % of one "
                 "link's capacity), ms:\n")
        L.append("| scenario | %s |" % " | ".join(TOOL_NAMES[t] for t in tools))
        L.append("|" + " --- |" * (1 + len(tools)))
        L += fd_rows
        L.append("")
    soak = [r for r in runs if r["tool"] == "ri2n" and r["scenario"] == "main"]
    if soak:
        # a run that ended before a heal did not take that link back either
        missed = [r["rep"] for r in soak
                  if any((event_of(r, i) or {}).get("time_to_90") is None for i in (2, 3))]
        L.append("- Figure-4 take-back soak: %d ri2n runs; a healed link not taken back (90 %% "
                 "not reached before the next event or the end) in %d%s." % (
                     len(soak), len(missed), " (runs %s)" % missed if missed else ""))
    dips = {t: [event_of(r, 0).get("min_bin_200ms") for r in runs
                if r["tool"] == t and r["scenario"] == "main" and event_of(r, 0)]
            for t in ("ri2n", "mptcp")}
    L.append("- Lowest 10 ms goodput in the 200 ms after link 1's switch died (t=2 s, main): "
             "ri2n %s Mbit/s, MPTCP %s Mbit/s." % (spread(dips["ri2n"], "%.0f", 1e-6),
                                                   spread(dips["mptcp"], "%.0f", 1e-6)))
    for transport in ("ri2n", "ri2n-tcp"):
        link_events(L, runs, transport)
    for tool in ("ri2n", "ri2n-tcp", "mptcp"):
        ss = [r["analysis"]["steady_bps"] for r in runs if r["tool"] == tool and r["scenario"] == "main"]
        tg = [event_of(r, 3).get("target_bps") for r in runs
              if r["tool"] == tool and r["scenario"] == "main" and event_of(r, 3)]
        if ss:
            L.append("- %s: two-link goodput before the first fault %s Mbit/s (capacity %.0f); "
                     "the two-link recovery target was %s Mbit/s." % (
                         TOOL_NAMES[tool].replace(" A→B", ""), spread(ss, "%.0f", 1e-6),
                         2 * link_cap(res, tool) / 1e6, spread(tg, "%.0f", 1e-6)))
    mp = [r for r in runs if r["tool"] == "mptcp"]
    if mp:
        L.append("- MPTCP really ran (TCP_IS_MPTCP on both ends: %s); `subflows:` (joined subflows "
                 "besides the first) at t=1 s (`ss -Mni` in A): %s; MB sent by A on each link in a main-scenario run: %s." % (
                     ", ".join(sorted(set("%s/%s" % (r["mptcp_send"], r["mptcp_recv"]) for r in mp))),
                     ", ".join(sorted(set(str(r["ss_subflows_at_1s"]) for r in mp))),
                     next((mb_per_link(r["link_tx_bytes"]) for r in mp
                           if r["scenario"] == "main"), "n/a")))
    nojoin = ["%s run %d (MB sent by A per link %s)" % (r["scenario"], r["rep"],
                                                      mb_per_link(r["link_tx_bytes"]))
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
    errs = [(r["tool"], r["scenario"], r["rep"], r.get("error") or common.exits(r)) for r in runs
            if common.failed(r)]
    if errs:
        L.append("- Runs that did not exit 0: %s" % errs)
    return "\n".join(L)


def plot(res):
    """docs/fault-timeline.png: the main scenario and the 10 s outage, ri2n (UDP and TCP
    transports, A→B) and MPTCP."""
    d = os.path.join(common.RESULTS, "plot")
    os.makedirs(d, exist_ok=True)
    files = {}
    for scen in ("main", "outage10"):
        for tool in ("ri2n", "ri2n-tcp", "mptcp"):
            rs = [r for r in res["runs"] if r["tool"] == tool and r["scenario"] == scen]
            if not rs:
                continue
            # the run whose last recovery is the median one (never recovered: last)
            def key(r):
                t = (event_of(r, -1) or {}).get("time_to_90")
                return 99 if t is None else t
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
            # first, underneath: its receiver counts a striped stretch once all of it is in,
            # so its 10 ms bins swing around the rate
            if (scen, "ri2n-tcp") in files:
                pl.append("'%s' using 1:2 with steps lw 1 lc rgb '#ffbb78' title 'ri2n bench --transport tcp (receiver)'" % files[(scen, "ri2n-tcp")][0])
            if (scen, "ri2n") in files:
                meter = files[(scen, "ri2n")][1].get("meter", "sender")
                pl.append("'%s' using 1:2 with steps lw 1.5 lc rgb '#1f77b4' title 'ri2n bench (%s)'" % (
                    files[(scen, "ri2n")][0],
                    "receiver" if meter == "receiver" else "sender, acknowledged"))
            if (scen, "mptcp") in files:
                pl.append("'%s' using 1:2 with steps lw 1.5 lc rgb '#d62728' title 'MPTCP, 2 subflows (receiver)'" % files[(scen, "mptcp")][0])
            pl.append("%.1f with lines dt 3 lc rgb '#2ca02c' title '2 links, UDP payload limit'" % (2 * udp_limit(1000) / 1e6))
            f.write("plot " + ", ".join(pl) + "\n")
        f.write("unset multiplot\n")
    if not shutil.which("gnuplot"):
        log("no gnuplot: %s not redrawn" % PLOT)
        return
    r = subprocess.run(["gnuplot", gp], capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        log("gnuplot failed: %s" % r.stderr[-500:])
