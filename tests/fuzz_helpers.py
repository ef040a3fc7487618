"""Fuzzing a Kafka listener: random and mutated request frames, sent on a fresh connection
per round (shared by the listener tests of a LocalBroker and of a cluster's brokers)."""

from __future__ import annotations

import os
import random
import socket


def mutated_frames(rng: random.Random, valid: list, n: int = 10, *,
                   garbage: float = 0.3, bad_size: float = 0.0) -> list:
    """``n`` frames: random bytes (share ``garbage``), a valid frame with an absurd size
    prefix (share ``bad_size``), or a valid frame with 1-3 bytes flipped."""
    frames = []
    for _ in range(n):
        frame = bytearray(rng.choice(valid))
        roll = rng.random()
        if roll < garbage:
            frame = bytearray(os.urandom(rng.randrange(1, 200)))
        elif roll < garbage + bad_size:
            frame[0:4] = rng.choice([b"\x7f\xff\xff\xff", b"\xff\xff\xff\xf0"])
        else:
            for _ in range(rng.randrange(1, 4)):
                frame[rng.randrange(len(frame))] = rng.randrange(256)
        frames.append(bytes(frame))
    return frames


def send_round(address, frames: list) -> None:
    """Send the frames on one connection, read whatever comes back until the server
    closes it or goes quiet for 0.5 s; a reset is the server's right."""
    try:
        with socket.create_connection(address, timeout=5) as sock:
            sock.sendall(b"".join(frames))
            sock.shutdown(socket.SHUT_WR)
            sock.settimeout(0.5)
            while sock.recv(65536):
                pass
    except OSError:
        pass                        # reset or timed out: the broker chose to drop us
