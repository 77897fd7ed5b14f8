"""Run retention on a real instance: this code location's finished runs older than the window go
with their event logs, those launched by hand in the UI (Dagster's code location tag alone) too;
the pruning run itself, runs inside the window, and other code locations' runs (a shared Dagster)
stay."""

from __future__ import annotations

from dagster import asset, instance_for_test, materialize

from lens_pipeline.defs.fleet.retention import prune_run_history
from lens_pipeline.defs.run_tags import CODE_LOCATION, CODE_LOCATION_TAG, DAGSTER_CODE_LOCATION_TAG


@asset
def tiny() -> int:
    return 1


def test_old_finished_runs_of_this_code_location_are_deleted_and_others_kept():
    with instance_for_test() as instance:
        ours = {CODE_LOCATION_TAG: CODE_LOCATION}
        old = [materialize([tiny], instance=instance, tags=ours).run_id for _ in range(3)]
        theirs = materialize([tiny], instance=instance, tags={"team": "other"}).run_id
        assert all(instance.get_records_for_run(run_id).records for run_id in old)

        kept = prune_run_history.execute_in_process(
            instance=instance, run_config={"ops": {"delete_old_runs": {"config": {"keep_hours": 1}}}}
        )
        assert kept.success and kept.output_for_node("delete_old_runs") == 0
        assert {r.run_id for r in instance.get_runs()} >= set(old)

        pruned = prune_run_history.execute_in_process(
            instance=instance, run_config={"ops": {"delete_old_runs": {"config": {"keep_hours": 0}}}}
        )
        assert pruned.success and pruned.output_for_node("delete_old_runs") == 4  # 3 + the first pruning
        remaining = {r.run_id for r in instance.get_runs()}
        assert remaining == {pruned.run_id, theirs}
        assert not any(instance.get_records_for_run(run_id).records for run_id in old)
        assert instance.get_records_for_run(theirs).records


def test_runs_launched_in_the_ui_go_by_dagsters_code_location_tag():
    """A run started by hand in the UI carries none of our tags, only the `dagster/code_location`
    Dagster gives every run of a workspace (test_browser.py sees it on one): the pruning run, itself
    launched in our code location, deletes those of its own location and keeps another's."""
    location = "lens-pipeline"  # the chart's deployment name, unlike CODE_LOCATION
    with instance_for_test() as instance:
        by_hand = [
            materialize([tiny], instance=instance, tags={DAGSTER_CODE_LOCATION_TAG: location}).run_id
            for _ in range(2)
        ]
        materialize(
            [tiny],
            instance=instance,
            tags={CODE_LOCATION_TAG: CODE_LOCATION, DAGSTER_CODE_LOCATION_TAG: location},
        )
        theirs = materialize([tiny], instance=instance, tags={DAGSTER_CODE_LOCATION_TAG: "billing"}).run_id
        config = {"ops": {"delete_old_runs": {"config": {"keep_hours": 0}}}}

        untagged = prune_run_history.execute_in_process(instance=instance, run_config=config)
        assert untagged.output_for_node("delete_old_runs") == 1  # in process: our own tag only
        assert {r.run_id for r in instance.get_runs()} >= {*by_hand, theirs}

        pruned = prune_run_history.execute_in_process(
            instance=instance, run_config=config, tags={DAGSTER_CODE_LOCATION_TAG: location}
        )
        assert pruned.success and pruned.output_for_node("delete_old_runs") == 3  # 2 + the first pruning
        assert {r.run_id for r in instance.get_runs()} == {pruned.run_id, theirs}


def test_the_deletion_bound_holds_across_both_marks():
    """`max_deletions` bounds a run's deletions whichever mark found them: a catch-up after a long
    stop goes in bounded runs, the rest at the next hour."""
    location = "lens-pipeline"
    with instance_for_test() as instance:
        for tags in [{CODE_LOCATION_TAG: CODE_LOCATION}] * 2 + [{DAGSTER_CODE_LOCATION_TAG: location}] * 3:
            materialize([tiny], instance=instance, tags=tags)
        config = {"ops": {"delete_old_runs": {"config": {"keep_hours": 0, "max_deletions": 3}}}}
        first = prune_run_history.execute_in_process(
            instance=instance, run_config=config, tags={DAGSTER_CODE_LOCATION_TAG: location}
        )
        assert first.output_for_node("delete_old_runs") == 3
        assert len(instance.get_runs()) == 3  # two of the five, and the pruning run
        second = prune_run_history.execute_in_process(
            instance=instance, run_config=config, tags={DAGSTER_CODE_LOCATION_TAG: location}
        )
        assert second.output_for_node("delete_old_runs") == 3  # the two, and the first pruning run
        assert [r.run_id for r in instance.get_runs()] == [second.run_id]
