"""The `lens` command: `lens demo`, `lens sim`, `lens db upgrade`, `lens ingest`, `lens api`, `lens doctor`."""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from lens_pipeline import settings

# The local instance and workspace the demo starts, installed with the package (the repository's
# top-level dagster.yaml and workspace.yaml are links to them).
INSTANCE_DIR = Path(__file__).resolve().parent / "instance"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="lens", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    db = commands.add_parser("db", help="database schema")
    db_commands = db.add_subparsers(dest="db_command", required=True)
    upgrade = db_commands.add_parser("upgrade", help="run the Alembic migrations (Lens and SaFE databases)")
    upgrade.add_argument("--database", choices=("lens", "safe", "both"), default="both")
    upgrade.add_argument("--revision", default="head")

    commands.add_parser(
        "sim", help="serve a fleet of simulated clusters (see `lens sim --help`)", add_help=False
    )

    demo = commands.add_parser("demo", help="simulated clusters + embedded SQLite + the Dagster UI")
    demo.add_argument("--clusters", type=int, default=4)
    demo.add_argument("--nodes", type=int, default=24)
    demo.add_argument("--seed", type=int, default=7)
    demo.add_argument("--port", type=int, default=3000, help="Dagster UI port")
    demo.add_argument("--state-dir", default=".lens/demo", help="where the demo keeps its databases")
    demo.add_argument("--fresh", action="store_true", help="start from empty databases")
    demo.add_argument("--churn", type=float, default=20.0, help="seconds between churn steps (0: none)")
    demo.add_argument("--api-port", type=int, default=8080, help="read API port (0: no API)")
    demo.add_argument(
        "--ingest-port", type=int, default=50051, help="ingest gRPC port (0: no ingest, no agents)"
    )
    demo.add_argument(
        "--watch-port", type=int, default=8095, help="watch cache port (0: the runs list from the simulator)"
    )
    demo.add_argument(
        "--tls",
        action="store_true",
        help="the simulator serves HTTPS from a fresh CA, so that kubectl (which sends tokens only over "
        "TLS) can use the kubeconfigs the demo writes",
    )

    api = commands.add_parser("api", help="the read API: cluster overview, nodes, workloads (spec §7)")
    api.add_argument("--database-url", help=f"Lens database (default: ${settings.LENS_DATABASE_URL})")
    api.add_argument("--host", default="0.0.0.0")
    api.add_argument("--port", type=int, default=8080)
    api.add_argument("--default-cluster", help="cluster of requests that name none (default: the only one)")
    api.add_argument("--workers", type=int, default=1, help="server processes")
    api.add_argument(
        "--no-access-log",
        action="store_true",
        help=f"no JSON line per request on standard output (${settings.LENS_API_ACCESS_LOG}=0)",
    )

    watch = commands.add_parser(
        "watch",
        help="the watch cache: every cluster's collections kept by list and watch, for the runs",
        description="Bearer tokens, when wanted, come from $LENS_WATCH_CACHE_TOKEN (comma-separated"
        " during a rotation), never argv.",
    )
    watch.add_argument(
        "--registry", help=f"registry file or directory (default: ${settings.LENS_CLUSTERS_FILE})"
    )
    watch.add_argument("--host", default="0.0.0.0")
    watch.add_argument("--port", type=int, default=8095, help="the kept objects, /metrics and /healthz")
    watch.add_argument("--metrics-port", type=int, default=0, help="/metrics and /healthz alone (0: none)")
    watch.add_argument(
        "--warm",
        metavar="PATHS",
        help="comma-separated collections kept of every cluster from the start, before a run asks;"
        " but for the nodes, pods and storage classes, one its cluster does not serve (404) or lets"
        " us not list (403) is let go (default: those three and the owner kinds GPU pods commonly"
        " belong to, kube/cache.py WARM; '' for none: each is kept when a run first asks)",
    )

    ingest = commands.add_parser("ingest", help="the container-event sidecar (gRPC + HTTP) for node agents")
    _ingest_arguments(ingest)

    doctor = commands.add_parser(
        "doctor", help="what each registered cluster would give, and what would be missing (exit 1 if any)"
    )
    doctor.add_argument(
        "--registry", help=f"registry file or directory (default: ${settings.LENS_CLUSTERS_FILE})"
    )
    doctor.add_argument("--cluster", action="append", default=[], help="only this cluster (repeatable)")
    doctor.add_argument("--timeout", type=float, default=10.0, help="seconds per request")

    args, rest = parser.parse_known_args(argv)
    if args.command in ("sim", "demo") and (missing := _simulator_missing()):
        print(
            f"lens {args.command}: the simulator is not installed ({missing}): "
            "the production image leaves it out; install lens-pipeline from a checkout for the demo",
            file=sys.stderr,
        )
        return 2
    if args.command == "sim":
        from lens_pipeline.sim.cli import main as sim_main

        return sim_main(rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.command == "api":
        return _api(args)
    if args.command == "db":
        return _db_upgrade(args.database, args.revision)
    if args.command == "ingest":
        return _ingest(args)
    if args.command == "doctor":
        return _doctor(args)
    if args.command == "watch":
        return _watch(args)
    return _demo(args)


def _registry_path(args: argparse.Namespace, command: str) -> str | None:
    """`--registry`, else `$LENS_CLUSTERS_FILE`; None (and said) when neither is given."""
    path = args.registry or settings.clusters_file()
    if not path:
        print(
            f"lens {command}: no registry; pass --registry or set {settings.LENS_CLUSTERS_FILE}",
            file=sys.stderr,
        )
    return path


def _watch(args: argparse.Namespace) -> int:
    from lens_pipeline.clusters import load_registry
    from lens_pipeline.kube.cache import WARM, serve, warm_paths

    path = _registry_path(args, "watch")
    if not path:
        return 2
    try:
        warm = (
            WARM if args.warm is None else warm_paths([p.strip() for p in args.warm.split(",") if p.strip()])
        )
    except ValueError as exc:
        print(f"lens watch: --warm: {exc}", file=sys.stderr)
        return 2
    first = load_registry(path)
    for error in first.errors:
        print(f"lens watch: {error}", file=sys.stderr)
    return serve(
        lambda: load_registry(path).clusters,
        args.host,
        args.port,
        args.metrics_port,
        tokens=settings.watch_cache_tokens(),
        clusters=first.clusters,
        warm=warm,
    )


def _doctor(args: argparse.Namespace) -> int:
    from lens_pipeline.clusters import load_registry
    from lens_pipeline.doctor import FAIL, diagnose, render

    path = _registry_path(args, "doctor")
    if not path:
        return 2
    registry = load_registry(path)
    findings = diagnose(registry, args.cluster, args.timeout)
    print(render(findings))
    failed = sorted({f.cluster for f in findings if f.status == FAIL})
    paused = (
        f" ({len(registry.disabled)} disabled: {', '.join(sorted(registry.disabled))})"
        if registry.disabled
        else ""
    )
    if failed:
        print(f"\n{len(failed)} cluster(s) would have missing data: {', '.join(failed)}{paused}")
        return 1
    checked = {f.cluster for f in findings} - registry.disabled
    print(f"\nevery enabled cluster ({len(checked)}) would be collected in full{paused}")
    return 0


def _db_upgrade(which: str, revision: str) -> int:
    from lens_pipeline.store.db import get_engine
    from lens_pipeline.store.migrate import upgrade

    targets = {"lens": settings.lens_database_url(), "safe": settings.safe_database_url()}
    for database, url in targets.items():
        if which in (database, "both"):
            upgrade(get_engine(url), database, revision)  # type: ignore[arg-type]
            print(f"{database} database at {_safe_url(url)}: at revision {revision}")
    return 0


def _ingest_arguments(parser: argparse.ArgumentParser) -> None:
    from lens_pipeline.ingest.events import DEFAULT_MAX_EVENT_BYTES

    parser.add_argument("--database-url", help=f"event log database (default: ${settings.LENS_DATABASE_URL})")
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--grpc-port", type=int, default=50051, help="the original's jobs.grpc_port")
    parser.add_argument(
        "--http-port", type=int, default=8989, help="POST /v1/container-events, /metrics, /healthz"
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=0,
        help="/metrics, /livez and /healthz alone, plain HTTP (for probes and the scrape when the HTTP "
        "port serves TLS; 0: none)",
    )
    parser.add_argument("--default-cluster", default="default", help="cluster of events that name none")
    parser.add_argument("--tokens-file", help="per-cluster bearer tokens (default: $LENS_INGEST_TOKENS_FILE)")
    parser.add_argument("--tls-cert", help="serve TLS with this certificate chain (PEM)")
    parser.add_argument("--tls-key", help="the certificate's private key (PEM)")
    parser.add_argument("--tls-client-ca", help="require client certificates signed by this CA (PEM)")
    parser.add_argument("--max-event-bytes", type=int, default=DEFAULT_MAX_EVENT_BYTES)
    parser.add_argument("--linger-ms", type=float, default=2.0, help="how long a group commit waits to fill")
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="server processes sharing both ports (SO_REUSEPORT), restarted when they die",
    )


