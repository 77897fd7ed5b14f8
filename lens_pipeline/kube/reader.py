"""Paged LISTs against one cluster's API server, through the official client, as raw JSON.

One collection run makes one paged LIST per kind (limit=500 and continue tokens) and joins in
memory. The client's model objects are slow to build at 100k pods, so it is used for
configuration and auth only: responses are read raw, parsed with orjson, and each item is cut
down by a `project` function while the next pages are fetched (`_PagesAhead`). A continue token
that expired (410 Gone) restarts the whole list, so one LIST is always one consistent snapshot.
"""

from __future__ import annotations

import atexit
import builtins
import contextlib
import hashlib
import logging
import os
import queue
import re
import tempfile
import threading
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field, replace
from types import ModuleType
from typing import TYPE_CHECKING, Any, TypeVar

import orjson
import urllib3

from lens_pipeline.clusters import CONNECTION_FIELDS, ClusterConfig, api_server_proxy, proxy_problem
from lens_pipeline.memory import paused_gc
from lens_pipeline.retry import KUBE_REQUEST, KUBE_RETRIES

if TYPE_CHECKING:
    from kubernetes import client as k8s_client

log = logging.getLogger(__name__)
T = TypeVar("T")


def kubernetes_client() -> ModuleType:
    """The official client's `kubernetes.client`, imported when a reader first needs it: the import
    builds every model class, most of a second of CPU, which a run process that reads no cluster
    (the container events', the hourly history's) does not pay when it loads the code location."""
    from kubernetes import client

    return client


PAGE_SIZE = 500
# Pages fetched ahead wait in a queue of this size while the caller parses one (the helper may hold
# one more, received, until there is room): the API server is never left waiting for us.
PAGES_AHEAD = 2
TRANSIENT_STATUSES = frozenset({429, 500, 502, 503, 504})
# A whole collection at cluster scope (what a watch cache may keep), and the resources it never
# keeps: whatever may hold credentials stays between the runs and the API server.
_COLLECTION = re.compile(r"^/(api/v1|apis/[a-z0-9.-]+/[a-z0-9]+)/([a-z0-9]+)$")
NEVER_CACHED = frozenset({"secrets", "configmaps"})


# A run sends the digest of its registry entry for the cluster with each request to a watch cache,
# which serves only what it read with the same entry (a cluster whose entry changed, a new server or
# token, is read anew).
ENTRY_PARAMETER = "lensRegistryEntry"
# A run asks the cache to hold a page of a collection it is still listing for up to this many
# seconds, until the page has arrived from the API server (the run's own LIST would be a second one
# of the collection beside the cache's); the cache waits at most its own limit, then answers 503.
WAIT_PARAMETER = "lensWaitSeconds"
CACHE_WAIT_SECONDS = 60.0


# The fields of a registry entry that decide how its API server is reached and what it answers;
# the others (its Prometheus, its exporters' settings) have no bearing on the objects listed.
KUBE_FIELDS = frozenset({"name", *CONNECTION_FIELDS, "proxy_url", "request_timeout_seconds"})


def entry_digest(cluster: ClusterConfig) -> str:
    """A digest of the registry entry's `KUBE_FIELDS` (a token in it is one-way hashed with the
    rest): a watch cache serves a run only what it read with the same."""
    return hashlib.sha256(cluster.model_dump_json(include=set(KUBE_FIELDS)).encode()).hexdigest()[:32]


def same_kube_entry(one: ClusterConfig | None, other: ClusterConfig | None) -> bool:
    """Whether two registry entries reach the same API server the same way (`KUBE_FIELDS`)."""
    if one is None or other is None:
        return one is other
    return one is other or entry_digest(one) == entry_digest(other)


def cacheable(path: str) -> bool:
    """Whether `path` is a collection a watch cache may keep and serve."""
    found = _COLLECTION.match(path)
    return found is not None and found.group(2) not in NEVER_CACHED


