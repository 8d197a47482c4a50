"""`@idempotent_task` on real workers and a real Redis broker: one body run per key."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from celery import Celery
from celery.signals import task_failure, task_retry, task_success
from django.db import connection
from django.test import override_settings
from django.utils import timezone

from django_idempotency.core.outcomes import Outcome, Scope
from django_idempotency.exceptions import KeyInProgress, KeyMismatch
from django_idempotency.models import IdempotencyRecord
from django_idempotency.stores import ClaimRequest, get_store
from tests import tasks
from tests.models import Charge
from tests.stores import the_record
from tests.utils import fingerprint_of

ROOT = Path(__file__).resolve().parent.parent

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.celery,
    pytest.mark.redis,
    # Celery's Redis result backend still calls a method redis-py 6+ deprecates.
    pytest.mark.filterwarnings("ignore:Call to deprecated setex:DeprecationWarning"),
]


@pytest.fixture
def outcomes() -> Iterator[list[tuple[str, Any]]]:
    """("success", result) or ("failure", exception) for every task the worker finished."""
    seen: list[tuple[str, Any]] = []

    def succeeded(sender: Any, result: Any, **kwargs: Any) -> None:
        seen.append(("success", result))

    def failed(sender: Any, exception: BaseException, **kwargs: Any) -> None:
        seen.append(("failure", exception))

    task_success.connect(succeeded, weak=False)
    task_failure.connect(failed, weak=False)
    yield seen
    task_success.disconnect(succeeded)
    task_failure.disconnect(failed)


def wait_for(condition: Callable[[], bool], seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.mark.usefixtures("store", "worker")
def test_a_message_delivered_twice_runs_its_body_once(
    celery_app: Celery, outcomes: list[tuple[str, Any]]
) -> None:
    message_id = f"message-{uuid.uuid4()}"  # Results outlive a test run in Redis: never reuse.
    for _ in range(2):  # What a broker does when the first acknowledgement was lost.
        celery_app.send_task(tasks.record_payment.name, args=["pay-1", 100], task_id=message_id)

    wait_for(lambda: len(outcomes) == 2)

    charge = Charge.objects.get(reference="pay-1")
    assert outcomes == [("success", {"charge": charge.pk, "reference": "pay-1"})] * 2
    record = the_record()
    assert (record.namespace, record.key, record.method, record.status) == (
        "tests.tasks.record_payment",
        message_id,
        "TASK",
        "completed",
    )


@pytest.mark.usefixtures("store", "worker")
def test_a_key_from_the_arguments_makes_other_messages_duplicates(
    celery_app: Celery, outcomes: list[tuple[str, Any]]
) -> None:
    for amount in (30, 30, 45):
        celery_app.send_task(tasks.refund.name, args=["ref-1", amount])

    wait_for(lambda: len(outcomes) == 3)

    charge = Charge.objects.get(reference="ref-1")
    assert outcomes[:2] == [("success", charge.pk)] * 2
    kind, error = outcomes[2]
    assert kind == "failure"
    assert isinstance(error, KeyMismatch)  # Same refund, another amount: refused, not re-run.
    assert charge.amount == -30


@pytest.mark.usefixtures("worker")
def test_autoretry_attempts_are_not_duplicates_of_each_other(
    celery_app: Celery, store: str
) -> None:
    result = celery_app.send_task(tasks.flaky_payment.name, args=["flaky-1", 2])

    assert result.get(timeout=30)["attempt"] == 2
    # Each attempt ran once and the third was stored. Atomic mode rolled the two failed
    # attempts' writes back with their claims; lease mode (the other stores') cannot.
    attempts = [2] if store == "database" else [0, 1, 2]
    charges = Charge.objects.order_by("pk").values_list("reference", "amount")
    assert list(charges) == [("flaky-1", attempt) for attempt in attempts]
    assert the_record().status == "completed"


@pytest.mark.usefixtures("worker")
@override_settings(IDEMPOTENCY_LEASE=4, IDEMPOTENCY_WAIT_TIMEOUT=0.5)
def test_a_duplicate_while_another_attempt_runs_is_retried_once_that_lease_can_end(
    celery_app: Celery,
) -> None:
    # Another worker took the refund and died with it: its claim holds the key for its lease.
    payload = {"reference": "held-1", "amount": 30}
    held = ClaimRequest(
        scope=Scope("refund-tasks", "", "held-1"),
        fingerprint=fingerprint_of(tasks.refund.name, payload, method="TASK"),
        method="TASK",
        path=tasks.refund.name,
        now=timezone.now(),
        ttl=timedelta(hours=1),
        lease=timedelta(seconds=4),
    )
    assert get_store().begin(held).outcome is Outcome.FRESH
    retried: list[Any] = []  # Celery's Retry, the original exception as its `exc`.

    def on_retry(sender: Any, reason: Any, **kwargs: Any) -> None:
        retried.append(reason)

    task_retry.connect(on_retry, weak=False)
    try:
        result = celery_app.send_task(tasks.refund.name, args=["held-1", 30])
        charge_id = result.get(timeout=30)
    finally:
        task_retry.disconnect(on_retry)

    # Waited for the key in vain, retried after IDEMPOTENCY_LEASE, then run: once.
    assert [type(reason.exc) for reason in retried] == [KeyInProgress]
    assert Charge.objects.get().pk == charge_id
    assert the_record().status == "completed"


def test_a_task_called_as_a_plain_function_runs_each_time_unguarded() -> None:
    # No message, no message id: nothing a broker could deliver twice, so nothing is claimed.
    first = tasks.record_payment("direct-1", 5)
    second = tasks.record_payment("direct-1", 5)

    assert first != second
    assert Charge.objects.filter(reference="direct-1").count() == 2
    assert not IdempotencyRecord.objects.exists()


def _database_url() -> str:
    """The test database, for a worker process to use."""
    settings = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{settings['NAME']}"
    credentials = quote(settings["USER"]) + (
        f":{quote(settings['PASSWORD'])}" if settings["PASSWORD"] else ""
    )
    scheme = "mysql" if connection.vendor == "mysql" else "postgres"
    return f"{scheme}://{credentials}@{settings['HOST']}:{settings['PORT']}/{settings['NAME']}"


def _worker_process(queue: str, log: Path) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "DATABASE_URL": _database_url(),
        "DJANGO_SETTINGS_MODULE": "tests.settings",
    }
    return subprocess.Popen(
        [sys.executable, "-m", "tests.celery_worker", queue, "--lifetime=60"],
        cwd=ROOT,
        env=env,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
    )


def test_a_worker_killed_mid_task_leaves_nothing_and_the_redelivery_runs_once(
    celery_app: Celery, tmp_path: Path
) -> None:
    queue = celery_app.conf.task_default_queue
    marker = tmp_path / "first-run-paused"
    log = tmp_path / "workers.log"
    message_id = f"message-{uuid.uuid4()}"
    connection.close()  # SQLite: let the workers write.

    first = _worker_process(queue, log)
    try:
        result = celery_app.send_task(
            tasks.record_payment.name, args=["kill-1", 7, str(marker)], task_id=message_id
        )
        wait_for(marker.exists, 45)
    finally:
        first.kill()  # SIGKILL mid-task: no chance to acknowledge, roll back or release.
        first.wait()

    # Atomic mode: the claim and the charge died with the worker's transaction.
    assert not Charge.objects.filter(reference="kill-1").exists()
    assert not IdempotencyRecord.objects.exists()

    second = _worker_process(queue, log)
    try:
        value = result.get(timeout=45)  # The broker delivers the unacknowledged message again.
    finally:
        second.kill()
        second.wait()

    charge = Charge.objects.get(reference="kill-1")
    assert value == {"charge": charge.pk, "reference": "kill-1"}
    assert IdempotencyRecord.objects.get().key == message_id
