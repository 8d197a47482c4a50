"""Shared fixtures; tests of one database only are deselected (not skipped) on the other."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection, connections
from django.test import override_settings

from django_idempotency.models import IdempotencyRecord
from django_idempotency.stores import get_store
from django_idempotency.stores.redis import RedisStore
from tests.flushes import postgresql_flushes_by_delete, snapshots_restored_after_flush
from tests.stores import STORE_MODES, STORE_PARAMS, using_store
from tests.utils import ViewKind, lose_database


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.import_plugin("tests.ci_no_skips")
    config.pluginmanager.import_plugin("tests.coverage_scope")


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """tests/reliability runs only when named (tox -e reliability): it starts servers of its own."""
    if collection_path != Path(__file__).parent / "reliability":
        return None
    named = ((config.invocation_params.dir / arg.split("::")[0]).resolve() for arg in config.args)
    return True if not any(path.is_relative_to(collection_path) for path in named) else None


# The markers that name databases; a test carrying any of them runs only on those.
DATABASE_MARKERS = ("sqlite", "postgresql", "mariadb")

# Behind PgBouncer, the files whose outcome the pooler cannot change, left to the run on
# PostgreSQL without it: the admin's pages and the system checks read through Django's ORM in
# one connection, and the HTTP properties send the requests of tests/test_http.py, whose store
# statements, transactions and locks run here, with other bodies (docs/contributing.md).
NOT_ABOUT_THE_POOLER = frozenset({"test_admin.py", "test_checks.py", "test_http_properties.py"})


def database_under_test() -> str:
    from django.conf import settings

    engine = settings.DATABASES["default"]["ENGINE"]
    return {"sqlite3": "sqlite", "mysql": "mariadb"}.get(engine.rsplit(".", 1)[-1], "postgresql")


def behind_pgbouncer() -> bool:
    """Whether DATABASE_URL is a PgBouncer in transaction pooling (tests/settings.py)."""
    return os.environ.get("PGBOUNCER") == "1"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    database = database_under_test()

    from django.conf import settings

    # Tests that read from a streaming replica run only where there is one (PG_REPLICA_URL on
    # PostgreSQL); tox's replica env, which exists for them, sets PG_REPLICA_REQUIRED.
    without_replica = "replica" not in settings.DATABASES
    if without_replica and os.environ.get("PG_REPLICA_REQUIRED") == "1":
        raise pytest.UsageError(
            "PG_REPLICA_REQUIRED=1 but there is no replica to test: set PG_REPLICA_URL to a "
            "streaming replica of the PostgreSQL in DATABASE_URL (scripts/services.sh: "
            "start_pg_replica)."
        )

    # Tests of a Redis Cluster's own behaviour run only on one (tox's rediscluster env), and
    # tests of a single Redis server's only elsewhere.
    on_cluster = bool(os.environ.get("REDIS_CLUSTER_URL"))
    unlike_redis = "single_node_redis" if on_cluster else "redis_cluster_nodes"

    pooled = behind_pgbouncer()
    only_database_tests = os.environ.get("ONLY_DATABASE_TESTS") == "1"
    # The browser tests (Chromium, about 45 s of CPU a run) run in the runs that set no BROWSER:
    # what the browser does with a form is the same on every database and Django; the store
    # under them is tested on each database by the HTTP tests (docs/contributing.md).
    without_browser = os.environ.get("BROWSER") == "0"

    def elsewhere(item: pytest.Item) -> bool:
        if only_database_tests and not about_the_database(item):
            return True
        if without_replica and item.get_closest_marker("replica"):
            return True
        if without_browser and item.get_closest_marker("browser"):
            return True
        if item.get_closest_marker(unlike_redis):
            return True
        named = [name for name in DATABASE_MARKERS if item.get_closest_marker(name)]
        if item.get_closest_marker("pgbouncer") and not pooled:
            return True
        if item.get_closest_marker("no_pooler") and pooled:
            return True
        if pooled and item.path.name in NOT_ABOUT_THE_POOLER:
            return True
        return bool(named) and database not in named

    deselected = [item for item in items if elsewhere(item)]
    if deselected:
        items[:] = [item for item in items if not elsewhere(item)]
        config.hook.pytest_deselected(items=deselected)


# The fixtures that give a test the database (pytest-django's); the session's own set-up aside.
DATABASE_FIXTURES = frozenset(
    {
        "db",
        "transactional_db",
        "django_db_reset_sequences",
        "django_db_serialized_rollback",
        "live_server",
    }
)


def about_the_database(item: pytest.Item) -> bool:
    """Whether the test's outcome can depend on the database under test: it uses the database,
    needs a given one, or is marked `database` (it reads the database's vendor or settings, or
    hands DATABASE_URL to a process of its own), and it does not run on a store that keeps its
    records elsewhere (the `store`, `store_mode` and `shared_store` fixtures' Redis and memory
    stores: the database then holds only the view's own rows, written through Django's ORM).
    tox's PostgreSQL, MariaDB and PgBouncer runs run only these (ONLY_DATABASE_TESTS=1): the
    others would repeat the SQLite runs' work. A test marked for a database still runs there,
    whatever its store."""
    if any(item.get_closest_marker(name) for name in ("database", *DATABASE_MARKERS)):
        return True
    if _store_of(item) not in (None, "database"):
        return False
    if item.get_closest_marker("django_db"):
        return True
    return not DATABASE_FIXTURES.isdisjoint(getattr(item, "fixturenames", ()))


def _store_of(item: pytest.Item) -> str | None:
    """The store the test is parametrized with by conftest's store fixtures, if any."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    if "store_mode" in params:
        return str(params["store_mode"][0])
    for name in ("store", "shared_store"):
        if name in params:
            return str(params[name])
    return None


