"""A seeded sweep of hostile read-API requests, in process, on SQLite and on PostgreSQL.

On a Lens database the pipeline filled from a simulated fleet of two clusters, at least
`REQUESTS_PER_DIALECT` generated requests per dialect go to every route of the app (listed from
`app.routes`, parameters from its OpenAPI description), through one `TestClient`: each parameter and
path segment drawn from a table of hostile values (integers past any limit, "1e309" and "NaN", NUL
percent-encoded and raw, 10 KB and 100 KB strings, RTL, emoji, combining marks, lone surrogates,
SQL and PromQL injections, path traversal, trailing newlines, repeated, unknown and empty
parameters) or a valid one, and about one request in five with a missing or wrong token.
`random.Random(SEED)`: the same requests every run (`LENS_HOSTILE_SEED` and `LENS_HOSTILE_REQUESTS`
choose another sweep, as reproducible).

It proves, for every request: no 5xx (a failure names the request and, for an exception, the line
that raised it); a request NUL or oversize (`QueryGuard`) is a 400; without the right token a `/v1`
route answers 401 and no route answers data but the public ones; every 4xx is the API's envelope
(`meta.code` = status x 10, a message, `data` null); and no request changed a row: the row count of
every Lens table is the same after the sweep as before. The figures (requests, answers by status,
time) are printed: `pytest -s` shows them.
"""

from __future__ import annotations

import io
import json
import os
import random
import sys
import time
import traceback
from collections import Counter
from collections.abc import Iterator
from contextlib import redirect_stderr
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

import pytest
from dagster import instance_for_test
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import Engine, func, select

from lens_pipeline.api.app import (
    MAX_PAGE_NUM,
    MAX_PAGE_SIZE,
    MAX_QUERY_BYTES,
    NODE_STATUSES,
    WORKLOAD_STATUSES,
    create_app,
)
from lens_pipeline.api.queries import NODE_ORDER, WORKLOAD_ORDER
from lens_pipeline.clusters import load_registry
from lens_pipeline.defs.partitions import CLUSTER_PARTITIONS_NAME
from lens_pipeline.sim.fleet import SimFleet
from lens_pipeline.sim.registry import write_registry
from lens_pipeline.sim.server import SimServer
from lens_pipeline.store.db import get_engine
from lens_pipeline.store.schema import gpu_workload, lens_metadata, node
from lens_pipeline_tests.api.test_api import INJECTIONS
from lens_pipeline_tests.conftest import _server_database
from lens_pipeline_tests.defs.test_derived_against_truth import run_cluster

TOKEN = "s3cret-token"
# The suite's sweep; `LENS_HOSTILE_SEED=<n> LENS_HOSTILE_REQUESTS=<n>` runs another, reproducibly
# (docs/RELIABILITY.md lists the seeds run by hand).
SEED = int(os.environ.get("LENS_HOSTILE_SEED", "20250101"))
REQUESTS_PER_DIALECT = int(os.environ.get("LENS_HOSTILE_REQUESTS", "10000"))
SHOWN_FAILURES = 25
HTTPX_MAX_URL = 65_536


def q(text: str) -> str:
    """`text` percent-encoded as a client sends it (UTF-8, every reserved character escaped)."""
    return quote(text, safe="")


def _encoded(category: str, *texts: str) -> list[tuple[str, str]]:
    return [(category, q(t)) for t in texts]


def _wire(category: str, *wires: str) -> list[tuple[str, str]]:
    """Values exactly as they go on the wire (already escaped, or deliberately not)."""
    return [(category, w) for w in wires]


