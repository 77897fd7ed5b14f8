"""Instant PromQL queries through `prometheus-api-client`, returned as plain (labels, value) samples."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import requests
from prometheus_api_client import PrometheusApiClientException, PrometheusConnect
from urllib3.util.retry import Retry


class PromError(RuntimeError):
    def __init__(self, cluster: str, query: str, message: str) -> None:
        self.cluster, self.query = cluster, query
        super().__init__(f"cluster {cluster!r}: Prometheus query {query!r}: {message}")


@dataclass(frozen=True)
class Sample:
    labels: dict[str, str]
    value: float


@dataclass(frozen=True)
class Series:
    labels: dict[str, str]
    points: list[tuple[float, float]]


@dataclass
class PromReader:
    cluster: str
    url: str
    timeout_seconds: float = 30.0
    retries: int = 2
    queries: int = 0
    _client: PrometheusConnect | None = field(default=None, repr=False)

    @property
    def client(self) -> PrometheusConnect:
        if self._client is None:
            # Transient gateway errors are retried a little, then reported; the run never hangs on them.
            retry = Retry(
                total=self.retries,
                backoff_factor=0.2,
                status_forcelist=(429, 502, 503, 504),
                allowed_methods=("GET", "POST"),
            )
            self._client = PrometheusConnect(
                url=self.url, disable_ssl=False, timeout=self.timeout_seconds, retry=retry
            )
        return self._client

    def _ask(self, query: str, call: Callable[[], Any]) -> Any:
        self.queries += 1
        try:
            return call()
        except PrometheusApiClientException as exc:
            raise PromError(self.cluster, query, str(exc)[:300]) from None
        except requests.RequestException as exc:
            raise PromError(self.cluster, query, _request_failure(exc)) from None
        except ValueError as exc:  # a 200 whose body is not the JSON Prometheus answers with
            raise PromError(self.cluster, query, f"malformed response: {exc}") from None

    def vector(self, query: str) -> list[Sample]:
        """The samples of an instant query; NaN and infinite values are dropped."""
        result = self._ask(query, lambda: self.client.custom_query(query))
        samples = []
        for series in result or []:
            try:
                value = float(series["value"][1])
                labels = dict(series.get("metric") or {})
            except (KeyError, IndexError, TypeError, ValueError) as exc:
                raise PromError(self.cluster, query, f"malformed sample {series!r:.200}: {exc}") from None
            if math.isfinite(value):
                samples.append(Sample(labels, value))
        return samples

    def matrix(self, query: str, start: datetime, end: datetime, step_seconds: float) -> list[Series]:
        """The series of a range query, each with its (unix time, value) points; NaN and infinite
        values are dropped (spec §4.8)."""
        result = self._ask(
            query,
            lambda: self.client.custom_query_range(
                query, start_time=start, end_time=end, step=f"{step_seconds:g}"
            ),
        )
        out = []
        for series in result or []:
            try:
                labels = dict(series.get("metric") or {})
                points = [(float(t), float(v)) for t, v in series["values"]]
            except (KeyError, TypeError, ValueError) as exc:
                raise PromError(self.cluster, query, f"malformed series {series!r:.200}: {exc}") from None
            out.append(Series(labels, [(t, v) for t, v in points if math.isfinite(v)]))
        return out


def _request_failure(exc: requests.RequestException) -> str:
    """The root cause of a failed request ("too many 503 error responses", "Connection refused")."""
    cause: BaseException = exc
    for _ in range(5):
        inner = getattr(cause, "reason", None)
        if inner is None and cause.args and isinstance(cause.args[0], BaseException):
            inner = cause.args[0]
        if not isinstance(inner, BaseException) or inner is cause:
            break
        cause = inner
    return f"{type(exc).__name__}: {str(cause)[:200]}"