def pytest_report_header(config: pytest.Config) -> str:
    pooler = " through PgBouncer (transaction pooling)" if behind_pgbouncer() else ""
    return (
        f"database: {database_under_test()}{pooler} (tests marked for other databases are "
        "deselected)"
    )


@pytest.fixture(autouse=True, scope="session")
def json_support_known(django_db_setup: None, django_db_blocker: Any) -> None:
    """Django 6 runs the model checks (`manage.py check`, `run_checks()`) on every database, and
    the JSONField check asks each whether it supports JSON, SQLite and MariaDB with a query: a
    test of the checks without database access would fail, or pass only after a test that
    queried. Ask once, for real, here. The second database ("records"), set up only for the
    tests that use it, is on the same server: the same answer."""
    with django_db_blocker.unblock():
        supported = connections["default"].features.supports_json_field
    connections["records"].features.__dict__["supports_json_field"] = supported


@pytest.fixture(autouse=True, scope="session")
def quick_flushes() -> Iterator[None]:
    """Content types and permissions come back after each transactional test's flush in two
    statements instead of Django's ninety, and PostgreSQL's flush deletes rather than truncates
    (tests/flushes.py)."""
    with snapshots_restored_after_flush(), postgresql_flushes_by_delete():
        yield


@pytest.fixture(autouse=True)
def no_operation_left_running() -> Iterator[None]:
    """A test that leaves a claim held on purpose (standing for a process that died mid-work)
    leaves its attempt current in this thread too: the next test starts outside any operation,
    as the next process would."""
    from django_idempotency.attempts import _current

    yield
    _current.set(None)


@pytest.fixture(autouse=True)
def built_afresh() -> None:
    """What the package builds once per process and keeps (each backend's statements, the
    configured store, the hooks a view class defines) is built again for each test: no test
    depends on what an earlier one built, each runs the building code itself, and mutation
    testing, which maps each function to the tests that call it, sees every test that relies on
    that code, not only the first."""
    from django_idempotency.http import options
    from django_idempotency.stores import _store_for, dialects

    dialects._BUILT.clear()
    _store_for.cache_clear()
    options._hooks_of.cache_clear()


@pytest.fixture(scope="session")
def django_db_modify_db_settings(django_db_modify_db_settings_parallel_suffix: None) -> None:
    """Name SQLite's test database file after the process that sets it up, not the one that
    imported the settings: processes forked after import (xdist workers, mutation testing) or
    tox envs side by side never share, and so never wipe, one file. With
    TEST_DATABASE_PER_PROCESS=1 (scripts/mutation.py sets it), a server's test databases are
    named after the process too, so that runs side by side on one server do not collide."""
    from django.conf import settings

    for alias, database in settings.DATABASES.items():
        test = database.setdefault("TEST", {})
        if database["ENGINE"].endswith("sqlite3"):
            name = f"django-idempotency-test-{alias}-{os.getpid()}.sqlite3"
            test["NAME"] = os.path.join(tempfile.gettempdir(), name)
        elif os.environ.get("TEST_DATABASE_PER_PROCESS") == "1":
            test["NAME"] = f"{test.get('NAME') or 'test_' + database['NAME']}_{os.getpid()}"


