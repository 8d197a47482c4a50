"""Edges of the request flow: waiting for a running duplicate, other key headers, bad bodies."""

from __future__ import annotations

import threading
import time

import pytest
from django.test import Client, override_settings
from django.utils import timezone

from django_idempotency import idempotent
from django_idempotency.core.outcomes import Claim, Outcome, StoredResponse
from django_idempotency.models import IdempotencyRecord
from django_idempotency.stores import get_store
from tests.factories import IdempotencyRecordFactory
from tests.models import Charge
from tests.utils import assert_problem, fingerprint_of, post

URL = "/function/charges/"


@pytest.mark.django_db
@override_settings(IDEMPOTENCY_ON_CONFLICT="wait", IDEMPOTENCY_WAIT_TIMEOUT=0.3)
def test_wait_gives_up_with_409_when_the_first_request_outlasts_the_timeout(
    client: Client,
) -> None:
    IdempotencyRecordFactory(
        in_progress=True, key="k", fingerprint=fingerprint_of(URL, {"amount": 10})
    )

    started = time.monotonic()
    response = post(client, URL, key="k")

    assert time.monotonic() - started >= 0.3
    assert_problem(response, 409, "request-in-progress")
    assert Charge.objects.count() == 0


@pytest.mark.django_db(transaction=True)
@override_settings(IDEMPOTENCY_ON_CONFLICT="wait", IDEMPOTENCY_WAIT_TIMEOUT=10)
def test_wait_replays_the_result_once_the_first_request_completes() -> None:
    record = IdempotencyRecordFactory(
        in_progress=True, key="k", fingerprint=fingerprint_of(URL, {"amount": 10})
    )

    def complete_soon() -> None:
        time.sleep(0.2)
        claim = Claim(Outcome.FRESH, record_id=record.pk, lease_token=record.lease_token)
        get_store().complete(claim, StoredResponse(201, [], b"first"), timezone.now())

    finisher = threading.Thread(target=complete_soon)
    finisher.start()
    response = post(Client(), URL, key="k")
    finisher.join()

    assert response.status_code == 201
    assert response.content == b"first"
    assert response["Idempotent-Replayed"] == "true"
    assert Charge.objects.count() == 0


@pytest.mark.django_db
def test_the_key_can_come_from_another_header(rf: object) -> None:
    calls = []

    @idempotent(header="webhook-id")
    def receive(request: object) -> object:
        from django.http import HttpResponse

        calls.append(1)
        return HttpResponse(b"ok", status=202)

    from django.test import RequestFactory

    factory = RequestFactory()
    first = receive(factory.post("/hook/", b"{}", "application/json", headers={"webhook-id": "m1"}))
    retry = receive(factory.post("/hook/", b"{}", "application/json", headers={"webhook-id": "m1"}))

    assert first.status_code == retry.status_code == 202  # type: ignore[attr-defined]
    assert retry["Idempotent-Replayed"] == "true"  # type: ignore[index]
    assert len(calls) == 1
    assert IdempotencyRecord.objects.get().key == "m1"


@pytest.mark.django_db
@override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=100)
def test_a_body_over_the_upload_limit_is_413_not_500(client: Client) -> None:
    response = post(client, URL, {"amount": 10, "padding": "x" * 500})

    assert_problem(response, 413, "request-too-large")
    assert Charge.objects.count() == 0


@pytest.mark.django_db
def test_a_malformed_multipart_body_is_400_not_500(client: Client) -> None:
    response = client.post(
        URL,
        b"--oops\r\nContent-Disposition: form-data; name=\r\n\r\nbroken",
        content_type="multipart/form-data; boundary=",
        headers={"Idempotency-Key": "k"},
    )

    assert_problem(response, 400, "malformed-request")
    assert not IdempotencyRecord.objects.exists()
