"""Helpers shared by the tests: view shapes, a JSON POST shortcut, lost databases and caches."""

from __future__ import annotations

import contextlib
import enum
import json
import os
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from django.core.cache import caches
from django.test import Client
from django.test.client import AsyncClient

from django_idempotency.core.fingerprint import canonical_json, fingerprint

# The default problem types: RFC 4151 tag URIs (IDEMPOTENCY_PROBLEM_BASE_URL changes the prefix).
PROBLEM_TYPE_PREFIX = "tag:django-idempotency.github.io,2026:"
# Where every problem response links by default (IDEMPOTENCY_DOCS_URL), followed by `#slug`.
DOCS_URL = "https://github.com/django-idempotency/django-idempotency/blob/main/docs/errors.md"


class ViewKind(enum.Enum):
    """Every view shape `@idempotent` supports, with its URL and namespace."""

    FUNCTION = ("/function/charges/", "default")
    CLASS_BASED = ("/cbv/charges/", "default")
    DRF_API_VIEW = ("/api-view/charges/", "default")
    DRF_APIVIEW = ("/apiview/charges/", "default")
    VIEWSET_MIXIN = ("/viewset/charges/", "default")
    VIEWSET_ACTION = ("/viewset/charges/refund/", "refunds")
    ASYNC_FUNCTION = ("/async/charges/", "default")
    ASYNC_CLASS_BASED = ("/async-cbv/charges/", "async-cbv")

    @property
    def url(self) -> str:
        return self.value[0]

    @property
    def namespace(self) -> str:
        return self.value[1]


def post(
    client: Client | AsyncClient,
    url: str,
    body: dict[str, Any] | None = None,
    key: str | None = "key-1",
    outcome: str | None = None,
    **headers: str,
) -> Any:
    """POST JSON; ``outcome`` asks the test view to act out a failure (see tests/views.py)."""
    if key is not None:
        headers["Idempotency-Key"] = key
    if outcome is not None:
        headers["X-Outcome"] = outcome
    return client.post(
        url, json.dumps(body or {"amount": 10}), content_type="application/json", headers=headers
    )


def fingerprint_of(url: str, body: dict[str, Any], method: str = "POST") -> str:
    """The fingerprint the default IDEMPOTENCY_FINGERPRINT gives a JSON request."""
    return fingerprint(method, url, canonical_json(body))


def assert_problem(response: Any, status: int, slug: str) -> dict[str, Any]:
    assert response.status_code == status, response.content
    assert response["Content-Type"] == "application/problem+json"
    problem = json.loads(response.content)
    assert set(problem) == {"type", "title", "status", "detail"}
    assert problem["status"] == status
    assert problem["type"] == PROBLEM_TYPE_PREFIX + slug
    assert problem["detail"]
    # The IETF draft asks that the key's errors link to their documentation.
    assert response["Link"] == f'<{DOCS_URL}#{slug}>; rel="describedby"; type="text/html"'
    return problem  # type: ignore[no-any-return]


def lose_database(connection: Any) -> dict[str, Any]:
    """Point a connection at a server that is not there; return its settings to restore."""
    original = dict(connection.settings_dict)
    connection.close()
    if connection.vendor == "postgresql":
        connection.settings_dict.update(HOST="127.0.0.1", PORT="9", OPTIONS={"connect_timeout": 2})
    else:
        connection.settings_dict["NAME"] = "/nonexistent-directory/db.sqlite3"
    return original


CSRF_TOKEN = "a" * 32


def logged_in_browser() -> Client:
    """A logged-in browser holding its CSRF token (CSRF_TOKEN), checked as a browser's is."""
    from tests.factories import UserFactory  # The factories need the apps ready.

    client = Client(enforce_csrf_checks=True)
    client.force_login(UserFactory())
    client.cookies["csrftoken"] = CSRF_TOKEN
    return client


