#!/usr/bin/env python3
"""Writes seed inputs for the established_connection target: chunks [flags, len_hi, len_lo,
bytes] whose bytes are a short packet (the header is rewritten by the target when flags bit 0
is set; bit 1 also sets the link byte) carrying one kind of frame each."""
import os

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "established_connection")
HEADER = bytes([1, 1]) + bytes(8) + bytes([0])  # version, SHORT, cid (rewritten), link


def varint(v):
    if v < 64:
        return bytes([v])
    if v < 16384:
        return (v | 0x4000).to_bytes(2, "big")
    if v < 1 << 30:
        return (v | 0x8000_0000).to_bytes(4, "big")
    return (v | 0xC000_0000_0000_0000).to_bytes(8, "big")


def chunk(frames, pn, flags=0x13):
    body = HEADER + varint(pn) + frames
    return bytes([flags]) + len(body).to_bytes(2, "big") + body


PING = b"\x01"
ACK = b"\x02\x00" + varint(40) + varint(100) + varint(1) + varint(5) + varint(3) + varint(10)
STREAM0 = b"\x0a" + varint(60_000) + varint(16) + bytes(range(16))
STREAM1_FIN = b"\x0f" + varint(500) + varint(4) + b"\x03abc"
MAX_DATA = b"\x04\x00" + varint(1 << 20)
LINK_STATUS = b"\x05\x01\x01"
CLOSE = b"\x06" + varint(7) + varint(3) + b"bye"
PAD = bytes(20)

SEEDS = {
    "ping": chunk(PING, 200),
    "ack_stream": chunk(ACK, 201) + chunk(STREAM0, 202) + chunk(MAX_DATA + PING, 203, 0x33),
    "all_frames": chunk(PAD + PING + ACK + STREAM0 + MAX_DATA + LINK_STATUS + STREAM1_FIN, 300),
    "status_close": chunk(LINK_STATUS, 204, 0x17) + bytes([0, 0, 5]) + b"junk!" + chunk(CLOSE, 205),
}

os.makedirs(HERE, exist_ok=True)
for name, data in SEEDS.items():
    with open(os.path.join(HERE, name), "wb") as f:
        f.write(data)