class KubeError(RuntimeError):
    """A Kubernetes API call that failed for good; says which cluster, which path and why."""

    def __init__(self, cluster: str, path: str, message: str, status: int | None = None) -> None:
        self.cluster, self.path, self.status = cluster, path, status
        self.reason = message if status is None else f"HTTP {status}: {message}"
        where = f"cluster {cluster!r}: GET {path}"
        super().__init__(f"{where}: {message}" if status is None else f"{where}: HTTP {status}: {message}")


@dataclass
class ListStats:
    requests: int = 0
    pages: int = 0
    restarts: int = 0
    retries: int = 0
    by_path: dict[str, int] = field(default_factory=dict)
    # Where each collection was listed from, when a watch cache is configured: "watch cache", or
    # "API server (watch cache: why it did not answer)".
    sources: dict[str, str] = field(default_factory=dict)

    def since(self, earlier: ListStats) -> ListStats:
        """What happened after `earlier` was copied (several collectors share one reader per run)."""
        return ListStats(
            self.requests - earlier.requests,
            self.pages - earlier.pages,
            self.restarts - earlier.restarts,
            self.retries - earlier.retries,
            {
                k: v - earlier.by_path.get(k, 0)
                for k, v in self.by_path.items()
                if v != earlier.by_path.get(k, 0)
            },
            {k: v for k, v in self.sources.items() if earlier.sources.get(k) != v},
        )

    def copy(self) -> ListStats:
        return ListStats(
            self.requests, self.pages, self.restarts, self.retries, dict(self.by_path), dict(self.sources)
        )


def api_client_for(cluster: ClusterConfig) -> k8s_client.ApiClient:
    """An ApiClient configured the way the registry entry says (kubeconfig, in-cluster, or token)."""
    from kubernetes import config as k8s_config
    from kubernetes.config.config_exception import ConfigException

    client = kubernetes_client()
    try:
        configuration = client.Configuration()
        # The reader retries itself, with backoff (lens_pipeline.retry); urllib3's own three retries
        # underneath would make each attempt four requests and a slow API four times as slow.
        configuration.retries = 0
        if cluster.kubeconfig:
            k8s_config.load_kube_config(
                config_file=cluster.kubeconfig,
                context=cluster.context,
                client_configuration=configuration,
                persist_config=False,
            )
        elif cluster.in_cluster:
            k8s_config.load_incluster_config(client_configuration=configuration)
        else:
            configuration.host = cluster.server
            token = cluster.token
            if token is None and cluster.token_file:
                with open(cluster.token_file) as handle:
                    token = handle.read().strip()
            if token:
                configuration.api_key = {"authorization": f"Bearer {token}"}
            configuration.verify_ssl = not cluster.insecure_skip_tls_verify
            configuration.ssl_ca_cert = cluster.ca_file or _pem_file(cluster.ca_data)
            configuration.cert_file = cluster.cert_file or _pem_file(cluster.cert_data)
            configuration.key_file = cluster.key_file or _pem_file(cluster.key_data)
            configuration.tls_server_name = cluster.tls_server_name
        proxy = api_server_proxy(cluster)
        if proxy:
            # The entry's proxy, not the environment's: the client read HTTPS_PROXY and NO_PROXY.
            configuration.proxy = configuration.no_proxy = None
        api = client.ApiClient(configuration)
        if proxy:
            _through_proxy(api, proxy)
        return api
    except (ConfigException, OSError, ValueError, TypeError, ImportError) as exc:
        # The message of a config error may quote the kubeconfig; keep only its type and first line.
        first_line = str(exc).splitlines()[0][:200] if str(exc) else ""
        raise KubeError(
            cluster.name, "(client configuration)", f"{type(exc).__name__}: {first_line}"
        ) from None


