"""`PromReader` over real HTTP against answers no Prometheus should give: one malformed sample is
skipped and counted, never the whole answer's loss; an answer that is not a list of series at all
is an error for that query."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import orjson
import pytest

from lens_pipeline.prom.reader import MAX_MALFORMED_EXAMPLES, PromError, PromReader

GOOD = {"metric": {"hostname": "node-1", "gpu_id": "0"}, "value": [1.7e9, "42.5"]}
# Samples an instant answer must not contain, each named by what is wrong with it.
MALFORMED_SAMPLES = {
    "value not a number": {"metric": {"gpu_id": "1"}, "value": [1.7e9, "busy"]},
    "value a bare number": {"metric": {"gpu_id": "2"}, "value": [1.7e9, 3]},
    "value missing": {"metric": {"gpu_id": "3"}},
    "value too short": {"metric": {"gpu_id": "4"}, "value": [1.7e9]},
    "value a mapping": {"metric": {"gpu_id": "5"}, "value": {"a": 1}},
    "labels a list": {"metric": ["gpu_id"], "value": [1.7e9, "1"]},
    "label value a number": {"metric": {"gpu_id": 6}, "value": [1.7e9, "1"]},
    "label value a mapping": {"metric": {"gpu_id": {"x": 1}}, "value": [1.7e9, "1"]},
    "NUL in a label": {"metric": {"hostname": "node\u0000"}, "value": [1.7e9, "1"]},
    "series a string": "gpu 7",
    "series null": None,
}
MALFORMED_SERIES = {
    "values a mapping": {"metric": {"gpu_id": "1"}, "values": {"a": 1}},
    "values missing": {"metric": {"gpu_id": "2"}},
    "labels not text": {"metric": {"gpu_id": 2}, "values": [[1.7e9, "1"]]},
    "series a number": 5,
}
MALFORMED_POINTS = [[1.7e9, "idle"], [1.7e9], "point", [1e300, "1"], [-5, "1"], [None, "1"], [1.7e9, 1]]


class CannedPrometheus:
    """Answers every query with `instant` (/api/v1/query) or `range` (/api/v1/query_range) as its
    `data.result`, wrapped as Prometheus wraps it; or with `body` as it is, when set."""

    def __init__(self) -> None:
        self.instant: object = []
        self.range: object = []
        self.body: bytes | None = None
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                ranged = self.path.startswith("/api/v1/query_range")
                result = server.range if ranged else server.instant
                kind = "matrix" if ranged else "vector"
                body = server.body or orjson.dumps(
                    {"status": "success", "data": {"resultType": kind, "result": result}}
                )
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_POST = do_GET

            def log_message(self, *_args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True).start()

    def reader(self) -> PromReader:
        return PromReader("canned", f"http://127.0.0.1:{self.httpd.server_address[1]}", 5, retries=0)


@pytest.fixture
def prometheus() -> Iterator[CannedPrometheus]:
    served = CannedPrometheus()
    yield served
    served.httpd.shutdown()
    served.httpd.server_close()


def test_malformed_samples_are_skipped_and_counted_the_good_ones_kept(prometheus):
    prometheus.instant = [GOOD, *MALFORMED_SAMPLES.values(), GOOD]
    reader = prometheus.reader()
    samples = reader.vector("gpu_utilization")
    assert [(s.labels, s.value) for s in samples] == [(GOOD["metric"], 42.5)] * 2
    assert reader.malformed_samples == len(MALFORMED_SAMPLES)
    assert len(reader.malformed_examples) == len(MALFORMED_SAMPLES)
    assert all(e.startswith("gpu_utilization: ") for e in reader.malformed_examples)
    assert any("NUL" in e for e in reader.malformed_examples)


def test_prefetched_answers_count_their_malformed_samples_when_taken(prometheus):
    prometheus.instant = [GOOD, MALFORMED_SAMPLES["value not a number"]]
    reader = prometheus.reader()
    reader.prefetch(["q"])
    mark = reader.malformed_samples
    assert len(reader.vector("q")) == 1
    assert reader.malformed_since(mark)[0] == 1
    reader.close()


def test_malformed_series_and_points_of_a_range_answer_are_skipped_and_counted(prometheus):
    good = {"metric": {"gpu_id": "0"}, "values": [[1.7e9, "1"], *MALFORMED_POINTS, [1.7e9 + 30, "NaN"]]}
    prometheus.range = [*MALFORMED_SERIES.values(), good]
    reader = prometheus.reader()
    start = datetime(2026, 1, 1, tzinfo=UTC)
    series = reader.matrix("gpu_utilization", start, start, 30)
    assert [(s.labels, s.points) for s in series] == [({"gpu_id": "0"}, [(1.7e9, 1.0)])]
    assert reader.malformed_samples == len(MALFORMED_SERIES) + len(MALFORMED_POINTS)
    assert reader.nonfinite == {"gpu_utilization": 1}  # NaN is a number: counted apart


def test_examples_are_bounded_the_count_is_not(prometheus):
    prometheus.instant = [MALFORMED_SAMPLES["value not a number"]] * 3000
    reader = prometheus.reader()
    assert reader.vector("q") == []
    assert reader.malformed_samples == 3000 and len(reader.malformed_examples) == MAX_MALFORMED_EXAMPLES


@pytest.mark.parametrize("result", [{"a": 1}, "text", 5])
def test_an_answer_that_is_no_list_of_series_is_an_error_for_the_query(prometheus, result):
    prometheus.instant = result
    with pytest.raises(PromError, match="result should be a list"):
        prometheus.reader().vector("gpu_utilization")


@pytest.mark.parametrize("ahead", [False, True], ids=["asked", "asked-ahead"])
@pytest.mark.parametrize(
    "body",
    [b"<html>gateway</html>", b'{"status": "success"}', b'{"data": 5}'],
    ids=["html", "no-data", "data-5"],
)
def test_a_200_that_is_no_prometheus_answer_is_an_error_for_the_query(prometheus, body, ahead):
    """Answers asked ahead are read on the background thread and parsed when taken: a body that is
    no Prometheus answer is the same error either way."""
    prometheus.body = body
    reader = prometheus.reader()
    try:
        if ahead:
            reader.prefetch(["gpu_utilization"])
        with pytest.raises(PromError, match=r"gpu_utilization.*malformed response: not a Prometheus answer"):
            reader.vector("gpu_utilization")
    finally:
        reader.close()
