"""Scenario 2: a gunicorn worker SIGKILLed in the middle of a slow idempotent view.

On the Redis store (lease mode only) the "atomic" variant's endpoint runs in lease mode, the demo's
IDEMPOTENCY_MODE: its killed claim waits for its lease like the lease variant's."""

from __future__ import annotations

import http.client
import json
import os
import signal
import time
from collections.abc import Callable, Iterator

import pytest

from tests.reliability.client import Answer, post
from tests.reliability.harness import (
    Database,
    Figure,
    Figures,
    Records,
    Serve,
    Server,
    Services,
    wait_until,
)

LEASE = 8  # Seconds; the killed request's claim blocks retries for this long in lease mode.
# Seconds the provider takes: the worker is killed while it waits. Long enough that on a loaded
# machine the test finds the worker and sends its duplicate before the view ends (at 3 s a CI
# rehearsal sent it late, and the duplicate was replayed, not turned away).
DELAY = 6
PATHS = {"atomic": "/api/provider/payments/", "lease": "/api/provider/lease/"}
NAMESPACES = {"atomic": "provider-payments", "lease": "provider-payments-lease"}


@pytest.fixture(scope="module")
def leased_server(serve: Serve) -> Iterator[Server]:
    with serve("killed", IDEMPOTENCY_LEASE=str(LEASE)) as running:
        yield running


@pytest.mark.parametrize("mode", ["atomic", "lease"])
def test_a_killed_worker_leaves_no_stuck_key_and_the_retry_runs_once(
    leased_server: Server,
    services: Services,
    db: Database,
    store: Records,
    figures: Figures,
    timer: Callable[[], float],
    mode: str,
) -> None:
    server, path, namespace = leased_server, PATHS[mode], NAMESPACES[mode]
    # The mode the endpoint runs in: the Redis store runs every view leased.
    runs_as = mode if services.store == "database" else "lease"
    key = f"killed-{mode}"
    body = {"amount": 700, "currency": "EUR", "description": key, "delay": DELAY}
    payload = json.dumps(body).encode()
    headers = {"Content-Type": "application/json", "Idempotency-Key": key}
    sent: list[Answer] = []

    # The first request: sent, then its worker found from the connection and killed mid-view.
    first = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    first.request("POST", path, body=payload, headers=headers)
    worker = None

    def found() -> bool:
        nonlocal worker
        worker = server.worker_serving(first.sock)
        return worker is not None

    wait_until(found, 10, "the worker serving the first request")

    def locked() -> bool:  # In atomic mode the claim is uncommitted until the view returns.
        return db.open_claim(namespace, key)

    def claimed() -> bool:
        if runs_as == "lease":  # The claim is committed (or written to Redis) before the view.
            return bool(store.records(namespace, key))
        return locked()  # Uncommitted until the view returns.

    wait_until(claimed, 10, "the first request to claim the key")
    sent.append(post(server.url, path, body, key))  # A duplicate is turned away meanwhile.
    assert sent[-1].status == 409, sent[-1]
    assert worker is not None
    os.kill(worker, signal.SIGKILL)
    killed_at = time.monotonic()
    with pytest.raises((http.client.HTTPException, ConnectionError)):
        first.getresponse()  # The client sees the connection drop, and will retry.
    first.close()

    if runs_as == "atomic":
        # The claim and the view's writes were one transaction, which died with the worker.
        wait_until(lambda: not locked(), 10, f"{db.label} to roll the transaction back")
        assert not db.records(namespace, key)
        assert db.executions(key) == {}
    else:
        # The committed claim outlives the worker until its lease ends; retries meanwhile: 409.
        assert store.records(namespace, key)[("", key)][0] == "in_progress"
        sent.append(post(server.url, path, body, key))
        assert sent[-1].status == 409, sent[-1]
        assert sent[-1].problem()["type"].endswith("request-in-progress")

    # The client retries (honouring Retry-After) until it gets an answer: the view runs once.
    retries = 0
    while True:
        free_after = time.monotonic() - killed_at
        retry = post(server.url, path, body, key)
        sent.append(retry)
        retries += 1
        if retry.status != 409:
            break
        assert retry.problem()["type"].endswith("request-in-progress")
        assert time.monotonic() - killed_at < LEASE + 15, "the key stayed stuck past its lease"
        time.sleep(0.25)
    assert (retry.status, retry.replayed) == (201, False), retry
    again = post(server.url, path, body, key)
    sent.append(again)
    assert (again.status, again.replayed, again.body) == (201, True, retry.body), again
    assert db.executions(key) == {key: 1}
    assert store.records(namespace, key)[("", key)][:3] == ("completed", 201, retry.body)
    if store is not db:  # The record is in Redis alone: the run was on the Redis store.
        assert not db.records(namespace, key)
    wait_until(lambda: len(server.worker_pids()) == server.workers, 30, "gunicorn to replace it")
    assert worker not in server.worker_pids()

    statuses = [a.status for a in sent]
    figures.add(
        Figure(
            "2. killed workers",
            mode
            if runs_as == "atomic"
            else f"{mode if runs_as == mode else f'lease ({mode} endpoint {path})'}, "
            f"SIGKILL mid-view (lease {LEASE} s)",
            requests=len(sent) + 1,
            absorbed=statuses.count(409) + again.replayed,
            executions="1",
            server_errors=sum(s >= 500 for s in statuses),
            seconds=timer(),
            notes=f"key free {free_after:.1f} s after the kill ({retries - 1} x 409 before)",
        )
    )
