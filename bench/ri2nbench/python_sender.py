"""The Python side of `bench/run-all bindings`: sends a file to `ri2n recv` as `ri2n send
--input FILE` does (read into one buffer, handed whole to the library), through the Python
package. Run by the virtual environment's Python, never imported by the driver.

    python python_sender.py ADDR FILE [KEY_FILE]
"""
import sys

import ri2n

CHUNK = 4 << 20


def main():
    to, path = sys.argv[1], sys.argv[2]
    key_file = sys.argv[3] if len(sys.argv) > 3 else None
    client = ri2n.Endpoint.client(["127.0.0.1:0", "127.0.0.2:0"], key_file=key_file)
    conn = client.connect([to], timeout=10)
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while True:
            n = f.readinto(buf)
            if not n:
                break
            conn.sendall(view[:n])
    conn.finish()
    conn.wait_acknowledged()
    conn.close()
    client.close(timeout=10)


if __name__ == "__main__":
    main()
