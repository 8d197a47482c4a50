"""The outbox in the admin: listed, shown, sent again by those allowed, delivered and counted."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone
from prometheus_client import REGISTRY

from django_idempotency.models import OutboxMessage
from django_idempotency.outbox import enqueue_request, enqueue_task
from tests.downstream import Downstream, reset_downstream
from tests.test_admin import messages_of, staff_client
from tests.test_outbox import relay

pytestmark = [pytest.mark.urls("tests.downstream"), pytest.mark.django_db(transaction=True)]

State = OutboxMessage.State
CHANGELIST = reverse("admin:django_idempotency_outboxmessage_changelist")
DELIVERIES = "django_idempotency_outbox_deliveries_total"
DELIVERY_SECONDS = "django_idempotency_outbox_delivery_seconds_count"


@pytest.fixture
def downstream() -> Iterator[Downstream]:
    yield from reset_downstream()


@pytest.fixture
def url(live_server: Any) -> Callable[[str], str]:
    return lambda path: f"{live_server.url}{path}"


@pytest.fixture
def viewer() -> Client:
    return staff_client("view_outboxmessage")


@pytest.fixture
def resender() -> Client:
    return staff_client("view_outboxmessage", "resend_outboxmessage")


def detail_url(message: OutboxMessage) -> str:
    return reverse("admin:django_idempotency_outboxmessage_change", args=[message.pk])


def listed(response: Any) -> list[str]:
    assert response.status_code == 200
    return [message.key for message in response.context["cl"].result_list]


def offered(response: Any) -> set[str]:
    """The actions in the list's menu; no menu at all when none is allowed."""
    form = response.context["action_form"]
    return set() if form is None else {name for name, _ in form.fields["action"].choices}


def send_again(client: Client, *messages: OutboxMessage) -> Any:
    selected = [str(message.pk) for message in messages]
    return client.post(CHANGELIST, {"action": "resend", "_selected_action": selected}, follow=True)


@pytest.fixture
def outbox() -> dict[str, OutboxMessage]:
    """One message in each state, written in this order: pending, sent, dead."""
    pending = enqueue_request(
        "POST", "https://bank.example/v1/charges", key="k-pending", aggregate="order-1"
    )
    sent = enqueue_request("POST", "https://mail.example/v1/send", key="k-sent")
    dead = enqueue_task("billing.tasks.refund", args=(7,), key="k-dead", aggregate="order-2")
    OutboxMessage.objects.filter(pk=pending.pk).update(
        attempts=2, last_error="answered 503", claim_token="a-relay"
    )
    OutboxMessage.objects.filter(pk=sent.pk).update(
        state=State.SENT, attempts=1, sent_at=timezone.now()
    )
    OutboxMessage.objects.filter(pk=dead.pk).update(
        state=State.DEAD,
        attempts=10,
        last_error="OperationalError: the broker is gone",
        available_at=timezone.now() + timedelta(days=1),
    )
    return {m.key: m for m in OutboxMessage.objects.all()}


@pytest.mark.usefixtures("outbox")
@pytest.mark.parametrize(
    ("query", "keys"),
    [
        ("", ["k-dead", "k-sent", "k-pending"]),  # Newest first.
        ("?state__exact=dead", ["k-dead"]),
        ("?state__exact=pending", ["k-pending"]),
        ("?state__exact=sent", ["k-sent"]),
        ("?kind__exact=task", ["k-dead"]),
        ("?q=k-sent", ["k-sent"]),
        ("?q=order-1", ["k-pending"]),  # The aggregate.
        ("?q=https://bank.example/", ["k-pending"]),
        ("?q=billing.tasks", ["k-dead"]),
    ],
)
def test_the_list_shows_messages_filtered_and_searched(
    viewer: Client, query: str, keys: list[str]
) -> None:
    assert listed(viewer.get(CHANGELIST + query)) == keys


@pytest.mark.usefixtures("outbox")
def test_the_list_shows_why_a_message_is_dead_and_offers_no_add(viewer: Client) -> None:
    content = viewer.get(CHANGELIST).content.decode()

    assert "OperationalError: the broker is gone" in content
    assert "billing.tasks.refund" in content
    assert reverse("admin:django_idempotency_outboxmessage_add") not in content


def test_the_detail_page_shows_a_json_body_read_only(viewer: Client) -> None:
    message = enqueue_request(
        "POST", "https://bank.example/v1/charges", json_body={"order": 1, "note": "café"}
    )

    response = viewer.get(detail_url(message))

    assert response.status_code == 200
    content = response.content.decode()
    # Indented for people, escaped, as the records' bodies are.
    assert '<pre class="idempotency-body">{\n  &quot;order&quot;: 1,' in content
    assert "&quot;note&quot;: &quot;café&quot;" in content
    assert 'name="_save"' not in content


def test_the_detail_page_cuts_a_long_body_and_names_a_binary_one(viewer: Client) -> None:
    long = enqueue_request(
        "POST", "https://a.example/", content="é" * 20_000, headers={"Content-Type": "text/plain"}
    )
    binary = enqueue_request(
        "PUT",
        "https://a.example/",
        content=b"\x89PNG\x00\x01",
        headers={"Content-Type": "image/png"},
    )

    cut = viewer.get(detail_url(long)).content.decode()
    named = viewer.get(detail_url(binary)).content.decode()

    assert "Truncated to its first 10,240 characters; the full body is 40,000 bytes." in cut
    assert "é" * 10_240 + "…</pre>" in cut and "é" * 10_241 not in cut
    assert "6 bytes of image/png" in named


