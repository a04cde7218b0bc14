#!/usr/bin/env python3
"""An asyncio echo server and client over ri2n (``ri2n.aio``: asyncio's own StreamReader and
StreamWriter over a ri2n connection, every connection striped over all links).

Both in one process, on loopback's two addresses (two links)::

    python asyncio_echo.py demo

Or apart::

    python asyncio_echo.py server --listen 127.0.0.1:7000 --listen 127.0.0.2:7000
    python asyncio_echo.py client --to 127.0.0.1:7000 --local 127.0.0.1:0 --local 127.0.0.2:0

The client sends a few lines, one at a time, and then a megabyte in one go, reads each echo
back and checks it; the server echoes every connection until the client's end of stream, any
number of clients at once.
"""

import argparse
import asyncio
import os
import sys
from typing import List

import ri2n


async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Echoes one connection until the client ends its stream, then ends ours."""
    echoed = 0
    while data := await reader.read(65536):
        writer.write(data)
        await writer.drain()  # waits while the connection's send buffer is full
        echoed += len(data)
    writer.write_eof()  # Connection.finish(): the client reads b"" after the echo
    writer.close()
    await writer.wait_closed()
    print(f"server: echoed {echoed} bytes")


async def serve(server: ri2n.Endpoint, clients: int = 0) -> None:
    """Accepts connections and echoes each in a task of its own; stops after ``clients``
    connections (0: never)."""
    tasks: "List[asyncio.Future[None]]" = []
    while clients == 0 or len(tasks) < clients:
        reader, writer = await ri2n.aio.accept(server)
        tasks.append(asyncio.ensure_future(echo(reader, writer)))
    await asyncio.gather(*tasks)


async def client(endpoint: ri2n.Endpoint, to: List[str]) -> None:
    reader, writer = await ri2n.aio.open_connection(endpoint, to, timeout=10)
    for line in [b"hello\n", b"over several links\n", b"at once\n"]:
        writer.write(line)
        back = await reader.readline()
        assert back == line, (back, line)
        print(f"client: {back!r} came back")
    blob = os.urandom(1 << 20)
    writer.write(blob)
    writer.write_eof()  # no more from us: the server ends its echo after this
    back = await reader.read()  # until the server's end of stream
    assert back == blob, "the echo differs"
    conn = writer.get_extra_info("connection")
    links = [f"{l['local']}->{l['remote']} {l['state']}" for l in conn.stats()["links"]]
    print(f"client: 1 MiB came back intact over {', '.join(links)}")
    writer.close()
    await writer.wait_closed()


async def demo() -> None:
    links = ["127.0.0.1:0", "127.0.0.2:0"]
    with ri2n.Endpoint.server(links) as server, ri2n.Endpoint.client(links) as endpoint:
        serving = asyncio.ensure_future(serve(server, clients=2))
        to = server.local_addrs()[:1]  # one address: the server announces the other
        await asyncio.gather(client(endpoint, to), client(endpoint, to))
        await serving


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="role", required=True)
    sub.add_parser("demo", help="server and two clients in this process, on loopback")
    s = sub.add_parser("server", help="echo every connection")
    s.add_argument("--listen", action="append", required=True, help="a local ip:port, one per link")
    c = sub.add_parser("client", help="send lines and a megabyte, check the echo")
    c.add_argument("--to", action="append", required=True, help="a server address ip:port")
    c.add_argument("--local", action="append", default=None, help="a local ip:port per network")
    for p in (s, c):
        p.add_argument("--key-file", help="the cluster key (both sides must hold the same)")
    args = parser.parse_args()
    try:
        if args.role == "demo":
            asyncio.run(demo())
        elif args.role == "server":
            with ri2n.Endpoint.server(args.listen, key_file=args.key_file) as server:
                print(f"server: listening on {', '.join(server.local_addrs())}", flush=True)
                asyncio.run(serve(server))
        else:
            local = args.local or ["0.0.0.0:0"]
            with ri2n.Endpoint.client(local, key_file=args.key_file) as endpoint:
                asyncio.run(client(endpoint, args.to))
    except KeyboardInterrupt:
        return 130
    except (OSError, ValueError) as e:
        print(f"asyncio_echo: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
