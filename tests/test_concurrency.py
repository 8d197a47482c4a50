"""Real concurrent duplicates over HTTP, PostgreSQL and MariaDB, every store: one run per key.

The quick race, in the suite: the reliability suite races the same endpoints from several client
processes at eight times the volume (docs/reliability.md, scenario 1)."""

from __future__ import annotations

import http.client
import json
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import pytest
from django.core.servers.basehttp import ThreadedWSGIServer
from django.test import override_settings
from django.test.testcases import LiveServerThread

from tests.models import Charge
from tests.stores import stored

# The database store races on each server database it runs on, directly and through PgBouncer;
# the Redis and memory stores, whose records are not in the database, once (on PostgreSQL).
ONCE_ON_POSTGRESQL = (pytest.mark.postgresql, pytest.mark.no_pooler)
MODES = [
    pytest.param(("database", "atomic"), marks=(pytest.mark.postgresql, pytest.mark.mariadb)),
    pytest.param(("database", "lease"), marks=(pytest.mark.postgresql, pytest.mark.mariadb)),
    pytest.param(("redis", "lease"), marks=(*ONCE_ON_POSTGRESQL, pytest.mark.redis)),
    pytest.param(("memory", "lease"), marks=ONCE_ON_POSTGRESQL),
]

pytestmark = [
    pytest.mark.django_db(transaction=True),
    # conftest's store_mode fixture, on this module's own selection of stores and databases.
    pytest.mark.parametrize("store_mode", MODES, indirect=True, ids="-".join),
]

KEYS = 20
DUPLICATES = 20
BODY = json.dumps({"amount": 10, "sleep": 0.05})


class _WideBacklogServer(ThreadedWSGIServer):
    # Twenty duplicates connect at the same instant; the default backlog (10) would make the
    # kernel drop some SYNs and the clients wait a second to retry.
    request_queue_size = 128


class _ServerThread(LiveServerThread):
    server_class = _WideBacklogServer


@pytest.fixture(scope="module")
def server_url(django_db_setup: None) -> Any:
    """The test project served over real HTTP by a threaded server, one connection a request."""
    thread = _ServerThread("127.0.0.1", lambda handler: handler)
    thread.daemon = True
    thread.start()
    thread.is_ready.wait()
    if thread.error:
        raise thread.error
    yield f"http://127.0.0.1:{thread.port}"
    thread.terminate()


@pytest.fixture
def mode(store_mode: tuple[str, str]) -> str:
    """Each store in each of its modes, as the race's report names it."""
    return "/".join(store_mode)


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes
    replayed: bool


def _send(base_url: str, path: str, key: str, barrier: threading.Barrier) -> Answer:
    parts = urlsplit(base_url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    barrier.wait()  # All duplicates of a key leave together.
    try:
        connection.request(
            "POST",
            path,
            body=BODY,
            headers={"Content-Type": "application/json", "Idempotency-Key": key},
        )
        response = connection.getresponse()
        return Answer(
            response.status, response.read(), response.getheader("Idempotent-Replayed") == "true"
        )
    finally:
        connection.close()


def _race(base_url: str, path: str) -> dict[str, list[Answer]]:
    answers: dict[str, list[Answer]] = {}
    with ThreadPoolExecutor(max_workers=DUPLICATES) as pool:
        for number in range(KEYS):
            key = f"race-{number}"
            barrier = threading.Barrier(DUPLICATES)
            futures = [pool.submit(_send, base_url, path, key, barrier) for _ in range(DUPLICATES)]
            answers[key] = [future.result() for future in futures]
    return answers


def _report(label: str, answers: dict[str, list[Answer]]) -> Counter[Any]:
    tally: Counter[Any] = Counter(
        "replay" if a.replayed else a.status for group in answers.values() for a in group
    )
    executions = Counter(Charge.objects.values_list("reference", flat=True))
    print(
        f"\n{label}: {KEYS * DUPLICATES} requests, {KEYS} keys; answers {dict(tally)}; "
        f"executions per key min={min(executions.values())} max={max(executions.values())}"
    )
    return tally


@pytest.mark.parametrize("path", ["/function/charges/", "/viewset/charges/"])
def test_concurrent_duplicates_run_once_and_the_rest_replay_or_409(
    server_url: str, mode: str, path: str
) -> None:
    with override_settings(IDEMPOTENCY_ON_CONFLICT="reject"):
        answers = _race(server_url, path)

    tally = _report(f"{mode}/reject {path}", answers)
    assert set(Counter(Charge.objects.values_list("reference", flat=True)).values()) == {1}
    assert Charge.objects.count() == KEYS
    assert not any(isinstance(kind, int) and kind >= 500 for kind in tally)
    for key, group in answers.items():
        created = [a for a in group if a.status == 201]
        assert len([a for a in created if not a.replayed]) <= 1, key
        assert len({a.body for a in created}) == 1, key  # Every replay is the identical body.
        assert all(a.status in (201, 409) for a in group), key
        if any(a.status == 409 for a in group):
            problem = json.loads(next(a.body for a in group if a.status == 409))
            assert problem["status"] == 409
    assert [record.status for record in stored()] == ["completed"] * KEYS


def test_with_wait_every_duplicate_gets_the_identical_response(server_url: str, mode: str) -> None:
    with override_settings(IDEMPOTENCY_ON_CONFLICT="wait", IDEMPOTENCY_WAIT_TIMEOUT=30):
        answers = _race(server_url, "/function/charges/")

    _report(f"{mode}/wait", answers)
    assert Charge.objects.count() == KEYS
    for key, group in answers.items():
        assert {a.status for a in group} == {201}, key
        assert len({a.body for a in group}) == 1, key
        assert sum(not a.replayed for a in group) == 1, key
