"""Part 9: ri2n from C and Python, against the Rust library and the `ri2n` command on
loopback (two links, 127.0.0.1 and 127.0.0.2): 64-byte ping-pong through the C interface and
through Rust (crates/ri2n-ffi/bench/pingpong.c, examples/pingpong.rs), and a file sent to
`ri2n recv` by Python's `sendall` (python_sender.py) and by `ri2n send`, in turn."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

from . import common
from .common import (PROCS, fast_file, free_port, log, med, mfacts, run, spread, timed_client,
                     wait_quiet, wait_ready)

HERE = os.path.dirname(os.path.abspath(__file__))


def target_dir():
    return os.environ.get("CARGO_TARGET_DIR") or os.path.join(common.ROOT, "target")


def build_c_pingpong(tmp):
    """The Rust ping-pong example and the C one, linked against the same build's libri2n_ffi.a."""
    # --lib: the library is then a target of its own, copied to target/release (as a mere
    # dependency of the example it stays in target/release/deps)
    run(["cargo", "build", "--release", "-q", "-p", "ri2n-ffi", "--lib", "--example", "pingpong"],
        timeout=1800)
    release = os.path.join(target_dir(), "release")
    c_prog = os.path.join(tmp, "pingpong_c")
    run([os.environ.get("CC", "cc"), "-O2", "-std=c11", "-D_GNU_SOURCE", "-I",
         os.path.join(common.ROOT, "crates/ri2n-ffi/include/ri2n"),
         os.path.join(common.ROOT, "crates/ri2n-ffi/bench/pingpong.c"),
         os.path.join(release, "libri2n_ffi.a"), "-lgcc_s", "-lutil", "-lrt", "-lpthread",
         "-lm", "-ldl", "-lc", "-o", c_prog], timeout=300)
    return c_prog, os.path.join(release, "examples", "pingpong")


def python_env(tmp):
    """A virtual environment with the package built from this checkout; its Python."""
    venv = os.path.join(tmp, "venv")
    run([sys.executable, "-m", "venv", "--system-site-packages", venv], timeout=300)
    py = os.path.join(venv, "bin", "python")
    if subprocess.run([py, "-c", "import maturin"], capture_output=True).returncode != 0:
        run([py, "-m", "pip", "install", "--quiet", "maturin"], timeout=600)
    # the environment's bin first, as activating it would: maturin's build hook runs `maturin`
    env = dict(os.environ, CARGO_TARGET_DIR=os.path.join(target_dir(), "ri2n-python-bench"),
               PATH=os.path.join(venv, "bin") + os.pathsep + os.environ.get("PATH", ""),
               VIRTUAL_ENV=venv)
    r = subprocess.run([py, "-m", "pip", "install", "--quiet", "--no-build-isolation",
                        "--no-deps", os.path.join(common.ROOT, "crates/ri2n-python")],
                       capture_output=True, text=True, timeout=1800, env=env)
    if r.returncode != 0:
        raise RuntimeError("pip install crates/ri2n-python: %s" % r.stderr[-800:])
    return py


def send_to_recv(sender, nbytes):
    """`ri2n recv` on two loopback addresses, fed by `sender(addr)` (a command): the goodput
    `recv` measured, the exit codes and the sender's CPU seconds."""
    port = free_port()
    with tempfile.TemporaryFile("w+") as out:
        recv = PROCS.start([common.RI2N, "recv", "--listen", "127.0.0.1:%d" % port, "--listen",
                            "127.0.0.2:%d" % port, "--output", "/dev/null", "--json", "-q"],
                           stdout=out)
        wait_ready(recv, "ri2n recv", 0.3)
        rc, cpu, busy, wall, _ = timed_client(sender("127.0.0.1:%d" % port), 600)
        recv_rc, _ = PROCS.wait_rusage(recv, 30)
        out.seek(0)
        try:
            doc = json.loads(out.read())
        except ValueError:
            doc = {}
    ok = rc == 0 and recv_rc == 0 and doc.get("bytes") == nbytes
    return {"rc": rc, "recv_rc": recv_rc, "bps": doc.get("goodput_bps") if ok else None,
            "sender_cpu": cpu, "machine_cpu": busy, "wall": wall}


