"""Part 5: the cost of a key (goodput and CPU per GB with and without one; handshakes)."""
import json

from . import common
from .common import fast_file, log, mfacts, run, spread, wait_quiet
from .labctl import new_lab
from .fast import rate_cpu_cell, ri2n_transfer


def part_keyed(o):
    """ri2n without and with a key, in turn, on 2 x 1 Gbit/s (tbf) and on unlimited 2-link
    veth links (MTU 1500): goodput and the machine's CPU per GB; the handshakes per second
    of the server's CPU, from the engine alone (examples/handshake_rate.rs); and the candidate
    AEADs' speed on one thread (examples/aead_speed.rs)."""
    res = {"part": "keyed", "bytes": o.fast_bytes, "configs": []}
    keyfile = common.key_file()
    res["commands"] = {
        "key": "ri2n keygen --output FILE; ri2n recv … --key FILE; ri2n send … --key FILE",
        "lab": "lab/ri2n-lab up 2 --rate 1000, and lab/ri2n-lab up 2 --mtu 1500 (unlimited)",
        "handshakes": "cargo run --release -p ri2n-proto --example handshake_rate 1000",
        "aead": "cargo run --release -p ri2n-proto --example aead_speed",
    }
    src = fast_file(o.fast_bytes)
    lab = new_lab(o.prefix)
    for name, rates in (("2 × 1 Gbit/s (tbf)", [1000, 1000]), ("2 links, unlimited, MTU 1500", None)):
        log("keyed: %s" % name)
        lab.up(rates or [0, 0], mtu=None if rates else 1500)
        c = {"name": name, "rates_mbit": rates, "runs": []}
        for rep in range(o.reps):
            row = {"rep": rep}
            for k in (["plain", "keyed"] if rep % 2 == 0 else ["keyed", "plain"]):
                row["busy_before_" + k] = wait_quiet()
                row[k] = ri2n_transfer(lab, src, o.fast_bytes,
                                       key=keyfile if k == "keyed" else None)
            log("  rep %d: %s" % (rep, ", ".join(
                "%s %.0f Mbit/s %.2f CPU-s/GB" % (k, (row[k].get("bps") or 0) / 1e6,
                                                  row[k]["cpu_machine"] / (o.fast_bytes / 1e9))
                for k in ("plain", "keyed"))))
            c["runs"].append(row)
        res["configs"].append(c)
    lab.down()
    log("keyed: handshake rate")
    wait_quiet()
    out = run(["cargo", "run", "--release", "-q", "-p", "ri2n-proto", "--example",
               "handshake_rate", "1000"], timeout=900)
    res["handshakes"] = json.loads(out.strip().splitlines()[-1])
    log("keyed: AEAD speed")
    wait_quiet()
    out = run(["cargo", "run", "--release", "-q", "-p", "ri2n-proto", "--example",
               "aead_speed"], timeout=900)
    res["aead"] = json.loads(out.strip().splitlines()[-1])
    return res


def report_keyed(res):
    L = [mfacts(res), ""]
    gb = res["bytes"] / 1e9
    L.append("ri2n send/recv of %.2f GB A→B per run without a key and with one (`--key`), in turn, "
             "median (min–max) of %d runs. CPU: the whole machine's busy time during the "
             "transfer (both ends) per GB moved.\n" % (gb, len(res["configs"][0]["runs"])))
    L.append("| links | without a key | with a key | goodput with / without | CPU per GB with / without | cipher |")
    L.append("| --- | --- | --- | --- | --- | --- |")
    for c in res["configs"]:
        runs = c["runs"]
        ratio = [r["keyed"]["bps"] / r["plain"]["bps"] for r in runs
                 if r["keyed"].get("bps") and r["plain"].get("bps")]
        cpu_ratio = [(r["keyed"]["cpu_machine"] / r["keyed"]["bytes"]) /
                     (r["plain"]["cpu_machine"] / r["plain"]["bytes"]) for r in runs
                     if r["keyed"].get("bytes") and r["plain"].get("bytes")]
        ciphers = sorted({str(r["keyed"].get("encryption")) for r in runs})
        L.append("| %s | %s | %s | **%s** | %s | %s |" % (
            c["name"], rate_cpu_cell(runs, "plain", "Mbit/s"), rate_cpu_cell(runs, "keyed", "Mbit/s"), spread(ratio, "%.3f"),
            spread(cpu_ratio, "%.2f"), ", ".join(ciphers)))
    h = res.get("handshakes")
    if h:
        L.append("")
        L.append("Handshakes a server completes per second of its own CPU (`%s`: client and "
                 "server endpoints in one process, datagrams in memory, only the server's calls "
                 "timed; median of 5 runs of 1000 handshakes each, the server holding every "
                 "connection it accepted):\n" % res["commands"]["handshakes"])
        L.append("| | server CPU per handshake | handshakes per server CPU-second | both sides on one CPU |")
        L.append("| --- | --- | --- | --- |")
        for k, name in (("plain", "without a key"), ("keyed", "with a key (Noise NNpsk0, X25519)")):
            x = h[k]
            L.append("| %s | %.1f µs | %.0f | %.0f /s |" % (
                name, x["server_us_per_handshake"], x["server_handshakes_per_s"],
                x["both_sides_handshakes_per_s"]))
    aead = res.get("aead")
    if aead:
        ciphers = list(dict.fromkeys(x["cipher"] for x in aead))
        sizes = list(dict.fromkeys(x["bytes"] for x in aead))
        at = {(x["cipher"], x["bytes"]): x for x in aead}
        L.append("")
        L.append("Each AEAD sealing a packet (or frame) in place and opening it again, one thread "
                 "(`%s`, median of 5 runs): nanoseconds per seal and open, and GB/s of data "
                 "sealed and opened; the cipher ri2n now uses in bold:\n" % res["commands"]["aead"])
        L.append("| bytes | %s |" % " | ".join(ciphers))
        L.append("|" + " --- |" * (len(ciphers) + 1))
        for size in sizes:
            cells = []
            for c in ciphers:
                x = at[(c, size)]
                cell = "%.0f ns, %.2f GB/s" % (x["ns_per_seal_and_open"], x["gb_per_s_sealed_and_opened"])
                cells.append("**%s**" % cell if c.startswith("AEGIS-256X4") else cell)
            L.append("| %d | %s |" % (size, " | ".join(cells)))
    bad = [(c["name"], r["rep"], k, common.exits(r[k])) for c in res["configs"] for r in c["runs"]
           for k in ("plain", "keyed") if common.failed(r[k])]
    if bad:
        L.append("")
        L.append("Runs that failed (configuration, run, tool, exit code: the sender's, then the receiver's where known): %s." % bad)
    return "\n".join(L)
