"""The relay and recovery commands in this process, and the relay's deliveries that fail."""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from io import StringIO
from typing import Any

import httpx
import pytest
from celery import Celery
from django.core.exceptions import ImproperlyConfigured
from django.core.management import CommandError, call_command
from django.utils import timezone

from django_idempotency import crashes, idempotent_function
from django_idempotency.models import OutboxMessage, RecoverableOperation
from django_idempotency.outbound import IdempotentTransport, RetryPolicy
from django_idempotency.outbox import Relay, enqueue_request, enqueue_task
from django_idempotency.recovery import recover_operations
from tests.downstream import Downstream, reset_downstream
from tests.factories import IdempotencyRecordFactory
from tests.stores import using_store

pytestmark = [pytest.mark.urls("tests.downstream"), pytest.mark.django_db(transaction=True)]

State = OutboxMessage.State
NO_BACKOFF = RetryPolicy(max_attempts=3, base_delay=0, max_delay=0, deadline=float("inf"))


@pytest.fixture
def downstream() -> Iterator[Downstream]:
    yield from reset_downstream()


@pytest.fixture
def url(live_server: Any) -> Callable[[str], str]:
    return lambda path: f"{live_server.url}{path}"


def refused_port() -> int:
    """A loopback port nothing listens on."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def relay_once(message: OutboxMessage, **options: Any) -> OutboxMessage:
    client = httpx.Client(transport=IdempotentTransport(policy=RetryPolicy(max_attempts=1)))
    Relay(policy=NO_BACKOFF, http_client=client, **options).run_batch()
    message.refresh_from_db()
    return message


def test_the_command_relays_what_is_due_and_says_what_it_did(
    downstream: Downstream, url: Callable[[str], str]
) -> None:
    message = enqueue_request("POST", url(downstream.script("orders")))
    out = StringIO()

    call_command("idempotency_relay", "--batch-size=10", "--lease=30", stdout=out)

    assert out.getvalue() == (
        "Relayed 1 message(s): 1 sent, 0 to retry, 0 dead, 0 taken over by another relay.\n"
    )
    assert downstream.keys("orders") == [message.key]


def test_the_command_in_a_loop_stops_on_sigterm(
    downstream: Downstream, url: Callable[[str], str]
) -> None:
    enqueue_request("POST", url(downstream.script("orders")))
    out = StringIO()

    def stop_once_delivered() -> None:
        downstream.arrived("orders", 1, within=30)
        os.kill(os.getpid(), signal.SIGTERM)  # The command's own handler takes it.

    stopper = threading.Thread(target=stop_once_delivered)
    stopper.start()
    previous = signal.getsignal(signal.SIGTERM)
    call_command("idempotency_relay", "--loop", "--interval=0.05", stdout=out)
    stopper.join(30)

    assert "1 sent" in out.getvalue()
    assert signal.getsignal(signal.SIGTERM) is previous  # Given back as it was.


def test_the_command_says_the_database_is_lost(database_down: None) -> None:
    with pytest.raises(CommandError, match="could not be reached"):
        call_command("idempotency_relay")


def test_the_command_in_a_loop_waits_for_a_lost_database(database_down: None) -> None:
    err = StringIO()
    timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM))
    timer.start()
    try:
        call_command("idempotency_relay", "--loop", "--interval=0.1", stderr=err)
    finally:
        timer.cancel()
    assert "could not be reached" in err.getvalue()


def test_the_command_refuses_an_unknown_database() -> None:
    with pytest.raises(CommandError, match="No database is named 'nowhere'"):
        call_command("idempotency_relay", "--database=nowhere")


def test_the_recovery_command_says_what_it_needs() -> None:
    with using_store("memory"), pytest.raises(CommandError, match="database store"):
        call_command("idempotency_recover")


def test_the_recovery_command_says_the_database_is_lost(database_down: None) -> None:
    with pytest.raises(CommandError, match="could not be reached"):
        call_command("idempotency_recover")


def test_a_request_nobody_answers_is_retried() -> None:
    message = enqueue_request("POST", f"http://127.0.0.1:{refused_port()}/orders/")

    message = relay_once(message)

    assert (message.state, message.attempts) == (State.PENDING, 1)
    assert message.last_error.startswith("ConnectError")


@pytest.mark.parametrize("status", [409, 500])
def test_an_answer_that_may_change_is_retried(
    downstream: Downstream, url: Callable[[str], str], status: int
) -> None:
    message = relay_once(enqueue_request("POST", url(downstream.script("orders", status))))
    assert (message.state, message.last_error) == (State.PENDING, f"answered {status}")


def test_without_httpx_a_request_waits_for_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "httpx", None)  # As if the extra were not installed.
    message = enqueue_request("POST", "http://host.example/orders/")

    Relay(policy=NO_BACKOFF).run_batch()

    message.refresh_from_db()
    assert (message.state, message.last_error[:19]) == (State.PENDING, "ModuleNotFoundError")


def test_a_task_the_broker_refuses_is_retried(caplog: pytest.LogCaptureFixture) -> None:
    app = Celery("refused", broker=f"redis://127.0.0.1:{refused_port()}/0", set_as_current=False)
    app.conf.update(task_publish_retry=False, broker_connection_timeout=1)
    message = enqueue_task("tests.tasks.nothing", args=[1])

    with caplog.at_level(logging.INFO, "django_idempotency"):
        message = relay_once(message, app=app)

    assert (message.state, message.attempts) == (State.PENDING, 1)
    assert "(task tests.tasks.nothing) not delivered" in caplog.text


def test_a_message_whose_url_cannot_be_read_is_logged_without_stopping_the_relay(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A row written before URLs were checked (or by hand): its log line cannot stop a relay."""
    now = timezone.now()
    message = OutboxMessage.objects.create(
        key="by-hand",
        kind="request",
        method="POST",
        destination="http://[::1/orders?token=secret",
        available_at=now,
        created_at=now,
    )

    with caplog.at_level(logging.INFO, "django_idempotency"):
        message = relay_once(message)

    assert message.state == State.PENDING
    assert "http://[::1/orders" in caplog.text and "secret" not in caplog.text


