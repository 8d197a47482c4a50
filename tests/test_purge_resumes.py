"""The purge keeps a crashed operation until its record expires: its retry resumes it, sending the
same outbound keys (needs the outbound client's extras, which the base env leaves out)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.http import HttpResponse
from django.test import Client

from django_idempotency import idempotent_function
from django_idempotency.models import IdempotencyRecord, OutboundCall, abandoned
from django_idempotency.outbound import IdempotentTransport
from django_idempotency.purge import purge_expired_records
from django_idempotency.steps import step
from django_idempotency.stores import get_store
from tests import downstream as service
from tests.downstream import Downstream, reset_downstream
from tests.models import Charge
from tests.test_outbound_keys import _kill_after_the_charge, expected_key
from tests.utils import wait_for


@pytest.fixture
def downstream() -> Iterator[Downstream]:
    yield from reset_downstream()


def _charged() -> list[int]:
    return list(Charge.objects.order_by("pk").values_list("amount", flat=True))


def _pay(client: Client, url: str) -> HttpResponse:
    order = {"url": url, "amount": 100}
    return client.post("/caller/pay/", order, "application/json", HTTP_IDEMPOTENCY_KEY="o-1")


@pytest.mark.urls("tests.downstream")
@pytest.mark.django_db(transaction=True)
def test_a_view_that_crashed_after_its_call_is_purged_only_once_expired(
    downstream: Downstream, live_server: Any
) -> None:
    client = Client(raise_request_exception=False)
    guarded = f"{live_server.url}/downstream/guarded/"
    service.CRASHES[:] = [True, False]

    crashed = _pay(client, guarded)  # Charged, then raised: its lease ended, its record kept.
    purged = purge_expired_records()
    retried = _pay(client, guarded)

    assert (crashed.status_code, retried.status_code) == (500, 201)
    assert _charged() == [100]  # The downstream replayed its charge to the same key.
    assert purged.total == 0
    record = IdempotencyRecord.objects.get(key="o-1")
    _sent_once_then_replayed(downstream, record)


@pytest.mark.urls("tests.downstream")
@pytest.mark.django_db(transaction=True)
def test_a_crashed_operations_stored_step_survives_the_purge_and_is_not_run_again(
    downstream: Downstream, live_server: Any
) -> None:
    guarded = f"{live_server.url}/downstream/guarded/"
    crashes = [True, False]

    @idempotent_function(key="order", namespace="orders", mode="lease")
    def settle(order: str) -> int:
        def charge() -> int:
            with httpx.Client(transport=IdempotentTransport(namespace="bank")) as client:
                return int(client.post(guarded, json={"amount": 100}).json()["id"])

        charge_id = step("charge", charge)
        if crashes.pop(0):
            raise RuntimeError("crashed after the charge")
        return charge_id

    with pytest.raises(RuntimeError):
        settle("order-1")
    purged = purge_expired_records()
    charge_id = settle("order-1")

    assert _charged() == [100]
    assert purged.total == 0
    assert Charge.objects.get().pk == charge_id  # The stored step, not run again.
    assert len(downstream.keys("guarded")) == 1


@pytest.mark.urls("tests.downstream")
@pytest.mark.django_db(transaction=True)
def test_a_killed_operation_purged_after_its_lease_ran_out_is_resumed_by_its_retry(
    downstream: Downstream, live_server: Any, tmp_path: Path
) -> None:
    from tests.outbound_holder import charge_then_work

    guarded = f"{live_server.url}/downstream/guarded/"
    _kill_after_the_charge(tmp_path, "order-1", 100, guarded)
    killed = IdempotencyRecord.objects.filter(key="order-1")
    crashed = killed.get().operation_id
    # The purge comes after the dead process's lease ran out, by the store's clock.
    wait_for(lambda: killed.filter(abandoned(get_store().now())).exists(), 30)

    purged = purge_expired_records()
    charge = charge_then_work("order-1", 100, guarded, str(tmp_path / "again"), 0)

    assert _charged() == [100]
    assert purged.total == 0
    assert Charge.objects.get().pk == charge  # The downstream's answer to the first attempt.
    record = killed.get()
    assert (record.status, record.operation_id) == ("completed", crashed)
    _sent_once_then_replayed(downstream, record)


@pytest.mark.urls("tests.downstream")
@pytest.mark.django_db(transaction=True)
def test_a_crashed_view_past_its_expiry_goes_with_the_purge_and_its_retry_is_new(
    downstream: Downstream, live_server: Any
) -> None:
    # The control: once its record expired, the key stands for a new operation, as after a
    # completed record's expiry, with keys of its own.
    client = Client(raise_request_exception=False)
    guarded = f"{live_server.url}/downstream/guarded/"
    service.CRASHES[:] = [True, False]

    crashed = _pay(client, guarded)
    IdempotencyRecord.objects.filter(key="o-1").update(
        expires_at=get_store().now() - timedelta(minutes=5)
    )
    purged = purge_expired_records()
    retried = _pay(client, guarded)

    assert (crashed.status_code, retried.status_code) == (500, 201)
    assert (purged.expired, purged.abandoned) == (0, 1)
    assert _charged() == [100, 100]
    first, second = downstream.keys("guarded")
    assert first != second


def _sent_once_then_replayed(downstream: Downstream, record: IdempotencyRecord) -> None:
    """The charge reached the downstream once under the operation's key, and its retry was
    answered the same charge again: one journal row, confirmed after two attempts."""
    key = expected_key(record, "charge", namespace="bank")
    assert downstream.keys("guarded") == [key]  # Then the same key again, replayed.
    call = OutboundCall.objects.get()
    assert (call.key, call.attempts, call.replayed, call.outcome) == (key, 2, True, "confirmed")
