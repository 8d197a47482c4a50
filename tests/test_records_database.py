"""Records on a database of their own (IDEMPOTENCY_DATABASE, or a router): every step of a key
happens there."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.test import Client, override_settings
from django.utils import timezone

from django_idempotency.models import IdempotencyRecord
from django_idempotency.purge import purge_expired_records
from tests.models import Charge
from tests.utils import assert_problem, post

pytestmark = [
    pytest.mark.django_db(databases=["default", "records"], transaction=True),
    pytest.mark.parametrize("mode", ["atomic", "lease"]),
]

URL = "/function/charges/"


class RecordsRouter:
    """Sends the package's records to the "records" database, as a project's router may."""

    def db_for_write(self, model: Any, **hints: Any) -> str | None:
        return "records" if model._meta.app_label == "django_idempotency" else None

    db_for_read = db_for_write


@pytest.fixture(autouse=True, params=["IDEMPOTENCY_DATABASE", "DATABASE_ROUTERS"])
def records_apart(request: pytest.FixtureRequest, mode: str) -> object:
    """The records sent to "records" by the package's setting, or by the project's router."""
    if request.param == "IDEMPOTENCY_DATABASE":
        apart: dict[str, Any] = {"IDEMPOTENCY_DATABASE": "records"}
    else:
        apart = {"DATABASE_ROUTERS": [f"{__name__}.RecordsRouter"]}
    with override_settings(**apart, IDEMPOTENCY_MODE=mode):
        yield


def records(alias: str) -> list[tuple[str, str]]:
    return list(IdempotencyRecord.objects.using(alias).values_list("key", "status"))


def test_a_key_is_claimed_completed_and_replayed_on_the_records_database() -> None:
    client = Client()
    first = post(client, URL)
    retry = post(client, URL)

    assert first.status_code == 201
    assert retry["Idempotent-Replayed"] == "true"
    assert retry.content == first.content
    assert Charge.objects.count() == 1  # The view's own data, on its own database.
    assert records("records") == [("key-1", "completed")]
    assert records("default") == []


def test_a_released_key_leaves_nothing_on_the_records_database() -> None:
    client = Client()
    rejected = post(client, URL, outcome="invalid")
    corrected = post(client, URL)

    assert rejected.status_code == 400
    assert corrected.status_code == 201
    assert records("records") == [("key-1", "completed")]


def test_an_expired_record_is_taken_over_and_purged_there() -> None:
    client = Client()
    post(client, URL)
    IdempotencyRecord.objects.using("records").update(expires_at=timezone.now())

    again = post(client, URL)
    IdempotencyRecord.objects.using("records").update(
        expires_at=timezone.now() - timedelta(minutes=1)
    )
    report = purge_expired_records()

    assert again.status_code == 201
    assert "Idempotent-Replayed" not in again  # Expired: the key ran again.
    assert Charge.objects.count() == 2
    assert report.total == 1
    assert records("records") == []


def test_a_duplicate_of_a_running_request_is_told_from_the_records_database() -> None:
    client = Client()
    post(client, URL)
    IdempotencyRecord.objects.using("records").update(
        status=IdempotencyRecord.Status.IN_PROGRESS,
        lease_expires_at=timezone.now() + timedelta(minutes=1),
    )

    assert_problem(post(client, URL), 409, "request-in-progress")
