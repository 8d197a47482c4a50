"""The demo's examples of each pattern: functions, tasks, webhooks and outbound keys."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from django.conf import settings
from django.core import mail
from django.test import Client, override_settings
from standardwebhooks.webhooks import Webhook

from django_idempotency import mint_key
from testproject.payments import bank, tasks
from testproject.payments.models import Payment, Refund
from testproject.payments.services import Settlement, settle_payment

pytestmark = pytest.mark.django_db


class FakeBank(BaseHTTPRequestHandler):
    """A bank on loopback that records the key of every transfer it is sent."""

    keys: list[str]

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.keys.append(self.headers["Idempotency-Key"])
        body = json.dumps({"id": f"tr_{len(self.keys)}"}).encode()
        self.send_response(201)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def bank_keys() -> Iterator[list[str]]:
    keys: list[str] = []
    handler = type("Handler", (FakeBank,), {"keys": keys})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    with override_settings(BANK_API_URL=f"http://127.0.0.1:{server.server_address[1]}"):
        yield keys
    server.shutdown()
    server.server_close()


def test_settling_twice_moves_the_money_once(bank_keys: list[str]) -> None:
    payment = Payment.objects.create(amount=1200)

    first = settle_payment(payment.pk)
    again = settle_payment(payment.pk)

    assert first == again == Settlement(payment=payment.pk, bank_reference="tr_1")
    assert bank_keys == [mint_key("transfer", payment.pk, namespace="bank")]


def test_a_retried_bank_call_sends_the_same_key(bank_keys: list[str]) -> None:
    payment, other = Payment.objects.create(amount=1), Payment.objects.create(amount=2)

    bank.transfer(payment)
    bank.transfer(payment)  # As after a timeout: the bank's idempotency absorbs it.
    bank.transfer(other)

    assert bank_keys[0] == bank_keys[1] != bank_keys[2]


def test_a_redelivered_receipt_message_mails_once() -> None:
    payment = Payment.objects.create(amount=500)

    first = tasks.send_receipt.apply(args=[payment.pk], task_id="receipt-message-1")
    again = tasks.send_receipt.apply(args=[payment.pk], task_id="receipt-message-1")
    other = tasks.send_receipt.apply(args=[payment.pk], task_id="receipt-message-2")

    assert first.get() == again.get() == f"customer-{payment.pk}@example.com"
    assert other.successful()
    assert len(mail.outbox) == 2  # Two messages, two receipts; the redelivery sent none.


def test_settle_messages_for_the_same_payment_are_duplicates() -> None:
    payment = Payment.objects.create(amount=700)

    results = [tasks.settle.apply(args=[payment.pk]).get() for _ in range(2)]

    assert results == [{"payment": payment.pk, "bank_reference": results[0]["bank_reference"]}] * 2


def _delivery(event: dict[str, Any], message_id: str, secret: str) -> dict[str, str]:
    now = int(time.time())
    signature = Webhook(secret).sign(
        message_id, datetime.fromtimestamp(now, tz=UTC), json.dumps(event)
    )
    return {"webhook-id": message_id, "webhook-timestamp": str(now), "webhook-signature": signature}


@override_settings(ROOT_URLCONF="testproject.urls")
def test_the_provider_webhook_refunds_once_and_rejects_forgeries(client: Client) -> None:
    payment = Payment.objects.create(amount=900)
    event = {"type": "payment.refunded", "payment": payment.pk, "amount": 300}
    body = json.dumps(event)
    secret = settings.PAYMENTS_WEBHOOK_SECRET

    first = client.post(
        "/webhooks/provider/", body, "application/json", headers=_delivery(event, "msg_a", secret)
    )
    again = client.post(
        "/webhooks/provider/", body, "application/json", headers=_delivery(event, "msg_a", secret)
    )
    forged = client.post(
        "/webhooks/provider/",
        body,
        "application/json",
        headers=_delivery(event, "msg_b", "whsec_" + "Zm9yZ2Vk"),
    )

    assert (first.status_code, again.status_code, forged.status_code) == (200, 200, 400)
    assert again["Idempotent-Replayed"] == "true"
    assert list(Refund.objects.values_list("amount", flat=True)) == [300]


@override_settings(ROOT_URLCONF="testproject.urls")
def test_the_benchmark_yardsticks_answer_as_the_benchmark_assumes(client: Client) -> None:
    """The floor answers at once; the recorded create writes its payment and one record."""
    from django_idempotency.models import IdempotencyRecord

    body = {"amount": 100, "currency": "EUR", "description": "benchmark"}
    floor = client.post("/api/bench/floor/", body, content_type="application/json")
    recorded = client.post("/api/bench/recorded/", body, content_type="application/json")

    assert floor.status_code == 201
    assert floor.json()["amount"] == 100
    assert recorded.status_code == 201
    record = IdempotencyRecord.objects.get(namespace="bench-record")
    assert json.loads(bytes(record.response_body)) == recorded.json()
    assert Payment.objects.filter(pk=recorded.json()["id"]).exists()
