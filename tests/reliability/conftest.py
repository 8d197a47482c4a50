"""Servers for the reliability suite, the store it runs on, scenario order, and the figures printed
at the end."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.reliability.harness import (
    DATABASES,
    STORES,
    Database,
    Figures,
    Records,
    RedisRecords,
    Serve,
    Server,
    ServiceError,
    Services,
    chosen_database,
    chosen_pooler,
    chosen_store,
    pgbouncer_version,
    store_settings,
)

# Scenarios run in the order of docs/reliability.md.
SCENARIOS = {
    "test_races": "1. races",
    "test_killed_workers": "2. killed workers",
    "test_lost_servers": "3. lost servers",
    "test_expiry": "4. clock and expiry",
    "test_hostile_input": "5. hostile input",
    "test_isolation": "6. isolation",
    "test_failover": "7. fail-over",
    "test_end_to_end": "8. end to end",
}
# One session per process: what the tests measured, and how long each scenario took.
_FIGURES = Figures()
_DURATIONS: dict[str, float] = defaultdict(float)


def _scenario(item: pytest.Item) -> str:
    return SCENARIOS.get(item.path.stem, item.path.stem)


# Scenarios tied to one store (RELIABILITY_STORE) are deselected on the other, never skipped.
STORE_MARKERS = {
    "database_store": "database",
    "redis_store": "redis",
}


# The fail-over scenario starts a Redis Cluster of its own: only its env runs it
# (reliability-rediscluster, RELIABILITY_REDIS_CLUSTER=1); deselected elsewhere, never skipped.
CLUSTER_MARKER = "redis_cluster"


def _cluster_run() -> bool:
    return os.environ.get("RELIABILITY_REDIS_CLUSTER", "") == "1"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "database_store: a reliability scenario of the database store alone; deselected when "
        "RELIABILITY_STORE=redis",
    )
    config.addinivalue_line(
        "markers",
        "redis_store: a reliability scenario of the Redis store alone; deselected unless "
        "RELIABILITY_STORE=redis",
    )
    config.addinivalue_line(
        "markers",
        "redis_cluster: a reliability scenario on a Redis Cluster of its own; deselected unless "
        "RELIABILITY_REDIS_CLUSTER=1",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    order = list(SCENARIOS.values())
    items.sort(key=lambda item: order.index(s) if (s := _scenario(item)) in order else len(order))
    try:
        store = chosen_store()
    except ServiceError:
        return  # The services fixture fails the run with the message.
    selected: list[pytest.Item] = []
    deselected: list[pytest.Item] = []
    for item in items:
        stores = {STORE_MARKERS[m.name] for m in item.iter_markers() if m.name in STORE_MARKERS}
        on_cluster = item.get_closest_marker(CLUSTER_MARKER) is not None
        unwanted = (stores and store not in stores) or on_cluster != _cluster_run()
        (deselected if unwanted else selected).append(item)
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = selected


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    stem = Path(report.location[0]).stem
    _DURATIONS[SCENARIOS.get(stem, stem)] += report.duration


@pytest.fixture(scope="session")
def figures() -> Figures:
    return _FIGURES


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    rows = _FIGURES.rows
    durations = _DURATIONS
    if not rows and not durations:
        return
    write = terminalreporter.write_line
    store = f"{_FIGURES.store or '?'} store"
    if _FIGURES.store_server:
        store += f" ({_FIGURES.store_server})"
    terminalreporter.section(f"reliability figures on {_FIGURES.database or '?'}, {store}")
    header = (
        "store",
        "database",
        "scenario",
        "variant",
        "requests",
        "absorbed",
        "executions/key",
        "5xx",
        "s",
        "notes",
    )
    table = [header] + [
        (
            _FIGURES.store or "?",
            _FIGURES.database.split()[0] if _FIGURES.database else "?",
            f.scenario,
            f.variant,
            str(f.requests),
            str(f.absorbed),
            f.executions,
            str(f.server_errors),
            f"{f.seconds:.1f}",
            f.notes,
        )
        for f in rows
    ]
    widths = [max(len(row[i]) for row in table) for i in range(len(header) - 1)]
    for row in table:
        cells = [cell.ljust(width) for cell, width in zip(row[:-1], widths, strict=True)]
        write("  ".join([*cells, row[-1]]))
    write("")
    write("time per scenario (set-up, tests and tear-down):")
    for scenario in sorted(durations):
        write(f"  {scenario}: {durations[scenario]:.1f} s")
    write(f"  total: {sum(durations.values()):.1f} s")


def pytest_report_header(config: pytest.Config) -> list[str]:
    lines = []
    try:
        lines.append(f"reliability database: {DATABASES[chosen_database()]} (RELIABILITY_DATABASE)")
    except ServiceError as exc:
        lines.append(str(exc))
    try:
        lines.append(f"reliability store: {STORES[chosen_store()]} (RELIABILITY_STORE)")
    except ServiceError as exc:
        lines.append(str(exc))
    try:
        lines.append(f"reliability pooler: {chosen_pooler()} (RELIABILITY_POOLER)")
    except ServiceError as exc:
        lines.append(str(exc))
    return lines


@pytest.fixture(scope="session")
def services() -> Iterator[Services]:
    """The database (RELIABILITY_DATABASE: postgresql or mariadb) and Redis of this run alone,
    for the store RELIABILITY_STORE names (database or redis); a missing binary fails the run."""
    try:
        database, store, pooler = chosen_database(), chosen_store(), chosen_pooler()
    except ServiceError as exc:
        pytest.fail(str(exc), pytrace=False)
    directory = Path(tempfile.mkdtemp(prefix="idempotency-reliability-"))
    services = Services(directory, database, store, pooler)
    try:
        services.start()
    except ServiceError as exc:
        services.stop()
        shutil.rmtree(directory, ignore_errors=True)
        pytest.fail(str(exc), pytrace=False)
    _FIGURES.database = Database(services.database_url).version()
    if services.pgbouncer:
        _FIGURES.database += f" behind {pgbouncer_version()} in transaction pooling"
    _FIGURES.store = STORES[store]
    if store == "redis":
        _FIGURES.store_server = services.redis_persistence()
    yield services
    services.stop()
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="session")
def db(services: Services) -> Database:
    return Database(services.database_url)


@pytest.fixture(scope="session")
def store(services: Services, db: Database) -> Records:
    """Where the run's store keeps its records: the database's table, or Redis."""
    return RedisRecords(services.redis_url) if services.store == "redis" else db


@pytest.fixture(scope="session")
def serve(services: Services, tmp_path_factory: pytest.TempPathFactory) -> Serve:
    """Start the demo under gunicorn with these IDEMPOTENCY_* (and other) settings, on the run's
    store (on the Redis store: IDEMPOTENCY_STORE, and IDEMPOTENCY_MODE=lease)."""
    log_dir = tmp_path_factory.mktemp("gunicorn")

    @contextmanager
    def start(name: str, **settings: str) -> Iterator[Server]:
        server = Server(name, services, log_dir, **{**store_settings(services.store), **settings})
        try:
            server.start()
        except ServiceError as exc:
            pytest.fail(str(exc), pytrace=False)
        try:
            yield server
        finally:
            server.stop()

    return start


@pytest.fixture(scope="session")
def server(serve: Serve) -> Iterator[Server]:
    """The demo as deployed: atomic mode (lease on the Redis store), on_conflict reject, no cache
    tier."""
    with serve("main") as running:
        yield running


@pytest.fixture
def timer() -> Callable[[], float]:
    started = time.monotonic()
    return lambda: time.monotonic() - started
