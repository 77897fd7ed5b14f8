"""Every watch the simulator serves, streamed from one thread.

A request's own thread answers a watch's headers and opening events, then hands the connection
here and ends. This thread keeps each connection non-blocking in one selector: it steps a stream
when its cluster says its kind changed (`Stream.subscribe`) or when it is due (a bookmark, the end of
the watch), writes what the step gave as one HTTP chunk, and notices a client that went away (its
connection reads as closed). A 100-cluster fleet keeps about 1,300 watches open; as a thread each,
woken by their clusters' changes, they kept hundreds of threads runnable at once and the simulator
starved the pipeline it was there to exercise (docs/BENCHMARKS.md, sixteenth pass).

A watch's response says `Connection: close`: its connection ends with it (a client watches again
on a new one, as HTTP/1.1 allows).
"""

from __future__ import annotations

import contextlib
import functools
import heapq
import itertools
import logging
import selectors
import socket
import ssl
import threading
import time
from collections.abc import Callable

from lens_pipeline.sim.wire import Stream, http_chunk

log = logging.getLogger(__name__)

# Changes that come close together go out together: a pass over the woken streams at most this often.
MIN_PASS_SECONDS = 0.01
# What one send offers the socket (a TLS write retried after "would block" must offer at least as
# much as the first try: the front of the buffer stays in place until it is written).
SEND_SLICE = 256 << 10
# A client that lets this much wait unread is too slow to follow the watch: its connection is closed
# (kube-apiserver drops a watcher whose buffer fills, and the client watches again).
MAX_UNSENT = 64 << 20
_WOULD_BLOCK = (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError)


class _Streamed:
    __slots__ = ("cancel", "due", "ended", "events", "sock", "stream", "unsent")

    def __init__(self, sock: socket.socket, stream: Stream) -> None:
        self.sock, self.stream = sock, stream
        self.unsent = bytearray()
        self.ended = False
        self.due = 0.0
        self.cancel: Callable[[], None] = lambda: None
        self.events = selectors.EVENT_READ


