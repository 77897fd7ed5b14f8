"""The pages of a large LIST parsed and cut down in a process of their own.

At 150k pods, parsing the pages and cutting each pod down were most of what a collection run's one
busy thread did, while the machine's other core waited. A `ParseWorker` is a child process
(`python -m lens_pipeline.kube.apart`) that takes each page's body as it arrives, parses it, passes
every item through the list's `project` function, and hands back only what `project` returned,
pickled: a few hundred bytes a pod instead of a few kilobytes of JSON to parse.

The worker only ever takes the plain path. A page it cannot read (not JSON, no `items`), a
`project` that raises, a worker that died or never started: the page is parsed in the caller's
process as if there were no worker, so every error is raised where it always was, with the same
message. `project` must be a pure function that pickles by reference (a module's function, or a
`functools.partial` of one): what it changes would change in the worker's copy only.

Frames, both ways: one byte of type, eight of length (big-endian), the payload.
- to the worker: `P` a pickled `project`; `B` a page's body; `Q` quit (it answers `U`).
- from it: `R` pickled `(continue token, results)`; `F` a reason to parse the page here; `U` its
  peak RSS (KiB) and CPU seconds, as JSON, last.
"""

from __future__ import annotations

import contextlib
import fcntl
import gc
import json
import logging
import pickle
import resource
import select
import struct
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any

import orjson

log = logging.getLogger(__name__)

_HEAD = struct.Struct("!cQ")
_PIPE_BYTES = 1 << 20  # Linux lets an unprivileged process grow a pipe to 1 MiB
# How long a page may take the worker before it is given up on (and the page parsed here).
ANSWER_SECONDS = 60.0


@dataclass
class WorkerUsage:
    peak_rss_kib: int = 0
    cpu_seconds: float = 0.0


def project_frame(project: Callable[[dict[str, Any]], Any]) -> bytes | None:
    """`project` as the worker receives it; None when it does not pickle (a lambda, a closure)."""
    try:
        return pickle.dumps(project, protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, AttributeError, TypeError):
        return None


class ParseWorker:
    """One child process parsing pages for one `KubeReader`, one page at a time, in order.

    Bodies are sent from the thread that fetches them (`send`), answers read by the thread that
    lists (`take`), one answer per body sent; `drain` throws away answers nobody will take (a list
    that ended early or started again). Once anything goes wrong the worker is ended for good
    (`broken` says why) and every page is parsed by the caller."""

    largest_peak_rss_kib = 0  # the largest peak RSS any worker of this process reported

    def __init__(self) -> None:
        self.broken: str | None = None
        self.usage = WorkerUsage()
        self._write_lock = threading.Lock()
        self._sent = 0  # bodies written whole
        self._taken = 0  # answers read
        self._project: bytes | None = None
        self._process = subprocess.Popen(
            [sys.executable, "-m", __name__], stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0
        )
        assert self._process.stdin is not None and self._process.stdout is not None
        self._stdin: IO[bytes] = self._process.stdin
        self._stdout: IO[bytes] = self._process.stdout
        for pipe in (self._stdin, self._stdout):
            _grow(pipe.fileno())

    @property
    def pid(self) -> int:
        return self._process.pid

    def send(self, body: bytes, project: bytes) -> bool:
        """Write one page's body (after `project`, when the worker does not have it yet); False when
        the worker cannot take it, and the caller is to parse the page itself."""
        with self._write_lock:
            if self.broken is not None:
                return False
            try:
                if project is not self._project:
                    _write(self._stdin, b"P", project)
                    self._project = project
                _write(self._stdin, b"B", body)
            except (OSError, ValueError) as exc:
                self._break(f"could not send it a page: {exc}")
                return False
            self._sent += 1
            return True

    def take(self) -> tuple[str | None, list[Any]] | None:
        """The answer for the oldest body not yet answered: (continue token, projected items), or
        None when the caller is to parse that page itself."""
        if self.broken is not None:
            self._taken += 1
            return None
        frame = self._read()
        self._taken += 1
        if frame is None:
            return None
        kind, payload = frame
        if kind == b"F":
            log.debug("page parsed in process: %s", payload.decode("utf-8", "replace"))
            return None
        if kind != b"R":
            self._break(f"it answered a frame of type {kind!r}")
            return None
        try:
            token, results = pickle.loads(payload)
        except Exception as exc:  # any unreadable answer: the page is parsed here
            self._break(f"its answer did not unpickle: {type(exc).__name__}: {exc}")
            return None
        return token, results

    def drain(self) -> None:
        """Read and drop the answers of every body sent and not taken. Call with no `send` under way."""
        while self._taken < self._sent:
            self.take()

    def close(self) -> WorkerUsage:
        """Ask the worker to quit, and what it used; kill it if it does not answer."""
        if self.broken is None:
            try:
                self.drain()
                with self._write_lock:
                    _write(self._stdin, b"Q", b"")
                frame = self._read()
                if frame is not None and frame[0] == b"U":
                    figures = json.loads(frame[1])
                    self.usage = WorkerUsage(int(figures["peak_rss_kib"]), float(figures["cpu_seconds"]))
                    peak = max(ParseWorker.largest_peak_rss_kib, self.usage.peak_rss_kib)
                    ParseWorker.largest_peak_rss_kib = peak
            except (OSError, ValueError, KeyError, TypeError) as exc:
                log.debug("parse worker %s did not quit cleanly: %s", self.pid, exc)
        self._end()
        return self.usage

    def _read(self) -> tuple[bytes, bytes] | None:
        try:
            ready, _, _ = select.select([self._stdout], [], [], ANSWER_SECONDS)
            if not ready:
                self._break(f"no answer in {ANSWER_SECONDS:.0f} s")
                return None
            head = _read_exactly(self._stdout, _HEAD.size)
            kind, length = _HEAD.unpack(head)
            return kind, _read_exactly(self._stdout, length)
        except (OSError, ValueError, EOFError) as exc:
            self._break(f"could not read its answer: {exc or type(exc).__name__}")
            return None

    def _break(self, reason: str) -> None:
        if self.broken is None:
            self.broken = reason
            log.warning("parse worker %s ended (%s): pages are parsed in process", self.pid, reason)
        self._end()

    def _end(self) -> None:
        for pipe in (self._stdin, self._stdout):
            with contextlib.suppress(OSError):
                pipe.close()
        try:
            self._process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        if self.broken is None:
            self.broken = "closed"