@pytest.mark.usefixtures("outbox")
def test_send_again_requeues_dead_and_sent_messages_and_leaves_pending_ones(
    resender: Client, outbox: dict[str, OutboxMessage]
) -> None:
    with CaptureQueriesContext(connection) as queries:
        response = send_again(resender, *outbox.values())

    assert messages_of(response) == [
        "Queued 2 messages to be sent again. Skipped 1 pending message: it is already waiting"
        " to be sent."
    ]
    updates = [q["sql"] for q in queries if q["sql"].startswith("UPDATE")]
    assert len([sql for sql in updates if "django_idempotency_outbox" in sql]) == 1
    now = timezone.now()
    for key in ("k-dead", "k-sent"):
        message = OutboxMessage.objects.get(key=key)
        assert (message.state, message.attempts, message.last_error) == (State.PENDING, 0, "")
        assert (message.claim_token, message.claimed_until) == ("", None)
        assert now - timedelta(minutes=1) < message.available_at <= now
    pending = OutboxMessage.objects.get(key="k-pending")
    assert (pending.attempts, pending.last_error, pending.claim_token) == (
        2,
        "answered 503",
        "a-relay",
    )


@pytest.mark.usefixtures("outbox")
def test_send_again_only_pending_messages_queues_none(
    resender: Client, outbox: dict[str, OutboxMessage]
) -> None:
    response = send_again(resender, outbox["k-pending"])

    assert messages_of(response) == [
        "Queued 0 messages to be sent again. Skipped 1 pending message: it is already waiting"
        " to be sent."
    ]


@pytest.mark.usefixtures("outbox")
def test_send_again_needs_its_permission(
    viewer: Client, resender: Client, outbox: dict[str, OutboxMessage]
) -> None:
    assert "resend" not in offered(viewer.get(CHANGELIST))
    assert "resend" in offered(resender.get(CHANGELIST))

    send_again(viewer, outbox["k-dead"])  # Posted by hand all the same.

    assert OutboxMessage.objects.get(key="k-dead").state == State.DEAD


@pytest.mark.usefixtures("outbox")
def test_the_outbox_needs_the_view_permission() -> None:
    assert staff_client().get(CHANGELIST).status_code == 403


def test_a_dead_message_sent_again_is_delivered_with_its_key_and_its_aggregate_goes_on(
    downstream: Downstream, url: Callable[[str], str], resender: Client
) -> None:
    path = downstream.script("orders", 400)  # Refused once, then accepted.
    first = enqueue_request("POST", url(path), aggregate="order-1", json_body={"n": 1})
    second = enqueue_request("POST", url(path), aggregate="order-1", json_body={"n": 2})
    assert relay().dead == 1 and relay().handled == 0  # The second waits behind the dead one.

    send_again(resender, first)
    delivered = [relay(), relay()]

    assert [(report.sent, report.handled) for report in delivered] == [(1, 1), (1, 1)]
    assert downstream.keys("orders") == [first.key, first.key, second.key]
    assert [json.loads(seen.body) for seen in downstream.seen["orders"]] == [
        {"n": 1},
        {"n": 1},
        {"n": 2},
    ]
    assert listed(resender.get(CHANGELIST + "?state__exact=sent")) == [second.key, first.key]


def test_deleting_a_dead_message_lets_its_aggregate_go_on(
    downstream: Downstream, url: Callable[[str], str]
) -> None:
    path = downstream.script("orders", 400)
    first = enqueue_request("POST", url(path), aggregate="order-1", json_body={"n": 1})
    second = enqueue_request("POST", url(path), aggregate="order-1", json_body={"n": 2})
    relay()
    deleter = staff_client("view_outboxmessage", "delete_outboxmessage")
    assert "delete_selected" in offered(deleter.get(CHANGELIST))
    assert "resend" not in offered(deleter.get(CHANGELIST))

    delete = reverse("admin:django_idempotency_outboxmessage_delete", args=[first.pk])
    assert deleter.post(delete, {"post": "yes"}).status_code == 302

    assert relay().sent == 1
    assert downstream.keys("orders") == [first.key, second.key]


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_deliveries_are_counted_by_kind_and_outcome(
    downstream: Downstream, url: Callable[[str], str]
) -> None:
    outcomes = ("sent", "retried", "dead", "lost")
    before = {outcome: sample(DELIVERIES, kind="request", outcome=outcome) for outcome in outcomes}
    timed = sample(DELIVERY_SECONDS, kind="request")
    enqueue_request("POST", url(downstream.script("retried-then-sent", 503)))
    enqueue_request("POST", url(downstream.script("refused", 400)))

    relay(), relay()

    counted = {
        outcome: sample(DELIVERIES, kind="request", outcome=outcome) - before[outcome]
        for outcome in outcomes
    }
    assert counted == {"sent": 1, "retried": 1, "dead": 1, "lost": 0}
    assert sample(DELIVERY_SECONDS, kind="request") - timed == 3
    # Every series is there before its first event: an alert on dead tasks sees it rise.
    assert REGISTRY.get_sample_value(DELIVERIES, {"kind": "task", "outcome": "dead"}) is not None


def test_the_detail_page_of_a_task_shows_its_arguments_and_no_body(viewer: Client) -> None:
    message = enqueue_task("billing.tasks.refund", args=(7,), kwargs={"reason": "late"})

    page = viewer.get(detail_url(message)).content.decode()

    assert "billing.tasks.refund" in page and "late" in page