# (category, the value as it goes on the wire). httpx refuses a URL with a control character or over
# `HTTPX_MAX_URL` characters: those requests go to the app as a raw ASGI scope instead.
HOSTILE: list[tuple[str, str]] = [
    *_encoded(
        "integer",
        str(2**63),
        str(2**63 - 1),
        str(2**64 + 1),
        str(-(2**63) - 1),
        str(10**30),
        "-1",
        "0",
        "-0",
        "+1",
        "1e309",
        "-1e309",
        "1e3",
        "NaN",
        "nan",
        "inf",
        "-Infinity",
        "1.0",
        "1.5",
        "0x10",
        "1_000",
        " 1",
        "1 ",
        "\u0663",  # ARABIC-INDIC DIGIT THREE: int() takes it
        "\uff11",  # FULLWIDTH DIGIT ONE
        "9" * 5_000,  # past int()'s 4300-digit limit
        str(MAX_PAGE_NUM + 1),
        str(MAX_PAGE_SIZE + 1),
    ),
    *_encoded("nul", "\x00", "gpu\x00-1", "a\x00", "\x00\x00", "Ready\x00"),
    *_wire("nul", "%00", "x%00y", "%2500", "%c0%80"),  # %2500 is the text "%00"; %c0%80 an overlong NUL
    *_wire("raw-control", "\x00", "gpu\x00node", "x\x00", "Ready\n", "\r\n", "\x7f", "a\tb"),
    *_encoded("long", "x" * 10_240, "\u00e9" * 5_120, "y" * 102_400, "a%_" * 2_000, "z" * 7_900),
    *_encoded(
        "unicode",
        "\u202egpu-1\u202c",
        "\u0645\u0631\u062d\u0628\u0627",
        "\u05e9\u05dc\u05d5\u05dd",
        "\U0001f525\U0001f4a5\U0001f916",
        "\U0001f468\u200d\U0001f469\u200d\U0001f467",
        "e\u0301\u0302\u0303\u0304",
        "Z\u0334\u0321a\u0336\u031bl\u0337g\u0338o\u0335",
        "\u200b",
        "\ufeff",
        "\uff47\uff50\uff55",
        "\u0130",
        "\u00df",
        "\uffff",
        "\U0010ffff",
        "Ready\u200b",
        "\uff32\uff45\uff41\uff44\uff59",
    ),
    *_wire("unicode", "%ED%A0%80", "%ED%B0%80", "a%ED%A0%80b", "%FF%FE", "%C3", "%E2%82"),
    *_encoded(
        "sql",
        *INJECTIONS,
        "1; SELECT pg_sleep(10)--",
        "' OR 1=1; DELETE FROM node; --",
        "name DESC",
        "name; DROP TABLE node",
        "1 UNION SELECT NULL--",
        "%",
        "_",
        "\\",
        "%%",
        "\\%",
        "' || (SELECT current_user) || '",
        "$$; DROP TABLE gpu_workload; $$",
        "E'\\\\x00'",
        "1)) OR ((1=1",
        "gpu_allocation desc, (select 1)",
        'name COLLATE "C"',
        "`node`",
        "node.name",
        "\"; ATTACH DATABASE '/tmp/x.db' AS x; --",
    ),
    *_encoded(
        "promql",
        'up{job=~".+"}',
        "sum(rate(DCGM_FI_DEV_GPU_UTIL[5m])) or vector(1)",
        '"}) or vector(1) #',
        '{__name__=~".+"}',
        'x"} or on() vector(1) #{',
        'label_replace(up, "a", "$1", "b", "(.*)")',
        "=~.*",
    ),
    *_encoded(
        "traversal",
        "../../etc/passwd",
        "..",
        ".",
        "/",
        "..\\..\\windows\\win.ini",
        "....//....//",
        "/etc/passwd",
        "%2e%2e%2f",
    ),
    *_wire("traversal", "..%2F..%2Fetc%2Fpasswd", "%2e%2e", "..", "."),
    *_encoded("newline", "\n", "\r\n", "x\n", "a\rb", "\t"),
    *_wire("empty", "", "", "+", "%20", "%09"),
]
CATEGORIES = sorted({c for c, _ in HOSTILE})
UNKNOWN_PARAMS = (
    "foo",
    "limit",
    "offset",
    "q",
    "Cluster",
    "cluster[]",
    "page",
    "__proto__",
    "$where",
    "sort",
)
RIGHT_TOKENS = (f"Bearer {TOKEN}", f"bearer {TOKEN}", f"BEARER {TOKEN}")
WRONG_TOKENS: tuple[str | bytes | None, ...] = (
    None,
    "",
    "Bearer",
    "Bearer ",
    f"Bearer {TOKEN[:-1]}",
    f"Bearer {TOKEN}x",
    f"Bearer  {TOKEN}",
    f"Basic {TOKEN}",
    TOKEN,
    f"Bearer {TOKEN.upper()}",
    "Bearer ' OR '1'='1",
    "Bearer " + "A" * 10_000,
    f"Bearer {TOKEN[:-1]}\u00e9".encode("latin-1"),
    f"Token {TOKEN}",
)


