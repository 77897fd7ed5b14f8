"""The one Definitions of the lens_pipeline code location."""

from dagster import Definitions, in_process_executor

from lens_pipeline.defs import resources
from lens_pipeline.defs.collectors import schedules as collectors
from lens_pipeline.defs.containers import sensors as containers
from lens_pipeline.defs.derived import assets as derived
from lens_pipeline.defs.fleet import freshness, retention
from lens_pipeline.defs.fleet import sensors as fleet
from lens_pipeline.defs.history import sensors as history

defs = Definitions.merge(
    resources.defs,
    collectors.defs,
    containers.defs,
    derived.defs,
    fleet.defs,
    freshness.defs,
    retention.defs,
    history.defs,
    # Every run is a new process that loads the code location (3-5 CPU-seconds on two slow cores);
    # Dagster's default executor starts another per step, which loads it again. Our jobs are one or
    # two steps, and a run's collectors share one resource instance (one LIST per kind): the
    # scheduled jobs ask for this executor themselves, and with this default so do the runs of the
    # automation sensors, the retention schedules, backfills and the UI's materializations.
    Definitions(executor=in_process_executor),
)
