"""Steps run at most once: an interrupted one is reported ambiguous, until an operator says."""

from __future__ import annotations

from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction
from django.http import HttpRequest, JsonResponse
from django.test import Client
from django.urls import path
from django.views.decorators.csrf import csrf_exempt

from django_idempotency import idempotent, idempotent_function
from django_idempotency.exceptions import KeyInProgress, StepAmbiguous
from django_idempotency.steps import astep, resolve_step, step
from django_idempotency.testing import CrashPoint, crash_at
from tests.models import Charge
from tests.utils import post

pytestmark = [pytest.mark.urls(__name__), pytest.mark.django_db(transaction=True)]

NAMESPACE = "tests.test_steps_at_most_once.ship_view"


def ship(parcel: str) -> int:
    """A side effect with no key to deduplicate it by: a parcel handed to a courier."""
    return Charge.objects.create(reference=parcel, amount=1).pk


@csrf_exempt
@idempotent(mode="lease", namespace=NAMESPACE)
def ship_view(request: HttpRequest) -> JsonResponse:
    shipment = step("ship", ship, "parcel-1", at_most_once=True)
    return JsonResponse({"shipment": shipment}, status=201)


urlpatterns = [path("ship/", ship_view)]


def interrupt(client: Client) -> None:
    """The first request ships, then dies before the shipment's result is stored."""
    with crash_at("step.ran:ship"), pytest.raises(CrashPoint):
        post(client, "/ship/")
    assert Charge.objects.count() == 1


def test_an_interrupted_step_is_not_run_again_and_the_retry_is_told_why(client: Client) -> None:
    interrupt(client)

    response = post(client, "/ship/")

    assert response.status_code == 500
    assert response["Content-Type"] == "application/problem+json"
    assert response.json()["type"].endswith("step-ambiguous")
    assert "'ship'" in response.json()["detail"]
    assert post(client, "/ship/").status_code == 500  # Until an operator says.
    assert Charge.objects.count() == 1


def test_marked_done_the_retry_resumes_after_it_with_the_result_given(client: Client) -> None:
    interrupt(client)
    resolve_step("key-1", namespace=NAMESPACE, step="ship", happened=True, result=41)

    response = post(client, "/ship/")

    assert (response.status_code, response.json()) == (201, {"shipment": 41})
    assert Charge.objects.count() == 1


def test_marked_not_done_the_retry_runs_it(client: Client) -> None:
    interrupt(client)
    resolve_step("key-1", namespace=NAMESPACE, step="ship", happened=False)

    response = post(client, "/ship/")

    assert response.status_code == 201
    assert Charge.objects.count() == 2


def test_a_step_that_finished_is_skipped_as_any_step_is(client: Client) -> None:
    with crash_at("step.saved:ship"), pytest.raises(CrashPoint):
        post(client, "/ship/")

    assert post(client, "/ship/").status_code == 201
    assert Charge.objects.count() == 1
    with pytest.raises(LookupError):
        resolve_step("key-1", namespace=NAMESPACE, step="ship", happened=True)


def test_nothing_to_resolve_and_a_key_still_held_are_refused(client: Client) -> None:
    with pytest.raises(LookupError):
        resolve_step("key-1", namespace=NAMESPACE, step="ship", happened=True)

    def resolve_meanwhile() -> None:
        with pytest.raises(KeyInProgress):
            resolve_step("key-1", namespace=NAMESPACE, step="ship", happened=False)

    # While the first request still holds its lease, its step is running, not interrupted.
    with crash_at("step.ran:ship", action=resolve_meanwhile):
        assert post(client, "/ship/").status_code == 201


@idempotent_function(key="parcel", mode="lease")
def ship_once(parcel: str) -> int:
    return step("ship", ship, parcel, at_most_once=True)


def test_a_function_raises_step_ambiguous_to_its_caller() -> None:
    with crash_at("step.ran:ship"), pytest.raises(CrashPoint):
        ship_once("parcel-2")

    with pytest.raises(StepAmbiguous) as raised:
        ship_once("parcel-2")

    assert raised.value.step == "ship"
    assert Charge.objects.count() == 1


@idempotent_function(key="parcel", mode="lease")
def ship_in_a_transaction(parcel: str) -> int:
    with transaction.atomic():
        return step("ship", ship, parcel, at_most_once=True)


def test_an_at_most_once_step_inside_a_transaction_is_refused_before_it_runs() -> None:
    """Its mark that it started would roll back with the transaction: the retry would run it."""
    with pytest.raises(ImproperlyConfigured, match="transaction"):
        ship_in_a_transaction("parcel-3")
    assert not Charge.objects.exists()


@pytest.mark.parametrize("result", [(1, 2), {1: "x"}, float("nan")])
def test_a_result_that_would_come_back_changed_is_refused(client: Client, result: Any) -> None:
    interrupt(client)
    with pytest.raises((TypeError, ValueError)):
        resolve_step("key-1", namespace=NAMESPACE, step="ship", happened=True, result=result)
    assert post(client, "/ship/").status_code == 500  # Still unresolved.


@idempotent_function(key="parcel", mode="lease")
async def ship_later(parcel: str) -> int:
    async def hand_over(parcel: str) -> int:
        return await sync_to_async(ship)(parcel)

    return await astep("ship", hand_over, parcel, at_most_once=True)


def test_an_interrupted_async_step_is_not_run_again() -> None:
    with crash_at("step.ran:ship"), pytest.raises(CrashPoint):
        async_to_sync(ship_later)("parcel-4")

    with pytest.raises(StepAmbiguous):
        async_to_sync(ship_later)("parcel-4")

    assert Charge.objects.count() == 1