def part_bindings(o):
    res = {"part": "bindings", "pingpong": [], "goodput": [], "bytes": o.fast_bytes,
           "rounds": o.lat_count}
    res["commands"] = {
        "c_pingpong": "crates/ri2n-ffi/bench/pingpong.c %d 64 (cc -O2, libri2n_ffi.a)" % o.lat_count,
        "rust_pingpong": "cargo run --release -p ri2n-ffi --example pingpong -- %d 64" % o.lat_count,
        "python_send": "python bench/ri2nbench/python_sender.py ADDR FILE (4 MiB sendall calls)",
        "cli_send": "ri2n send --to ADDR --input FILE -q",
        "recv": "ri2n recv --listen 127.0.0.1:PORT --listen 127.0.0.2:PORT --output /dev/null --json -q",
    }
    tmp = tempfile.mkdtemp(prefix="ri2nbench-bindings-")
    try:
        c_prog, rust_prog = build_c_pingpong(tmp)
        # each mode and language in turn within a run; pinned: the whole process (both ends
        # and the library's threads) on one CPU, where the host's other load moves it least
        for rep in range(o.lat_reps):
            row = {"rep": rep}
            for mode in ("pinned", "unpinned"):
                pin = ["taskset", "-c", "0"] if mode == "pinned" else []
                for k in (["c", "rust"] if rep % 2 == 0 else ["rust", "c"]):
                    wait_quiet()
                    prog = c_prog if k == "c" else rust_prog
                    row[mode + "_" + k] = json.loads(
                        run(pin + [prog, o.lat_count, 64], timeout=600).strip())
            log("  ping-pong %d: pinned C %.1f µs, Rust %.1f µs; unpinned C %.1f, Rust %.1f" % (
                rep, row["pinned_c"]["median_us"], row["pinned_rust"]["median_us"],
                row["unpinned_c"]["median_us"], row["unpinned_rust"]["median_us"]))
            res["pingpong"].append(row)

        py = python_env(tmp)
        res["python"] = run([py, "-c", "import sys, ri2n; print(sys.version.split()[0], ri2n.__version__)"]).strip()
        src = fast_file(o.fast_bytes)
        senders = {
            "cli": lambda addr: [common.RI2N, "send", "--to", addr, "--input", src, "-q"],
            "python": lambda addr: [py, os.path.join(HERE, "python_sender.py"), addr, src],
        }
        # as many runs as the ping-pong: a transfer of this size takes about a second, and
        # this host's speed moves from second to second
        for rep in range(o.lat_reps):
            row = {"rep": rep}
            for k in (["cli", "python"] if rep % 2 == 0 else ["python", "cli"]):
                wait_quiet()
                row[k] = send_to_recv(senders[k], o.fast_bytes)
            log("  goodput %d: ri2n send %.2f Gbit/s, Python %.2f Gbit/s" % (
                rep, (row["cli"]["bps"] or 0) / 1e9, (row["python"]["bps"] or 0) / 1e9))
            res["goodput"].append(row)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return res


def report_bindings(res):
    L = [mfacts(res), ""]
    pp = res["pingpong"]
    L.append("64-byte messages, %d round trips per run after 1000 of warm-up, over two loopback "
             "links, both ends in one process (a thread echoes): `%s` against `%s`. Pinned: "
             "the process on one CPU (`taskset -c 0`). Each run measures the four in turn; "
             "median (min–max) of %d runs' medians.\n" % (
                 res["rounds"], res["commands"]["c_pingpong"], res["commands"]["rust_pingpong"],
                 len(pp)))
    L.append("| | C interface | Rust library | C ÷ Rust per run | p99, C / Rust |")
    L.append("| --- | --- | --- | --- | --- |")
    for mode in ("pinned", "unpinned"):
        c = [r[mode + "_c"] for r in pp]
        rust = [r[mode + "_rust"] for r in pp]
        L.append("| %s | %s µs | %s µs | **%s** | %s / %s µs |" % (
            mode, spread([x["median_us"] for x in c]), spread([x["median_us"] for x in rust]),
            spread([a["median_us"] / b["median_us"] for a, b in zip(c, rust)], "%.3f"),
            spread([x["p99_us"] for x in c]), spread([x["p99_us"] for x in rust])))
    g = res["goodput"]
    if g:
        gratio = [r["python"]["bps"] / r["cli"]["bps"] for r in g
                  if r["python"]["bps"] and r["cli"]["bps"]]
        L.append("")
        L.append("%.2f GB read from a file in /dev/shm and sent to `%s` over its two links, by "
                 "Python (%s; `%s`) and by `%s`, in turn, %d runs; goodput as `recv` measured it, "
                 "median (min–max).\n" % (res["bytes"] / 1e9, res["commands"]["recv"],
                                         res.get("python", "?"), res["commands"]["python_send"],
                                         res["commands"]["cli_send"], len(g)))
        L.append("| sender | goodput | sender's CPU-s per GB |")
        L.append("| --- | --- | --- |")
        gb = res["bytes"] / 1e9
        for k, name in (("cli", "`ri2n send`"), ("python", "Python `sendall`")):
            L.append("| %s | %s Gbit/s | %s |" % (
                name, spread([r[k]["bps"] for r in g if r[k]["bps"]], "%.2f", 1e-9),
                # the runs that moved the data only, as for the goodput
                spread([r[k]["sender_cpu"] / gb for r in g
                        if r[k]["bps"] and r[k]["sender_cpu"] is not None], "%.2f")))
        L.append("| Python / `ri2n send` per run | **%s** | |" % spread(gratio, "%.3f"))
        bad = [(r["rep"], k, r[k]["rc"], r[k]["recv_rc"]) for r in g for k in ("cli", "python")
               if r[k]["bps"] is None]
        if bad:
            L.append("")
            L.append("Runs that failed (rep, sender, sender exit, recv exit): %s." % bad)
    return "\n".join(L)
