"""What every per-cluster asset shares.

Each asset is a `ClusterPart`: what it is (key, group, description, checks, upstream parts) and a
function computing it for one cluster from a `ClusterTurn` (the cluster, the run's resources and
log). `lens_pipeline.defs.cluster_assets` puts every part into one Dagster multi-asset, so that
one run can cover one cluster or a batch of them, with the collectors of a cluster sharing one
snapshot of its Kubernetes objects.
"""

import functools
import hashlib
import importlib
import threading
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import Future, wait
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetExecutionContext,
    AssetKey,
    AssetRecordsFilter,
    AssetSpec,
    AutomationCondition,
    Backoff,
    Config,
    FreshnessPolicy,
    Jitter,
    MaterializeResult,
    RetryPolicy,
    TableColumn,
    TableColumnConstraints,
    TableSchema,
)
from pydantic import Field
from sqlalchemy import Table

from lens_pipeline.clusters import ClusterConfig
from lens_pipeline.collect.freshness import FAIL_AFTER, WARN_AFTER
from lens_pipeline.collect.problems import Problem
from lens_pipeline.defs.collectors.reporting import problems_metadata, read_metadata
from lens_pipeline.defs.collectors.snapshot import ClusterSnapshot
from lens_pipeline.defs.partitions import cluster_partitions
from lens_pipeline.defs.resources import (
    KubernetesResource,
    LensDatabase,
    PrometheusResource,
    SafeDatabase,
)
from lens_pipeline.prom.dialect import read_dialect
from lens_pipeline.prom.reader import PromError, PromReader
from lens_pipeline.retry import OP_RETRIES, OP_RETRY_DELAY
from lens_pipeline.store.pods import StoredPods, stored_pods
from lens_pipeline.store.schema import safe_metadata
from lens_pipeline.vendors import Dialect, GpuResources, gpu_resources, shipped_dialect

# The step's retries, from the one table of retries (lens_pipeline.retry).
COLLECTOR_RETRY = RetryPolicy(
    max_retries=OP_RETRIES, delay=OP_RETRY_DELAY, backoff=Backoff.EXPONENTIAL, jitter=Jitter.PLUS_MINUS
)
MAX_LOGGED_PROBLEMS = 20


# The UI shows an asset as late after warn_window and failing after fail_window without a new
# materialization; the schedule refreshes every minute.
FRESHNESS = FreshnessPolicy.time_window(fail_window=FAIL_AFTER, warn_window=WARN_AFTER)


# The code that builds the rows of pods and workloads from their objects. A row is rebuilt only
# when its object changed (a new resourceVersion), so rows built by other code are rebuilt once
# when this code changes: a fix or a new column then reaches every object, changed or not.
ROW_MODULES = (
    "lens_pipeline.collect.objects",
    "lens_pipeline.collect.owners",
    "lens_pipeline.collect.pods",
    "lens_pipeline.collect.problems",
    "lens_pipeline.collect.quantity",
    "lens_pipeline.collect.times",
    "lens_pipeline.collect.workloads",
    "lens_pipeline.defs.collectors.gpu_pods",
    "lens_pipeline.defs.collectors.gpu_workloads",
    "lens_pipeline.store.pods",
    "lens_pipeline.store.schema",
    "lens_pipeline.store.types",
    "lens_pipeline.store.workloads",
    "lens_pipeline.vendors",  # which resources are GPUs
)
ROWS_BUILT_BY = "rows_built_by"


@functools.cache
def rows_version() -> str:
    """Names the code of `ROW_MODULES` (a digest of their source), recorded with each materialization
    of `gpu_pods` and `gpu_workloads` as `rows_built_by`."""
    digest = hashlib.sha256()
    for name in ROW_MODULES:
        digest.update(Path(importlib.import_module(name).__file__ or name).read_bytes())
    return digest.hexdigest()[:16]


def rows_built_by(unreadable: Collection[str], gpu_resources: GpuResources) -> str:
    """What a `gpu_pods` / `gpu_workloads` materialization records as `rows_built_by`: this code's
    `rows_version` and the GPU resources the cluster's pods were read for, when every object was
    readable. An unreadable object keeps its stored row as it was, built by whatever code built
    it; were this code recorded, the next run would take that row as this code's and the object,
    unchanged, would no longer be reported. So the next run reads every object in full again, and
    reports it again, until it is readable or gone."""
    if unreadable:
        return f"not recorded: {len(unreadable)} objects unreadable, all read in full next run"
    return _built_by(gpu_resources)


def _built_by(gpu_resources: GpuResources) -> str:
    # The resources are part of it: a pod's GPUs are counted in the resources of the cluster's
    # vendor, so rows built for another vendor (the registry's entry corrected) say nothing of this one's.
    return f"{rows_version()} for {gpu_resources}"


