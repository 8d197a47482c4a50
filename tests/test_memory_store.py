"""The memory store: its purge (it has no TTL of its own), and its refusal in a forked worker."""

from __future__ import annotations

import io
import json
import logging
import os
from dataclasses import replace
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from django.test import Client
from django.utils import timezone

from django_idempotency.core.outcomes import Claim, Outcome, Scope, StoredResponse
from django_idempotency.stores import PurgeOptions, PurgeResult, get_store
from django_idempotency.stores.memory import MemoryStore
from tests.stores import claim_request, using_store
from tests.utils import in_a_forked_child


def _begin(store: MemoryStore, key: str, *, lease: float, namespace: str = "default") -> Claim:
    claim = store.begin(claim_request(Scope(namespace, "", key), lease=lease))
    assert claim.outcome is Outcome.FRESH
    return claim


def test_purge_frees_expired_records_and_abandoned_claims_only() -> None:
    store = MemoryStore()
    for claim in (_begin(store, "done", lease=60), _begin(store, "r", lease=60, namespace="x")):
        assert store.complete(claim, StoredResponse(201), timezone.now())
    _begin(store, "abandoned", lease=60)
    _begin(store, "abandoned too", lease=60)
    _begin(store, "running", lease=3 * 3600)  # Past its TTL, but its lease is still live.
    later = timezone.now() + timedelta(hours=2)

    dry_run = store.purge(later, PurgeOptions(namespace="default", dry_run=True))
    purged = store.purge(later)

    assert dry_run == PurgeResult(expired=1, abandoned=2, batches=0)
    assert purged == PurgeResult(expired=2, abandoned=2, batches=1)
    assert [scope.key for scope in store.records] == ["running"]


@pytest.mark.django_db  # The command purges the outbound journal too, in the database.
def test_the_purge_command_frees_the_memory_store_in_one_batch_and_reports_it() -> None:
    two_hours_ago = timezone.now() - timedelta(hours=2)  # Claims of an hour's TTL, expired.
    with using_store("memory"):
        store = get_store()
        assert isinstance(store, MemoryStore)
        done, _ = (
            store.begin(replace(claim_request(Scope("default", "", key)), now=two_hours_ago))
            for key in ("done", "abandoned")
        )
        assert store.complete(done, StoredResponse(201), two_hours_ago)
        _begin(store, "running", lease=60)
        stdout = StringIO()

        call_command("idempotency_purge", "--batch-size", "1", verbosity=2, stdout=stdout)

        batch, summary = stdout.getvalue().splitlines()
        # The memory store frees everything at once, whatever the batch size: one batch.
        assert batch == "Batch 1: 2 records purged so far (1 expired, 1 abandoned)."
        assert summary.startswith("Purged 2 records (1 expired, 1 abandoned) in ")
        assert [scope.key for scope in store.records] == ["running"]


# Under a server that forks its workers from a process that already made the store, each worker
# would claim keys in its own copy of the records: the worker refuses instead.


@pytest.mark.django_db  # The view, run in the process that created the store, writes a charge.
@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_a_forked_worker_refuses_the_memory_store_with_500_and_says_what_to_use() -> None:
    with using_store("memory"):
        store = get_store()
        assert isinstance(store, MemoryStore)
        answers: list[dict[str, Any]] = [
            _post_in(os.getpid()),  # The process that created the store keeps it.
            _post_in_forked_worker(),
        ]

    in_creator, in_worker = answers
    assert in_creator["status"] == 201
    assert in_worker["status"] == 500
    assert in_worker["type"].endswith("store-misconfigured")
    assert in_worker["retry_after"] is None
    assert in_worker["ran"] is False  # The view did not run.
    [line] = in_worker["errors"]
    assert line.startswith("Idempotency store unusable: The memory store was created in process")
    assert "Use the database store (the default) or" in line
    assert "RedisStore under a server with several worker processes" in line


def _post_in(pid: int) -> dict[str, Any]:
    """POST a keyed request to a guarded view from this process: what the client sees."""
    errors: list[str] = []
    handler = logging.Handler(logging.ERROR)
    handler.emit = lambda record: errors.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger("django_idempotency")
    logger.addHandler(handler)
    try:
        response = Client().post(
            "/forms/charges/", {"amount": "5"}, headers={"Idempotency-Key": f"order-{pid}"}
        )
    finally:
        logger.removeHandler(handler)
    body = json.loads(response.content) if response.status_code == 500 else {}
    return {
        "status": response.status_code,
        "type": body.get("type", ""),
        "retry_after": response.get("Retry-After"),
        "ran": response.status_code == 201,
        "errors": errors,
    }


