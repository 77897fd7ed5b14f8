"""The hourly history's partitions: every registered cluster times every closed UTC hour of the last
`$LENS_HISTORY_DAYS` days (Dagster's multi-partitions of the `cluster` partitions and hourly ones).

In the UI an asset of the history shows a grid of clusters by hours; a cluster's row is its week,
and a backfill can be launched over any rectangle of it. Hours older than the window are not
partitions any more (Prometheus no longer has them); their rows stay in the tables.
"""

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

from dagster import HourlyPartitionsDefinition, MultiPartitionKey, MultiPartitionsDefinition

from lens_pipeline import settings
from lens_pipeline.defs.partitions import CLUSTER_PARTITIONS_NAME, cluster_partitions

HOUR_DIMENSION = "hour"
HOUR_FORMAT = "%Y-%m-%d-%H:%M"


def first_hour(now: datetime, days: int) -> datetime:
    """The window's first hour: midnight UTC `days` days back (a whole day, so that the window's
    start moves once a day, not at every code reload)."""
    return (now - timedelta(days=days)).astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)


hour_partitions = HourlyPartitionsDefinition(
    start_date=first_hour(datetime.now(UTC), settings.history_days()).strftime(HOUR_FORMAT),
    fmt=HOUR_FORMAT,
    timezone="UTC",
)
history_partitions = MultiPartitionsDefinition(
    {CLUSTER_PARTITIONS_NAME: cluster_partitions, HOUR_DIMENSION: hour_partitions}
)


def cluster_and_hour(key: str) -> tuple[str, datetime]:
    """(cluster, start of the hour) of a history partition key ("<cluster>|<hour>": dimensions in
    name order; cluster names never hold '|')."""
    if isinstance(key, MultiPartitionKey):
        cluster, hour = key.keys_by_dimension[CLUSTER_PARTITIONS_NAME], key.keys_by_dimension[HOUR_DIMENSION]
    else:
        cluster, _, hour = str(key).partition("|")
    return cluster, datetime.strptime(hour, HOUR_FORMAT).replace(tzinfo=UTC)


def history_key(cluster: str, hour: datetime) -> str:
    return str(
        MultiPartitionKey({CLUSTER_PARTITIONS_NAME: cluster, HOUR_DIMENSION: hour.strftime(HOUR_FORMAT)})
    )


def hours_by_cluster(keys: Iterable[str]) -> dict[str, list[datetime]]:
    """A run's partitions, each cluster's hours in order (clusters in the order met)."""
    out: dict[str, list[datetime]] = {}
    for key in keys:
        cluster, hour = cluster_and_hour(key)
        out.setdefault(cluster, []).append(hour)
    return {cluster: sorted(hours) for cluster, hours in out.items()}
