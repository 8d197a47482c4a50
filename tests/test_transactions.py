"""Atomic mode's own transaction behaves as Django's: hooks, savepoints, rollbacks, isolation.

On PostgreSQL the claim carries the transaction's BEGIN and the completion its COMMIT; these
tests hold that what a view can do inside `transaction.atomic` works the same either way.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection, connections, transaction
from django.http import HttpRequest, JsonResponse
from django.test import Client, override_settings
from django.urls import path

from django_idempotency import idempotent
from django_idempotency.models import IdempotencyRecord
from tests.models import Charge
from tests.utils import post

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.urls(__name__)]

seen_by_hooks: list[tuple[int, list[str]]] = []


def _committed_elsewhere() -> tuple[int, list[str]]:
    """Charges and record statuses as another connection sees them: what is committed."""
    other = connections.create_connection("default")
    try:
        with other.cursor() as cursor:
            cursor.execute(f"SELECT count(*) FROM {Charge._meta.db_table}")
            charges = cursor.fetchone()[0]
            cursor.execute(f"SELECT status FROM {IdempotencyRecord._meta.db_table}")
            statuses = [status for (status,) in cursor.fetchall()]
    finally:
        other.close()
    return charges, statuses


@idempotent
def hooked(request: HttpRequest) -> JsonResponse:
    charge = Charge.objects.create(reference="hooked", amount=1)
    transaction.on_commit(lambda: seen_by_hooks.append(_committed_elsewhere()))
    return JsonResponse({"id": charge.pk}, status=201)


@idempotent
def nested(request: HttpRequest) -> JsonResponse:
    Charge.objects.create(reference="kept", amount=1)
    try:
        with transaction.atomic():  # A savepoint, rolled back on its own.
            Charge.objects.create(reference="undone", amount=2)
            raise ValueError
    except ValueError:
        pass
    return JsonResponse({"charges": Charge.objects.count()}, status=201)


@idempotent
def rolled_back(request: HttpRequest) -> JsonResponse:
    Charge.objects.create(reference="rolled-back", amount=1)
    transaction.set_rollback(True)
    return JsonResponse({"done": True}, status=201)


@idempotent
def isolation(request: HttpRequest) -> JsonResponse:
    with connection.cursor() as cursor:
        cursor.execute("SHOW transaction_isolation")
        level = cursor.fetchone()[0]
    Charge.objects.create(reference="isolated", amount=1)
    return JsonResponse({"isolation": level}, status=201)


urlpatterns = [
    path("hooked/", hooked),
    path("nested/", nested),
    path("rolled-back/", rolled_back),
    path("isolation/", isolation),
]


@pytest.fixture(autouse=True)
def atomic_mode() -> Iterator[None]:
    seen_by_hooks.clear()
    with override_settings(IDEMPOTENCY_MODE="atomic"):
        yield


def test_on_commit_hooks_run_once_after_the_view_and_its_record_are_committed() -> None:
    client = Client()
    first = post(client, "/hooked/", key="hooked")
    replay = post(client, "/hooked/", key="hooked")

    assert first.status_code == replay.status_code == 201
    assert replay.content == first.content
    # Once: the replay did not run the view. By then both writes were visible to everyone.
    assert seen_by_hooks == [(1, ["completed"])]


def test_a_savepoint_the_view_rolls_back_leaves_the_rest_of_its_work_and_the_record() -> None:
    response = post(Client(), "/nested/", key="nested")

    assert response.status_code == 201
    assert json.loads(response.content) == {"charges": 1}
    assert _committed_elsewhere() == (1, ["completed"])


def test_a_view_that_marks_its_transaction_for_rollback_keeps_nothing() -> None:
    client = Client()
    first = post(client, "/rolled-back/", key="rolled-back")

    assert first.status_code == 201
    # Neither the charge nor the claim nor the stored response: a retry runs again, cleanly.
    assert _committed_elsewhere() == (0, [])
    assert post(client, "/rolled-back/", key="rolled-back").status_code == 201
    assert _committed_elsewhere() == (0, [])


@pytest.mark.postgresql
def test_a_configured_isolation_level_is_the_one_the_view_runs_in() -> None:
    from psycopg import IsolationLevel

    connection.ensure_connection()
    raw: Any = connection.connection
    raw.isolation_level = IsolationLevel.SERIALIZABLE  # As OPTIONS["isolation_level"] sets it.
    try:
        response = post(Client(), "/isolation/", key="isolation")
    finally:
        raw.isolation_level = None

    assert response.status_code == 201
    assert json.loads(response.content) == {"isolation": "serializable"}
    assert _committed_elsewhere() == (1, ["completed"])
