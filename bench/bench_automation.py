"""Benchmark: what one evaluation of the hourly history's automation (`hourly_history_automation`,
defs/history/automation.py) costs the Dagster daemon, for `--clusters` clusters and the default
window of partitions (`$LENS_HISTORY_DAYS` days of hours per cluster).

The evaluations follow an hour as the daemon sees it: three a minute apart before five past, then
one after the tick once every cluster's collectors ran (it asks for every cluster's closed hour),
then `--after` more, with the collectors materializing every cluster before each of these as the
one-minute schedule does (before the tick no collector has run yet, so those evaluations are
cheaper than the daemon's). Each evaluation's wall time (the daemon runs it on one thread) and
what it asked are printed, then the median of the quiet ones (nothing to ask).

`--condition on_cron` puts Dagster's `AutomationCondition.on_cron` back in place of our closed-hour
condition (on the same one asset of the five), to compare (`missing_hour` and `new_cluster_hour`
are today's in both). `--backfill-days` (0 by default) is `$LENS_HISTORY_BACKFILL_DAYS`: with
more, the first evaluation also asks for the missing days of every new cluster. With
`--collected-before` the clusters' collectors ran before the first evaluation, as in a fleet that
has been running (without it every cluster is new, collected first at the tick, so its first
collection also asks for its closed hour).

    .venv/bin/python bench/bench_automation.py --clusters 100 [--condition on_cron] [--collected-before]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from datetime import UTC, datetime, timedelta


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clusters", type=int, default=100)
    parser.add_argument("--after", type=int, default=4, help="quiet evaluations after the tick's")
    parser.add_argument("--condition", choices=("ours", "on_cron"), default="ours")
    parser.add_argument("--backfill-days", type=int, default=0)
    parser.add_argument(
        "--collected-before",
        action="store_true",
        help="the collectors materialized every cluster before the first evaluation (clusters that "
        "were there all along; without it, every cluster is new and collected first at the tick)",
    )
    args = parser.parse_args()
    # Read when the automation module is imported.
    os.environ["LENS_HISTORY_BACKFILL_DAYS"] = str(args.backfill_days)

    from dagster import (
        AssetMaterialization,
        AssetSelection,
        AutomationCondition,
        evaluate_automation_conditions,
        instance_for_test,
    )

    from lens_pipeline import settings
    from lens_pipeline.definitions import defs
    from lens_pipeline.defs.history.assets import AUTOMATED, KEYS, UPSTREAM
    from lens_pipeline.defs.history.automation import CLOSED_HOUR_CRON, missing_hour, new_cluster_hour
    from lens_pipeline.defs.partitions import CLUSTER_PARTITIONS_NAME

    assets = list(defs.resolve_asset_graph().assets_defs)
    if args.condition == "on_cron":
        baseline = AutomationCondition.on_cron(CLOSED_HOUR_CRON) | new_cluster_hour | missing_hour
        assets = [
            a.map_asset_specs(
                lambda spec: spec.replace_attributes(
                    automation_condition=baseline if spec.key == AUTOMATED else None
                )
            )
            if set(a.keys) & set(KEYS)
            else a
            for a in assets
        ]
    names = [f"bench-{i:04d}" for i in range(args.clusters)]
    # The evaluations after the tick run at the wall clock's time (the collectors' materializations
    # carry it): a run started between :00 and five past waits for the tick first. (A run of many
    # clusters started late in the hour can still cross the next one.)
    now = datetime.now(UTC)
    tick = now.replace(minute=5, second=0, microsecond=0)
    if timedelta(seconds=-5) < tick - now < timedelta(minutes=5):
        print(f"waiting {(tick - now).total_seconds() + 5:.0f} s for the tick at {tick:%H:%M}")
        time.sleep((tick - now).total_seconds() + 5)
    tick = tick if tick <= datetime.now(UTC) else tick - timedelta(hours=1)
    print(
        f"{args.clusters} clusters x {settings.history_days()} days of hours ({args.condition}), "
        f"backfill {args.backfill_days} days; the tick at {tick:%H:%M}"
    )
    times: list[datetime | None] = [tick - timedelta(minutes=m) for m in (3, 2, 1)]
    times += [None] * (args.after + 1)  # now
    quiet: list[float] = []

    def collect(instance, names: list[str]) -> None:
        for name in names:
            for upstream in UPSTREAM:
                instance.report_runless_asset_event(AssetMaterialization(upstream, partition=name))

    with instance_for_test() as instance:
        instance.add_dynamic_partitions(CLUSTER_PARTITIONS_NAME, names)
        if args.collected_before:
            collect(instance, names)
        cursor = None
        for planned in times:
            if planned is None:
                collect(instance, names)
            when = planned or datetime.now(UTC)
            began = time.perf_counter()
            result = evaluate_automation_conditions(
                defs=assets,
                instance=instance,
                asset_selection=AssetSelection.assets(*KEYS),
                evaluation_time=when,
                cursor=cursor,
            )
            seconds = time.perf_counter() - began
            cursor = result.cursor
            # Every asset of the history, those asked with the one that carries the condition too.
            asked = sum(len(result.get_requested_partitions(key)) for key in KEYS)
            if asked == 0 and planned is None:
                quiet.append(seconds)
            print(f"  {when:%H:%M:%S}  {seconds:6.2f} s  asked {asked} partitions")
    if quiet:
        print(f"quiet evaluations after the tick's: median {statistics.median(quiet):.2f} s of {len(quiet)}")


if __name__ == "__main__":
    main()