class StatisticsConfig(Config):
    step_seconds: int = Field(
        default=30, ge=1, description="resolution of the utilization series (§4.8: 30 s)"
    )
    idle_threshold_percent: float = Field(
        default=5.0, ge=0, le=100, description="a held GPU under this utilization counts as idle"
    )
    first_window_seconds: int = Field(
        default=600, ge=1, description="how far back the first run of a cluster reads (later runs continue)"
    )
    max_window_seconds: int = Field(
        default=3600,
        ge=1,
        description="a run reads at most this much of what it has not read yet; after an outage the "
        "next runs catch up",
    )


class ClusterAssetsConfig(Config):
    """Run configuration of the cluster assets (`ops: {cluster_assets: {config: ...}}`)."""

    statistics: StatisticsConfig = Field(default_factory=StatisticsConfig)


@dataclass
class ClusterTurn:
    """One cluster's turn in a run: its configuration, the run's resources and log."""

    context: AssetExecutionContext
    cluster: ClusterConfig
    kubernetes: KubernetesResource
    prometheus: PrometheusResource
    lens_db: LensDatabase
    safe_db: SafeDatabase
    config: ClusterAssetsConfig
    _prometheus_reader: PromReader | None = field(default=None, init=False, repr=False)
    _dialect: Dialect | None = field(default=None, init=False, repr=False)
    _dialect_error: str | None = field(default=None, init=False, repr=False)
    _ahead: Future[None] | None = field(default=None, init=False, repr=False)
    _learner: PromReader | None = field(default=None, init=False, repr=False)
    _not_run: set[str] = field(default_factory=set, init=False, repr=False)
    _not_run_lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    @property
    def log(self) -> Any:
        return self.context.log

    def prometheus_reader(self) -> PromReader | None:
        """The cluster's Prometheus for this turn (None when the registry gives it none): one reader
        shared by the parts, holding the answers asked for in advance by `ask_ahead`."""
        if self._prometheus_reader is None:
            self._prometheus_reader = self.prometheus.reader(self.cluster)
        return self._prometheus_reader

    def dialect(self) -> Dialect:
        """How this cluster's exporters name their metrics and labels, learned once per turn from
        its Prometheus (a few cheap requests), with the registry's overrides. When Prometheus cannot
        be asked, the shipped names: the queries then fail and say so."""
        if self._ahead is not None:
            # Learned in the background (`ask_ahead`); once done, the queries are asked too, and a
            # part's query is taken from them rather than asked a second time. Should the background
            # have failed, the dialect is learned here, and its error raised here.
            wait([self._ahead])
        if self._dialect is None:
            self._learn_dialect(self._new_learner())
        assert self._dialect is not None
        return self._dialect

    def _new_learner(self) -> PromReader | None:
        """A reader of its own to learn the dialect on, whichever thread learns it: the dialect's
        requests are no part's, in any part's counts. Made by the turn's thread, so that `release`
        closes it should the turn end while the dialect is being learned."""
        self._learner = self.prometheus.reader(self.cluster)
        return self._learner

    def _learn_dialect(self, learner: PromReader | None) -> Dialect:
        overrides = self.cluster.exporter_overrides
        dialect = shipped_dialect(self.cluster.vendor, overrides)
        if learner is not None:
            try:
                dialect = read_dialect(learner, self.cluster.vendor, overrides)
            except PromError as exc:
                self._dialect_error = str(exc)
            finally:
                learner.close()
        self._dialect = dialect
        return dialect

    def ask_ahead(self, parts: Sequence["ClusterPart"]) -> None:
        """At the start of the turn, in the background: the exporters' dialect learned, then every
        instant query of `parts` asked, in order, so that Prometheus evaluates them while the
        Kubernetes objects are listed and written (at the envelope, the dialect's requests and the
        answers `gpu_devices` waited for were 5-6 s of a no-change run). `forget` drops the queries
        of parts that will not run."""
        reader = self.prometheus_reader()
        if reader is None or self._ahead is not None or not any(p.prometheus_queries for p in parts):
            return
        learner = self._new_learner()

        def learn_and_ask() -> None:
            try:
                dialect = self._learn_dialect(learner)
                with self._not_run_lock:  # a part that failed meanwhile has its queries dropped here
                    reader.prefetch(
                        [q for part in parts if part.key not in self._not_run for q in part.queries(dialect)]
                    )
            except Exception as exc:  # `dialect()` and each part meet the same error, and report it
                self.log.debug(f"cluster {self.cluster.name}: no Prometheus queries asked ahead: {exc}")

        self._ahead = reader.in_background(learn_and_ask)

    def forget(self, parts: Sequence["ClusterPart"]) -> None:
        """The queries asked ahead for `parts`, which will not run (their upstream failed), not
        asked: dropped if already asked for, else never asked for."""
        reader = self.prometheus_reader()
        with self._not_run_lock:
            self._not_run.update(part.key for part in parts)
            if reader is not None and self._dialect is not None:
                reader.forget([q for part in parts for q in part.queries(self._dialect)])

    def dialect_metadata(self) -> dict[str, Any]:
        """The dialect as run metadata: what each exporter's series look like, and what is missing."""
        dialect = self.dialect()
        described = {f"exporter_{k}": v for k, v in dialect.describe().items()}
        if self._dialect_error:
            described["exporter_detection_error"] = self._dialect_error
        return described

    def malformed_samples_mark(self) -> int:
        """Where the turn's count of malformed Prometheus samples stands (see `prometheus_check`)."""
        reader = self.prometheus_reader()
        return reader.malformed_samples if reader is not None else 0

    def release(self) -> None:
        """The end of the cluster's turn: its listed objects and unused answers are let go."""
        if self._prometheus_reader is not None:
            self._prometheus_reader.close()
        if self._learner is not None:
            self._learner.close()
        self.kubernetes.release(self.cluster)

    def snapshot(self) -> ClusterSnapshot:
        """The cluster's Kubernetes objects, listed once and shared by the collectors of the run."""
        snapshot = self.kubernetes.snapshot(self.cluster)
        if snapshot.read_stored_pods is None:
            snapshot.read_stored_pods = self._stored_pods
        return snapshot

    def _stored_pods(self) -> StoredPods:
        with self.lens_db.engine().connect() as conn:
            stored = stored_pods(conn, self.cluster.name)
        if not self.rows_built_by_this_code("gpu_pods"):
            return StoredPods(stored.versions)  # every pod's rows built again
        return stored

    def rows_built_by_this_code(self, key: str) -> bool:
        """Whether the cluster's last materialization of `key` recorded rows built by this code
        (`rows_version`) for this cluster's GPU resources: only then do rows stored for an object
        that did not change hold what this code would build from it."""
        found = self.context.instance.fetch_materializations(
            AssetRecordsFilter(asset_key=AssetKey(key), asset_partitions=[self.cluster.name]), limit=1
        ).records
        if not found or found[0].asset_materialization is None:
            return False
        recorded = found[0].asset_materialization.metadata.get(ROWS_BUILT_BY)
        return recorded is not None and recorded.value == _built_by(self.gpu_resources)

    @property
    def gpu_resources(self) -> GpuResources:
        """The resources the cluster's pods are read for (`ClusterSnapshot` reads them so too)."""
        return gpu_resources(self.cluster.vendor)


