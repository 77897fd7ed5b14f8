"""How everything that retries waits: exponential backoff with jitter and a cap, in one place.

A retry without a wait is a tight loop that burns a core while what it waits for is away; a retry
without jitter makes every client come back at the same instant. The budgets of each layer are in
docs/OPERATIONS.md.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class Backoff:
    """Waits of `first` seconds, times `factor` each time, never over `cap`; each wait is drawn
    between (1 - jitter) and 1 times its nominal value ("equal jitter")."""

    first: float = 0.1
    factor: float = 2.0
    cap: float = 5.0
    jitter: float = 0.5

    def __post_init__(self) -> None:
        if not (0 < self.first <= self.cap and self.factor >= 1 and 0 <= self.jitter <= 1):
            raise ValueError(f"a backoff needs 0 < first <= cap, factor >= 1, 0 <= jitter <= 1: {self}")

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """The wait before retry number `attempt` (1 for the first retry)."""
        nominal = min(self.cap, self.first * self.factor ** max(0, attempt - 1))
        draw = (rng or random).random()
        return nominal * (1 - self.jitter * draw)

    def delays(self, rng: random.Random | None = None) -> Iterator[float]:
        """The waits of retries 1, 2, 3... (endless: the caller bounds the attempts)."""
        attempt = 0
        while True:
            attempt += 1
            yield self.delay(attempt, rng)


# The log writer retries a commit until the database is back (nothing is acknowledged meanwhile).
LOG_COMMIT = Backoff(first=0.1, factor=2.0, cap=5.0)
# A Kubernetes GET that met a transient error (5xx, 429, refused, timeout): KUBE_RETRIES of these
# (`KubernetesResource.max_retries`).
KUBE_REQUEST = Backoff(first=0.5, factor=2.0, cap=8.0)
KUBE_RETRIES = 3
# A Prometheus query that met a gateway error (429, 502, 503, 504): PROM_RETRIES of these
# (`PromReader.retries`), waited by urllib3 (its factor, cap and jitter are these).
PROM_REQUEST = Backoff(first=0.2, factor=2.0, cap=2.0)
PROM_RETRIES = 2

# The layers above the readers retry whole attempts, so their budgets multiply (docs/OPERATIONS.md
# states the product); each covers what the one below cannot.
# A Dagster step (the cluster assets of a run, `container_events`) that raised: Dagster runs it
# OP_RETRIES more times, by the RetryPolicy defs builds from these figures. Dagster's own formula
# waits OP_RETRY_DELAY x (2^n - 1), plus or minus OP_RETRY_DELAY: 0-4 s, then 4-8 s.
OP_RETRIES = 2
OP_RETRY_DELAY = 2.0
# A Dagster run whose worker died (evicted, out of memory), not one whose step failed (the step's
# retries, the schedule and the events sensor cover that): the daemon launches it RUN_RETRIES more
# times (the run tags `dagster/max_retries` and `dagster/retry_on_asset_or_op_failure: false` of
# every lens job, defs/run_tags.py; a test holds them together).
RUN_RETRIES = 1
