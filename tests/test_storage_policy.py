"""Which responses are stored and replayed, and which release the key for a corrected retry."""

from __future__ import annotations

import logging

import pytest
from django.test import Client, override_settings

from django_idempotency.models import IdempotencyRecord
from tests.models import Charge
from tests.stores import stored, the_record
from tests.utils import assert_problem, post

pytestmark = pytest.mark.django_db

URL = "/function/charges/"


@pytest.fixture
def mode(store_mode: tuple[str, str]) -> str:
    """Each store in each of its modes; the mode decides what a failure leaves behind."""
    return store_mode[1]


def test_a_400_releases_the_key_so_the_corrected_retry_runs(client: Client, mode: str) -> None:
    rejected = post(client, URL, outcome="invalid")
    corrected = post(client, URL)

    assert rejected.status_code == 400
    assert corrected.status_code == 201
    assert "Idempotent-Replayed" not in corrected
    assert Charge.objects.count() == 1


def test_a_402_records_a_decision_and_is_replayed(client: Client, mode: str) -> None:
    declined = post(client, URL, outcome="declined")
    retry = post(client, URL)

    assert declined.status_code == 402
    assert retry.status_code == 402
    assert retry.content == declined.content
    assert retry["Idempotent-Replayed"] == "true"
    assert Charge.objects.count() == 1


# Transactional: atomic mode owns the transaction only when no caller's transaction is open.
@pytest.mark.django_db(transaction=True)
def test_a_returned_500_releases_the_key(client: Client, mode: str) -> None:
    failed = post(client, URL, outcome="server-error")
    retry = post(client, URL)

    assert failed.status_code == 500
    assert retry.status_code == 201
    # Atomic mode rolls the failed attempt's writes back with the claim; lease mode cannot.
    assert Charge.objects.count() == (1 if mode == "atomic" else 2)
    assert the_record().response_status == 201


def test_500s_are_stored_when_the_project_opts_in(client: Client, mode: str) -> None:
    with override_settings(IDEMPOTENCY_STORE_SERVER_ERRORS=True):
        failed = post(client, URL, outcome="server-error")
        retry = post(client, URL)

    assert retry.status_code == 500
    assert retry.content == failed.content
    assert retry["Idempotent-Replayed"] == "true"


def test_stored_client_errors_are_configurable(client: Client, mode: str) -> None:
    with override_settings(IDEMPOTENCY_STORED_CLIENT_ERRORS=()):
        post(client, URL, outcome="declined")
        retry = post(client, URL)

    assert retry.status_code == 201
    assert "Idempotent-Replayed" not in retry


@pytest.mark.django_db(transaction=True)
def test_an_exception_releases_the_key_and_the_retry_runs_once(mode: str) -> None:
    client = Client(raise_request_exception=False)

    crashed = post(client, URL, outcome="raise")
    assert crashed.status_code == 500
    assert not stored()

    retry = post(client, URL)
    again = post(client, URL)

    assert retry.status_code == 201
    assert again["Idempotent-Replayed"] == "true"
    # Atomic mode: the crashed attempt's charge was rolled back with its claim.
    assert Charge.objects.count() == (1 if mode == "atomic" else 2)


def test_binary_bodies_replay_exactly(client: Client) -> None:
    first = post(client, "/binary/")
    retry = post(client, "/binary/")

    assert first.content == bytes(range(256)) * 4
    assert retry.content == first.content
    assert retry["Content-Type"] == "application/octet-stream"
    assert retry["Idempotent-Replayed"] == "true"
    assert Charge.objects.count() == 1


def test_streaming_responses_are_not_stored_and_say_so(
    client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="django_idempotency"):
        first = post(client, "/streaming/")

    assert b"".join(first.streaming_content) == b"ab"
    assert "streaming response cannot be stored" in caplog.text
    assert not IdempotencyRecord.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_under_atomic_requests_a_crash_rolls_back_the_view_and_the_claim(
    atomic_requests: None,
) -> None:
    client = Client(raise_request_exception=False)

    assert post(client, URL, outcome="raise").status_code == 500
    assert Charge.objects.count() == 0
    assert not IdempotencyRecord.objects.exists()

    assert post(client, URL).status_code == 201
    assert post(client, URL)["Idempotent-Replayed"] == "true"
    assert Charge.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_under_atomic_requests_a_returned_500_releases_the_key(
    atomic_requests: None, client: Client
) -> None:
    assert post(client, URL, outcome="server-error").status_code == 500
    # The request's own transaction commits a returned response, as Django does; the key is
    # released all the same, so the retry runs.
    assert not IdempotencyRecord.objects.exists()
    assert post(client, URL).status_code == 201


# IDEMPOTENCY_MAX_STORED_BYTES: a response too large to keep still never runs twice.

BINARY = "/binary/"  # Answers 1024 bytes.


def test_a_response_over_the_limit_is_kept_without_its_body_and_never_runs_again(
    client: Client, mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    with override_settings(IDEMPOTENCY_MAX_STORED_BYTES=1023):
        first = client.post(BINARY, headers={"Idempotency-Key": "big-1"})
        retry = client.post(BINARY, headers={"Idempotency-Key": "big-1"})

    assert first.status_code == 200
    assert len(first.content) == 1024  # The first client gets the whole response.
    problem = assert_problem(retry, 410, "response-not-stored")
    assert problem["title"] == "Response not stored"
    assert problem["detail"] == (
        "The first request with this key completed with status 200, but its response (1024 "
        "bytes) was too large to keep, so it cannot be replayed. It was not run again: read its "
        "result from the API instead."
    )
    assert Charge.objects.count() == 1
    record = the_record()
    assert (record.status, record.response_body, record.response_status) == (
        "completed",
        b"",
        200,
    )
    assert "over IDEMPOTENCY_MAX_STORED_BYTES (1023)" in caplog.text


def test_a_response_at_the_limit_is_replayed(client: Client) -> None:
    with override_settings(IDEMPOTENCY_MAX_STORED_BYTES=1024):
        first = client.post(BINARY, headers={"Idempotency-Key": "big-1"})
        retry = client.post(BINARY, headers={"Idempotency-Key": "big-1"})

    assert retry.content == first.content
    assert retry["Idempotent-Replayed"] == "true"


def test_no_limit_stores_every_body(client: Client) -> None:
    with override_settings(IDEMPOTENCY_MAX_STORED_BYTES=None):
        first = client.post(BINARY, headers={"Idempotency-Key": "big-1"})
        retry = client.post(BINARY, headers={"Idempotency-Key": "big-1"})

    assert retry.content == first.content


def test_a_created_resource_too_large_to_replay_keeps_its_location(client: Client) -> None:
    with override_settings(IDEMPOTENCY_MAX_STORED_BYTES=0):
        first = post(client, "/viewset/charges/", key="big-2")
        retry = post(client, "/viewset/charges/", key="big-2")

    assert first.status_code == 201
    assert_problem(retry, 410, "response-not-stored")
    assert retry["Location"] == first["Location"]
    assert "Idempotent-Replayed" not in retry