@dataclass(frozen=True)
class ClusterPart:
    """One per-cluster asset: its definition and the function computing it for one cluster."""

    key: str
    group: str
    description: str
    kinds: frozenset[str]
    checks: dict[str, str]
    deps: tuple["ClusterPart", ...]
    compute: Callable[[ClusterTurn], MaterializeResult]
    automation_condition: AutomationCondition | None = None
    # The instant PromQL queries `compute` will ask in a cluster of this dialect, asked ahead by
    # `ClusterTurn.ask_ahead`.
    prometheus_queries: Callable[[Dialect], list[str]] | None = None
    # The table it writes (its main one), shown in the catalog: `table_metadata`.
    table: Table | None = None

    def queries(self, dialect: Dialect) -> list[str]:
        return self.prometheus_queries(dialect) if self.prometheus_queries is not None else []

    def spec(self) -> AssetSpec:
        return AssetSpec(
            self.key,
            deps=[d.key for d in self.deps],
            description=self.description,
            group_name=self.group,
            kinds=set(self.kinds),
            partitions_def=cluster_partitions,
            freshness_policy=FRESHNESS,
            automation_condition=self.automation_condition,
            metadata=table_metadata(self.table) if self.table is not None else None,
            # A cluster that failed gets no materialization; the run goes on with the others.
            skippable=True,
        )

    def check_specs(self) -> list[AssetCheckSpec]:
        return [AssetCheckSpec(n, asset=self.key, description=d) for n, d in self.checks.items()]


def table_metadata(table: Table) -> dict[str, Any]:
    """What the Dagster catalog shows of the table an asset writes (its Columns tab, and the table
    it names for lineage): the table's name as the schema declares it, in the Lens database or the
    SaFE one, and its columns with their types and whether they may be NULL."""
    database = "safe" if table.metadata is safe_metadata else "lens"
    return {
        "dagster/table_name": f"{database}.{table.name}",
        "dagster/column_schema": TableSchema(
            columns=[
                TableColumn(
                    column.name,
                    str(column.type),
                    description=column.comment,
                    constraints=TableColumnConstraints(nullable=column.nullable),
                )
                for column in table.columns
            ]
        ),
    }


