"""`KubeReader.list` fetching pages ahead: the whole list, one request per page, in order, whether
or not a page's head says where the next page starts."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import orjson
import pytest

from lens_pipeline.clusters import ClusterConfig
from lens_pipeline.kube.reader import KubeError, KubeReader, _peek_continue
from lens_pipeline.memory import paused_gc

ITEMS = [{"metadata": {"name": f"pod-{n:03d}"}} for n in range(23)]


class PagedServer:
    """Serves ITEMS as a paged PodList; `items_first` writes `items` before `metadata`, as
    kube-apiserver does not; `fail_at` answers that page with a 500."""

    def __init__(self, *, items_first: bool = False, fail_at: int | None = None) -> None:
        self.items_first, self.fail_at = items_first, fail_at
        self.seen: list[str | None] = []  # the continue token of each request, in order
        self.asked = threading.Condition()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                query = parse_qs(urlparse(self.path).query)
                token = query.get("continue", [None])[0]
                with server.asked:
                    server.seen.append(token)
                    server.asked.notify_all()
                start, limit = int(token or 0), int(query["limit"][0])
                if server.fail_at is not None and start == server.fail_at:
                    self._send(500, {"kind": "Status", "message": "etcd is on fire"})
                    return
                metadata = {"resourceVersion": "7"}
                if start + limit < len(ITEMS):
                    metadata["continue"] = str(start + limit)
                items = ITEMS[start : start + limit]
                parts = [("items", items), ("metadata", metadata)]
                if not server.items_first:
                    parts.reverse()
                self._send(200, {"kind": "PodList", "apiVersion": "v1", **dict(parts)})

            def _send(self, status: int, document: dict) -> None:
                body = orjson.dumps(document)
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"


@pytest.fixture
def serve() -> Iterator:
    servers: list[PagedServer] = []

    def start(**options: object) -> PagedServer:
        server = PagedServer(**options)  # type: ignore[arg-type]
        threading.Thread(target=server.httpd.serve_forever, daemon=True).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.httpd.shutdown()
        server.httpd.server_close()


def reader_for(server: PagedServer) -> KubeReader:
    cluster = ClusterConfig(name="paged", server=server.url, token="t", request_timeout_seconds=5)
    return KubeReader(cluster, page_size=5, max_retries=0)


@pytest.mark.parametrize("items_first", [False, True], ids=["metadata-first", "items-first"])
def test_every_page_is_asked_once_in_order(serve, items_first):
    server = serve(items_first=items_first)
    with reader_for(server) as reader:
        names = reader.list("/api/v1/pods", lambda item: item["metadata"]["name"])
    assert names == [item["metadata"]["name"] for item in ITEMS]
    assert server.seen == [None, "5", "10", "15", "20"]
    assert reader.stats.pages == reader.stats.requests == 5


def test_later_pages_are_asked_while_the_first_is_projected(serve):
    server = serve()

    def project(item: dict) -> str:
        if item == ITEMS[0]:
            with server.asked:  # pages two and three are asked before page one is done with
                assert server.asked.wait_for(lambda: "10" in server.seen, timeout=10), server.seen
        return item["metadata"]["name"]

    with reader_for(server) as reader:
        assert len(reader.list("/api/v1/pods", project)) == len(ITEMS)
    assert server.seen == [None, "5", "10", "15", "20"]


def test_a_failed_page_is_the_lists_error(serve):
    server = serve(fail_at=10)
    with reader_for(server) as reader, pytest.raises(KubeError, match="HTTP 500: etcd is on fire"):
        reader.list("/api/v1/pods", lambda item: item)
    assert server.seen == [None, "5", "10"]  # nothing asked past the failed page


def test_the_continue_token_is_read_from_the_head_only():
    page = (
        b'{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"9","continue":"abc"},"items":[]}'
    )
    assert _peek_continue(page) == "abc"
    assert _peek_continue(page.replace(b',"continue":"abc"', b"")) is None  # the last page
    # A head that is not kube-apiserver's (items first, or not JSON) says nothing: the caller
    # parses the page and restarts the fetcher from the token it found.
    assert _peek_continue(b'{"items":[],"metadata":{"continue":"abc"}}') is None
    assert _peek_continue(b'{"metadata":{"continue":"abc"],"items":[]}') is None


@pytest.mark.parametrize("freeze", [True, False])
def test_the_cyclic_collector_is_paused_inside_and_back_after(freeze):
    frozen = gc.get_freeze_count()
    try:
        with paused_gc(freeze=freeze):
            built = [[n] for n in range(1000)]  # lists: always tracked by the collector
            with paused_gc():  # nested: still paused, and nothing frozen yet
                assert not gc.isenabled()
            # Other threads' frozen objects may be freed meanwhile: the count drifts by a few, not
            # by the thousand lists built here.
            assert not gc.isenabled() and gc.get_freeze_count() < frozen + len(built) // 2
        assert gc.isenabled()
        # Frozen: what was built is out of the collector's sight; not frozen: left where it was.
        assert (gc.get_freeze_count() >= frozen + len(built) // 2) is freeze
    finally:
        gc.unfreeze()
        gc.enable()


def test_a_list_given_up_half_way_leaves_no_request_behind(serve):
    server = serve()

    def broken(item: dict) -> None:
        raise RuntimeError("projection broke")

    with reader_for(server) as reader, pytest.raises(RuntimeError, match="projection broke"):
        reader.list("/api/v1/pods", broken)
    # The helper was waited for: whatever it had asked for is answered and counted, nothing later.
    asked = list(server.seen)
    assert reader.stats.requests == len(asked) <= 1 + 3
    assert not [t for t in threading.enumerate() if t.name == "kube-list"]
