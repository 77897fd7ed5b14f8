"""Instant PromQL queries through `prometheus-api-client`, returned as plain (labels, value) samples."""

from __future__ import annotations

import base64
import contextlib
import math
import os
import re
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import orjson
import requests
import requests.auth
from prometheus_api_client import PrometheusApiClientException, PrometheusConnect
from urllib3.util.retry import Retry

from lens_pipeline.clusters import PrometheusHttp, header_text, shown_url
from lens_pipeline.retry import PROM_REQUEST, PROM_RETRIES

# How far back the metric and label names are looked up: recent enough that what was renamed or
# removed is not seen, long enough for a few scrapes of a slow scrape interval.
LOOKBACK_SECONDS = 600.0
# The label `series_counts` tags each selector's count with (no exporter writes it).
SELECTOR_TAG = "lens_selector"

T = TypeVar("T")


# Examples of skipped samples kept per reader (the count has no limit).
MAX_MALFORMED_EXAMPLES = 50
# A range point's time past this (the year 2200) is no sample's: it would not even make a datetime.
MAX_UNIX_TIME = 7_258_118_400.0


class PromError(RuntimeError):
    def __init__(self, cluster: str, query: str, message: str) -> None:
        self.cluster, self.query = cluster, query
        super().__init__(f"cluster {cluster!r}: Prometheus query {query!r}: {message}")


@dataclass(frozen=True, slots=True)
class Sample:
    labels: dict[str, str]
    value: float


@dataclass(frozen=True)
class Series:
    labels: dict[str, str]
    points: list[tuple[float, float]]