def _ingest(args: argparse.Namespace) -> int:
    from lens_pipeline.ingest.config import LENS_INGEST_TOKENS_FILE, IngestConfig, Tokens
    from lens_pipeline.ingest.server import serve_forever

    if bool(args.tls_cert) != bool(args.tls_key):
        print("lens ingest: --tls-cert and --tls-key go together", file=sys.stderr)
        return 2
    if args.workers < 1:
        print("lens ingest: --workers must be at least 1", file=sys.stderr)
        return 2
    if args.metrics_port and args.metrics_port in (args.grpc_port, args.http_port):
        print("lens ingest: --metrics-port must differ from --grpc-port and --http-port", file=sys.stderr)
        return 2
    config = IngestConfig(
        database_url=args.database_url or settings.lens_database_url(),
        host=args.host,
        grpc_port=args.grpc_port,
        http_port=args.http_port,
        metrics_port=args.metrics_port,
        default_cluster=args.default_cluster,
        tokens=Tokens.load(args.tokens_file or os.environ.get(LENS_INGEST_TOKENS_FILE)),
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        tls_client_ca=args.tls_client_ca,
        max_event_bytes=args.max_event_bytes,
        linger_seconds=args.linger_ms / 1000,
    )
    print(f"lens ingest: event log in {_safe_url(config.database_url)}", flush=True)
    if args.workers > 1:
        from lens_pipeline.ingest.workers import supervise

        return supervise(config, args.workers)
    from lens_pipeline.ingest.workers import PortInUse, check_free

    try:  # the same words as with workers, rather than gRPC's "Failed to bind" traceback
        check_free(config.host, config.grpc_port, "gRPC")
        check_free(config.host, config.http_port, "HTTP")
        if config.metrics_port:
            check_free(config.host, config.metrics_port, "metrics")
    except PortInUse as exc:
        print(f"lens ingest: {exc}", file=sys.stderr, flush=True)
        return 1
    return serve_forever(config)


