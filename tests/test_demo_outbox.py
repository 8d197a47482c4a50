"""The demo shop's orders through the outbox: the payment and its two messages commit together,
a retried checkout writes none, and the relay ships each order once and mails it once, however
often a message is sent."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from celery import Celery
from celery.signals import task_postrun
from django.core import mail
from django.db import transaction
from django.db.models.signals import post_save
from django.test import Client, override_settings

from django_idempotency.models import OutboxMessage
from django_idempotency.outbox import relay_due
from testproject.payments import orders, tasks
from testproject.payments.models import Payment, Shipment

pytestmark = [pytest.mark.urls("testproject.urls"), pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parent.parent
CHECKOUT = "/shop/checkout/"
FIELD = re.compile(r'<input type="hidden" name="idempotency_key" value="([^"]+)"')
ORDER = {"amount": 1200, "currency": "EUR", "description": "a desk lamp"}
Kind = OutboxMessage.Kind
State = OutboxMessage.State


def shown_key(client: Client) -> str:
    """The key of a checkout form as the shop shows it."""
    match = FIELD.search(client.get(CHECKOUT).content.decode())
    assert match, "the checkout form carries no key"
    return match.group(1)


def place_order(client: Client, key: str, *, in_header: bool = False) -> Any:
    """Send the checkout form with `key`, in its hidden field or as the Idempotency-Key."""
    if in_header:
        return client.post(CHECKOUT, ORDER, headers={"Idempotency-Key": key})
    return client.post(CHECKOUT, {**ORDER, "idempotency_key": key})


def messages() -> dict[str, OutboxMessage]:
    return {message.kind: message for message in OutboxMessage.objects.all()}


@pytest.fixture
def commits() -> Iterator[list[tuple[int, list[str]]]]:
    """What the database held when the transaction saving a payment committed: the payments,
    and the kinds of the outbox's messages."""
    seen: list[tuple[int, list[str]]] = []

    def committed() -> None:
        kinds = OutboxMessage.objects.order_by("id").values_list("kind", flat=True)
        seen.append((Payment.objects.count(), list(kinds)))

    def saved(sender: Any, **kwargs: Any) -> None:
        transaction.on_commit(committed)

    post_save.connect(saved, sender=Payment, weak=False)
    yield seen
    post_save.disconnect(saved, sender=Payment)


@override_settings(DEMO_WAREHOUSE_URL="http://warehouse.example/shipments/")
def test_an_order_commits_its_payment_with_its_e_mail_and_its_shipment(
    commits: list[tuple[int, list[str]]],
) -> None:
    client = Client()

    response = place_order(client, shown_key(client))

    payment = Payment.objects.get()
    assert (response.status_code, response["Location"]) == (303, f"/shop/receipts/{payment.pk}/")
    # One commit, which brought the payment and both messages.
    assert commits == [(1, [Kind.TASK, Kind.REQUEST])]
    e_mail, shipment = messages()[Kind.TASK], messages()[Kind.REQUEST]
    assert (e_mail.destination, e_mail.payload["args"], e_mail.aggregate) == (
        tasks.send_receipt.name,
        [payment.pk],
        "",
    )
    assert (shipment.method, shipment.destination, bytes(shipment.body)) == (
        "POST",
        "http://warehouse.example/shipments/",
        b'{"order":%d}' % payment.pk,
    )
    assert shipment.aggregate == f"order-{payment.pk}"
    assert e_mail.key != shipment.key
    assert {e_mail.state, shipment.state} == {State.PENDING}


@pytest.mark.parametrize("in_header", [False, True], ids=["form-key", "idempotency-key"])
def test_a_retried_checkout_writes_no_further_message(in_header: bool) -> None:
    client = Client()
    key = shown_key(client)

    first = place_order(client, key, in_header=in_header)
    written = sorted(OutboxMessage.objects.values_list("key", flat=True))
    again = place_order(client, key, in_header=in_header)

    assert (again.status_code, again["Location"]) == (first.status_code, first["Location"])
    assert again["Idempotent-Replayed"] == "true"
    assert Payment.objects.count() == 1
    assert sorted(OutboxMessage.objects.values_list("key", flat=True)) == written
    assert len(written) == 2