def _post_in_forked_worker() -> dict[str, Any]:
    """`_post_in` run in a child process forked from this one, as a server forks its workers."""
    return in_a_forked_child(lambda: _post_in(os.getpid()))  # type: ignore[no-any-return]


# Without --preload, each of gunicorn's workers creates a store of its own: no fork follows the
# store, yet each worker keeps its own records. The server says it runs several processes
# (PEP 3333's wsgi.multiprocess), and the guard refuses the store on that word.
# (tests/test_walkthrough.py runs gunicorn --workers 2 for real.)


@pytest.mark.django_db
@pytest.mark.parametrize("multiprocess", [True, False], ids=["several workers", "one worker"])
def test_a_server_of_several_processes_refuses_the_memory_store_and_one_process_keeps_it(
    multiprocess: bool, caplog: pytest.LogCaptureFixture
) -> None:
    with using_store("memory"):
        first, retry = (_serve_wsgi(multiprocess) for _ in range(2))

    if multiprocess:
        for status, body in (first, retry):
            assert status == 500
            assert body["type"].endswith("store-misconfigured")
        logged = [r.getMessage() for r in caplog.records if r.name == "django_idempotency"]
        assert (
            logged
            == [
                "Idempotency store unusable: IDEMPOTENCY_STORE ="
                " 'django_idempotency.stores.memory.MemoryStore' keeps its records in the memory of"
                " one process, and this server runs several worker processes (its WSGI environ says"
                " wsgi.multiprocess): a retry reaching another worker would run the view again. Use"
                " the database store (the default) or django_idempotency.stores.redis.RedisStore,"
                " or serve with one worker process."
            ]
            * 2
        )
    else:  # runserver, or gunicorn with one worker: the store serves that one process.
        assert (first[0], retry[0]) == (201, 201)
        assert first[1] == retry[1]


@pytest.mark.django_db
def test_the_test_client_keeps_the_memory_store_though_its_environ_says_multiprocess() -> None:
    # Django's RequestFactory and test client set wsgi.multiprocess whatever runs the test.
    with using_store("memory"):
        first, retry = (
            Client().post("/forms/charges/", {"amount": "5"}, headers={"Idempotency-Key": "t1"})
            for _ in range(2)
        )
        assert first.wsgi_request.META["wsgi.multiprocess"] is True

    assert (first.status_code, retry.status_code) == (201, 201)
    assert retry["Idempotent-Replayed"] == "true"


def _serve_wsgi(multiprocess: bool) -> tuple[int, dict[str, Any]]:
    """POST a keyed form through Django's WSGI handler as a WSGI server calls it: its status and
    its JSON body."""
    from django.core.wsgi import get_wsgi_application

    body = b"amount=5"
    environ: dict[str, Any] = {
        "REQUEST_METHOD": "POST",
        "PATH_INFO": "/forms/charges/",
        "SERVER_NAME": "shop.example",
        "SERVER_PORT": "80",
        "CONTENT_TYPE": "application/x-www-form-urlencoded",
        "CONTENT_LENGTH": str(len(body)),
        "HTTP_IDEMPOTENCY_KEY": "order-wsgi",
        "wsgi.input": io.BytesIO(body),
        "wsgi.errors": io.StringIO(),
        "wsgi.url_scheme": "http",
        "wsgi.version": (1, 0),
        "wsgi.multithread": True,
        "wsgi.multiprocess": multiprocess,
        "wsgi.run_once": False,
    }
    statuses: list[str] = []
    # As the test client does: the handler would close the connection the test's transaction is on.
    for signal in (request_started, request_finished):
        signal.disconnect(close_old_connections)
    try:
        chunks = get_wsgi_application()(environ, lambda status, headers: statuses.append(status))
        content = b"".join(chunks)
        chunks.close()
    finally:
        for signal in (request_started, request_finished):
            signal.connect(close_old_connections)
    return int(statuses[0].split()[0]), json.loads(content)
