"""Resources: every outside system (registry, databases, Kubernetes, Prometheus) behind one class."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import ClassVar

from dagster import ConfigurableResource, Definitions, EnvVar, InitResourceContext
from pydantic import Field, PrivateAttr
from sqlalchemy import Engine

from lens_pipeline import settings
from lens_pipeline.clusters import ClusterConfig, Registry, load_registry
from lens_pipeline.defs.collectors.snapshot import ClusterSnapshot
from lens_pipeline.kube.reader import CACHE_WAIT_SECONDS, PAGE_SIZE, KubeReader
from lens_pipeline.prom.reader import PromReader
from lens_pipeline.retry import KUBE_REQUEST, KUBE_RETRIES
from lens_pipeline.store.db import get_engine
from lens_pipeline.store.migrate import Database, ensure_schema


class ClusterRegistryResource(ConfigurableResource):
    """The cluster registry file or kubeconfig directory (default: `$LENS_CLUSTERS_FILE`)."""

    clusters_file: str | None = Field(default=None, description="registry YAML or kubeconfig directory")

    def path(self) -> str:
        path = self.clusters_file or settings.clusters_file()
        if not path:
            raise RuntimeError(f"no cluster registry: set {settings.LENS_CLUSTERS_FILE} or clusters_file")
        return path

    def load(self) -> Registry:
        return load_registry(self.path())

    def cluster(self, name: str) -> ClusterConfig:
        return self.load().get(name)


class _Database(ConfigurableResource):
    """A database through SQLAlchemy, migrated on first use in the process."""

    url: str | None = Field(default=None, description="SQLAlchemy URL")
    _schema: ClassVar[Database]
    _default_url: ClassVar[Callable[[], str]]

    def engine(self) -> Engine:
        engine = get_engine(self.url or type(self)._default_url())
        ensure_schema(engine, self._schema)
        return engine


class LensDatabase(_Database):
    """The Lens database (default: `$LENS_DATABASE_URL`, else SQLite under `$DAGSTER_HOME`)."""

    _schema: ClassVar[Database] = "lens"
    _default_url: ClassVar[Callable[[], str]] = staticmethod(settings.lens_database_url)


class SafeDatabase(_Database):
    """The SaFE database (default: `$LENS_SAFE_DATABASE_URL`, else SQLite under `$DAGSTER_HOME`)."""

    _schema: ClassVar[Database] = "safe"
    _default_url: ClassVar[Callable[[], str]] = staticmethod(settings.safe_database_url)


class KubernetesResource(ConfigurableResource):
    """How collectors LIST: page size and retries of transient errors (5xx, timeouts, refused)."""

    page_size: int = PAGE_SIZE
    max_retries: int = KUBE_RETRIES
    backoff_seconds: float = KUBE_REQUEST.first
    max_list_restarts: int = 3  # a continue token that expired (410) restarts the LIST this often
    # The watch cache (`lens watch`) to ask before the API server; default `$LENS_WATCH_CACHE_URL`.
    watch_cache_url: str | None = None
    # How long a run waits for each page of a collection the cache is listing (cold, or again after
    # 410), as the cache gets it from the API server, before it lists from the API server itself.
    watch_cache_wait_seconds: float = CACHE_WAIT_SECONDS
    # One snapshot per cluster in a run: the collectors of a cluster share every LIST.
    _snapshots: dict = PrivateAttr(default_factory=dict)

    def reader(self, cluster: ClusterConfig) -> KubeReader:
        return KubeReader(
            cluster,
            page_size=self.page_size,
            max_retries=self.max_retries,
            backoff_seconds=self.backoff_seconds,
            max_restarts=self.max_list_restarts,
            cache_url=self.watch_cache_url or settings.watch_cache_url(),
            cache_token=next(iter(settings.watch_cache_tokens()), None),
            cache_wait_seconds=self.watch_cache_wait_seconds,
        )

    def snapshot(self, cluster: ClusterConfig) -> ClusterSnapshot:
        if cluster.name not in self._snapshots:
            self._snapshots[cluster.name] = ClusterSnapshot(cluster, self.reader(cluster))
        return self._snapshots[cluster.name]

    def release(self, cluster: ClusterConfig) -> None:
        """Forget the cluster's snapshot (its objects and connections) once its assets are done."""
        snapshot = self._snapshots.pop(cluster.name, None)
        if snapshot is not None:
            snapshot.reader.close()

    def teardown_after_execution(self, context: InitResourceContext) -> None:
        for snapshot in list(self._snapshots.values()):
            self.release(snapshot.cluster)


class PrometheusResource(ConfigurableResource):
    timeout_seconds: float = 30.0
    # Range of `rate()` over counters: at least twice the scrape interval.
    rate_window: str = Field(default="1m", pattern=r"^[0-9]+[smh]$")

    def reader(self, cluster: ClusterConfig) -> PromReader | None:
        """None when the registry gives the cluster no Prometheus."""
        if not cluster.prometheus_url:
            return None
        return PromReader(
            cluster.name,
            cluster.prometheus_url,
            timeout_seconds=self.timeout_seconds,
            http=cluster.prometheus_http,
        )


def _setting(variable: str, default: Callable[[], str]) -> str | EnvVar:
    """What the UI shows for a setting: the environment variable when it is set (its name, not a
    URL that may hold a password), else the default in use (a SQLite file under $DAGSTER_HOME)."""
    return EnvVar(variable) if os.environ.get(variable) else default()


defs = Definitions(
    resources={
        # The registry has no default: a code location without it fails its runs and sensors with
        # Dagster's own error naming the variable.
        "registry": ClusterRegistryResource(clusters_file=EnvVar(settings.LENS_CLUSTERS_FILE)),
        "lens_db": LensDatabase(url=_setting(settings.LENS_DATABASE_URL, settings.lens_database_url)),
        "safe_db": SafeDatabase(url=_setting(settings.LENS_SAFE_DATABASE_URL, settings.safe_database_url)),
        "kubernetes": KubernetesResource(),
        "prometheus": PrometheusResource(),
    }
)
