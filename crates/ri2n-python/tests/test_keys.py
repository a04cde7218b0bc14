"""Keys: files as `ri2n keygen` writes them, and connections refused when the keys differ."""

import errno
import os
import re
import stat
import subprocess
import sys
import time

import pytest

import ri2n
from conftest import LINKS, close_quietly, ctrl_c_after


def test_save_and_read_a_key_file(tmp_path) -> None:
    key = ri2n.Key.generate()
    path = tmp_path / "cluster.key"
    key.save(path)
    text = path.read_text()
    # `ri2n keygen`'s format: one line, the prefix and 64 hex digits
    assert re.fullmatch(r"ri2n-key-v1:[0-9a-f]{64}\n", text), text
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    again = ri2n.Key.from_file(str(path))
    assert again == key and again.path == path
    assert ri2n.Key.from_text(text) == key == ri2n.Key.from_text(key.to_text())
    assert ri2n.Key.generate() != key
    assert "ri2n-key" not in repr(key) and key.to_text() not in repr(again)


def test_save_refuses_to_overwrite(tmp_path) -> None:
    path = tmp_path / "k"
    first = ri2n.Key.generate()
    first.save(path)
    with pytest.raises(FileExistsError):
        ri2n.Key.generate().save(path)
    assert ri2n.Key.from_file(path) == first
    os.chmod(path, 0o644)
    second = ri2n.Key.generate()
    second.save(path, overwrite=True)
    assert ri2n.Key.from_file(path) == second
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600, "a replaced file is made private"


def test_a_save_that_fails_keeps_the_old_key(tmp_path) -> None:
    """A key that cannot be written whole (a file size limit, as a full disk would) raises
    and leaves the old key as it was, and no other file; before, ``overwrite=True`` emptied
    the old key first. In a child process: the limit is the whole process's."""
    path = tmp_path / "cluster.key"
    old = ri2n.Key.generate()
    old.save(path)
    child = f"""
import errno, resource, signal, ri2n
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (10, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
try:
    ri2n.Key.generate().save({str(path)!r}, overwrite=True)
except OSError as e:
    assert e.errno == errno.EFBIG, e
else:
    raise SystemExit("the premise: the write did not fail")
"""
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert ri2n.Key.from_file(path) == old
    assert os.listdir(tmp_path) == ["cluster.key"]


def test_reading_a_key_from_a_fifo_lets_other_threads_run(tmp_path) -> None:
    """``Key.from_file`` waits for a FIFO's writer without the GIL: another thread of the
    process writes the key. Before, the reader held the GIL in ``open()`` and the writer never
    ran. In a child process, which the test can end when it hangs."""
    fifo = tmp_path / "cluster.key"
    os.mkfifo(fifo, 0o600)
    key = ri2n.Key.generate()
    child = f"""
import threading, time, ri2n
got = []
# a daemon thread: a failed premise ends the process, not a wait for a writer never coming
reader = threading.Thread(
    target=lambda: got.append(ri2n.Key.from_file({str(fifo)!r})), daemon=True
)
reader.start()
# the premise: a thread of the process (the reader, or one it waits on) waits in the FIFO's
# open for a writer before the writer opens it; where the kernel does not name the function
# (0), a thread other than these two, asleep
def waits_in_open():
    import os
    for tid in os.listdir("/proc/self/task"):
        task = f"/proc/self/task/{{tid}}"
        wchan = open(task + "/wchan").read()
        asleep = open(task + "/stat").read().rsplit(")", 1)[1].split()[0] == "S"
        other = int(tid) not in (threading.main_thread().native_id, reader.native_id)
        if wchan in ("wait_for_partner", "fifo_open") or (wchan == "0" and asleep and other):
            return True
    return False
deadline = time.monotonic() + 10
while not waits_in_open():
    assert time.monotonic() < deadline, "the reader never waited in the FIFO's open"
    time.sleep(0.001)
with open({str(fifo)!r}, "w") as f:
    f.write({key.to_text()!r} + "\\n")
reader.join()
assert got == [ri2n.Key.from_text({key.to_text()!r})], got
"""
    try:
        done = subprocess.run(
            [sys.executable, "-c", child], capture_output=True, text=True, timeout=20
        )
    except subprocess.TimeoutExpired:
        pytest.fail("the writer thread never ran while the reader waited")
    assert done.returncode == 0, done.stderr