def _api(args: argparse.Namespace) -> int:
    """Serve the read API; the bearer token, when wanted, comes from `$LENS_API_TOKEN` (never argv)."""
    import uvicorn

    os.environ[settings.LENS_DATABASE_URL] = args.database_url or settings.lens_database_url()
    if args.default_cluster:
        os.environ[settings.LENS_API_DEFAULT_CLUSTER] = args.default_cluster
    if args.no_access_log:
        os.environ[settings.LENS_API_ACCESS_LOG] = "0"
    try:
        settings.api_cors_origins()  # refused here, before any worker starts, with its reason
    except ValueError as exc:
        print(f"lens api: {exc}", file=sys.stderr, flush=True)
        return 2
    print(
        f"lens api on http://{args.host}:{args.port} over {_safe_url(settings.lens_database_url())}",
        flush=True,
    )
    uvicorn.run(
        "lens_pipeline.api.app:app_from_environment",
        factory=True,
        host=args.host,
        port=args.port,
        workers=args.workers,
        access_log=False,
        log_level="warning",
    )
    return 0


def _simulator_missing() -> str | None:
    """What `lens sim` and `lens demo` need that this installation lacks (the production image
    leaves the simulator out), or None."""
    from importlib.util import find_spec

    return "no module lens_pipeline.sim" if find_spec("lens_pipeline.sim") is None else None


