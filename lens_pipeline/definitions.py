"""The one Definitions of the lens_pipeline code location."""

from dagster import Definitions

from lens_pipeline.defs import resources
from lens_pipeline.defs.collectors import schedules as collectors
from lens_pipeline.defs.containers import sensors as containers
from lens_pipeline.defs.derived import assets as derived
from lens_pipeline.defs.fleet import freshness, retention
from lens_pipeline.defs.fleet import sensors as fleet

defs = Definitions.merge(
    resources.defs,
    collectors.defs,
    containers.defs,
    derived.defs,
    fleet.defs,
    freshness.defs,
    retention.defs,
)
