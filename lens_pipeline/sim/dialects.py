"""How a simulated cluster's exporters and scrape configuration differ from the shipped defaults,
as real deployments do. The ground truth never changes with the dialect: only the names and labels
a Prometheus holds do, and JuiceFS's figures for a volume without quota.

Facts, from each project's own source:
- AMD device-metrics-exporter puts `CommonConfig.MetricsFieldPrefix` (its example config: `amd_`)
  before every metric name, and exports its mandatory labels (`gpuMandatoryLables`: `gpu_id`,
  `card_model`, `gpu_partition_id`, `gpu_compute_partition_type`, `gpu_memory_partition_type`,
  `deployment_mode`, `serial_number`, `pod`, `namespace`, `container`, `job_id`, `job_user`,
  `job_partition`, `hostname`) with empty values where there is nothing to say (a GPU no workload
  holds). `card_series` (the market name) and `gpu_uuid` are optional labels its example config
  turns on; its default set names the model by `card_model` only.
- Prometheus with `honor_labels: false` (a ServiceMonitor's default, and dcgm-exporter's chart)
  renames a scraped label that clashes with a non-empty target label to `exported_<name>`; the
  target's `pod`, `namespace`, `container` are the exporter pod's. An empty scraped value is not
  renamed, and labels with empty values are dropped.
- node_exporter's InfiniBand series name no node: without relabelling, only `instance`
  (`<node IP>:9100`) says where they come from; relabelling configs name it `node`,
  `kubernetes_node`, `nodename`, or (the original's vmagent) `primus_lens_node_name`.
- GPU feature discovery before k8s-device-plugin v0.15.0 labels nodes with
  `nvidia.com/cuda.driver.major/minor/rev` only, not `nvidia.com/cuda.driver-version.full`.
- dcgm-exporter exports `DCGM_FI_DEV_FB_RESERVED` since 4.3.1-4.4.0 (etc/default-counters.csv);
  `--use-old-namespace` writes `uuid`, `pod_name`, `pod_namespace`, `container_name` for `UUID`,
  `pod`, `namespace`, `container`. Its main branch renamed `Hostname` to `hostname` (#655, commit
  d5e5f51), after 4.5.3-4.8.2 and in no release tag yet.
- JuiceFS without a capacity quota reports 1 PiB of total space, doubled until the used space is at
  most 80 % of it, and 10 Mi free inodes, doubled likewise (pkg/meta/base.go, statRootFs).
- Prometheus lists the metric and label names of its lookback window (`/api/v1/labels` with
  `start`), so for minutes after an exporter upgrade the old names are listed beside the new ones,
  while instant queries see only current series.
"""

from __future__ import annotations

from dataclasses import dataclass

EXPORTED = "exported_"
# The labels Prometheus Operator's ServiceMonitor puts on every target (besides job and instance).
TARGET_POD_LABELS = ("pod", "namespace", "container")
# dcgm-exporter's `--use-old-namespace` names for its labels.
DCGM_OLD_NAMESPACE = {
    "UUID": "uuid",
    "pod": "pod_name",
    "namespace": "pod_namespace",
    "container": "container_name",
}
# AMD device-metrics-exporter's mandatory labels besides those the simulator always writes, with the
# values an unpartitioned GPU outside Slurm has (empty ones are dropped by Prometheus).
AMD_DEFAULT_EXTRA_LABELS = {
    "gpu_partition_id": "0",
    "gpu_compute_partition_type": "spx",
    "gpu_memory_partition_type": "nps1",
    "deployment_mode": "",
    "job_id": "",
    "job_user": "",
    "job_partition": "",
}
AMD_OPTIONAL_LABELS = ("card_series", "gpu_uuid")