def kept(target: str, args: list[Any], key: str) -> RecoverableOperation:
    """A kept call whose record was abandoned: its worker is gone, its lease over."""
    past = timezone.now() - timedelta(minutes=5)
    IdempotencyRecordFactory(
        namespace="tests.kept", key=key, in_progress=True, lease_expires_at=past
    )
    return RecoverableOperation.objects.create(
        namespace="tests.kept",
        key=key,
        kind="function",
        target=target,
        arguments=b'P{"args": %s, "kwargs": {}}' % str(args).encode(),
        next_attempt_at=past,
        created_at=past,
        updated_at=past,
    )


@pytest.mark.parametrize(
    ("target", "args", "reason"),
    [
        ("tests.nowhere:fulfil", [1], "cannot be found"),
        ("tests.test_recovery:charge", [1, 2], "no longer declared with recover=True"),
        ("tests.test_recovery:fulfil", [1, 2, 3, 4], "no longer fit"),
    ],
)
def test_a_kept_call_the_sweep_cannot_call_as_it_was_is_failed(
    target: str, args: list[Any], reason: str
) -> None:
    import tests.test_recovery  # noqa: F401 - declares its recover=True functions.

    row = kept(target, args, "k-1")

    assert recover_operations().failed == 1
    row.refresh_from_db()
    assert row.state == "failed" and reason in row.last_error


def test_crash_points_read_from_the_environment() -> None:
    with pytest.raises(ValueError, match="not an action"):
        crashes.arm_from_environment("claimed=explode")
    with pytest.raises(ValueError, match="arrival number"):
        crashes.arm_from_environment("claimed@x")
    crashes.arm_from_environment("outbox.sent@2=raise")
    try:
        crashes.reached("outbox.sent")
        with pytest.raises(crashes.CrashPoint):
            crashes.reached("outbox.sent")
    finally:
        crashes.disarm()


def test_a_json_body_keeps_the_content_type_it_was_given() -> None:
    message = enqueue_request(
        "POST",
        "http://host.example/orders/",
        json_body={"order": 1},
        headers={"Content-Type": "application/vnd.orders+json"},
    )
    assert message.payload["headers"] == [["Content-Type", "application/vnd.orders+json"]]


@idempotent_function(key="order", mode="atomic")
def confirm_elsewhere(order: int) -> None:
    enqueue_request("POST", "http://host.example/orders/", using="records")


def test_a_message_on_another_database_than_an_atomic_claim_s_is_refused() -> None:
    """They would not commit together: the retry would write it again under another key."""
    with pytest.raises(ImproperlyConfigured, match="do not commit together"):
        confirm_elsewhere(1)


def test_a_relay_runs_no_more_batches_than_asked(
    downstream: Downstream, url: Callable[[str], str]
) -> None:
    path = url(downstream.script("orders"))
    for _ in range(3):
        enqueue_request("POST", path)
    client = httpx.Client(transport=IdempotentTransport(policy=RetryPolicy(max_attempts=1)))

    report = Relay(batch_size=1, policy=NO_BACKOFF, http_client=client).run(max_batches=2)

    assert report.sent == 2
    with pytest.raises(ValueError):
        Relay(batch_size=0)


def test_the_recovery_beat_task_reports_its_sweep() -> None:
    from django_idempotency import tasks

    result = tasks.recover_operations.apply().get()

    assert result == {"recovered": 0, "retried": 0, "failed": 0, "waiting": 0, "cleared": 0}
