"""Shared fixtures; PostgreSQL-only tests are deselected (not skipped) on SQLite runs."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.db import connection

from tests.utils import ViewKind


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    from django.conf import settings

    if settings.DATABASES["default"]["ENGINE"].endswith("postgresql"):
        return
    deselected = [item for item in items if item.get_closest_marker("postgresql")]
    if deselected:
        items[:] = [item for item in items if not item.get_closest_marker("postgresql")]
        config.hook.pytest_deselected(items=deselected)


def pytest_report_header(config: pytest.Config) -> str:
    from django.conf import settings

    engine = settings.DATABASES["default"]["ENGINE"].rsplit(".", 1)[-1]
    return f"database: {engine} (PostgreSQL-only tests run only on postgresql)"


@pytest.fixture
def database_down(transactional_db: None) -> Iterator[None]:
    """Point the default connection at a server that is not there, then restore it."""
    original = dict(connection.settings_dict)
    connection.close()
    if connection.vendor == "postgresql":
        connection.settings_dict.update(HOST="127.0.0.1", PORT="9", OPTIONS={"connect_timeout": 2})
    else:
        connection.settings_dict["NAME"] = "/nonexistent-directory/db.sqlite3"
    try:
        yield
    finally:
        connection.close()
        connection.settings_dict.clear()
        connection.settings_dict.update(original)


@pytest.fixture(params=list(ViewKind), ids=lambda kind: kind.name.lower())
def view_kind(request: pytest.FixtureRequest) -> ViewKind:
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
def atomic_requests() -> Iterator[None]:
    """Turn on ATOMIC_REQUESTS for the default database, as a project's settings would."""
    connection.settings_dict["ATOMIC_REQUESTS"] = True
    try:
        yield
    finally:
        connection.settings_dict["ATOMIC_REQUESTS"] = False
