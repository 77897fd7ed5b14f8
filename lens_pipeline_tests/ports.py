"""Ports for the servers the tests start, which no other test and no outgoing connection can take.

A port the kernel hands out for `bind(("127.0.0.1", 0))`, once closed, may be handed out again (to
another xdist worker's bind, or as the source port of any outgoing connection) before the server
meant to listen there has bound it. The kernel hands out ports of its ephemeral range only
(`/proc/sys/net/ipv4/ip_local_port_range`, 32768-60999 by default), so these come from below it:
a block of its own for each xdist worker, taken in turn from a random place (two sessions on one
machine do not walk a block in step), each checked free by binding it. Where the range leaves no
room for the blocks, the kernel's choice it is, as before.
"""

from __future__ import annotations

import itertools
import os
import random
import socket
from pathlib import Path

FIRST_PORT = 20_000
MAX_BLOCK = 1_000
MIN_BLOCK = 50


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default; elsewhere the check below still binds each port


def _block() -> tuple[int, int] | None:
    """(first port, size) of this worker's block; None when the ephemeral range leaves no room."""
    digits = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    index = int(digits) if digits.isdigit() else 0
    count = max(int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1), index + 1)
    size = min(MAX_BLOCK, (_ephemeral_low() - FIRST_PORT) // count)
    return (FIRST_PORT + index * size, size) if size >= MIN_BLOCK else None


_BLOCK = _block()
_turn = itertools.count(random.randrange(_BLOCK[1]) if _BLOCK else 0)


def free_port() -> int:
    """A port nothing listens on at 127.0.0.1, from this worker's block."""
    if _BLOCK is None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            return sock.getsockname()[1]
    first, size = _BLOCK
    for _ in range(size):
        port = first + next(_turn) % size
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue  # something listens there, or a connection of it lingers
            return port
    raise RuntimeError(f"no free port in {first}-{first + size - 1}")