def _through_proxy(api: k8s_client.ApiClient, proxy: str) -> None:
    """Send every request of `api` through `proxy`, as kubectl does with a `proxy-url`: the TLS
    settings and pool sizes the client chose for its direct connections kept, the proxy's user and
    password sent as kubectl sends them (Proxy-Authorization to an HTTP proxy, SOCKS5's own
    authentication), and names resolved by a SOCKS proxy, not here (socks5 is socks5h, as in Go).
    Errors never quote the URL, which may hold a password."""
    from urllib.parse import unquote

    if (why := proxy_problem(proxy)) is not None:
        raise ValueError(why)
    parts = urllib3.util.parse_url(proxy)
    scheme, auth = (parts.scheme or "").lower(), parts.auth
    user, _, password = (unquote(x) for x in (auth or "").partition(":"))
    rest = api.rest_client
    direct = rest.pool_manager
    # What the client set for its connections, less what belongs to the way it took (an
    # environment proxy's, a SOCKS manager's).
    settings = {k: v for k, v in direct.connection_pool_kw.items() if not k.startswith("_")}
    pools = getattr(direct.pools, "_maxsize", 10)
    if scheme.startswith("socks5"):
        from urllib3.contrib.socks import SOCKSProxyManager  # PySocks: a dependency of ours

        rest.pool_manager = SOCKSProxyManager(
            f"socks5h://{parts.netloc}",
            username=user if auth else None,
            password=password if auth else None,
            num_pools=pools,
            **settings,
        )
    else:
        headers = urllib3.make_headers(proxy_basic_auth=f"{user}:{password}") if auth else None
        rest.pool_manager = urllib3.ProxyManager(
            f"{scheme}://{parts.netloc}", num_pools=pools, proxy_headers=headers, **settings
        )
    direct.clear()


_PEM_FILES: dict[str, str] = {}
_PEM_LOCK = threading.Lock()


@atexit.register
def _remove_pem_files() -> None:
    """Leave no credential behind in the temporary directory when the process ends."""
    with _PEM_LOCK:
        for path in _PEM_FILES.values():
            with contextlib.suppress(OSError):
                os.unlink(path)
        _PEM_FILES.clear()


def _pem_file(data: str | None) -> str | None:
    """A private file holding inline PEM (the client and ssl read certificates from files only),
    written once per content for the life of the process, as the kubeconfig loader does."""
    if not data:
        return None
    digest = hashlib.sha256(data.encode()).hexdigest()
    with _PEM_LOCK:
        if digest not in _PEM_FILES or not os.path.exists(_PEM_FILES[digest]):
            fd, path = tempfile.mkstemp(prefix="lens-pem-", suffix=".pem")
            with os.fdopen(fd, "w") as handle:  # mkstemp's file is 0600
                handle.write(data)
            _PEM_FILES[digest] = path
        return _PEM_FILES[digest]