def test_a_checkout_that_fails_writes_no_message_and_its_retry_writes_them_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def unwritten(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("the shipment could not be written")

    client = Client()
    key = shown_key(client)
    with monkeypatch.context() as patched:
        # After the payment and the e-mail's message were written, in the same transaction.
        patched.setattr(orders, "enqueue_request", unwritten)
        with pytest.raises(RuntimeError, match="could not be written"):
            place_order(client, key)

    assert not Payment.objects.exists()
    assert not OutboxMessage.objects.exists()

    retried = place_order(client, key)  # The key was given back: the retry runs, once.

    assert retried.status_code == 303
    assert Payment.objects.count() == 1
    assert sorted(messages()) == [Kind.REQUEST, Kind.TASK]


def test_the_warehouse_ships_once_per_key_and_refuses_what_it_cannot_read() -> None:
    client = Client()

    def ship(key: str, body: str) -> Any:
        headers = {"Idempotency-Key": key}
        return client.post("/warehouse/shipments/", body, "application/json", headers=headers)

    refused = ship("shipment-1", '{"order": 0}')
    first, again = ship("shipment-1", '{"order": 7}'), ship("shipment-1", '{"order": 7}')

    assert refused.status_code == 400  # The relay gives such a message up: sent again, refused.
    assert (first.status_code, again.status_code, again["Idempotent-Replayed"]) == (
        201,
        201,
        "true",
    )
    assert list(Shipment.objects.values_list("key", "order")) == [("shipment-1", 7)]


class Receipts:
    """The ids of the receipt tasks the worker ran, the duplicates too (they mail nothing)."""

    def __init__(self) -> None:
        self.ids: list[str] = []
        self._done = threading.Condition()

    def finished(self, sender: Any, task_id: str, **kwargs: Any) -> None:
        if sender.name == tasks.send_receipt.name:
            with self._done:
                self.ids.append(task_id)
                self._done.notify_all()

    def wait_for(self, count: int) -> None:
        with self._done:
            assert self._done.wait_for(lambda: len(self.ids) >= count, timeout=30), self.ids


@pytest.fixture
def receipts() -> Iterator[Receipts]:
    seen = Receipts()
    task_postrun.connect(seen.finished, weak=False)
    yield seen
    task_postrun.disconnect(seen.finished)


@pytest.mark.celery
@pytest.mark.redis
@pytest.mark.usefixtures("worker")
@pytest.mark.filterwarnings("ignore:Call to deprecated setex:DeprecationWarning")
def test_the_relay_ships_once_and_mails_once_when_a_relay_dies_after_sending(
    live_server: Any, celery_app: Celery, receipts: Receipts
) -> None:
    client = Client()
    with override_settings(DEMO_WAREHOUSE_URL=f"{live_server.url}/warehouse/shipments/"):
        place_order(client, shown_key(client))
    payment = Payment.objects.get()
    e_mail = messages()[Kind.TASK]

    with httpx.Client(timeout=10) as http:
        first = relay_due(app=celery_app, http_client=http)
        receipts.wait_for(1)
        second = relay_due(app=celery_app, http_client=http)
        # A relay killed after sending, before marking its messages sent: both are due again.
        OutboxMessage.objects.update(state=State.PENDING, sent_at=None)
        third = relay_due(app=celery_app, http_client=http)
        receipts.wait_for(2)

    assert (first.sent, second.handled, third.sent) == (2, 0, 2)
    assert receipts.ids == [e_mail.key, e_mail.key]  # The task's id is the message's key.
    assert [m.to for m in mail.outbox] == [[f"customer-{payment.pk}@example.com"]]
    (shipment,) = Shipment.objects.all()
    assert (shipment.order, shipment.key) == (payment.pk, messages()[Kind.REQUEST].key)
    assert set(OutboxMessage.objects.values_list("state", flat=True)) == {State.SENT}


WITHOUT_CELERY = """
import re
import sys
sys.modules["celery"] = None  # Any `import celery...` now raises ImportError.
import django
django.setup()
from django.core.management import call_command
from django.test import Client
from django_idempotency.models import OutboxMessage
call_command("migrate", verbosity=0)
client = Client(SERVER_NAME="localhost")
form = client.get("/shop/checkout/").content.decode()
key = re.search(r'name="idempotency_key" value="([^"]+)"', form).group(1)
paid = client.post("/shop/checkout/", {"amount": 500, "currency": "EUR", "idempotency_key": key})
print(paid.status_code)
call_command("idempotency_relay")
print(*OutboxMessage.objects.order_by("id").values_list("kind", "state"))
"""


def test_without_celery_the_relay_command_ships_the_order_and_keeps_its_e_mail(
    live_server: Any, tmp_path: Path
) -> None:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "testproject.settings",
        "DATABASE_URL": f"sqlite:///{tmp_path / 'demo.sqlite3'}",
        "SHOP_PAYMENT_SECONDS": "0",
        "DEMO_WAREHOUSE_URL": f"{live_server.url}/warehouse/shipments/",
    }
    result = subprocess.run(
        [sys.executable, "-c", WITHOUT_CELERY],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )

    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "303",
        "Relayed 2 message(s): 1 sent, 1 to retry, 0 dead, 0 taken over by another relay.",
        "('task', 'pending') ('request', 'sent')",
    ]
    # The warehouse of this test's live server shipped the demo's order.
    assert list(Shipment.objects.values_list("order", flat=True)) == [1]