def _grow(fd: int) -> None:
    with contextlib.suppress(OSError, AttributeError):
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, _PIPE_BYTES)  # type: ignore[attr-defined]


def _write(pipe: IO[bytes], kind: bytes, payload: bytes) -> None:
    pipe.write(_HEAD.pack(kind, len(payload)))
    view = memoryview(payload)
    while view:
        written = pipe.write(view)
        if written is None:
            raise OSError("pipe not ready")
        view = view[written:]


def _read_exactly(pipe: IO[bytes], size: int) -> bytes:
    chunks = []
    while size:
        chunk = pipe.read(size)
        if not chunk:
            raise EOFError("the worker closed its end")
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


# The worker's side.


def answer(body: bytes, project: Callable[[dict[str, Any]], Any] | None) -> tuple[bytes, bytes]:
    """One page's answer frame: `R` with the projected items, or `F` with why the caller is to
    parse the page itself."""
    if project is None:
        return b"F", b"no project function was sent"
    try:
        page = orjson.loads(body)
    except orjson.JSONDecodeError:
        return b"F", b"not JSON"
    items = page.get("items") if isinstance(page, dict) else None
    if not isinstance(items, list):
        return b"F", b"no items array"
    metadata = page.get("metadata")
    token = metadata.get("continue") if isinstance(metadata, dict) else None
    try:
        results = [project(item) for item in items]
        return b"R", pickle.dumps((token, results), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:  # the caller's own run of `project` raises it properly
        return b"F", f"{type(exc).__name__}: {exc}".encode()


def _peak_rss_kib() -> int:
    """This process's own peak RSS. Not `ru_maxrss`: Linux carries that over an exec, so it would
    start at the size of the process that spawned the worker."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def main() -> None:
    # Parsed JSON holds no reference cycles: the cyclic collector would only rescan every page.
    gc.disable()
    source, sink = sys.stdin.buffer, sys.stdout.buffer
    project: Callable[[dict[str, Any]], Any] | None = None
    while True:
        try:
            kind, length = _HEAD.unpack(_read_exactly(source, _HEAD.size))
            payload = _read_exactly(source, length)
        except EOFError:
            return  # the reader's process ended or closed us
        if kind == b"P":
            try:
                project = pickle.loads(payload)
            except Exception as exc:  # every page of this list is then parsed there
                project = None
                print(f"lens parse worker: project did not unpickle: {exc}", file=sys.stderr)
            continue
        if kind == b"Q":
            usage = resource.getrusage(resource.RUSAGE_SELF)
            figures = {"peak_rss_kib": _peak_rss_kib(), "cpu_seconds": usage.ru_utime + usage.ru_stime}
            _write(sink, b"U", json.dumps(figures).encode())
            sink.flush()
            return
        reply = answer(payload, project)
        del payload
        _write(sink, *reply)
        sink.flush()


if __name__ == "__main__":
    main()