class WatchStreams:
    """The streaming thread of one simulator server (`adopt` a connection, `stop` closes them all)."""

    def __init__(self) -> None:
        self._selector = selectors.DefaultSelector()
        self._wake_in, self._wake_out = socket.socketpair()
        for end in (self._wake_in, self._wake_out):
            end.setblocking(False)
        self._selector.register(self._wake_in, selectors.EVENT_READ, None)
        self._lock = threading.Lock()
        self._adopted: list[_Streamed] = []
        self._woken: set[_Streamed] = set()
        self._signalled = False
        self._stopping = False
        self._open: set[_Streamed] = set()
        self._due: list[tuple[float, int, _Streamed]] = []
        self._order = itertools.count()
        self._thread = threading.Thread(target=self._run, name="lens-sim-watches", daemon=True)
        self._thread.start()

    def __len__(self) -> int:
        """Streams open now."""
        return len(self._open)

    def adopt(self, sock: socket.socket, stream: Stream) -> None:
        """Stream `stream` on `sock` from now on (its headers and opening are written); the
        connection is this thread's to close."""
        streamed = _Streamed(sock, stream)
        with self._lock:
            accepted = not self._stopping
            if accepted:
                self._adopted.append(streamed)
                signal = self._signal_locked()
        if not accepted:
            _close(sock)
        elif signal:
            self._send_signal()

    def stop(self, timeout: float = 5.0) -> None:
        """Close every stream (mid-watch, as a stopping API server does) and end the thread."""
        with self._lock:
            self._stopping = True
        self._send_signal()
        self._thread.join(timeout)

    # The streaming thread ------------------------------------------------------------------------

    def _wake(self, streamed: _Streamed) -> None:
        """A change its stream may send (called by the changing thread: only takes note)."""
        with self._lock:
            self._woken.add(streamed)
            signal = self._signal_locked()
        if signal:
            self._send_signal()

    def _signal_locked(self) -> bool:
        """Whether the thread is still to be signalled (once between two of its passes)."""
        signal, self._signalled = not self._signalled, True
        return signal

    def _send_signal(self) -> None:
        with contextlib.suppress(OSError):  # full or closed: the thread wakes or has ended anyway
            self._wake_out.send(b"\0")

    def _run(self) -> None:
        try:
            while self._pass():
                pass
        except Exception:  # a bug here must not leave clients hanging on open connections
            log.exception("the simulator's watch streams failed; closing them")
        finally:
            with self._lock:
                self._stopping = True
                adopted, self._adopted = self._adopted, []
            for streamed in [*adopted, *self._open]:
                self._close(streamed)
            self._selector.close()
            self._wake_in.close()
            self._wake_out.close()

    def _pass(self) -> bool:
        now = time.monotonic()
        timeout = 1.0 if not self._due else min(1.0, max(0.0, self._due[0][0] - now))
        for key, mask in self._selector.select(timeout):
            streamed = key.data
            if streamed is None:
                with contextlib.suppress(OSError):
                    self._wake_in.recv(4096)
                continue
            if mask & selectors.EVENT_READ:
                self._read(streamed)
            if mask & selectors.EVENT_WRITE and streamed in self._open:
                self._flush(streamed)
        with self._lock:
            if self._stopping:
                return False
            adopted, self._adopted = self._adopted, []
            woken, self._woken = self._woken, set()
            self._signalled = False
        for streamed in adopted:
            self._open.add(streamed)
            streamed.sock.setblocking(False)
            self._selector.register(streamed.sock, streamed.events, streamed)
            streamed.cancel = streamed.stream.subscribe(functools.partial(self._wake, streamed))
            woken.add(streamed)
        now = time.monotonic()
        while self._due and self._due[0][0] <= now:
            due, _, streamed = heapq.heappop(self._due)
            if due == streamed.due:  # else stepped since, and pushed again
                woken.add(streamed)
        for streamed in woken:
            if streamed in self._open and not streamed.ended:
                self._step(streamed, now)
        if woken:
            time.sleep(MIN_PASS_SECONDS)
        return True

    def _step(self, streamed: _Streamed, now: float) -> None:
        try:
            data, ended = streamed.stream.step(now)
        except Exception:
            log.exception("a watch failed; ending it")
            data, ended = b"", True
        if data:
            streamed.unsent += http_chunk(data)
        if ended:
            streamed.ended = True
            streamed.unsent += b"0\r\n\r\n"
        else:
            streamed.due = streamed.stream.due()
            heapq.heappush(self._due, (streamed.due, next(self._order), streamed))
        self._flush(streamed)

    def _flush(self, streamed: _Streamed) -> None:
        unsent = streamed.unsent
        while unsent:
            try:
                sent = streamed.sock.send(bytes(unsent[:SEND_SLICE]))
            except _WOULD_BLOCK:
                break
            except OSError:  # the client went away
                self._close(streamed)
                return
            del unsent[:sent]
        if not unsent and streamed.ended:
            self._close(streamed)
            return
        if len(unsent) > MAX_UNSENT:
            log.warning("a watch client left %d bytes unread; closing its connection", len(unsent))
            self._close(streamed)
            return
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if unsent else 0)
        if events != streamed.events:
            streamed.events = events
            self._selector.modify(streamed.sock, events, streamed)

    def _read(self, streamed: _Streamed) -> None:
        """A watch's client sends nothing more: readable means it closed (or broke) its end."""
        try:
            data = streamed.sock.recv(4096)
        except _WOULD_BLOCK:
            return
        except OSError:
            data = b""
        if not data:
            self._close(streamed)

    def _close(self, streamed: _Streamed) -> None:
        if streamed in self._open:
            self._open.discard(streamed)
            with contextlib.suppress(KeyError, ValueError, OSError):
                self._selector.unregister(streamed.sock)
        streamed.cancel()
        streamed.ended = True
        streamed.due = -1.0
        _close(streamed.sock)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.close()
