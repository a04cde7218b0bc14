"""Part 7: attacks without the key, measured by bench/attacks/attacks.py (root, loopback; not
run by run-all); only its block of docs/BENCHMARKS.md is written here, from
bench/results/attacks.json (the build under test) and attacks-before.json (the build it is
compared with)."""
import re

from .common import load

SIZES = ((1 << 30, "GiB"), (1 << 20, "MiB"))


def size(n):
    for unit, name in SIZES:
        if n and n >= unit:
            return "%g %s" % (round(n / unit, 1), name)
    return "%s B" % n


def transfer(d):
    """A transfer's outcome: the exit codes, intact or what the sender said and when."""
    if not d or "send_exit" not in d:
        return "no transfer"
    s = "exits %s/%s" % tuple("running" if d.get(k) is None else d[k]
                              for k in ("send_exit", "recv_exit"))
    if d.get("intact"):
        return s + ", %s intact" % size(d.get("bytes_received"))
    said = " ".join(d.get("send_said") or [])
    m = re.search(r"connection lost: ([^:;]*).*?after (\d+) bytes written", said)
    if m:
        s += " (send: \"%s\" after %s written)" % (m.group(1).strip(), size(int(m.group(2))))
    return s + ", **not intact**"


def drops(d):
    """What each end dropped, by reason (the tools' `dropped` counters)."""
    ends = d.get("dropped") or []
    parts = ["%s %s" % (end, ", ".join("%s %d" % kv for kv in sorted(x.items())))
             for end, x in zip(("send", "recv"), ends) if x]
    return "; dropped: " + "; ".join(parts) if parts else ""


def answers(a):
    return ", ".join("%d %s" % (v, k) for k, v in sorted((a or {}).items()))


def cell(name, d):
    if not d:
        return "not run"
    if name == "icmp":
        return "%s; %d ICMP forged, checked with the peer %s%s" % (
            transfer(d), d["forged_icmp"], "/".join(map(str, d["refusals"])), drops(d))
    if name == "sweep":
        return "%s; %d ports swept in %.2f s%s" % (transfer(d), d["swept_ports"], d["sweep_s"],
                                                   drops(d))
    if name == "reset":
        return "%s; %d RESETs provoked, %d replayed%s" % (
            transfer(d), d["resets_provoked"], d["resets_replayed"], drops(d))
    if name == "replay":
        return "%s; %d replays, %d accepted%s" % (transfer(d), d["replays"],
                                                  d["replays_accepted"], drops(d))
    if name == "accept":
        return "replay answered with %s; then %s%s" % (d["replay_answered_with"], transfer(d),
                                                      drops(d))
    if name == "memory":
        kib = [d.get(k) for k in ("rss_before_kib", "rss_peak_kib", "rss_after_kib")]
        mib = ["%.1f" % (x / 1024) if x else "–" for x in kib]
        s = "RSS %s → peak %s MiB, %s after; answers: %s" % (mib[0], mib[1], mib[2],
                                                             answers(d["answers"]))
        if d.get("recv_exited") is not None:
            s += "; recv exited %s" % d["recv_exited"]
        if "send_exit" in d:
            s += "; then a real transfer: %s" % transfer(d)
        return s
    if name == "flood":
        downs = sum(1 for e in d.get("link_events") or [] if e["event"].endswith("-> down"))
        return ("%.2f Gbit/s before, %.2f in the 1.5 s from the burst (%s), lowest 100 ms %.2f; "
                "%d links went down; %d replays in %.3f s, answers: %s; a new client exits %s" % (
                    d["goodput_before_bps"] / 1e9, (d["goodput_during_bps"] or 0) / 1e9,
                    "%.3f×" % d["ratio"] if d.get("ratio") else "–",
                    (d["lowest_100ms_during_bps"] or 0) / 1e9, downs, d["replays"],
                    d["burst_s"], answers(d["answers"]), d["new_client_exit"]))
    if name == "resets":
        return ("%.1f µs of server CPU per RESET with no connection, %.1f with 4 000 (%s): "
                "%s×" % (d["us_per_reset_none"], d["us_per_reset_4000"], d["held"], d["ratio"]))
    if name == "junk":
        return "%.2f → %.2f Gbit/s: **%.3f** (medians of %d quiet and %d flooded)" % (
            d["median_quiet_bps"] / 1e9, d["median_flooded_bps"] / 1e9, d["ratio"], d["runs"],
            d["runs"])
    return "?"


ROWS = [
    ("icmp", "ICMP port unreachable to both ends of a 2 GiB 2-link transfer, quoting datagrams "
             "each sent and made-up ones, 100/s per link and side"),
    ("sweep", "one ICMP per ephemeral port against a 1-link transfer, made-up payload"),
    ("reset", "SHORT with the receiver's CID to the sender from 127.0.0.66, the RESET it "
              "provokes replayed to the sender from the receiver's address"),
    ("replay", "another run's keyed INITIAL spoofed from the sender, with a cookie read off `lo`"),
    ("accept", "a captured INITIAL replayed twice from 127.0.0.66 to a waiting recv, then the "
               "real 64 MiB transfer"),
    ("memory", "2 000 replays from fresh ports of 16 addresses to a waiting recv"),
    ("flood", "8 s keyed bench against serve; at 3 s 4 096 replays in one burst"),
    ("resets", "100 000 RESETs with made-up IDs at 50 000/s to serve"),
    ("junk", "1 GiB keyed transfers alone and under 100 000 junk datagrams/s from spoofed "
             "127/8 sources"),
]


def facts(res, which):
    """When, where, what build and by which command the results `which` were measured."""
    cpu = res.get("cpu") or "CPU model not recorded"
    build = "commit `%s`" % res["commit"] if res.get("commit") else "commit not recorded"
    if res.get("ri2n_sha256"):
        build += " (binary sha256 %s…)" % res["ri2n_sha256"][:12]
    return "%s: %s, %s, %s CPUs (`nproc`), %s%s, `%s`" % (
        which, res.get("date_utc"), build, res.get("nproc"), cpu,
        ", kernel `%s`" % res["uname_r"] if res.get("uname_r") else "",
        res.get("command") or "bench/attacks/attacks.py --ri2n %s" % res.get("ri2n"))


def report_attacks(res):
    before = load("attacks-before") or {}
    L = ["**Measured %s**; %s. (Exits: send/recv; the scenarios are listed in the order of "
         "issue 40's findings, 1 to 8.)" % (facts(res, "after"), facts(before, "before")
                                            if before else "no results of a build before"), ""]
    L.append("| scenario | what the attacker does | before | after |")
    L.append("| --- | --- | --- | --- |")
    for name, what in ROWS:
        if name in res or name in before:
            L.append("| `%s` | %s | %s | %s |" % (name, what, cell(name, before.get(name)),
                                                cell(name, res.get(name))))
    return "\n".join(L)
