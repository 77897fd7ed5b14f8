"""Runs for different clusters write one SQLite file at the same time, as Dagster's run processes do.

Four processes start together on a fresh database, so they also race the first-use migration.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

from lens_pipeline.sim.fleet import SimFleet
from lens_pipeline.sim.registry import write_registry
from lens_pipeline.sim.server import SimServer
from lens_pipeline_tests.defs.test_gpu_nodes import assert_table_equals_truth

RUN_ONE = textwrap.dedent(
    """
    import sys
    from dagster import instance_for_test
    from lens_pipeline.defs import resources
    from lens_pipeline_tests.defs.support import materialize_cluster
    from lens_pipeline.defs.resources import ClusterRegistryResource, LensDatabase

    cluster, registry, url = sys.argv[1:4]
    with instance_for_test() as instance:
        instance.add_dynamic_partitions("cluster", [cluster])
        for _ in range(3):
            materialize_cluster(["gpu_nodes"], partition_key=cluster, instance=instance, resources={
                **resources.defs.resources,
                "registry": ClusterRegistryResource(clusters_file=registry),
                "lens_db": LensDatabase(url=url),
            })
    """
)


def test_concurrent_runs_of_several_clusters_on_one_sqlite_file(tmp_path):
    fleet = SimFleet.generate(clusters=4, nodes=40, seed=5, vendor="mixed")
    url = f"sqlite:///{tmp_path / 'lens.db'}"
    with SimServer(fleet) as server:
        registry = write_registry(tmp_path / "clusters.yaml", server)
        processes = [
            subprocess.Popen(
                [sys.executable, "-c", RUN_ONE, cluster.name, str(registry), url],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for cluster in fleet
        ]
        outputs = [p.communicate(timeout=240)[0] for p in processes]
        for process, output in zip(processes, outputs, strict=True):
            assert process.returncode == 0, output[-3000:]
        for cluster in fleet:
            assert_table_equals_truth(url, server, cluster.name)