@dataclass
class PromReader:
    """Instant and range queries of one cluster's Prometheus. `queries` counts the answers taken.

    `prefetch` asks instant queries in a background thread, in order, so that Prometheus evaluates
    them while the caller does other work (listing Kubernetes objects); `vector` then takes the
    answer, or the error, as if it had asked itself.
    """

    cluster: str
    url: str
    timeout_seconds: float = 30.0
    retries: int = PROM_RETRIES
    # TLS, credentials and headers from the registry (`prometheus_http`); None: open HTTP(S).
    http: PrometheusHttp | None = None
    queries: int = 0
    # NaN or infinite samples dropped, by query (a check names them: a GPU is not idle for lack of a number).
    nonfinite: dict[str, int] = field(default_factory=dict)
    # Samples (and range points) skipped because they were not what Prometheus answers (a value that
    # is no number, labels that are not text...): one such sample never costs the whole answer.
    malformed_samples: int = 0
    malformed_examples: list[str] = field(default_factory=list)
    _client: PrometheusConnect | None = field(default=None, repr=False)
    _session: requests.Session | None = field(default=None, repr=False)
    _early: dict[str, Future[bytes]] = field(default_factory=dict, repr=False)
    _pool: ThreadPoolExecutor | None = field(default=None, repr=False)
    _closed: bool = field(default=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def client(self) -> PrometheusConnect:
        if self._client is None:
            # Transient gateway errors are retried a little, then reported; the run never hangs on them.
            # urllib3's own backoff, set from the one table (lens_pipeline.retry).
            retry = Retry(
                total=self.retries,
                backoff_factor=PROM_REQUEST.first,
                backoff_max=PROM_REQUEST.cap,
                backoff_jitter=PROM_REQUEST.first * PROM_REQUEST.jitter,
                status_forcelist=(429, 502, 503, 504),
                allowed_methods=("GET", "POST"),
                # The last answer is reported with its body once the retries are spent ("no
                # endpoints available for service", from an API server's service proxy), not as
                # "too many 503 error responses".
                raise_on_status=False,
            )
            session = requests.Session()
            if self.http is not None:
                configure_session(session, self.http)
            self._client = PrometheusConnect(
                url=self.url, timeout=self.timeout_seconds, retry=retry, session=session
            )
            self._session = session
        return self._client

    def _connect(self, query: str) -> PrometheusConnect:
        """The client, or the query's PromError when none can be made (a malformed URL)."""
        try:
            return self.client
        except Exception as exc:
            raise PromError(self.cluster, query, f"no client for {self.url!r}: {exc}") from None

    def _ask(self, query: str, call: Callable[[PrometheusConnect], Any]) -> Any:
        client = self._connect(query)
        try:
            return call(client)
        except PrometheusApiClientException as exc:
            raise PromError(self.cluster, query, str(exc)[:300]) from None
        except requests.RequestException as exc:
            through = (
                f" (through the proxy {shown_url(self.http.proxy_url)})"
                if self.http is not None and self.http.proxy_url
                else ""
            )
            raise PromError(self.cluster, query, _request_failure(exc) + through) from None
        except OSError as exc:  # requests' own: a CA or client certificate file that is not there
            raise PromError(self.cluster, query, f"{type(exc).__name__}: {str(exc)[:200]}") from None
        except ValueError as exc:  # a 200 whose body is not the JSON Prometheus answers with
            raise PromError(self.cluster, query, f"malformed response: {exc}") from None

    def prefetch(self, queries: Sequence[str]) -> None:
        """Start asking `queries` (instant, in this order, one at a time) in the background."""
        with self._lock:  # not after `close`, which may run on another thread meanwhile
            fresh = [q for q in dict.fromkeys(queries) if q not in self._early]
            if not fresh or self._closed:
                return
            try:
                self._connect(fresh[0])  # made here, not raced for by the two threads
            except PromError:
                return  # `vector` raises it, query by query
            for query in fresh:
                self._early[query] = self._background().submit(self._answer, query)

    def in_background(self, work: Callable[[], T]) -> Future[T]:
        """Run `work` on the thread that asks the prefetched queries, after those asked so far; what
        it prefetches is asked after it. Once the reader is closed, `work` is not run (the future
        is cancelled)."""
        with self._lock:
            if self._closed:
                cancelled: Future[T] = Future()
                cancelled.cancel()
                return cancelled
            with contextlib.suppress(PromError):  # a bad URL is `work`'s own error
                self._connect("")  # made here, not raced for by the two threads
            return self._background().submit(work)

    def forget(self, queries: Sequence[str]) -> None:
        """Drop the prefetched answers of `queries` nobody will take: those not yet sent are not sent."""
        for query in queries:
            early = self._early.pop(query, None)
            if early is not None:
                early.cancel()

    def _background(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"prom-{self.cluster}")
        return self._pool

    def close(self) -> None:
        """Drop the prefetched answers nobody took: queries not yet sent are not sent, and the
        connections are closed (a request under way fails instead of running on). Nothing is asked
        ahead after (what is asked directly opens new connections)."""
        with self._lock:
            self._closed = True
            if self._pool is not None:
                self._pool.shutdown(wait=False, cancel_futures=True)
                self._pool = None
            self._early.clear()
            # Taken under the lock: two threads closing one reader (a turn's end and the thread
            # that learned the dialect on it) close its session once.
            session, self._session, self._client = self._session, None, None
        if session is not None:
            session.close()

    def vector(self, query: str, *, keep_nonfinite: bool = False) -> list[Sample]:
        """The samples of an instant query. Malformed samples are skipped and counted
        (`malformed_samples`); NaN and infinite values are dropped and counted in `nonfinite` (by
        query), unless `keep_nonfinite` asks for them."""
        self.queries += 1
        early = self._early.pop(query, None)
        body = early.result() if early is not None and not early.cancelled() else self._answer(query)
        samples, skipped = self._samples(query, body)
        self._skipped(query, skipped)
        if keep_nonfinite:
            return samples
        finite = [s for s in samples if math.isfinite(s.value)]
        if len(finite) != len(samples):
            self.nonfinite[query] = self.nonfinite.get(query, 0) + len(samples) - len(finite)
        return finite

    def _answer(self, query: str) -> bytes:
        """The body of Prometheus' answer to the instant `query`, read but not parsed (on the
        prefetch thread or the caller's). `vector` parses it on the caller's thread: samples built
        on the prefetch thread competed for the GIL with the collector's thread, and eleven answers'
        samples held at once raised the peak RSS by about 100 MiB at the envelope."""
        return self._ask(query, lambda _client: self._instant(query))

    def _samples(self, query: str, body: bytes) -> tuple[list[Sample], list[str]]:
        """The answer's samples and a description of each malformed one."""
        samples, skipped = [], []
        for series in _result_list(self.cluster, query, _parse_answer(self.cluster, query, body)):
            try:
                labels = _labels(series)
                value = series["value"]
                if not isinstance(value, list) or len(value) != 2 or not isinstance(value[1], str):
                    raise ValueError('value should be [time, "number"]')
                samples.append(Sample(labels, float(value[1])))
            except (KeyError, TypeError, ValueError) as exc:
                skipped.append(f"{exc}: {series!r:.200}")
        return samples, skipped

    def malformed_since(self, mark: int) -> tuple[int, list[str]]:
        """The samples skipped since `malformed_samples` was `mark`, and the first examples of them."""
        return self.malformed_samples - mark, self.malformed_examples[mark:]

    def _skipped(self, query: str, skipped: list[str]) -> None:
        self.malformed_samples += len(skipped)
        room = MAX_MALFORMED_EXAMPLES - len(self.malformed_examples)
        self.malformed_examples += [f"{query}: {what}" for what in skipped[: max(room, 0)]]

    def _instant(self, query: str) -> bytes:
        """What `custom_query(query)` asks, on the session the client was given (its retries
        mounted); the body is parsed by `_parse_answer`, not by the client's standard `json`."""
        assert self._session is not None  # made with the client, by `_ask`
        response = self._session.get(
            f"{self.url}/api/v1/query",
            params={"query": query},
            timeout=self.timeout_seconds,
            # Said per request, as the client does: requests lets $REQUESTS_CA_BUNDLE override a
            # session's own CA file otherwise.
            verify=self._session.verify,
        )
        if response.status_code != 200:
            raise PrometheusApiClientException(
                f"HTTP Status Code {response.status_code} ({response.content!r})"
            )
        return response.content

    def metric_names(self, lookback_seconds: float = LOOKBACK_SECONDS) -> set[str]:
        """Every metric name with samples in the last `lookback_seconds`: one request, whatever the
        number of series (a metric renamed a month ago is not seen)."""
        self.queries += 1
        query = "label __name__ values"
        names = self._ask(
            query, lambda c: c.get_label_values("__name__", params=self._recent(lookback_seconds))
        )
        if not isinstance(names, list):
            raise PromError(self.cluster, query, f"malformed response: {names!r:.200}")
        return {str(n) for n in names}

    def label_names(self, *selectors: str, lookback_seconds: float = LOOKBACK_SECONDS) -> set[str]:
        """The label names of the series the selectors match, over the last `lookback_seconds`."""
        self.queries += 1
        query = f"labels of {' or '.join(selectors)}"
        params: dict[str, Any] = {**self._recent(lookback_seconds), "match[]": list(selectors)}
        names = self._ask(query, lambda c: c.get_label_names(params=params))
        if not isinstance(names, list):
            raise PromError(self.cluster, query, f"malformed response: {names!r:.200}")
        return {str(n) for n in names}

    def series_counts(self, selectors: Sequence[str]) -> dict[str, float]:
        """How many series each selector has now (0 for none), in one instant query: each count
        tagged with its selector's position by `label_replace`, joined by `or`."""
        if not selectors:
            return {}
        tagged = " or ".join(
            f'label_replace(count({selector}), "{SELECTOR_TAG}", "{i}", "", "")'
            for i, selector in enumerate(selectors)
        )
        counts = {s.labels.get(SELECTOR_TAG): s.value for s in self.vector(tagged)}
        return {selector: counts.get(str(i), 0.0) for i, selector in enumerate(selectors)}

    def pod_is_targets(self, metric: str, pod_label: str) -> bool:
        """Whether every series of `metric` carries the `pod_label` of its scrape target (the same
        (instance, pod) as the target's `up` series): the scrape configuration's label, not one the
        exporter wrote (which honor_labels: true keeps, and `up` never has)."""

        def pairs(query: str) -> set[tuple[str, str]]:
            return {(s.labels.get("instance", ""), s.labels.get(pod_label, "")) for s in self.vector(query)}

        by = f"count by (instance, {pod_label})"
        series, targets = pairs(f"{by} ({metric})"), pairs(f"{by} (up)")  # always two requests
        return bool(series) and all(pod for _, pod in series) and series <= targets

    @staticmethod
    def _recent(lookback_seconds: float) -> dict[str, str]:
        now = time.time()
        return {"start": f"{now - lookback_seconds:.3f}", "end": f"{now:.3f}"}

    def matrix(self, query: str, start: datetime, end: datetime, step_seconds: float) -> list[Series]:
        """The series of a range query, each with its (unix time, value) points; NaN and infinite
        values are dropped (spec §4.8)."""
        self.queries += 1
        result = self._ask(
            query,
            lambda client: client.custom_query_range(
                query, start_time=start, end_time=end, step=f"{step_seconds:g}"
            ),
        )
        out, skipped = [], []
        for series in _result_list(self.cluster, query, result):
            try:
                labels = _labels(series)
                values = series["values"]
                if not isinstance(values, list):
                    raise TypeError("values should be a list")
            except (KeyError, TypeError, ValueError) as exc:
                skipped.append(f"{exc}: {series!r:.200}")
                continue
            points = []
            for point in values:
                try:
                    if not isinstance(point, list) or len(point) != 2 or not isinstance(point[1], str):
                        raise ValueError('a point should be [time, "number"]')
                    when = float(point[0])
                    if not 0 <= when < MAX_UNIX_TIME:
                        raise ValueError(f"time {when} is no time of a sample")
                    points.append((when, float(point[1])))
                except (TypeError, ValueError) as exc:
                    skipped.append(f"{exc}: {labels} {point!r:.100}")
            finite = [(t, v) for t, v in points if math.isfinite(v)]
            if len(finite) != len(points):
                self.nonfinite[query] = self.nonfinite.get(query, 0) + len(points) - len(finite)
            out.append(Series(labels, finite))
        self._skipped(query, skipped)
        return out


def _parse_answer(cluster: str, query: str, body: bytes) -> Any:
    """The `result` of an instant query's answer, parsed by orjson: an answer naming every GPU of a
    5,000-node cluster is megabytes of JSON, several times slower to parse with the standard `json`
    the client uses."""
    try:
        return orjson.loads(body)["data"]["result"]
    except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
        raise PromError(cluster, query, f"malformed response: not a Prometheus answer: {exc}") from None


def _result_list(cluster: str, query: str, result: Any) -> list:
    """The answer's `result`: a list of series, or an error for the whole answer."""
    if result is None:
        return []
    if not isinstance(result, list):
        raise PromError(cluster, query, f"malformed response: result should be a list, got {result!r:.200}")
    return result


def _labels(series: Any) -> dict[str, str]:
    """A series' labels; a series that is not an object, or labels that are not text, are malformed."""
    if not isinstance(series, dict):
        raise TypeError("a series should be an object")
    labels = series.get("metric") or {}
    if not isinstance(labels, dict):
        raise TypeError("metric should map label names to text")
    try:  # joined in C: a name or value that is not text fails the join (a loop was 1-2 µs a label)
        text = "".join(labels) + "".join(labels.values())
    except TypeError:
        raise TypeError("metric should map label names to text") from None
    if "\x00" in text:
        raise ValueError("a label holds a NUL character (no text column stores one)")
    return labels


def configure_session(session: requests.Session, http: PrometheusHttp) -> None:
    """Give `session` the registry's TLS settings, headers and credentials for one Prometheus."""
    tls = http.tls_config
    session.verify = False if tls.insecure_skip_verify else (tls.ca_file or True)
    if tls.cert_file and tls.key_file:
        session.cert = (tls.cert_file, tls.key_file)
    # Several values of one header go as one comma-separated line (RFC 9110's list form).
    session.headers.update({name: ", ".join(header.values) for name, header in http.http_headers.items()})
    if http.authorization is not None or http.basic_auth is not None:
        session.auth = _RegistryAuthorization(http)
    if http.proxy_url:
        # A SOCKS proxy resolves the names (socks5h), as Go's dialer, hence Prometheus, has it.
        proxy = re.sub(r"^socks5://", "socks5h://", http.proxy_url, flags=re.IGNORECASE)
        session.proxies = {"http": proxy, "https": proxy}
        # requests lets the environment's proxies win over a session's: not this one's. Its CA
        # bundle ($REQUESTS_CA_BUNDLE, which requests reads only while it trusts the environment)
        # still stands in for the system's CAs.
        session.trust_env = False
        if session.verify is True:
            session.verify = os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE") or True


class _RegistryAuthorization(requests.auth.AuthBase):
    """The Authorization header of `prometheus_http`, its secret file read at every request as
    Prometheus reads its own http_config's files: a rotated token or password is used at once (a
    projected service account token changes every hour)."""

    def __init__(self, http: PrometheusHttp) -> None:
        self.http = http

    def __call__(self, request: requests.PreparedRequest) -> requests.PreparedRequest:
        authorization, basic = self.http.authorization, self.http.basic_auth
        if authorization is not None:
            secret = authorization.credentials or _secret(authorization.credentials_file, "credentials_file")
            request.headers["Authorization"] = f"{authorization.type} {secret}"
        elif basic is not None:
            # No password at all: an empty one, as Prometheus sends.
            password = (
                _secret(basic.password_file, "password_file") if basic.password_file else basic.password or ""
            )
            pair = base64.b64encode(f"{basic.username}:{password}".encode()).decode("ascii")
            request.headers["Authorization"] = f"Basic {pair}"
        return request


def _secret(path: str | None, what: str) -> str:
    """A secret file's content less the white space around it, as Prometheus reads one. Raised as a
    RequestException, so that the query fails with the cause named, as a refused connection does;
    never with the content."""
    try:
        secret = Path(str(path)).read_text(encoding="utf-8").strip()
        return str(header_text(secret, f"{what} {str(path)!r}"))
    except (OSError, UnicodeDecodeError) as exc:
        raise requests.exceptions.InvalidHeader(
            f"prometheus_http {what} {str(path)!r} cannot be read ({type(exc).__name__})"
        ) from None
    except ValueError as exc:
        raise requests.exceptions.InvalidHeader(f"prometheus_http {exc}") from None


def _request_failure(exc: requests.RequestException) -> str:
    """The root cause of a failed request ("Connection refused", "CERTIFICATE_VERIFY_FAILED")."""
    cause: BaseException = exc
    for _ in range(5):
        inner = getattr(cause, "reason", None)
        if inner is None and cause.args and isinstance(cause.args[0], BaseException):
            inner = cause.args[0]
        if not isinstance(inner, BaseException) or inner is cause:
            break
        cause = inner
    return f"{type(exc).__name__}: {str(cause)[:200]}"
