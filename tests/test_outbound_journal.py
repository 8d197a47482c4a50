"""The journal of outbound calls: written before the first attempt, updated after each, in the
admin, signalled, counted, purged."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from datetime import timedelta
from io import StringIO
from typing import Any

import httpx
import pytest
from django.core.management import call_command
from django.db import connection, transaction
from django.test import override_settings
from django.urls import reverse
from django.utils import timezone
from prometheus_client import REGISTRY

from django_idempotency import idempotent_function, signals
from django_idempotency.models import OutboundCall
from django_idempotency.outbound import IdempotentTransport, journal
from django_idempotency.purge import purge_expired_records
from tests.downstream import Downstream, reset_downstream
from tests.outbound_clients import CALLERS, Clock, HttpxCaller, refused_port
from tests.test_admin import staff_client
from tests.utils import lose_database

pytestmark = [pytest.mark.urls("tests.downstream"), pytest.mark.django_db(transaction=True)]

KEY = "order-1-charge"
CHANGELIST = reverse("admin:django_idempotency_outboundcall_changelist")


@pytest.fixture
def downstream() -> Iterator[Downstream]:
    yield from reset_downstream()


@pytest.fixture
def url(live_server: Any) -> Callable[[str], str]:
    return lambda path: f"{live_server.url}{path}"


def send(url: str, *, key: str | None = KEY, **policy: Any) -> Any:
    return HttpxCaller(Clock().policy(**policy)).send("POST", url, key=key)


@pytest.mark.parametrize("kind", list(CALLERS))
def test_the_row_is_written_before_the_first_attempt_and_confirmed_after_the_answer(
    downstream: Downstream, url: Callable[[str], str], kind: str
) -> None:
    path = downstream.script("charges", 503)
    before = timezone.now()

    CALLERS[kind](Clock().policy()).send("POST", url(path) + "?token=secret", key=KEY)

    # What a crash while a request was in flight would leave: a row saying "maybe sent".
    assert [seen.journaled for seen in downstream.seen["charges"]] == ["sending", "sending"]
    call = OutboundCall.objects.get()
    assert (call.key, call.method, call.outcome, call.attempts, call.last_status) == (
        KEY,
        "POST",
        "confirmed",
        2,
        201,
    )
    assert call.target == url(path)  # The query string, which may hold secrets, is left out.
    assert call.host == url(path).split("/")[2]
    assert (call.namespace, call.owner, call.operation_key, call.step) == ("", "", "", "")
    assert before <= call.created_at <= call.updated_at
    assert not call.replayed


@pytest.mark.parametrize(
    ("answers", "outcome", "last_status"),
    [
        ((402,), "confirmed", 402),  # A decision: the card was declined.
        ((400,), "failed", 400),
        ((422,), "failed", 422),
        ((503, 503), "failed", 503),  # Refused each time, run never.
        ((429, 429), "failed", 429),
        ((409, 409), "ambiguous", 409),  # The downstream is running the key: maybe done.
        ((502, 502), "ambiguous", 502),
        ((500,), "ambiguous", 500),
        ((502, 503), "ambiguous", 503),  # Refused now, but the first attempt may have run.
    ],
)
def test_each_final_answer_leaves_its_outcome(
    downstream: Downstream,
    url: Callable[[str], str],
    answers: tuple[int, ...],
    outcome: str,
    last_status: int,
) -> None:
    path = downstream.script("charges", *answers)

    send(url(path), max_attempts=2)

    call = OutboundCall.objects.get()
    assert (call.outcome, call.last_status, call.attempts) == (outcome, last_status, len(answers))


def test_a_lost_answer_is_ambiguous(downstream: Downstream, url: Callable[[str], str]) -> None:
    with pytest.raises(httpx.ReadTimeout):
        HttpxCaller(Clock().policy(max_attempts=2)).send(
            "POST", url("/downstream/slow/"), key=KEY, timeout=0.3
        )

    call = OutboundCall.objects.get()
    assert (call.outcome, call.last_status, call.last_error, call.attempts) == (
        "ambiguous",
        None,
        "ReadTimeout",
        2,
    )


def test_a_connection_never_made_fails_the_call() -> None:
    with refused_port() as port, pytest.raises(httpx.ConnectError):
        send(f"http://127.0.0.1:{port}/charges/", max_attempts=2)

    call = OutboundCall.objects.get()
    assert (call.outcome, call.last_status, call.last_error) == ("failed", None, "ConnectError")


def test_a_call_without_a_key_is_not_journaled(
    downstream: Downstream, url: Callable[[str], str]
) -> None:
    send(url(downstream.script("keyless")), key=None)
    HttpxCaller(Clock().policy()).send("GET", url(downstream.script("listing")))

    assert not OutboundCall.objects.exists()


def test_a_run_after_a_crash_goes_on_with_the_same_row(
    downstream: Downstream, url: Callable[[str], str]
) -> None:
    path = downstream.script("charges", 504)
    send(url(path), max_attempts=1)  # Ambiguous: the gateway gave up, the bank may have run it.

    send(url(path))

    call = OutboundCall.objects.get()
    assert (call.outcome, call.attempts, call.last_status) == ("confirmed", 2, 201)


def test_a_later_run_that_fails_leaves_an_earlier_confirmation_as_it_was(
    downstream: Downstream, url: Callable[[str], str]
) -> None:
    path = downstream.script("charges", 201, 503, 503)
    send(url(path))  # The bank did it, and said so.

    # A later run of the same operation (its answer lost to a crash before it was stored):
    # the bank refuses it now, and it never runs again.
    send(url(path), max_attempts=2)
    during_the_later_run = [seen.journaled for seen in downstream.seen["charges"][1:]]

    call = OutboundCall.objects.get()
    assert (call.outcome, call.attempts, call.last_status) == ("confirmed", 3, 503)
    assert during_the_later_run == ["confirmed", "confirmed"]  # Never back to "sending".


def test_a_later_run_that_fails_leaves_an_earlier_run_that_may_have_sent_it_ambiguous(
    downstream: Downstream, url: Callable[[str], str]
) -> None:
    lost = downstream.script("lost", 502)
    send(url(lost), max_attempts=1)  # The gateway gave up: the bank may have done it.

    # The later run never reaches the bank.
    with refused_port() as port, pytest.raises(httpx.ConnectError):
        send(f"http://127.0.0.1:{port}/charges/", max_attempts=2)

    call = OutboundCall.objects.get()
    assert (call.outcome, call.attempts, call.last_error) == ("ambiguous", 3, "ConnectError")


def test_a_row_a_crash_left_sending_is_ambiguous_after_a_later_run_that_fails(
    downstream: Downstream, url: Callable[[str], str]
) -> None:
    # What a run killed while its request was in flight leaves: "maybe sent".
    journal.open_call(KEY, method="POST", target="t", host="h", step="", scope=None)

    with refused_port() as port, pytest.raises(httpx.ConnectError):
        send(f"http://127.0.0.1:{port}/charges/", max_attempts=1)

    call = OutboundCall.objects.get()
    assert (call.outcome, call.attempts) == ("ambiguous", 1)  # Never "failed": not done.


def test_in_a_transaction_the_row_is_written_with_a_warning_once(
    downstream: Downstream,
    url: Callable[[str], str],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(journal, "_warned_in_transaction", False)
    path = downstream.script("charges")

    @idempotent_function(key="order", namespace="settle", mode="atomic")
    def settle(order: int) -> None:
        # A key of the caller's own: atomic mode derives none (see test_outbound_keys.py).
        with httpx.Client(transport=IdempotentTransport()) as client:
            client.post(url(path), headers={"Idempotency-Key": f"settle-{order}"})

    with caplog.at_level(logging.WARNING, logger="django_idempotency"):
        settle(1)
        settle(2)

    warnings = [r for r in caplog.records if "inside a transaction" in r.getMessage()]
    assert len(warnings) == 1
    assert 'mode="lease"' in warnings[0].getMessage()
    assert OutboundCall.objects.filter(outcome="confirmed").count() == 2

    # What the warning is about: a rollback takes the row with it.
    with transaction.atomic():
        send(url(path), key="rolled-back")
        transaction.set_rollback(True)
    assert not OutboundCall.objects.filter(key="rolled-back").exists()


def test_a_journal_that_cannot_be_written_never_stops_the_call(
    downstream: Downstream, url: Callable[[str], str], caplog: pytest.LogCaptureFixture
) -> None:
    path = downstream.script("charges", 503)
    original = lose_database(connection)
    try:
        with caplog.at_level(logging.ERROR, logger="django_idempotency"):
            answer = send(url(path))
    finally:
        connection.close()
        connection.settings_dict.clear()
        connection.settings_dict.update(original)

    assert answer.status == 201
    assert downstream.keys("charges") == [KEY, KEY]  # Retried as ever.
    errors = [r.getMessage() for r in caplog.records if r.name == "django_idempotency"]
    assert len(errors) == 3  # The row, then each of two attempts: logged, not raised.
    assert all("could not record the call" in error for error in errors)
    assert not OutboundCall.objects.exists()


def test_each_attempt_is_signalled(downstream: Downstream, url: Callable[[str], str]) -> None:
    path = downstream.script("charges", (503, {"Retry-After": "1"}))
    received: list[dict[str, Any]] = []

    def receive(sender: Any, **kwargs: Any) -> None:
        received.append(kwargs)

    def fail(sender: Any, **kwargs: Any) -> None:
        raise RuntimeError("a broken receiver")

    signals.outbound_attempt.connect(receive, weak=False)
    signals.outbound_attempt.connect(fail, weak=False)
    try:
        assert send(url(path)).status == 201  # The broken receiver is logged, not raised.
    finally:
        signals.outbound_attempt.disconnect(receive)
        signals.outbound_attempt.disconnect(fail)

    shown = [(k["attempt"], k["status"], k["outcome"], k["replayed"], k["error"]) for k in received]
    assert shown == [(1, 503, "sending", False, None), (2, 201, "confirmed", False, None)]
    for kwargs in received:
        assert (kwargs["key"], kwargs["method"], kwargs["target"]) == (KEY, "POST", url(path))
        assert kwargs["host"] == url(path).split("/")[2]
        assert kwargs["duration"] > 0


def _sample(name: str, **labels: str) -> float:
    value = REGISTRY.get_sample_value(name, labels)
    return value or 0.0


def test_attempts_are_counted_by_host_and_outcome(
    downstream: Downstream, url: Callable[[str], str]
) -> None:
    path = downstream.script("charges", 503)
    host = url(path).split("/")[2]
    name = "django_idempotency_outbound_attempts_total"
    durations = "django_idempotency_outbound_attempt_duration_seconds_count"
    before = {
        outcome: _sample(name, host=host, outcome=outcome) for outcome in ("sending", "confirmed")
    }
    timed = _sample(durations, host=host)

    send(url(path))
    with override_settings(IDEMPOTENCY_METRICS=False):
        send(url(path), key="not-counted")

    assert _sample(name, host=host, outcome="sending") - before["sending"] == 1
    assert _sample(name, host=host, outcome="confirmed") - before["confirmed"] == 1
    assert _sample(durations, host=host) - timed == 2


def test_old_rows_go_with_the_purge(downstream: Downstream, url: Callable[[str], str]) -> None:
    send(url(downstream.script("charges")), key="old")
    send(url(downstream.script("charges")), key="recent")
    OutboundCall.objects.filter(key="old").update(
        updated_at=timezone.now() - timedelta(hours=24, seconds=1)
    )

    assert purge_expired_records(namespace="default").outbound_calls == 0  # Not a namespace's.
    assert purge_expired_records(dry_run=True).outbound_calls == 1
    output = StringIO()
    call_command("idempotency_purge", stdout=output)

    assert "and 1 outbound journal row" in output.getvalue()
    assert list(OutboundCall.objects.values_list("key", flat=True)) == ["recent"]


def test_the_purge_follows_the_ttl(downstream: Downstream, url: Callable[[str], str]) -> None:
    send(url(downstream.script("charges")), key="an-hour-old")
    OutboundCall.objects.update(updated_at=timezone.now() - timedelta(hours=1, seconds=1))

    with override_settings(IDEMPOTENCY_TTL=3600):
        assert purge_expired_records(batch_size=1).outbound_calls == 1


# The admin.


@pytest.fixture
def journaled() -> None:
    now = timezone.now()
    for key, outcome, host in [
        ("k-confirmed", "confirmed", "bank.example"),
        ("k-ambiguous", "ambiguous", "bank.example"),
        ("k-failed", "failed", "mail.example"),
    ]:
        OutboundCall.objects.create(
            key=key,
            method="POST",
            target=f"https://{host}/v1/charges",
            host=host,
            outcome=outcome,
            attempts=1,
            last_status=201,
            operation_key=f"op-{key}",
            operation_id=f"id-{key}",
            created_at=now,
            updated_at=now,
        )


def listed(response: Any) -> set[str]:
    return {call.key for call in response.context["cl"].result_list}


@pytest.mark.usefixtures("journaled")
@pytest.mark.parametrize(
    ("query", "keys"),
    [
        ("", {"k-confirmed", "k-ambiguous", "k-failed"}),
        ("?outcome__exact=ambiguous", {"k-ambiguous"}),
        ("?host__exact=mail.example", {"k-failed"}),
        ("?q=k-confirmed", {"k-confirmed"}),
        ("?q=op-k-failed", {"k-failed"}),
        ("?q=id-k-failed", {"k-failed"}),  # The operation's identity.
        ("?q=https://bank.example/", {"k-confirmed", "k-ambiguous"}),
    ],
)
def test_the_admin_lists_filters_and_searches_the_journal(query: str, keys: set[str]) -> None:
    response = staff_client("view_outboundcall").get(CHANGELIST + query)

    assert response.status_code == 200
    assert listed(response) == keys


@pytest.mark.usefixtures("journaled")
def test_the_admin_shows_a_call_read_only() -> None:
    viewer = staff_client("view_outboundcall")
    call = OutboundCall.objects.get(key="k-ambiguous")

    detail = viewer.get(reverse("admin:django_idempotency_outboundcall_change", args=[call.pk]))

    assert detail.status_code == 200
    content = detail.content.decode()
    assert "https://bank.example/v1/charges" in content
    assert call.operation_id in content
    assert 'name="_save"' not in content
    add = reverse("admin:django_idempotency_outboundcall_add")
    assert viewer.get(add).status_code == 403


@pytest.mark.usefixtures("journaled")
def test_the_admin_journal_needs_the_view_permission() -> None:
    assert staff_client().get(CHANGELIST).status_code == 403
