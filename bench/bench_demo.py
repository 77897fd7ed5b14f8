"""Benchmark: the README's demo command on a fresh machine's terms.

Clones this repository (HEAD) into a temporary directory, runs the README's first command there in
its two halves (`python3 -m venv .venv && .venv/bin/pip install -e .`, then `.venv/bin/lens demo`),
and measures: the install time, and from the demo command to the first cluster's overview and to
every cluster's overview (the demo's own progress lines), then stops it with Ctrl-C (SIGINT) and
checks that the whole process tree is gone.

    .venv/bin/python bench/bench_demo.py [--keep]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--timeout-minutes", type=float, default=10)
    parser.add_argument("--keep", action="store_true", help="keep the clone (its .venv) afterwards")
    parser.add_argument(
        "--venv",
        help="run the demo from this virtual environment instead of installing one (no install time: "
        "what CI's smoke run of the benches does)",
    )
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="lens-demo-bench-"))
    clone = work / "lens-pipeline"
    try:
        subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
        lens = Path(args.venv).resolve() / "bin/lens" if args.venv else clone / ".venv/bin/lens"
        if not args.venv:
            started = time.monotonic()
            subprocess.run(
                "python3 -m venv .venv && .venv/bin/pip install -q -e .",
                shell=True,
                cwd=clone,
                check=True,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            install = time.monotonic() - started
            print(f"fresh virtual environment and `pip install -e .`: {install:.0f} s", flush=True)

        ports = [
            "--port",
            str(free_port()),
            "--api-port",
            str(free_port()),
            "--ingest-port",
            str(free_port()),
            "--watch-port",
            str(free_port()),
        ]
        started = time.monotonic()
        demo = subprocess.Popen(
            [str(lens), "demo", *ports],
            cwd=clone,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        first = every = None
        deadline = started + args.timeout_minutes * 60
        assert demo.stdout is not None
        for line in demo.stdout:
            elapsed = time.monotonic() - started
            print(f"  {elapsed:5.0f} s | {line.rstrip()}", flush=True)
            if first is None and re.search(r"\b[1-9]\d*/\d+ cluster overviews|every cluster has", line):
                first = elapsed
            if "every cluster has its overview" in line:
                every = elapsed
                break
            if time.monotonic() > deadline:
                break
        tree = [demo, *psutil.Process(demo.pid).children(recursive=True)]
        # What the demo prints from now on is still read (a pipe nobody drains would block the demo
        # at its next line), and shown once it has stopped.
        later: list[str] = []
        reader = threading.Thread(target=lambda: later.extend(demo.stdout or ()), daemon=True)
        reader.start()
        time.sleep(20)  # let the first runs finish their checks
        os.killpg(demo.pid, signal.SIGINT)
        interrupted = time.monotonic()
        code = demo.wait(timeout=120)
        stopping = time.monotonic() - interrupted
        reader.join(timeout=5)
        for line in later[-20:]:
            print(f"  after ready | {line.rstrip()}", flush=True)
        time.sleep(2)
        left = [p.pid for p in tree if psutil.pid_exists(p.pid) and p.status() != psutil.STATUS_ZOMBIE]
        print(f"demo command -> first overview: {first if first is None else round(first)} s")
        print(f"demo command -> every cluster's overview: {every if every is None else round(every)} s")
        print(f"Ctrl-C: exit code {code} after {stopping:.1f} s, processes left of {len(tree)}: {left}")
        return 0 if every is not None and not left else 1
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"kept {clone}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