def cluster_part(
    *,
    group: str,
    description: str,
    checks: dict[str, str],
    deps: Sequence[ClusterPart] = (),
    kinds: frozenset[str],
    automation_condition: AutomationCondition | None = None,
    prometheus_queries: Callable[[Dialect], list[str]] | None = None,
    table: Table | None = None,
) -> Callable[[Callable[[ClusterTurn], MaterializeResult]], ClusterPart]:
    """Declare a per-cluster asset (name -> what each check guards)."""

    def decorate(fn: Callable[[ClusterTurn], MaterializeResult]) -> ClusterPart:
        return ClusterPart(
            key=fn.__name__,
            group=group,
            description=description,
            kinds=kinds,
            checks=dict(checks),
            deps=tuple(deps),
            compute=fn,
            automation_condition=automation_condition,
            prometheus_queries=prometheus_queries,
            table=table,
        )

    return decorate


def collector(
    *,
    description: str,
    checks: dict[str, str],
    deps: Sequence[ClusterPart] = (),
    kinds: frozenset[str] = frozenset({"kubernetes", "sql"}),
    prometheus_queries: Callable[[Dialect], list[str]] | None = None,
    table: Table | None = None,
) -> Callable[[Callable[[ClusterTurn], MaterializeResult]], ClusterPart]:
    """A per-cluster collector, refreshed by the `collect_every_minute` schedule."""
    return cluster_part(
        group="collectors",
        description=description,
        checks=checks,
        deps=deps,
        kinds=kinds,
        prometheus_queries=prometheus_queries,
        table=table,
    )


def check(name: str, passed: bool, *, warn: bool = False, **metadata: Any) -> AssetCheckResult:
    """An asset check's result: an error when it fails, or only a warning."""
    severity = AssetCheckSeverity.WARN if warn else AssetCheckSeverity.ERROR
    return AssetCheckResult(check_name=name, passed=passed, severity=severity, metadata=metadata)


def prometheus_check(name: str, turn: ClusterTurn, mark: int, error: str | None) -> AssetCheckResult:
    """A part's Prometheus check: it answered (no `error`), and no sample since `mark` (the reader's
    `malformed_samples` when the part began) was skipped as malformed. A warning: what could be
    read is used, what could not is counted and shown."""
    reader = turn.prometheus_reader()
    skipped, examples = reader.malformed_since(mark) if reader is not None else (0, [])
    return check(
        name,
        error is None and not skipped,
        warn=True,
        error=error or "",
        malformed_samples=skipped,
        malformed_sample_examples=examples[:MAX_LOGGED_PROBLEMS],
    )


@dataclass
class CollectorRun:
    """One collector's work on one cluster in one run."""

    turn: ClusterTurn
    problems: list[Problem] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.cluster = self.turn.cluster
        self.snapshot = self.turn.snapshot()
        self._started = datetime.now(UTC)
        self._stats_before = self.snapshot.reader.stats.copy()
        self._prometheus_before = self._prometheus_answers()
        self.malformed_samples_mark = self.turn.malformed_samples_mark()

    def check(self, name: str, passed: bool, *, warn: bool = False, **metadata: Any) -> AssetCheckResult:
        return check(name, passed, warn=warn, **metadata)

    def readable_check(self, name: str) -> AssetCheckResult:
        """The check every collector has: every object could be read (a warning, not an error)."""
        return self.check(name, not self.problems, warn=True, malformed_objects=len(self.problems))

    def _malformed_samples(self) -> int:
        reader = self.turn.prometheus_reader()
        return reader.malformed_since(self.malformed_samples_mark)[0] if reader is not None else 0

    def _prometheus_answers(self) -> int:
        """Answers the cluster's Prometheus reader gave so far: shared by the parts of the turn, so
        a part counts its own as the difference, as it counts its Kubernetes reads."""
        reader = self.turn.prometheus_reader()
        return reader.queries if reader is not None else 0

    def finish(self, metadata: dict[str, Any], checks: list[AssetCheckResult]) -> MaterializeResult:
        for problem in self.problems[:MAX_LOGGED_PROBLEMS]:
            self.turn.log.warning(f"cluster {self.cluster.name}: skipped {problem}")
        stats = self.snapshot.reader.stats.since(self._stats_before)
        return MaterializeResult(
            metadata={
                "cluster": self.cluster.name,
                **metadata,
                "duration_seconds": round((datetime.now(UTC) - self._started).total_seconds(), 3),
                **read_metadata(stats, self._prometheus_answers() - self._prometheus_before),
                "prometheus_malformed_samples": self._malformed_samples(),
                **problems_metadata(self.problems),
            },
            check_results=checks,
        )
