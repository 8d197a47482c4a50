"""Atomic mode's own transaction behaves as Django's: hooks, savepoints, rollbacks, isolation.

On PostgreSQL the claim carries the transaction's BEGIN and the completion its COMMIT; these
tests hold that what a view can do inside `transaction.atomic` works the same either way.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from django.db import connection, connections, transaction
from django.http import HttpRequest, JsonResponse
from django.test import Client, override_settings
from django.urls import path
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from django_idempotency import idempotent
from django_idempotency.contrib.rest_framework import IdempotencyMixin
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


def write_then_answer(request: Any) -> int:
    """Write a charge, then answer the status X-Answer asks for, or raise if it says "raise"."""
    Charge.objects.create(reference="written", amount=1)
    answer = request.headers["X-Answer"]
    if answer == "raise":
        raise RuntimeError("the view failed after writing")
    return int(answer)


@idempotent
def decorated_writer(request: HttpRequest) -> JsonResponse:
    return JsonResponse({}, status=write_then_answer(request))


def plain_writer(request: HttpRequest) -> JsonResponse:
    return JsonResponse({}, status=write_then_answer(request))


class MixinWriter(IdempotencyMixin, APIView):
    def post(self, request: Request) -> Response:
        return Response({}, status=write_then_answer(request))


class PlainAPIWriter(APIView):
    def post(self, request: Request) -> Response:
        return Response({}, status=write_then_answer(request))


urlpatterns = [
    path("decorated-writer/", decorated_writer),
    path("plain-writer/", plain_writer),
    path("mixin-writer/", MixinWriter.as_view()),
    path("plain-api-writer/", PlainAPIWriter.as_view()),
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


# Every entry point, as (URL, the settings that turn it on).
ENTRY_POINTS = {
    "decorator": ("/decorated-writer/", {}),
    "mixin": ("/mixin-writer/", {}),
    "project-wide guard": ("/plain-api-writer/", {"IDEMPOTENCY_GUARD_ALL_VIEWS": True}),
    "middleware": (
        "/plain-writer/",
        {
            "MIDDLEWARE": [
                *settings.MIDDLEWARE,
                "django_idempotency.middleware.IdempotencyMiddleware",
            ]
        },
    ),
}


def _kept_after(entry: str, answer: str, *, enabled: bool) -> tuple[int, tuple[int, list[str]]]:
    """The status of one keyed request answering `answer`, and what is committed after it;
    with `enabled` False, as the project would see it without this package."""
    url, entry_settings = ENTRY_POINTS[entry]
    Charge.objects.all().delete()
    with override_settings(**entry_settings, IDEMPOTENCY_ENABLED=enabled):
        client = Client(raise_request_exception=False)
        response = post(
            client, url, key=f"{entry}-{answer}".replace(" ", "-"), **{"X-Answer": answer}
        )
    return response.status_code, _committed_elsewhere()


@pytest.mark.usefixtures("atomic_requests")
@pytest.mark.parametrize("entry", ENTRY_POINTS)
@pytest.mark.parametrize("status", ["400", "404", "422"])
def test_under_atomic_requests_a_released_answer_keeps_the_writes_django_would_keep(
    entry: str, status: str
) -> None:
    without_the_package = _kept_after(entry, status, enabled=False)
    guarded = _kept_after(entry, status, enabled=True)

    # Django commits ATOMIC_REQUESTS for a returned response: the charge stays, the key does not.
    assert guarded == without_the_package == (int(status), (1, []))


@pytest.mark.usefixtures("atomic_requests")
@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_under_atomic_requests_a_view_that_raises_keeps_neither_its_writes_nor_the_claim(
    entry: str,
) -> None:
    without_the_package = _kept_after(entry, "raise", enabled=False)
    guarded = _kept_after(entry, "raise", enabled=True)

    assert guarded == without_the_package == (500, (0, []))


@pytest.mark.usefixtures("atomic_requests")
@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_under_atomic_requests_a_stored_answer_commits_with_the_views_writes(entry: str) -> None:
    client = Client()
    url, entry_settings = ENTRY_POINTS[entry]
    with override_settings(**entry_settings):
        first = post(client, url, key="stored", **{"X-Answer": "201"})
        retry = post(client, url, key="stored", **{"X-Answer": "201"})

    assert first.status_code == retry.status_code == 201
    assert retry["Idempotent-Replayed"] == "true"
    assert _committed_elsewhere() == (1, ["completed"])
