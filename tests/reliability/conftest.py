"""Servers for the reliability suite, scenario order, and the figures printed at the end."""

from __future__ import annotations

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
    Database,
    Figures,
    Serve,
    Server,
    ServiceError,
    Services,
    chosen_database,
)

# Scenarios run in the order of docs/reliability.md.
SCENARIOS = {
    "test_races": "1. races",
    "test_killed_workers": "2. killed workers",
    "test_lost_servers": "3. lost servers",
    "test_expiry": "4. clock and expiry",
    "test_hostile_input": "5. hostile input",
    "test_isolation": "6. isolation",
}
# One session per process: what the tests measured, and how long each scenario took.
_FIGURES = Figures()
_DURATIONS: dict[str, float] = defaultdict(float)


def _scenario(item: pytest.Item) -> str:
    return SCENARIOS.get(item.path.stem, item.path.stem)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    order = list(SCENARIOS.values())
    items.sort(key=lambda item: order.index(s) if (s := _scenario(item)) in order else len(order))


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
    terminalreporter.section(f"reliability figures on {_FIGURES.database or '?'}")
    header = (
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


def pytest_report_header(config: pytest.Config) -> str:
    try:
        return f"reliability database: {DATABASES[chosen_database()]} (RELIABILITY_DATABASE)"
    except ServiceError as exc:
        return str(exc)


@pytest.fixture(scope="session")
def services() -> Iterator[Services]:
    """The database (RELIABILITY_DATABASE: postgresql or mariadb) and Redis of this run alone;
    a missing binary fails the run."""
    try:
        database = chosen_database()
    except ServiceError as exc:
        pytest.fail(str(exc), pytrace=False)
    directory = Path(tempfile.mkdtemp(prefix="idempotency-reliability-"))
    services = Services(directory, database)
    try:
        services.start()
    except ServiceError as exc:
        services.stop()
        shutil.rmtree(directory, ignore_errors=True)
        pytest.fail(str(exc), pytrace=False)
    _FIGURES.database = Database(services.database_url).version()
    yield services
    services.stop()
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="session")
def db(services: Services) -> Database:
    return Database(services.database_url)


@pytest.fixture(scope="session")
def serve(services: Services, tmp_path_factory: pytest.TempPathFactory) -> Serve:
    """Start the demo under gunicorn with these IDEMPOTENCY_* (and other) settings."""
    log_dir = tmp_path_factory.mktemp("gunicorn")

    @contextmanager
    def start(name: str, **settings: str) -> Iterator[Server]:
        server = Server(name, services, log_dir, **settings)
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
    """The demo as deployed: atomic mode, on_conflict reject, no cache tier."""
    with serve("main") as running:
        yield running


@pytest.fixture
def timer() -> Callable[[], float]:
    started = time.monotonic()
    return lambda: time.monotonic() - started