# The Redis store's and the cache tier's tests on a Redis Cluster instead of one Redis
# (tox env py311-django52-rediscluster): every alias they make is a RedisClusterClient.
REDIS_CLUSTER_URL = os.environ.get("REDIS_CLUSTER_URL", "")
REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:63799")


def redis_caches(location: str) -> dict[str, dict[str, object]]:
    """CACHES with a django-redis alias "idempotency" at `location`, failing fast.

    Its keys are prefixed by this process: test processes running side by side (tox envs, xdist
    workers) share the Redis server, and one must never see or delete another's keys. Empty it
    with `clear_own_keys`, never `clear()`, which empties the whole Redis database.

    With REDIS_CLUSTER_URL set, the alias is on that cluster: a location on the test Redis is
    moved there, its database number (a cluster has database 0 only) made part of the prefix.
    """
    prefix = f"tests-{os.getpid()}"
    options: dict[str, object] = {"SOCKET_CONNECT_TIMEOUT": 0.5, "SOCKET_TIMEOUT": 0.5}
    if REDIS_CLUSTER_URL:
        location, database = on_cluster(location)
        prefix += f"-db{database}"
        options["CLIENT_CLASS"] = "django_idempotency.contrib.redis_cluster.RedisClusterClient"
    return {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "idempotency": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": location,
            "KEY_PREFIX": prefix,
            "OPTIONS": options,
        },
    }


def on_cluster(location: str) -> tuple[str, str]:
    """(the location on REDIS_CLUSTER_URL if it is on the test Redis, its database number)."""
    parts = urlsplit(location)
    database = parts.path.strip("/") or "0"
    if parts.netloc == urlsplit(REDIS_URL).netloc:
        return REDIS_CLUSTER_URL, database
    return f"{parts.scheme}://{parts.netloc}", database  # A server of a test's own, or none.


def clear_own_keys(alias: str = "idempotency") -> None:
    """Delete this process's keys in the Redis behind `alias` (fails loudly without Redis)."""
    caches[alias].delete_pattern("*")  # type: ignore[attr-defined]  # django-redis


def terminate(victim: Any) -> None:
    """End the server process behind the `victim` connection from a connection of our own, as
    a database administrator would."""
    params = victim.get_connection_params()
    if victim.vendor == "mysql":
        import MySQLdb

        with contextlib.closing(MySQLdb.connect(**params)) as admin, admin.cursor() as cursor:
            cursor.execute("KILL %s", [victim.connection.thread_id()])
        return
    import psycopg
    from psycopg.pq import TransactionStatus

    raw = victim.connection
    pid = raw.info.backend_pid
    if raw.info.transaction_status == TransactionStatus.INTRANS:
        # Asked: behind PgBouncer the connection's own pid is the pooler's key, and the server
        # connection is the one the victim's transaction holds. (An idle client of PgBouncer
        # holds none: tests of that are marked no_pooler.)
        pid = raw.execute("SELECT pg_backend_pid()").fetchone()[0]
    for name in ("cursor_factory", "context", "prepare_threshold", "server_side_binding"):
        params.pop(name, None)
    with psycopg.connect(**params, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", [pid])


def asgi_post(path: str, key: str) -> dict[str, Any]:
    """The ASGI scope of a JSON POST with an idempotency key, as a server hands it to Django."""
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"content-type", b"application/json"),
            (b"idempotency-key", key.encode()),
            (b"host", b"testserver"),
        ],
        "client": ("127.0.0.1", 1),
        "server": ("testserver", 80),
    }


def in_a_forked_child(work: Callable[[], Any]) -> Any:
    """`work`'s JSON result, run in a child process forked from this one, as a server forks its
    workers; the child leaves without running pytest's exit."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(read_end)
            with os.fdopen(write_end, "w") as pipe:
                json.dump(work(), pipe)
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        answer = pipe.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, answer
    return json.loads(answer)


def wait_for(condition: Callable[[], bool], seconds: float) -> None:
    """Poll `condition` until it holds; fail once `seconds` have passed without it."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)