@dataclass
class Sent:
    """One request as the app saw it, and its answer."""

    method: str
    url: str  # path?query as it went on the wire
    token: str
    authorized: bool
    path: str  # the ASGI scope's decoded path
    query: bytes  # the ASGI scope's query string
    raw: bool
    status: int = 0
    content_type: str = ""
    body: bytes = b""
    error: str | None = None

    def describe(self) -> str:
        url = self.url if len(self.url) <= 300 else f"{self.url[:300]}... ({len(self.url)} chars)"
        body = self.body[:300].decode("utf-8", "replace")
        where = f"\n    raised: {self.error}" if self.error else ""
        return (
            f"{self.method} {url!r} ({'raw ASGI scope' if self.raw else 'TestClient'}, "
            f"token {self.token}) -> {self.status} {body!r}{where}"
        )


@dataclass
class Figures:
    dialect: str
    seed: int
    requests: int = 0
    raw: int = 0
    unauthorized: int = 0
    seconds: float = 0.0
    statuses: Counter = field(default_factory=Counter)
    by_route: dict[str, Counter] = field(default_factory=dict)
    categories: Counter = field(default_factory=Counter)

    def lines(self) -> list[str]:
        rate = self.requests / self.seconds if self.seconds else 0.0
        out = [
            f"HOSTILE-SWEEP dialect={self.dialect} seed={self.seed} requests={self.requests} "
            f"(testclient={self.requests - self.raw} raw_asgi={self.raw}) unauthorized={self.unauthorized} "
            f"seconds={self.seconds:.1f} rate={rate:.0f}/s",
            f"HOSTILE-SWEEP dialect={self.dialect} status "
            + " ".join(f"{s}={n}" for s, n in sorted(self.statuses.items())),
        ]
        for route, statuses in sorted(self.by_route.items()):
            counts = " ".join(f"{s}={n}" for s, n in sorted(statuses.items()))
            out.append(f"HOSTILE-SWEEP dialect={self.dialect} route {route:<32} {counts}")
        out.append(
            f"HOSTILE-SWEEP dialect={self.dialect} hostile values by category "
            + " ".join(f"{c}={n}" for c, n in sorted(self.categories.items()))
        )
        return out


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def filled(request, tmp_path_factory) -> Iterator[tuple[str, str, Path]]:
    """(dialect, Lens URL, registry): two simulated clusters collected once, as test_api.py does,
    their Prometheus still answering (the routes of series ask it)."""
    tmp = tmp_path_factory.mktemp("hostile")
    database = _server_database("postgresql", "hostile") if request.param == "postgresql" else None
    lens_url = next(database) if database is not None else f"sqlite:///{tmp}/lens.db"
    fleet = SimFleet.generate(clusters=2, nodes=8, seed=11, vendor="mixed")
    log = io.StringIO()  # Dagster's run log, shown only if the fill fails: `-s` shows the figures
    try:
        with SimServer(fleet) as server:
            registry = write_registry(tmp / "clusters.yaml", server)
            try:
                with redirect_stderr(log), instance_for_test() as instance:
                    instance.add_dynamic_partitions(CLUSTER_PARTITIONS_NAME, [c.name for c in fleet])
                    for cluster in fleet:
                        run_cluster(cluster.name, registry, lens_url, f"sqlite:///{tmp}/safe.db", instance)
            except BaseException:
                sys.stderr.write(log.getvalue())
                raise
            yield request.param, lens_url, registry
    finally:
        if database is not None:
            database.close()


def row_counts(engine: Engine) -> dict[str, int]:
    with engine.connect() as conn:
        return {
            t.name: conn.scalar(select(func.count()).select_from(t)) or 0 for t in lens_metadata.sorted_tables
        }


