"""Webhook receivers: verified deliveries run once, duplicates replay, forgeries leave no trace."""

from __future__ import annotations

import json
import sys
import time
from datetime import UTC, datetime
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import Client, RequestFactory
from standardwebhooks.webhooks import Webhook

from django_idempotency.exceptions import DeliveryRejected
from django_idempotency.webhooks import StandardWebhooks
from tests.models import Charge
from tests.stores import stored, the_record
from tests.views import WEBHOOK_SECRET

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("store")]

URL = "/webhooks/"


def deliver(
    client: Client,
    event: dict[str, Any],
    *,
    message_id: str = "msg_1",
    sent_at: float | None = None,
    secret: str = WEBHOOK_SECRET,
    body: bytes | None = None,
    signature: str | None = None,
) -> Any:
    """Send a delivery signed the way a Standard Webhooks sender signs it."""
    payload = json.dumps(event) if body is None else body.decode("latin-1")
    timestamp = int(time.time() if sent_at is None else sent_at)
    signed = Webhook(secret).sign(message_id, datetime.fromtimestamp(timestamp, tz=UTC), payload)
    return client.post(
        URL,
        json.dumps(event).encode() if body is None else body,
        content_type="application/json",
        headers={
            "webhook-id": message_id,
            "webhook-timestamp": str(timestamp),
            "webhook-signature": signature if signature is not None else signed,
        },
    )


def assert_rejected(response: Any, detail: str) -> None:
    assert response.status_code == 400
    assert response["Content-Type"] == "application/problem+json"
    problem = response.json()
    assert problem["type"].endswith("delivery-rejected")
    assert detail in problem["detail"]
    assert not stored()
    assert not Charge.objects.exists()


def test_a_valid_delivery_runs_once_and_a_redelivery_gets_the_stored_answer(
    client: Client,
) -> None:
    event = {"id": "evt_1", "amount": 250}

    first = deliver(client, event)
    # Senders sign each attempt anew: another timestamp and signature, the same webhook-id.
    again = deliver(client, event, sent_at=time.time() - 30)

    assert first.status_code == 202
    assert again.status_code == 202
    assert again.content == first.content
    assert again["Idempotent-Replayed"] == "true"
    assert Charge.objects.filter(reference="event:evt_1").count() == 1
    record = the_record()
    assert (record.namespace, record.key) == ("webhooks", "msg_1")


def test_another_delivery_id_runs_again(client: Client) -> None:
    deliver(client, {"id": "evt_2", "amount": 1}, message_id="msg_2")
    deliver(client, {"id": "evt_3", "amount": 1}, message_id="msg_3")
    assert Charge.objects.count() == 2


def test_a_forged_signature_is_rejected_before_any_record(client: Client) -> None:
    forger = "whsec_" + "QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo="
    response = deliver(client, {"id": "evt_4", "amount": 1}, secret=forger)
    assert_rejected(response, "No signature matches")


def test_a_tampered_body_is_rejected(client: Client) -> None:
    signed = Webhook(WEBHOOK_SECRET).sign(
        "msg_5", datetime.now(tz=UTC), json.dumps({"id": "evt_5", "amount": 1})
    )
    response = deliver(client, {"id": "evt_5", "amount": 1_000_000}, signature=signed)
    assert_rejected(response, "No signature matches")


@pytest.mark.parametrize("offset", [-120, 120])
def test_a_stale_or_future_timestamp_is_rejected(client: Client, offset: int) -> None:
    response = deliver(client, {"id": "evt_6", "amount": 1}, sent_at=time.time() + offset)
    assert_rejected(response, "the tolerance is 60")


@pytest.mark.parametrize(
    ("headers", "detail"),
    [
        ({}, "lacks a webhook-id"),
        (
            {"webhook-id": "m", "webhook-timestamp": "soon", "webhook-signature": "v1,AA=="},
            "not a Unix time",
        ),
    ],
)
def test_missing_or_malformed_headers_are_rejected(
    client: Client, headers: dict[str, str], detail: str
) -> None:
    response = client.post(URL, b"{}", content_type="application/json", headers=headers)
    assert_rejected(response, detail)


@pytest.mark.parametrize("signature", ["v1", "v1,not base64!", "v2,AAAA", "garbage"])
def test_malformed_signatures_are_rejected_not_crashed_on(client: Client, signature: str) -> None:
    response = deliver(client, {"id": "evt_7", "amount": 1}, signature=signature)
    assert_rejected(response, "No signature matches")


def test_a_body_that_is_not_utf8_is_rejected(client: Client) -> None:
    response = deliver(client, {}, body=b"\xff\xfe")
    assert_rejected(response, "not UTF-8")


def test_the_secret_may_be_read_on_each_delivery() -> None:
    verifier = StandardWebhooks(lambda: WEBHOOK_SECRET)
    payload = "{}"
    now = int(time.time())
    request = RequestFactory().post(
        URL,
        payload,
        content_type="application/json",
        headers={
            "webhook-id": "m1",
            "webhook-timestamp": str(now),
            "webhook-signature": Webhook(WEBHOOK_SECRET).sign(
                "m1", datetime.fromtimestamp(now, tz=UTC), payload
            ),
        },
    )
    verifier(request)  # No exception: verified.
    with pytest.raises(DeliveryRejected):
        StandardWebhooks(lambda: "whsec_" + "b3RoZXI=")(request)


def test_an_unusable_secret_fails_at_start_up() -> None:
    with pytest.raises(ImproperlyConfigured, match="signing secret"):
        StandardWebhooks("")


def test_without_the_webhooks_extra_it_fails_at_start_up_naming_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "standardwebhooks.webhooks", None)  # As if not installed.

    with pytest.raises(ImproperlyConfigured, match=r"pip install \"django-idempotency\[webhooks\]"):
        StandardWebhooks(WEBHOOK_SECRET)


def deliver_with_timestamp(client: Client, timestamp: str) -> Any:
    """A delivery correctly signed for now, whose webhook-timestamp header reads `timestamp`."""
    payload = json.dumps({"id": "evt_8", "amount": 1})
    signed = Webhook(WEBHOOK_SECRET).sign("msg_8", datetime.now(tz=UTC), payload)
    return client.post(
        URL,
        payload,
        content_type="application/json",
        headers={
            "webhook-id": "msg_8",
            "webhook-timestamp": timestamp,
            "webhook-signature": signed,
        },
    )


@pytest.mark.parametrize(
    "timestamp",
    [
        "4" * 400,  # Too large for a float: once an OverflowError and a 500.
        "-" + "4" * 400,
        "9" * 5000,  # Beyond Python's int-from-string digit limit.
        "-1",
        "1e9",
        "1700000000.5",
        "0x65a0bc00",
    ],
)
def test_a_timestamp_that_is_not_whole_unix_seconds_is_rejected(
    client: Client, timestamp: str
) -> None:
    assert_rejected(deliver_with_timestamp(client, timestamp), "not a Unix time")


@pytest.mark.parametrize("spelling", ["+{now}", "{now:_}", " {now}", "{now:013d}"])
def test_only_plain_digits_count_as_a_timestamp(client: Client, spelling: str) -> None:
    # int() accepts these spellings; the Standard Webhooks format is plain digits only.
    timestamp = spelling.format(now=int(time.time()))
    assert_rejected(deliver_with_timestamp(client, timestamp), "not a Unix time")
