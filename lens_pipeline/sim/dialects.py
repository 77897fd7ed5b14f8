"""How a simulated cluster's exporters and scrape configuration differ from the shipped defaults,
as real deployments do. The ground truth never changes with the dialect: only the names and labels
a Prometheus holds do, and JuiceFS's figures for a volume without quota.

Facts, from each project's own source:
- AMD device-metrics-exporter puts `CommonConfig.MetricsFieldPrefix` (its example config: `amd_`)
  before every metric name, and exports its mandatory labels (`pod`, `namespace`, `container`...)
  with empty values on GPUs that no workload holds.
- Prometheus with `honor_labels: false` (a ServiceMonitor's default, and dcgm-exporter's chart)
  renames a scraped label that clashes with a non-empty target label to `exported_<name>`; the
  target's `pod`, `namespace`, `container` are the exporter pod's. An empty scraped value is not
  renamed, and labels with empty values are dropped.
- node_exporter's InfiniBand series name no node: without relabelling, only `instance`
  (`<node IP>:9100`) says where they come from.
- GPU feature discovery before v0.15.0 labels nodes with `nvidia.com/cuda.driver.major/minor/rev`
  only, not `nvidia.com/cuda.driver-version.full`.
- dcgm-exporter renamed its `Hostname` label to `hostname` (#655), after the 4.x releases that
  added `DCGM_FI_DEV_FB_RESERVED` (4.3.1-4.4.0).
- JuiceFS without a capacity quota reports 1 PiB of total space, doubled until the used space is at
  most 80 % of it, and 10 Mi free inodes, doubled likewise (pkg/meta/base.go, statRootFs).
"""

from __future__ import annotations

from dataclasses import dataclass

EXPORTED = "exported_"
# The labels Prometheus Operator's ServiceMonitor puts on every target (besides job and instance).
TARGET_POD_LABELS = ("pod", "namespace", "container")


@dataclass(frozen=True)
class ExporterDialect:
    name: str
    metric_prefix: str = ""  # before every GPU exporter metric
    honor_labels: bool = True  # False: the exporter pod's labels are target labels, the GPU's exported_*
    node_label_on_targets: bool = True  # False: per-node targets carry `instance` only
    legacy_gfd: bool = False  # NVIDIA nodes: cuda.driver.major/minor/rev, not driver-version.full
    juicefs_quota: bool = True  # False: volumes report JuiceFS's made-up capacity
    lowercase_hostname: bool = False  # dcgm-exporter's `hostname` instead of `Hostname`
    missing_metrics: tuple[str, ...] = ()  # GPU exporter metrics (shipped names) it does not export

    @property
    def relabelled(self) -> bool:
        """Whether Prometheus changes the scraped labels (honor_labels: false)."""
        return not self.honor_labels


SHIPPED = ExporterDialect("shipped")
DIALECTS: dict[str, ExporterDialect] = {
    d.name: d
    for d in (
        SHIPPED,
        ExporterDialect("prefixed", metric_prefix="amd_"),
        ExporterDialect("honor-labels-false", honor_labels=False),
        ExporterDialect("instance-only", node_label_on_targets=False),
        ExporterDialect("legacy-gfd", legacy_gfd=True),
        ExporterDialect("no-quota", juicefs_quota=False),
        ExporterDialect("dcgm-hostname", lowercase_hostname=True),
        ExporterDialect(
            "everything",
            metric_prefix="amd_",
            honor_labels=False,
            node_label_on_targets=False,
            legacy_gfd=True,
            juicefs_quota=False,
            lowercase_hostname=True,
        ),
    )
}
DIALECT_CHOICES = (*DIALECTS, "mixed")


def dialect_for(choice: str, index: int, seed: int) -> ExporterDialect:
    """The dialect of the `index`-th cluster of a fleet: `mixed` takes every dialect in turn, from
    a place the seed chooses, so any eight consecutive indices show them all; `a,b` takes the named
    ones in turn."""
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
