"""Ports for the servers the tests start, which no other test and no outgoing connection can take.

A port the kernel hands out for `bind(("127.0.0.1", 0))`, once closed, may be handed out again (to
another xdist worker's bind, or as the source port of any outgoing connection) before the server
meant to listen there has bound it. Linux hands out ports of its ephemeral range only (32768-60999
by default), so these come from below it: a block of its own for each xdist worker, taken in turn,
each checked free by binding it.
"""

from __future__ import annotations

import itertools
import os
import socket

FIRST_PORT = 20_000
BLOCK = 1_000  # ports per xdist worker: 12 workers fit below the ephemeral range
_turn = itertools.count()


def _worker_index() -> int:
    digits = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    return int(digits) % 12 if digits.isdigit() else 0


def free_port() -> int:
    """A port nothing listens on at 127.0.0.1, from this worker's block."""
    first = FIRST_PORT + _worker_index() * BLOCK
    for _ in range(BLOCK):
        port = first + next(_turn) % BLOCK
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue  # something listens there, or a connection of it lingers
            return port
    raise RuntimeError(f"no free port in {first}-{first + BLOCK - 1}")