def _safe_url(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def _demo_epoch(state: Path, now: datetime) -> float:
    """The instant the demo's clusters are generated as of (`SimCluster(..., epoch=)`): midnight UTC
    a day before the hourly history's first hour. Every hour the UI offers then finds the objects
    made and settled, as the simulator's Prometheus answers for the past (the state it starts in),
    and a running job has run for days or weeks, not since a fixed date long gone. Kept in the state
    directory, so that a restarted demo makes the same objects again (`--fresh` starts anew), unless
    its history now reaches further back (`$LENS_HISTORY_DAYS` raised)."""
    from lens_pipeline.defs.history.partitions import first_hour

    path = state / "sim-epoch"
    epoch = (first_hour(now, settings.history_days()) - timedelta(days=1)).timestamp()
    with contextlib.suppress(FileNotFoundError, ValueError):
        kept = float(path.read_text())
        if 0 < kept <= epoch:  # anything else is no instant a demo kept: made anew
            return kept
    path.write_text(f"{epoch:.0f}\n")
    return epoch


def _demo(args: argparse.Namespace) -> int:
    """Start the simulator in this process and `dagster dev` beside it; Ctrl-C stops both."""
    from lens_pipeline.sim.cli import SWITCH_INTERVAL_SECONDS, churn_forever
    from lens_pipeline.sim.fleet import SimFleet
    from lens_pipeline.sim.registry import write_registry
    from lens_pipeline.sim.server import SimServer

    # `kill`/`timeout` send SIGTERM: stop the whole tree as cleanly as on Ctrl-C. And Ctrl-C itself
    # (SIGINT) even when a shell started us in the background, which hands a command SIGINT ignored
    # (Python then leaves it so): `kill -INT` would do nothing, and the processes started below
    # would inherit the ignored SIGINT that is to stop them. Set before any of them starts.
    signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    taken = _taken_ports(
        {
            "--port": args.port,
            "--api-port": args.api_port,
            "--ingest-port": args.ingest_port,
            "--watch-port": args.watch_port,
        }
    )
    if taken:
        for flag, port in taken.items():
            print(
                f"[lens demo] port {port} is taken on 127.0.0.1: choose another with {flag} PORT",
                file=sys.stderr,
            )
        return 2
    state = Path(args.state_dir).resolve()
    if args.fresh and state.exists():
        shutil.rmtree(state)
    home = state / "dagster_home"
    home.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(INSTANCE_DIR / "dagster.yaml", home / "dagster.yaml")
    # Dagster's own event stream and the sidecars' logs go to files; the console keeps the demo's lines.
    logs = {name: state / f"{name}.log" for name in ("dagster", "api", "ingest", "watch")}
    started_at = datetime.now(UTC)

    print(
        f"[lens demo] generating {args.clusters} simulated clusters of {args.nodes} GPU nodes (seed {args.seed})"
    )
    # Keeping history, its Prometheus answers for past hours: the hourly history has something to read.
    fleet = SimFleet.generate(
        clusters=args.clusters,
        nodes=args.nodes,
        seed=args.seed,
        vendor="mixed",
        history=True,
        epoch=_demo_epoch(state, started_at),
    )
    # The simulator serves from this process, as `lens sim` does from its own: the same short GIL
    # slices, so that a Kubernetes page does not queue behind a PromQL evaluation.
    sys.setswitchinterval(SWITCH_INTERVAL_SECONDS)
    server = SimServer(fleet, tls=args.tls)
    server.start()
    registry = state / "clusters.yaml"
    write_registry(registry, server)
    print(f"[lens demo] simulator on {server.url}; registry {registry}")
    first = next(iter(fleet)).name
    kubeconfig = state / "kubeconfigs" / f"{first}.yaml"
    print(
        f"[lens demo] kubectl --kubeconfig {kubeconfig} get pods -A"
        if args.tls
        else "[lens demo] kubectl sends its token only over TLS: `lens demo --tls` for kubeconfigs it can use"
    )
    stopped = threading.Event()
    if args.churn > 0:
        threading.Thread(target=churn_forever, args=(fleet, args.churn, stopped), daemon=True).start()
        print(f"[lens demo] churn: pods, workloads, nodes, GPUs and NICs change every {args.churn:g} s")

    env = {
        **os.environ,
        "DAGSTER_HOME": str(home),
        settings.LENS_CLUSTERS_FILE: str(registry),
        settings.LENS_DATABASE_URL: os.environ.get(settings.LENS_DATABASE_URL)
        or f"sqlite:///{state / 'lens.db'}",
        settings.LENS_SAFE_DATABASE_URL: os.environ.get(settings.LENS_SAFE_DATABASE_URL)
        or f"sqlite:///{state / 'safe.db'}",
        # A day of hours backfilled per new cluster, not a week: the demo's two cores stay on collection.
        settings.LENS_HISTORY_BACKFILL_DAYS: os.environ.get(settings.LENS_HISTORY_BACKFILL_DAYS) or "1",
    }
    if args.watch_port:
        env[settings.LENS_WATCH_CACHE_URL] = f"http://127.0.0.1:{args.watch_port}"
        # The cache and the runs share a token, as deployed (unless one is given).
        env[settings.LENS_WATCH_CACHE_TOKEN] = os.environ.get(
            settings.LENS_WATCH_CACHE_TOKEN
        ) or secrets.token_urlsafe(24)
    os.environ.update(env)
    _db_upgrade("both", "head")
    # `dagster dev` warns that `dg dev` supersedes it; `dg` needs a dg project layout this package
    # does not have, and the warning is the only line a newcomer would read in dagster.log.
    warnings = [w for w in (os.environ.get("PYTHONWARNINGS"), DAGSTER_DEV_SUPERSEDED) if w]
    dev_env = {**env, "PYTHONWARNINGS": ",".join(warnings)}
    dagster = Path(sys.executable).with_name("dagster")
    command = [
        str(dagster) if dagster.exists() else "dagster",
        "dev",
        "-w",
        str(INSTANCE_DIR / "workspace.yaml"),
        "-h",
        "127.0.0.1",
        "-p",
        str(args.port),
    ]
    print(f"[lens demo] starting Dagster: UI on http://127.0.0.1:{args.port}  (Ctrl-C stops everything)")
    print(f"[lens demo] Dagster's log: {logs['dagster']}")
    print("[lens demo] the registry sensor adds the clusters within 30 s; the schedule collects every minute")
    # Started in DAGSTER_HOME: a dagster.yaml in the current folder would draw Dagster's warning that
    # it is not used.
    process = subprocess.Popen(
        command,
        env=dev_env,
        cwd=home,
        start_new_session=True,
        stdout=_log(logs["dagster"]),
        stderr=subprocess.STDOUT,
    )
    sidecars: list[subprocess.Popen] = []
    try:
        lens = [sys.executable, "-c", "from lens_pipeline.cli import main; raise SystemExit(main())"]

        def sidecar(command: str, *arguments: object) -> None:
            """`lens <command> --host 127.0.0.1 <arguments>`, its output in its log."""
            line = [*lens, command, "--host", "127.0.0.1", *map(str, arguments)]
            sidecars.append(
                subprocess.Popen(
                    line,
                    env=env,
                    start_new_session=True,
                    stdout=_log(logs[command]),
                    stderr=subprocess.STDOUT,
                )
            )

        if args.watch_port:
            sidecar("watch", "--port", args.watch_port)
            print(
                f"[lens demo] watch cache on http://127.0.0.1:{args.watch_port}/metrics: the runs list from it"
                f" (log: {logs['watch']})"
            )
        if args.api_port:
            sidecar("api", "--port", args.api_port)
            print(
                f"[lens demo] read API on http://127.0.0.1:{args.api_port}/v1/clusters/overview?cluster=<name>"
                f" (log: {logs['api']})"
            )
        if args.ingest_port:
            http_port = _free_port()
            sidecar("ingest", "--grpc-port", args.ingest_port, "--http-port", http_port)
            print(
                f"[lens demo] ingest sidecar on 127.0.0.1:{args.ingest_port} (gRPC); simulated node agents feed it"
                f" (log: {logs['ingest']})"
            )
            threading.Thread(
                target=_feed_agents, args=(fleet, args.ingest_port, http_port, stopped), daemon=True
            ).start()
        answering = {"the Dagster UI": f"http://127.0.0.1:{args.port}/server_info"}
        if args.api_port:
            answering["the read API"] = f"http://127.0.0.1:{args.api_port}/healthz"
        threading.Thread(
            target=_report_progress,
            args=(env[settings.LENS_DATABASE_URL], len(fleet.clusters), started_at, answering, stopped),
            daemon=True,
        ).start()
        code = process.wait()
        if code:
            print(f"[lens demo] Dagster stopped (exit {code}); the end of its log:", file=sys.stderr)
            print(_tail(logs["dagster"]), file=sys.stderr)
        return code
    except KeyboardInterrupt:
        print("\n[lens demo] stopping Dagster, the sidecars and the simulator")
        return 0
    finally:
        stopped.set()
        _stop_process_trees([*sidecars, process])
        server.stop()


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _taken_ports(ports: dict[str, int]) -> dict[str, int]:
    """The ports (by the flag that sets them) something already listens on at 127.0.0.1."""
    import socket

    taken = {}
    for flag, port in ports.items():
        if not port:
            continue
        with socket.socket() as sock:
            # As the servers bind (SO_REUSEADDR): a port left in TIME_WAIT by the last demo is free.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                taken[flag] = port
    return taken


def _log(path: Path) -> Any:
    return path.open("ab")


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"({path} could not be read)"


def _answers(url: str) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def _report_progress(
    url: str, clusters: int, started_at: datetime, answering: dict[str, str], stopped: threading.Event
) -> None:
    """Say what the pipeline has stored since this start, until every cluster has an overview made
    since then and the UI and the API answer: only then is the demo ready."""
    from sqlalchemy import func, select
    from sqlalchemy.exc import SQLAlchemyError

    from lens_pipeline.store.db import get_engine
    from lens_pipeline.store.event_log import count_events
    from lens_pipeline.store.schema import cluster_overview_cache, node

    engine, last = get_engine(url), None
    started = time.monotonic()
    while not stopped.wait(5):
        try:
            with engine.connect() as conn:
                nodes = conn.scalar(select(func.count()).select_from(node))
                fresh = cluster_overview_cache.c.updated_at >= started_at
                overviews = {
                    r.cluster_name: r.allocation_rate
                    for r in conn.execute(select(cluster_overview_cache).where(fresh))
                }
                events = count_events(conn)
        except SQLAlchemyError:  # tables not there yet, or busy: ask again
            continue
        line = (
            f"{nodes} GPU nodes stored, {len(overviews)}/{clusters} cluster overviews since this start, "
            f"{events} container events"
        )
        if line != last:
            print(f"[lens demo] {time.monotonic() - started:5.0f} s: {line}", flush=True)
            last = line
        silent = [what for what, address in answering.items() if not _answers(address)]
        if len(overviews) >= clusters and not silent:
            rates = ", ".join(f"{name} {rate:.0f}%" for name, rate in sorted(overviews.items()))
            print(f"[lens demo] every cluster has its overview; allocation rate: {rates}", flush=True)
            print(f"[lens demo] ready: {', '.join(answering.values())}", flush=True)
            return


def _feed_agents(fleet: object, grpc_port: int, http_port: int, stopped: threading.Event) -> None:
    """Once the sidecar answers its health check, the simulated agents send every 10 s."""
    import urllib.request

    from lens_pipeline.sim.agent_feed import feed_forever

    while not stopped.is_set():
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{http_port}/healthz", timeout=2).read()
            break
        except OSError:
            stopped.wait(0.5)
    feed_forever(fleet, f"127.0.0.1:{grpc_port}", 10.0, stopped)  # type: ignore[arg-type]


# A -W filter: the action, then the start of the message (matched case-insensitively).
DAGSTER_DEV_SUPERSEDED = "ignore:Function `dev_command` is superseded"


def _stop_process_trees(processes: list[subprocess.Popen], grace_seconds: float = 30.0) -> None:
    """SIGINT to each (`dagster dev` then stops its webserver, daemon and code servers; the sidecars
    finish their open streams), all at once and within one grace period, so that a slow one does
    not hold up the others' stop; then make sure nothing of their process groups outlives them."""
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
    deadline = time.monotonic() + grace_seconds
    for process in processes:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
    for sig in (signal.SIGTERM, signal.SIGKILL):
        alive = False
        for process in processes:
            try:
                os.killpg(process.pid, sig)
                alive = True
            except ProcessLookupError:
                continue
        if not alive:
            return
        time.sleep(2)


def _raise_keyboard_interrupt(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())
