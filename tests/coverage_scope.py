"""pytest plugin: with COVERAGE_SCOPE=database, `coverage run` measures only DATABASE_TESTS."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest

# The test files whose lines differ by database: together they reach every line and branch that
# the PostgreSQL and MariaDB runs reach and the SQLite run does not (measured with coverage's
# per-test contexts), and the files of the stores, purge, admin and migrations around them.
# tox.ini sets COVERAGE_SCOPE=database in those two runs: the SQLite run, with the same Python,
# Django and settings, measures every test. Coverage's tracer costs its time on every Python
# call, in whatever module: a test not measured runs about 40 % faster. A line of one database
# reached only by a test of another file fails the gate until that file is added here.
DATABASE_TESTS = frozenset(
    {
        "tests/test_admin.py",
        "tests/test_attempts.py",
        "tests/test_checks.py",
        "tests/test_cors.py",
        "tests/test_databases.py",
        "tests/test_guard.py",
        "tests/test_leases.py",
        "tests/test_migrations.py",
        "tests/test_outbox.py",
        "tests/test_pgbouncer.py",
        "tests/test_purge.py",
        "tests/test_purge_resumes.py",
        "tests/test_records_database.py",
        "tests/test_results.py",
        "tests/test_roads.py",
        "tests/test_round_trips.py",
        "tests/test_store_contract.py",
        "tests/test_stores.py",
        "tests/test_transactions.py",
    }
)


def pytest_configure(config: pytest.Config) -> None:
    scope = os.environ.get("COVERAGE_SCOPE", "")
    if not scope:
        return
    if scope != "database":
        raise pytest.UsageError(f"COVERAGE_SCOPE={scope!r}: the one scope is 'database'.")
    # `coverage run` has imported coverage when it measures; a run without it (the quick loop's
    # PostgreSQL env, which has the scope but not coverage) has nothing to scope.
    coverage = sys.modules.get("coverage")
    measuring = coverage.Coverage.current() if coverage is not None else None
    if measuring is not None:
        config.pluginmanager.register(MeasuredFiles(measuring, DATABASE_TESTS), "coverage-scope")


class MeasuredFiles:
    """Pauses the measurement for the tests outside `files`, and resumes it for the others."""

    def __init__(self, measuring: Any, files: frozenset[str]) -> None:
        self.measuring = measuring
        self.files = files
        self.paused = False
        # A measurement resumed finds the package imported, as it was when paused: not news.
        disabled = measuring.get_option("run:disable_warnings") or []
        measuring.set_option("run:disable_warnings", [*disabled, "already-imported"])

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Iterator[None]:
        measured = item.nodeid.split("::", 1)[0] in self.files
        if measured and self.paused:
            self.measuring.start()
        elif not measured and not self.paused:
            self.measuring.stop()
        self.paused = not measured
        return (yield)

    def pytest_sessionfinish(self) -> None:
        # `coverage run` stops and saves the measurement it started: leave it running.
        if self.paused:
            self.measuring.start()
            self.paused = False
