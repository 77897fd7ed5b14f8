"""CPU accounting shared by the benchmark scripts: who used the machine's cores during a run.

On this 2-core machine the pipeline shares the cores with the simulator and the database
server, so a wall time means little without the CPU each of them spent.
"""

from __future__ import annotations

from pathlib import Path

import psutil


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU of a process and its children."""
    parent = psutil.Process(pid)
    return sum(sum(p.cpu_times()[:2]) for p in (parent, *parent.children(recursive=True)))


def children_cpu_seconds(pid: int) -> dict[int, float]:
    """User + system CPU of each direct child of a process (a supervisor's workers), by pid."""
    return {child.pid: sum(child.cpu_times()[:2]) for child in psutil.Process(pid).children()}


def machine_busy_seconds() -> float:
    """CPU seconds the whole machine spent busy (all cores, not idle, not waiting for I/O)."""
    times = psutil.cpu_times()
    return sum(times) - times.idle - getattr(times, "iowait", 0.0)


# The local database server of each SQLAlchemy dialect: its name and its processes' names
# (SQLite has none: it runs in the writer's process).
DATABASE_SERVERS = {
    "postgresql": ("PostgreSQL", {"postgres"}),
    "mysql": ("MariaDB/MySQL", {"mariadbd", "mysqld"}),
    "mariadb": ("MariaDB", {"mariadbd"}),
}


def database_cpu_seconds(dialect: str) -> float:
    """User + system CPU of the local database server's processes for `dialect` (0 without one)."""
    names = DATABASE_SERVERS.get(dialect, ("", set()))[1]
    total = 0.0
    for process in psutil.process_iter(["name", "cpu_times"]):
        if process.info["name"] in names and process.info["cpu_times"] is not None:
            total += sum(process.info["cpu_times"][:2])
    return total


def peak_rss_mib(pid: int) -> float:
    """A process's peak resident set (VmHWM of /proc/<pid>/status), MiB; NaN where there is none."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")