@dataclass(frozen=True)
class ExporterDialect:
    name: str
    metric_prefix: str = ""  # before every GPU exporter metric
    honor_labels: bool = True  # False: the exporter pod's labels are target labels, the GPU's exported_*
    node_target_label: str = "node"  # the label naming a per-node target's node; "": `instance` only
    legacy_gfd: bool = False  # NVIDIA nodes: cuda.driver.major/minor/rev, not driver-version.full
    juicefs_quota: bool = True  # False: volumes report JuiceFS's made-up capacity
    lowercase_hostname: bool = False  # dcgm-exporter's `hostname` instead of `Hostname`
    dcgm_old_namespace: bool = False  # dcgm-exporter's --use-old-namespace labels
    amd_default_labels: bool = False  # AMD exporter's default label set (no card_series, no gpu_uuid)
    missing_metrics: tuple[str, ...] = ()  # GPU exporter metrics (shipped names) it does not export
    # The dialect the exporters spoke minutes ago (an upgrade, a prefix just set, a relabelling just
    # removed): Prometheus still lists its metric and label names over its lookback window, while
    # no instant query sees a series of it any more.
    lingering: ExporterDialect | None = None

    @property
    def relabelled(self) -> bool:
        """Whether Prometheus changes the scraped labels (honor_labels: false)."""
        return not self.honor_labels


SHIPPED = ExporterDialect("shipped")
# dcgm-exporter releases before 4.3.1-4.4.0 have no reserved framebuffer series.
DCGM_WITHOUT_RESERVED = ("DCGM_FI_DEV_FB_RESERVED",)
DIALECTS: dict[str, ExporterDialect] = {
    d.name: d
    for d in (
        SHIPPED,
        ExporterDialect("prefixed", metric_prefix="amd_"),
        ExporterDialect("honor-labels-false", honor_labels=False),
        ExporterDialect("instance-only", node_target_label=""),
        ExporterDialect("kubernetes-node", node_target_label="kubernetes_node"),
        ExporterDialect("nodename", node_target_label="nodename"),
        ExporterDialect("primus-lens-node-name", node_target_label="primus_lens_node_name"),
        ExporterDialect("legacy-gfd", legacy_gfd=True),
        ExporterDialect("no-quota", juicefs_quota=False),
        ExporterDialect("dcgm-hostname", lowercase_hostname=True),
        ExporterDialect("dcgm-without-reserved", missing_metrics=DCGM_WITHOUT_RESERVED),
        ExporterDialect("dcgm-old-namespace", dcgm_old_namespace=True),
        ExporterDialect("amd-default-labels", amd_default_labels=True),
        ExporterDialect(
            "just-upgraded",
            metric_prefix="amd_",
            lowercase_hostname=True,
            node_target_label="",
            lingering=SHIPPED,
        ),
        ExporterDialect(
            "everything",
            metric_prefix="amd_",
            honor_labels=False,
            node_target_label="",
            legacy_gfd=True,
            juicefs_quota=False,
            lowercase_hostname=True,
            dcgm_old_namespace=True,
            amd_default_labels=True,
            missing_metrics=DCGM_WITHOUT_RESERVED,
        ),
    )
}
DIALECT_CHOICES = (*DIALECTS, "mixed")


def dialect_for(choice: str, index: int, seed: int) -> ExporterDialect:
    """The dialect of the `index`-th cluster of a fleet: `mixed` takes every dialect in turn, from
    a place the seed chooses, so any `len(DIALECTS)` consecutive indices show them all; `a,b` takes
    the named ones in turn."""
    names = list(DIALECTS) if choice == "mixed" else choice.split(",")
    unknown = [n for n in names if n not in DIALECTS]
    if unknown:
        raise ValueError(f"dialect must be one of {', '.join(DIALECT_CHOICES)} (or a,b), got {choice!r}")
    offset = seed if choice == "mixed" else 0
    return DIALECTS[names[(offset + index) % len(names)]]


def juicefs_made_up_space(used: float) -> float:
    """The total space JuiceFS reports for a volume without a quota."""
    total = float(1 << 50)
    while total * 8 < used * 10:
        total *= 2
    return total


def juicefs_made_up_inodes(used: float) -> float:
    """The total inodes JuiceFS reports for a volume without an inode quota."""
    free = float(10 << 20)
    while used > free * 4:
        free *= 2
    return used + free


def relabel(labels: dict[str, str], target: dict[str, str]) -> dict[str, str]:
    """A scraped series' labels as Prometheus stores them under `honor_labels: false`: a non-empty
    scraped label that a target label also names is kept as `exported_<name>`, the target's wins,
    and empty labels are dropped."""
    out = {k: v for k, v in labels.items() if v != "" and k not in target}
    for name, value in target.items():
        scraped = labels.get(name, "")
        if scraped:
            out[f"{EXPORTED}{name}"] = scraped
        out[name] = value
    return out