def test_ctrl_c_interrupts_reading_a_key_from_a_fifo_nobody_writes(tmp_path) -> None:
    """``Key.from_file`` on a FIFO whose writer does not come gives way to Ctrl-C, as
    Python's own ``open()`` does. It waited for the writer (the open retries on EINTR)."""
    fifo = tmp_path / "cluster.key"
    os.mkfifo(fifo, 0o600)
    start = time.monotonic()
    try:
        with ctrl_c_after(0.3), pytest.raises(KeyboardInterrupt):
            ri2n.Key.from_file(fifo)
        waited = time.monotonic() - start
    finally:
        # the abandoned open ends once a writer comes
        with open(fifo, "w") as f:
            f.write(ri2n.Key.generate().to_text() + "\n")
    assert waited < 2.0, f"Ctrl-C came after {waited:.1f} s"


def test_bad_key_files(tmp_path) -> None:
    missing = tmp_path / "missing.key"
    with pytest.raises(FileNotFoundError) as e:
        ri2n.Key.from_file(missing)
    assert e.value.filename == str(missing)
    bad = tmp_path / "bad.key"
    bad.write_text("not a key\n")
    os.chmod(bad, 0o600)
    with pytest.raises(ValueError, match="bad.key"):
        ri2n.Key.from_file(bad)
    # an endless file: refused after the most a key file holds, not read until memory ran out
    with pytest.raises(ValueError, match="/dev/zero: not a ri2n key"):
        ri2n.Key.from_file("/dev/zero")
    with pytest.raises(IsADirectoryError):
        ri2n.Key.from_file(tmp_path)
    with pytest.raises(ValueError):
        ri2n.Key.from_text("ri2n-key-v1:1234")
    with pytest.raises(FileNotFoundError):
        ri2n.Endpoint.client(LINKS, key_file=missing)
    with pytest.raises(ValueError):
        ri2n.Endpoint.client(LINKS, key=ri2n.Key.generate(), key_file=bad)


def test_a_key_file_others_can_read_gives_a_warning(tmp_path) -> None:
    path = tmp_path / "open.key"
    path.write_text(ri2n.Key.generate().to_text())
    os.chmod(path, 0o644)
    with pytest.warns(UserWarning, match="other users can read the key file.*chmod 600"):
        ri2n.Key.from_file(path)
    # one others may only change is told as such, not as readable
    os.chmod(path, 0o620)
    with pytest.warns(UserWarning, match="other users can change the key file"):
        ri2n.Key.from_file(path)


@pytest.mark.parametrize("transport", ["udp", "tcp"])
def test_another_key_is_a_key_mismatch_naming_the_file(tmp_path, transport: str) -> None:
    """The client is told, naming its key file; the server lists the refusal for its log
    (on the TCP transport it listed none before)."""
    path = tmp_path / "client.key"
    ri2n.Key.generate().save(path)
    server = ri2n.Endpoint.server(LINKS, key=ri2n.Key.generate(), transport=transport)
    client = ri2n.Endpoint.client(LINKS, key_file=path, transport=transport)
    try:
        with pytest.raises(ri2n.KeyMismatch) as e:
            client.connect(server.local_addrs(), timeout=10)
        assert isinstance(e.value, ConnectionError)
        assert e.value.mismatch == "wrong_key"
        assert e.value.errno == errno.EACCES  # as the C interface's
        assert "another key" in str(e.value) and str(path) in str(e.value)
        assert e.value.key_file == str(path)
        refused = server.refused_handshakes()
        assert refused and "another key" in refused[0][1]
    finally:
        close_quietly(client, server)


def test_a_key_on_one_side_only_is_a_key_mismatch() -> None:
    key = ri2n.Key.generate()
    keyed = ri2n.Endpoint.server(LINKS, key=key)
    plain = ri2n.Endpoint.server(LINKS)
    keyed_client = ri2n.Endpoint.client(LINKS, key=key)
    plain_client = ri2n.Endpoint.client(LINKS)
    try:
        with pytest.raises(ri2n.KeyMismatch) as e:
            plain_client.connect(keyed.local_addrs(), timeout=10)
        assert e.value.mismatch == "key_required"
        with pytest.raises(ri2n.KeyMismatch) as e:
            keyed_client.connect(plain.local_addrs(), timeout=10)
        assert e.value.mismatch == "no_key"
        # the same key on both sides is served, and encrypted
        with keyed_client.connect(keyed.local_addrs(), timeout=10) as conn:
            assert conn.stats()["cipher"] in ("aegis-256x4", "aes-256-gcm", "chacha20-poly1305")
    finally:
        # (the servers' side of what the clients aborted is "not delivered": not our concern)
        close_quietly(keyed_client, plain_client, keyed, plain)