class KubeReader:
    """Paged, retrying, counting LISTs for one cluster."""

    def __init__(
        self,
        cluster: ClusterConfig,
        *,
        page_size: int = PAGE_SIZE,
        max_restarts: int = 3,
        max_retries: int = KUBE_RETRIES,
        backoff_seconds: float = KUBE_REQUEST.first,
        cache_url: str | None = None,
        cache_token: str | None = None,
        cache_wait_seconds: float = CACHE_WAIT_SECONDS,
    ) -> None:
        """`cache_url`: a watch cache (`lens watch`, `kube/cache.py`) to ask for whole collections
        first, with `cache_token` as its bearer token; the API server answers whatever it cannot.
        A collection the cache is still listing (it was cold, or lists again after 410) is read
        as it arrives, each page waited for up to `cache_wait_seconds`, rather than listed from the
        API server a second time."""
        self.cluster = cluster
        self.cache_url = cache_url.rstrip("/") if cache_url else None
        self._cache_token = cache_token
        self.cache_wait_seconds = cache_wait_seconds
        self._cache_api: k8s_client.ApiClient | None = None
        self._entry = entry_digest(cluster) if cache_url else ""
        self.page_size = page_size
        self.max_restarts = max_restarts
        self.max_retries = max_retries
        self.backoff_seconds = backoff_seconds
        # Exponential, jittered, capped (lens_pipeline.retry); the first wait is `backoff_seconds`.
        self.backoff = replace(
            KUBE_REQUEST, first=backoff_seconds, cap=max(backoff_seconds, KUBE_REQUEST.cap)
        )
        self.stats = ListStats()
        self._api: k8s_client.ApiClient | None = None
        # Set when the API could not be reached at all: later requests of this reader fail at
        # once instead of waiting out the same timeouts again.
        self._unreachable: str | None = None

    @property
    def api(self) -> k8s_client.ApiClient:
        if self._api is None:
            self._api = api_client_for(self.cluster)
        return self._api

    def reset(self) -> None:
        """Forget that the API was unreachable and the client built from the registry entry (a token
        file read again): what a long-lived reader does before it tries again."""
        self._unreachable = None
        if self._api is not None:
            self._api.close()
            self._api = None

    def close(self) -> None:
        if self._api is not None:
            self._api.close()
            self._api = None
        if self._cache_api is not None:
            self._cache_api.close()
            self._cache_api = None

    def __enter__(self) -> KubeReader:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def list(
        self,
        path: str,
        project: Callable[[dict[str, Any]], T],
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> list[T]:
        """Every item of the collection at `path`, each passed through `project`, in one snapshot."""
        return self.list_versioned(
            path, project, label_selector=label_selector, field_selector=field_selector
        )[0]

    def list_versioned(
        self,
        path: str,
        project: Callable[[dict[str, Any]], T],
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        progress: Callable[[builtins.list[T], str], None] | None = None,
    ) -> tuple[builtins.list[T], str]:
        """`list`, and the resourceVersion of its snapshot: where a watch of it starts.

        `progress(items, version)` is told after each page: the items so far (the list that grows
        into the answer; a list restarted after 410 grows another) and the snapshot's version."""
        # Parsed JSON holds no reference cycles, but building millions of dicts makes the cyclic
        # collector rescan the whole heap again and again: at 150k pods that was most of the time.
        with paused_gc():
            if self.cache_url and not label_selector and not field_selector and cacheable(path):
                try:
                    found = self._list(path, project, None, None, self._cache_get, progress)
                except KubeError as exc:
                    self.stats.sources[path] = f"API server (watch cache: {exc.reason})"
                    # A cold or stale cache is routine; a token it refuses is a misconfiguration.
                    say = log.warning if exc.status == 401 else log.info
                    say("cluster %s: %s from the API server: %s", self.cluster.name, path, exc)
                else:
                    self.stats.sources[path] = "watch cache"
                    return found
            return self._list(path, project, label_selector, field_selector, self._get, progress)

    def _list(
        self,
        path: str,
        project: Callable[[dict[str, Any]], T],
        label_selector: str | None,
        field_selector: str | None,
        get: Callable[[str, builtins.list[tuple[str, Any]]], tuple[int, bytes]],
        progress: Callable[[builtins.list[T], str], None] | None = None,
    ) -> tuple[builtins.list[T], str]:
        for attempt in range(self.max_restarts + 1):
            items: list[T] = []
            token: str | None = None
            version = ""
            with _PagesAhead(self, path, label_selector, field_selector, get) as pages:
                while True:
                    status, body, followed = pages.next()
                    if status == 410 and token:
                        break  # the snapshot expired under us: start the list again
                    if status != 200:
                        raise KubeError(self.cluster.name, path, _status_message(body), status)
                    page = _parse(self.cluster.name, path, body)
                    del body
                    self.stats.pages += 1
                    raw_items = page.get("items")
                    if not isinstance(raw_items, list):
                        raise KubeError(self.cluster.name, path, "list response has no 'items' array")
                    metadata = page.get("metadata")
                    if not isinstance(metadata, dict):
                        metadata = {}
                    token = metadata.get("continue")
                    if not version and isinstance(metadata.get("resourceVersion"), str):
                        version = metadata["resourceVersion"]
                    if token and token != followed:
                        pages.restart(token)  # the fetcher could not read it, or read it wrong
                    items.extend(project(item) for item in raw_items)
                    del page, raw_items
                    if progress is not None:
                        progress(items, version)
                    if not token:
                        return items, version
            self.stats.restarts += 1
            log.warning(
                "cluster %s: continue token for %s expired (410); restarting the list (%d)",
                self.cluster.name,
                path,
                attempt + 1,
            )
        raise KubeError(
            self.cluster.name, path, f"continue token expired {self.max_restarts + 1} times in a row", 410
        )

    def watch(
        self,
        path: str,
        resource_version: str,
        *,
        timeout_seconds: int = 300,
        bookmarks: bool = True,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> Generator[dict[str, Any], None, None]:
        """The events of one watch of `path` from `resource_version`, parsed, until the server ends
        it (`timeout_seconds`). One request, not retried: the caller (`Reflector`) watches again
        from the last version it saw. A version no longer kept raises `KubeError` with status 410,
        whether the server says so by its status or by an ERROR event."""
        query: list[tuple[str, Any]] = [
            ("watch", "true"),
            ("resourceVersion", resource_version),
            ("timeoutSeconds", timeout_seconds),
        ]
        if bookmarks:
            query.append(("allowWatchBookmarks", "true"))
        if label_selector:
            query.append(("labelSelector", label_selector))
        if field_selector:
            query.append(("fieldSelector", field_selector))
        # The server stays quiet between events for as long as nothing changes: the read timeout
        # covers the whole watch, and a bit more for the server to end it.
        connect = min(5.0, self.cluster.request_timeout_seconds)
        self.stats.requests += 1
        self.stats.by_path[path] = self.stats.by_path.get(path, 0) + 1
        try:
            status, response = raw_stream(self.api, path, query, (connect, timeout_seconds + 30.0))
        except (urllib3.exceptions.HTTPError, OSError, kubernetes_client().ApiException) as exc:
            raise KubeError(
                self.cluster.name, path, f"watch: {type(exc).__name__}: {_first_line(exc)}"
            ) from None
        if isinstance(response, bytes):
            raise KubeError(self.cluster.name, path, _status_message(response), status)
        try:
            for line in _lines(response):
                event = _parse_event(self.cluster.name, path, line)
                if event["type"] == "ERROR":
                    failure = event["object"]
                    code = failure.get("code") if isinstance(failure, dict) else None
                    message = failure.get("message") if isinstance(failure, dict) else None
                    raise KubeError(
                        self.cluster.name,
                        path,
                        str(message or "watch ERROR event")[:300],
                        code if isinstance(code, int) else None,
                    )
                yield event
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise KubeError(
                self.cluster.name, path, f"watch: {type(exc).__name__}: {_first_line(exc)}"
            ) from None
        finally:
            # Unread events may remain: the connection cannot serve another request.
            response.close()
            response.release_conn()

    def _list_query(
        self, token: str | None, label_selector: str | None, field_selector: str | None
    ) -> builtins.list[tuple[str, Any]]:
        query: list[tuple[str, Any]] = [("limit", self.page_size)]
        if token:
            query.append(("continue", token))
        if label_selector:
            query.append(("labelSelector", label_selector))
        if field_selector:
            query.append(("fieldSelector", field_selector))
        return query

    def get(self, path: str) -> dict[str, Any] | None:
        """One object or discovery document; None when the server says 404 (kind or object absent)."""
        status, body = self._get(path, [])
        if status == 404:
            return None
        if status != 200:
            raise KubeError(self.cluster.name, path, _status_message(body), status)
        return _parse(self.cluster.name, path, body)

    def can_list(self, path: str) -> str | None:
        """Why the collection at `path` cannot be listed (an HTTP status and the server's message),
        or None when it can: one request for one item."""
        try:
            status, body = self._get(path, [("limit", 1)])
        except KubeError as exc:
            return str(exc)
        return None if status == 200 else f"HTTP {status}: {_status_message(body)}"

    def _cache_get(self, path: str, query: builtins.list[tuple[str, Any]]) -> tuple[int, bytes]:
        """One GET of the watch cache, not retried: what it cannot answer, the API server does."""
        if self._cache_api is None:
            client = kubernetes_client()
            configuration = client.Configuration()
            configuration.host = f"{self.cache_url}/clusters/{self.cluster.name}"
            configuration.retries = 0
            if self._cache_token:
                configuration.api_key = {"authorization": f"Bearer {self._cache_token}"}
            self._cache_api = client.ApiClient(configuration)
        read_timeout = self.cluster.request_timeout_seconds
        query = [*query, (ENTRY_PARAMETER, self._entry)]
        if self.cache_wait_seconds > 0:
            query.append((WAIT_PARAMETER, f"{self.cache_wait_seconds:g}"))
            read_timeout += self.cache_wait_seconds
        timeout = (min(2.0, self.cluster.request_timeout_seconds), read_timeout)
        try:
            return raw_get(self._cache_api, path, query, timeout)
        except (urllib3.exceptions.HTTPError, OSError, kubernetes_client().ApiException) as exc:
            raise KubeError(self.cluster.name, path, f"unreachable: {type(exc).__name__}") from None

    def _get(self, path: str, query: builtins.list[tuple[str, Any]]) -> tuple[int, bytes]:
        if self._unreachable is not None:
            raise KubeError(
                self.cluster.name, path, f"not tried: the API was unreachable ({self._unreachable})"
            )
        timeout = (min(5.0, self.cluster.request_timeout_seconds), self.cluster.request_timeout_seconds)
        last_error, reached = "", False
        for attempt in range(self.max_retries + 1):
            if attempt:
                self.stats.retries += 1
                time.sleep(self.backoff.delay(attempt))
            self.stats.requests += 1
            self.stats.by_path[path] = self.stats.by_path.get(path, 0) + 1
            try:
                status, body = raw_get(self.api, path, query, timeout)
            except (urllib3.exceptions.HTTPError, OSError, kubernetes_client().ApiException) as exc:
                last_error = f"{type(exc).__name__}: {_first_line(exc)}"
                continue
            reached = True
            if status in TRANSIENT_STATUSES:
                last_error = f"HTTP {status}: {_status_message(body)}"
                continue
            return status, body
        if not reached:
            self._unreachable = f"GET {path}: {last_error}"
        raise KubeError(
            self.cluster.name,
            path,
            f"gave up after {self.max_retries + 1} attempts; last error: {last_error}",
        )


def raw_get(
    api: k8s_client.ApiClient, path: str, query: list[tuple[str, Any]], timeout: tuple[float, float]
) -> tuple[int, bytes]:
    """(status, body) of a GET through the client's configuration (auth, TLS, proxy), undecoded."""
    status, response = raw_stream(api, path, query, timeout)
    return status, response if isinstance(response, bytes) else response.data


def raw_stream(
    api: k8s_client.ApiClient, path: str, query: list[tuple[str, Any]], timeout: tuple[float, float]
) -> tuple[int, Any]:
    """(200, the response to read as it comes: urllib3's) of a GET, or (another status, its body).

    kubernetes >= 37 serializes the request first and answers every status; before (what
    dagster-k8s pins for the deploy image), `call_api` raises on a status outside 2xx."""
    headers = {"Accept": "application/json"}
    if hasattr(api, "param_serialize"):
        request = api.param_serialize(
            method="GET",
            resource_path=path,
            query_params=query,
            header_params=headers,
            auth_settings=["BearerToken"],
        )
        response = api.call_api(*request, _request_timeout=timeout).response
    else:
        try:
            response = api.call_api(
                path,
                "GET",
                query_params=query,
                header_params=headers,
                auth_settings=["BearerToken"],
                _preload_content=False,
                _request_timeout=timeout,
            )
        except kubernetes_client().ApiException as exc:
            if not exc.status:
                raise
            body = exc.body if isinstance(exc.body, bytes) else str(exc.body or "").encode()
            return exc.status, body
    if response.status != 200:
        return response.status, response.read()
    return 200, response


def _lines(response: Any) -> Iterator[bytes]:
    """The lines of a streamed body as they arrive (a watch writes one event a line)."""
    pending = b""
    for chunk in response.stream(64 << 10, decode_content=True):
        pending += chunk
        if b"\n" not in chunk:
            continue
        *lines, pending = pending.split(b"\n")
        for line in lines:
            if line.strip():
                yield line
    if pending.strip():
        yield pending


_EVENT_TYPES = frozenset({"ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR"})


def _parse_event(cluster: str, path: str, line: bytes) -> dict[str, Any]:
    try:
        event = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise KubeError(cluster, path, f"watch event is not JSON ({exc})") from None
    if not isinstance(event, dict) or event.get("type") not in _EVENT_TYPES or "object" not in event:
        raise KubeError(cluster, path, f"not a watch event: {line[:120]!r}")
    return event


class _PagesAhead:
    """The pages of one LIST, fetched by a helper thread ahead of the caller.

    The helper reads each page's continue token from the page's head (kube-apiserver writes the
    list's `metadata` before its `items`) and asks for the next page at once, while up to
    `PAGES_AHEAD` pages wait for the caller: the server works on the next pages while the caller
    parses this one, and the helper is not kept waiting for a whole page to be parsed before it
    can ask. Still one request at a time, in order, as without it. When a head cannot be read, the
    helper stops and the caller restarts it from the token it parsed itself.
    """

    def __init__(
        self,
        reader: KubeReader,
        path: str,
        label_selector: str | None,
        field_selector: str | None,
        get: Callable[[str, list[tuple[str, Any]]], tuple[int, bytes]],
    ) -> None:
        self._reader, self._path, self._get = reader, path, get
        self._selectors = (label_selector, field_selector)
        self._stop = threading.Event()
        self._helper: threading.Thread | None = None
        self._pages: queue.Queue[tuple[int, bytes, str | None] | BaseException] = queue.Queue()
        self.restart(None)

    def restart(self, token: str | None) -> None:
        """Forget what was fetched ahead and fetch again from `token`."""
        self._end_helper()  # its request under way finishes first: still one at a time
        self._stop = threading.Event()
        self._pages = queue.Queue(maxsize=PAGES_AHEAD)
        self._helper = threading.Thread(
            target=self._fetch, args=(token, self._stop, self._pages), name="kube-list", daemon=True
        )
        self._helper.start()

    def next(self) -> tuple[int, bytes, str | None]:
        """(status, body, the continue token the next page was fetched with, if any)."""
        page = self._pages.get()
        if isinstance(page, BaseException):
            raise page
        return page

    def _fetch(self, token: str | None, stop: threading.Event, pages: queue.Queue) -> None:
        try:
            while not stop.is_set():
                query = self._reader._list_query(token, *self._selectors)
                status, body = self._get(self._path, query)
                token = _peek_continue(body) if status == 200 else None
                _put(pages, (status, body, token), stop)
                if token is None:
                    return
        except BaseException as exc:  # the caller raises it
            _put(pages, exc, stop)

    def _end_helper(self) -> None:
        """Stop the helper and wait for it: a request it has under way ends as it would have
        (its own timeout and retries), so that none outlives the list."""
        self._stop.set()
        if self._helper is not None:
            self._helper.join()

    def __enter__(self) -> _PagesAhead:
        return self

    def __exit__(self, *_exc: object) -> None:
        self._end_helper()


def _put(pages: queue.Queue, item: object, stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            pages.put(item, timeout=0.1)
            return
        except queue.Full:
            continue


_ITEMS = b',"items":'
_HEAD_BYTES = 64 << 10


def _peek_continue(body: bytes) -> str | None:
    """A list page's continue token, read from its head without parsing its items; None when there
    is none, or the head is not `{"kind":...,"apiVersion":...,"metadata":{...}` as kube-apiserver
    writes it."""
    end = body.find(_ITEMS, 0, _HEAD_BYTES)
    if end < 0:
        return None
    try:
        head = orjson.loads(body[:end] + b"}")
    except orjson.JSONDecodeError:
        return None
    metadata = head.get("metadata") if isinstance(head, dict) else None
    token = metadata.get("continue") if isinstance(metadata, dict) else None
    return token if isinstance(token, str) and token else None


def _parse(cluster: str, path: str, body: bytes) -> dict[str, Any]:
    try:
        page = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise KubeError(cluster, path, f"response is not JSON ({exc})") from None
    if not isinstance(page, dict):
        raise KubeError(cluster, path, "response is not a JSON object")
    return page


def _status_message(body: bytes) -> str:
    try:
        status = orjson.loads(body)
        if isinstance(status, dict) and status.get("message"):
            return str(status["message"])[:300]
    except orjson.JSONDecodeError:
        pass
    return body[:200].decode("utf-8", "replace") or "(empty body)"


def _first_line(exc: BaseException) -> str:
    text = str(exc)
    return text.splitlines()[0][:300] if text else ""