def real_values(engine: Engine) -> dict[str, list[str]]:
    """Valid values of every parameter, from the database the API reads."""
    now = int(time.time())
    with engine.connect() as conn:
        nodes = [
            dict(r)
            for r in conn.execute(select(node.c.cluster_name, node.c.name, node.c.gpu_name)).mappings()
        ]
        workloads = [
            dict(r)
            for r in conn.execute(
                select(gpu_workload.c.uid, gpu_workload.c.name, gpu_workload.c.kind, gpu_workload.c.namespace)
            ).mappings()
        ]
    assert nodes and workloads
    names = sorted({n["name"] for n in nodes})
    workload_names = sorted({w["name"] for w in workloads})
    return {
        "cluster": sorted({n["cluster_name"] for n in nodes}),
        "node": names,
        "uid": sorted({w["uid"] for w in workloads}),
        "name": names + workload_names + [n[-5:] for n in names] + [w[:4] for w in workload_names],
        "gpu_name": [*sorted({n["gpu_name"] for n in nodes if n["gpu_name"]}), "MI", "H100", "A"],
        "status": [*sorted(NODE_STATUSES | WORKLOAD_STATUSES), "Ready,NotReady", " Ready , Unknown "],
        "order_by": sorted({*NODE_ORDER, *WORKLOAD_ORDER}),
        "order": ["asc", "desc", "ASC", "Desc"],
        "desc": ["true", "false", "1", "0", "yes", "off"],
        "page_num": ["1", "2", "3", str(MAX_PAGE_NUM)],
        "page_size": ["1", "5", "10", str(MAX_PAGE_SIZE)],
        "kind": sorted({w["kind"] for w in workloads}),
        "namespace": sorted({w["namespace"] for w in workloads}),
        # History routes: the last hour or day, at Prometheus' own steps and the hourly tables'.
        "start": [str(now - 3600), str(now - 86_400), str(now - 600)],
        "end": [str(now), str(now - 60)],
        "step": ["60", "300", "3600", "15"],
    }


def route_table(app: FastAPI) -> list[tuple[str, list[str], list[str], Any]]:
    """(path template, path params, query params, route) of every GET route of the app."""
    spec = app.openapi()
    out = []
    for route in app.routes:
        if "GET" not in (getattr(route, "methods", None) or ()):
            continue
        params = spec["paths"].get(route.path, {}).get("get", {}).get("parameters", [])
        out.append(
            (
                route.path,
                [p["name"] for p in params if p["in"] == "path"],
                [p["name"] for p in params if p["in"] == "query"],
                route,
            )
        )
    return out


class Generator:
    """Seeded hostile requests: the same list for the same seed and database."""

    def __init__(self, seed: int, routes: list, real: dict[str, list[str]], figures: Figures) -> None:
        self.rng = random.Random(seed)
        self.routes = routes
        self.weights = [4 if path.startswith("/v1/") else 1 for path, *_ in routes]
        self.real = real
        self.figures = figures

    def valid(self, param: str) -> str:
        return q(self.rng.choice(self.real.get(param) or self.real["name"]))

    def hostile(self, param: str) -> str:
        rng = self.rng
        roll = rng.random()
        if roll < 0.08:  # a valid value with a trailing newline, or a NUL, or a second value
            category, wire = (
                "newline",
                self.valid(param) + rng.choice(("%0A", "%0D%0A", "%00", "%0A%00", ",")),
            )
        elif roll < 0.12:  # a valid value with hostile text around it
            category, extra = rng.choice(HOSTILE)
            wire = self.valid(param) + extra if rng.random() < 0.5 else extra + self.valid(param)
        else:
            category, wire = rng.choice(HOSTILE)
        self.figures.categories[category] += 1
        return wire

    def segment(self, param: str) -> str:
        rng = self.rng
        roll = rng.random()
        if roll < 0.5:
            return q(rng.choice(self.real["node" if param == "name" else "uid"]))
        if roll < 0.6:  # a real value of the other kind
            return q(rng.choice(self.real["uid" if param == "name" else "node"]))
        if roll < 0.65:
            return rng.choice(("", "..", ".", "%2e%2e", "a%2Fb", "%2F", ";", "%3B"))
        return self.hostile(param)

    def next(self) -> tuple[str, str, str, str | bytes | None, bool]:
        """(method, route template, path?query on the wire, Authorization header, authorized)."""
        rng = self.rng
        template, path_params, query_params, _ = rng.choices(self.routes, self.weights)[0]
        path = template
        for param in path_params:
            path = path.replace(f"{{{param}}}", self.segment(param))
        mode = rng.random()  # one hostile parameter among valid ones; many; or none
        chosen = [p for p in query_params if (p == "cluster" and rng.random() < 0.9) or rng.random() < 0.5]
        hostile_one = rng.choice(chosen) if chosen and mode < 0.5 else None
        pairs = []
        for param in chosen:
            bad = param == hostile_one or (0.5 <= mode < 0.85 and rng.random() < 0.5)
            pairs.append((param, self.hostile(param) if bad else self.valid(param)))
        if query_params and rng.random() < 0.15:  # a repeated parameter
            param = rng.choice(query_params)
            pairs.append((param, self.hostile(param) if rng.random() < 0.6 else self.valid(param)))
        if rng.random() < 0.15:  # unknown parameters
            for _ in range(rng.randint(1, 3)):
                name = rng.choice(UNKNOWN_PARAMS) if rng.random() < 0.7 else self.hostile("name")
                pairs.append((name, self.hostile(name) if rng.random() < 0.5 else "1"))
        rng.shuffle(pairs)
        parts = [f"{k}={v}" for k, v in pairs]
        if rng.random() < 0.05:  # malformed structure
            parts.insert(
                rng.randint(0, len(parts)), rng.choice(("", "=", "==", "cluster", "a=b=c", "&", "=x"))
            )
        query = "&".join(parts)
        if rng.random() < 0.2:
            token, authorized = rng.choice(WRONG_TOKENS), False
        else:
            token, authorized = rng.choice(RIGHT_TOKENS), True
        method = "GET" if rng.random() < 0.97 else rng.choice(("POST", "PUT", "DELETE", "PATCH"))
        return method, template, f"{path}?{query}" if query else path, token, authorized


