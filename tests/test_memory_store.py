"""The memory store: its purge (it has no TTL of its own), and its refusal in a forked worker."""

from __future__ import annotations

import json
import logging
import os
from dataclasses import replace
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.test import Client
from django.utils import timezone

from django_idempotency.core.outcomes import Claim, Outcome, Scope, StoredResponse
from django_idempotency.stores import PurgeOptions, PurgeResult, get_store
from django_idempotency.stores.memory import MemoryStore
from tests.stores import claim_request, using_store


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
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # The worker: answer through the pipe, and leave without running pytest's exit.
        code = 1
        try:
            os.close(read_end)
            with os.fdopen(write_end, "w") as pipe:
                json.dump(_post_in(os.getpid()), pipe)
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        answer = pipe.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, answer
    return json.loads(answer)  # type: ignore[no-any-return]