@pytest.fixture
def database_down(transactional_db: None) -> Iterator[None]:
    """Point the default connection at a server that is not there, then restore it."""
    original = lose_database(connection)
    try:
        yield
    finally:
        connection.close()
        connection.settings_dict.clear()
        connection.settings_dict.update(original)


@pytest.fixture
def records_table_missing(transactional_db: None) -> Iterator[None]:
    """The records table renamed away, as on a database `migrate` never ran on; then back."""
    table = IdempotencyRecord._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER TABLE {table} RENAME TO {table}_away")
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"ALTER TABLE {table}_away RENAME TO {table}")


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


# Celery is imported inside the fixtures: the suite also runs where Celery is not installed.


@pytest.fixture
def celery_app() -> Iterator[Any]:
    """An app on a queue of its own: what one test sent never reaches another test's worker."""
    import redis

    from tests.celery_app import make_app, new_queue, redis_url

    url = redis_url()
    try:
        redis.Redis.from_url(url, socket_connect_timeout=2).ping()
    except redis.RedisError as exc:
        # Fail, never skip: these tests are the only proof the Celery integration works.
        pytest.fail(
            f"Redis is not reachable at {url} ({exc}). Start it (scripts/services.sh: "
            "start_redis) or point REDIS_URL at one."
        )
    queue = new_queue()
    app = make_app(queue)
    yield app
    with app.connection_for_write() as connection:
        connection.default_channel.queue_delete(queue)  # What was sent after the worker left.
    app.close()


@pytest.fixture
def worker(celery_app: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A worker in this process, so its tasks use the test database; it stops with the test."""
    from celery.contrib.testing.worker import start_worker

    # Celery runs Django's system checks as a worker starts; in a test they would query every
    # database in DATABASES, the second one too, which only its own tests may touch. (The checks
    # have tests of their own.)
    monkeypatch.setenv("CELERY_SKIP_CHECKS", "1")

    with start_worker(celery_app, pool="solo", perform_ping_check=False, shutdown_timeout=30):
        yield


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """`scripts/test -k <expr>` passes the selection to every tox env: one whose tests it does
    not match (the reliability env for `-k admin`) has nothing to run, which is not a failure.
    Without a selection, an env that collects nothing still fails."""
    option = session.config.option
    if exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED and (option.keyword or option.markexpr):
        session.exitstatus = pytest.ExitCode.OK


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """The count of docs samples run (tests/test_docs_samples.py), for the CI log: a sample
    that stops being collected shows here as a smaller number."""
    counts = {
        outcome: sum(
            "test_docs_samples.py::test_sample_runs[" in report.nodeid
            for report in terminalreporter.stats.get(outcome, [])
        )
        for outcome in ("passed", "failed", "error")
    }
    if any(counts.values()):
        terminalreporter.write_line(
            f"docs samples run: {sum(counts.values())}, passed: {counts['passed']}"
        )


@pytest.fixture(params=STORE_PARAMS)
def store(request: pytest.FixtureRequest) -> Iterator[str]:
    """The test runs once per store: the database store (in its default mode), and the Redis
    and memory stores (lease mode, the only one they have). Yields the store's name."""
    with using_store(request.param) as name:
        yield name


@pytest.fixture
def shared_store(request: pytest.FixtureRequest) -> Iterator[str]:
    """A store several processes share, given by `parametrize(..., SHARED_STORES,
    indirect=True)` (tests.stores): yields its name."""
    with using_store(request.param):
        yield request.param


@pytest.fixture(params=STORE_MODES)
def store_mode(request: pytest.FixtureRequest) -> Iterator[tuple[str, str]]:
    """Each store in each of its modes: yields (store, mode)."""
    store, mode = request.param
    with using_store(store), override_settings(IDEMPOTENCY_MODE=mode):
        yield store, mode


@pytest.fixture
def redis_store() -> Iterator[RedisStore]:
    with using_store("redis"):
        store = get_store()
        assert isinstance(store, RedisStore)
        yield store