async def _call_asgi(app: Any, scope: dict) -> tuple[int, list, bytes, str | None]:
    """The app's answer to one raw scope (what httpx refuses to send: control characters, long URLs)."""
    started: dict = {}
    chunks: list[bytes] = []

    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict) -> None:
        if message["type"] == "http.response.start":
            started.update(message)
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    error = None
    try:
        await app(scope, receive, send)
    except Exception as exc:
        error = _origin(exc)
    return started.get("status", 500), started.get("headers", []), b"".join(chunks), error


def _origin(exc: BaseException) -> str:
    """The exception and the lens_pipeline line it came from."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "lens_pipeline" in f.filename]
    at = f" at {frames[-1].filename}:{frames[-1].lineno} ({frames[-1].name})" if frames else ""
    return f"{type(exc).__name__}: {str(exc)[:300]}{at}"


def _header(token: str | bytes | None) -> dict[str, str | bytes]:
    return {} if token is None else {"authorization": token}


def send(client: TestClient, app: FastAPI, method: str, url: str, token: str | bytes | None) -> Sent:
    label = "none" if token is None else repr(token if len(token) < 40 else token[:30])
    if len(url) > HTTPX_MAX_URL or any(ord(c) < 0x20 or ord(c) == 0x7F for c in url):
        path, _, query = url.partition("?")
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": method,
            "scheme": "http",
            "path": unquote(path),
            "raw_path": path.encode("latin-1"),
            "root_path": "",
            "query_string": query.encode("latin-1"),
            "headers": [(b"host", b"testserver")]
            + (
                []
                if token is None
                else [(b"authorization", token if isinstance(token, bytes) else token.encode())]
            ),
            "client": ("testclient", 50000),
            "server": ("testserver", 80),
            "extensions": {},
            "state": {},
        }
        status, headers, body, error = client.portal.call(_call_asgi, app, scope)
        content_type = dict(headers).get(b"content-type", b"").decode("latin-1")
        sent = Sent(method, url, label, False, scope["path"], scope["query_string"], True)
        sent.status, sent.content_type, sent.body, sent.error = status, content_type, body, error
        return sent
    response = client.request(method, url, headers=_header(token))
    request = response.request
    # TestClient's scope: `unquote` of httpx's (already decoded) path, httpx's query as sent.
    sent = Sent(method, url, label, False, unquote(request.url.path), request.url.query, False)
    sent.status, sent.content_type, sent.body = (
        response.status_code,
        response.headers.get("content-type", ""),
        response.content,
    )
    return sent


def rejected_by_guard(sent: Sent) -> bool:
    """What `QueryGuard` answers 400 before any route: NUL in the path or query, or a long query."""
    query = sent.query
    return "\x00" in sent.path or len(query) > MAX_QUERY_BYTES or b"\x00" in query or b"%00" in query.lower()


def problems(sent: Sent, guarded: list, public: list) -> list[str]:
    """What is wrong with one answer (nothing, for a good one)."""
    out = []
    if sent.status >= 500:
        out.append("5xx")
    envelope = None
    if sent.content_type.startswith("application/json") and sent.body:
        try:
            envelope = json.loads(sent.body)
        except ValueError:
            out.append("JSON content type, body not JSON")
    is_envelope = isinstance(envelope, dict) and "meta" in envelope and "data" in envelope
    if rejected_by_guard(sent) and sent.status != 400:
        out.append("NUL or oversize query not answered 400")
    if 400 <= sent.status < 500:
        if not is_envelope:
            out.append("4xx is not the API's envelope")
        else:
            meta = envelope["meta"]
            if meta.get("code") != sent.status * 10:
                out.append(f"meta.code {meta.get('code')} for status {sent.status}")
            if not isinstance(meta.get("message"), str) or not meta["message"]:
                out.append("4xx without a message")
            if envelope["data"] is not None:
                out.append("4xx carries data")
    on_guarded = sent.method == "GET" and any(r.path_regex.match(sent.path) for r in guarded)
    if on_guarded and sent.status == 200 and not (is_envelope and envelope["meta"].get("code") == 2000):
        out.append("a 200 of a /v1 route is not the API's envelope")
    if not sent.authorized:
        on_public = any(r.path_regex.match(sent.path) for r in public)
        if on_guarded and not rejected_by_guard(sent) and sent.status != 401:
            out.append(f"wrong or missing token on a /v1 route answered {sent.status}, not 401")
        if is_envelope and envelope["data"] is not None and not on_public:
            out.append("data answered without the right token")
        if not is_envelope and sent.body and 200 <= sent.status < 300 and not on_public:
            out.append("a body answered without the right token")
    return out


def test_hostile_requests_never_5xx_never_leak_never_write(filled):
    dialect, lens_url, registry = filled
    engine = get_engine(lens_url)
    before = row_counts(engine)
    real = real_values(engine)
    app = create_app(engine, token=TOKEN, registry=lambda: load_registry(registry))
    routes = route_table(app)
    guarded = [route for path, *_, route in routes if path.startswith("/v1/")]
    public = [route for path, *_, route in routes if not path.startswith("/v1/")]
    assert len(guarded) == 23 and len(public) >= 5, [path for path, *_ in routes]
    figures = Figures(dialect, SEED)
    generator = Generator(SEED, routes, real, figures)
    failures: list[str] = []
    failed = 0
    started = time.perf_counter()
    with TestClient(app, raise_server_exceptions=False, follow_redirects=False) as client:
        for _ in range(REQUESTS_PER_DIALECT):
            method, template, url, token, authorized = generator.next()
            sent = send(client, app, method, url, token)
            sent.authorized = authorized
            figures.requests += 1
            figures.raw += sent.raw
            figures.unauthorized += not authorized
            figures.statuses[sent.status] += 1
            figures.by_route.setdefault(template, Counter())[sent.status] += 1
            wrong = problems(sent, guarded, public)
            if wrong:
                failed += 1
                if len(failures) < SHOWN_FAILURES:
                    if sent.status >= 500 and sent.error is None and not sent.raw:
                        sent.error = replay(app, method, url, token)
                    failures.append(f"{'; '.join(wrong)}: {sent.describe()}")
    figures.seconds = time.perf_counter() - started
    after = row_counts(engine)
    print()
    print("\n".join(figures.lines()))
    assert figures.requests == REQUESTS_PER_DIALECT
    assert figures.unauthorized >= figures.requests // 10
    assert set(figures.by_route) == {path for path, *_ in routes}  # every route was asked
    assert figures.statuses[200] and figures.statuses[400] and figures.statuses[401] and figures.statuses[404]
    changed = {t: (before[t], after[t]) for t in before if before[t] != after[t]}
    assert not failures and not changed, (
        f"on {dialect}: rows changed (table: before, after) {changed}; "
        f"{failed} of {figures.requests} answers are wrong:\n" + "\n".join(failures)
    )


def replay(app: FastAPI, method: str, url: str, token: str | bytes | None) -> str | None:
    """The exception behind a 5xx: the same request again, letting the app's exception out."""
    try:
        TestClient(app, raise_server_exceptions=True).request(method, url, headers=_header(token))
    except Exception as exc:
        return _origin(exc)
    return None
