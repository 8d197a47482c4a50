"""The admin's recovery: kept calls listed and tried again, interrupted steps resolved."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from cryptography.fernet import Fernet
from django.contrib import admin
from django.http import HttpRequest, JsonResponse
from django.test import Client, override_settings
from django.urls import path, reverse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt

from django_idempotency import KeyState, idempotent, idempotent_function, lookup
from django_idempotency.conf import conf
from django_idempotency.encryption import seal_step
from django_idempotency.models import IdempotencyRecord, RecoverableOperation
from django_idempotency.outbound import RetryPolicy
from django_idempotency.recovery import recover_operations
from django_idempotency.steps import step
from django_idempotency.testing import CrashPoint, crash_at
from tests.factories import IdempotencyRecordFactory
from tests.models import Charge
from tests.test_admin import messages_of, staff_client
from tests.utils import post

pytestmark = [pytest.mark.urls(__name__), pytest.mark.django_db(transaction=True)]

State = RecoverableOperation.State
SHIP = "tests.test_recovery_admin.ship_view"
DELIVER = "tests.test_recovery_admin.deliver"
NO_BACKOFF = RetryPolicy(max_attempts=2, base_delay=0, max_delay=0, deadline=float("inf"))
FAILS: list[bool] = []  # Each call of `deliver` pops one: True raises after its step.


def ship(parcel: str) -> int:
    """A side effect with no key to deduplicate it by: a parcel handed to a courier."""
    return Charge.objects.create(reference=parcel, amount=1).pk


@csrf_exempt
@idempotent(mode="lease", namespace=SHIP)
def ship_view(request: HttpRequest) -> JsonResponse:
    shipment = step("ship", ship, "parcel-1", at_most_once=True)
    return JsonResponse({"shipment": shipment}, status=201)


@idempotent_function(key="order", recover=True, lease=timedelta(seconds=1))
def deliver(order: int) -> int:
    shipment = step("ship", ship, f"order-{order}")  # Kept: the failed call is left to recover.
    if FAILS and FAILS.pop(0):
        raise ConnectionError("the courier did not answer")
    return shipment


urlpatterns = [path("ship/", ship_view), path("admin/", admin.site.urls)]


def changelist(model: str) -> str:
    return reverse(f"admin:django_idempotency_{model}_changelist")


def detail(obj: Any) -> str:
    return reverse(f"admin:django_idempotency_{obj._meta.model_name}_change", args=[obj.pk])


def act(client: Client, action: str, *objs: Any) -> Any:
    url = changelist(objs[0]._meta.model_name)
    selected = [str(obj.pk) for obj in objs]
    return client.post(url, {"action": action, "_selected_action": selected}, follow=True)


def offered(response: Any) -> set[str]:
    form = response.context["action_form"]
    return set() if form is None else {name for name, _ in form.fields["action"].choices}


# The recover=True calls.


def kept(key: str, **fields: Any) -> RecoverableOperation:
    now = timezone.now()
    arguments = json.dumps({"args": [key], "kwargs": {"card": "4242-secret"}}).encode()
    values = {
        "namespace": DELIVER,
        "kind": "function",
        "target": "tests.test_recovery_admin:deliver",
        "arguments": seal_step(arguments, conf.ENCRYPTION_KEYS),
        "next_attempt_at": now,
        "created_at": now,
        "updated_at": now,
        **fields,
    }
    return RecoverableOperation.objects.create(key=key, **values)


@pytest.fixture
def calls() -> None:
    """Written in this order: a running function, a failed one, a failed task."""
    kept("k-running")
    kept("k-failed", state=State.FAILED, attempts=5, last_error="ConnectionError: no courier")
    kept("k-task", state=State.FAILED, kind="task", namespace="ns", target="billing.tasks.refund")


@pytest.mark.usefixtures("calls")
@pytest.mark.parametrize(
    ("query", "keys"),
    [
        ("", ["k-task", "k-failed", "k-running"]),  # Newest first.
        ("?state__exact=running", ["k-running"]),
        ("?state__exact=failed", ["k-task", "k-failed"]),
        ("?kind__exact=task", ["k-task"]),
        ("?q=k-failed", ["k-failed"]),
        ("?q=billing.tasks", ["k-task"]),  # The target's beginning.
        ("?q=ns", ["k-task"]),  # The namespace, whole.
        ("?q=k-", []),  # Keys are not searched by their beginning.
    ],
)
def test_the_list_shows_running_and_failed_calls_filtered_and_searched(
    query: str, keys: list[str]
) -> None:
    viewer = staff_client("view_recoverableoperation")

    response = viewer.get(changelist("recoverableoperation") + query)

    assert response.status_code == 200
    assert [call.key for call in response.context["cl"].result_list] == keys


@pytest.mark.usefixtures("calls")
def test_the_list_never_loads_nor_shows_the_arguments() -> None:
    viewer = staff_client("view_recoverableoperation", "view_decrypted_response")

    response = viewer.get(changelist("recoverableoperation"))

    assert "ConnectionError: no courier" in response.content.decode()
    assert "4242-secret" not in response.content.decode()
    assert all("arguments" in c.get_deferred_fields() for c in response.context["cl"].result_list)


def test_the_arguments_are_shown_only_to_who_may_read_decrypted_responses() -> None:
    with override_settings(IDEMPOTENCY_ENCRYPTION_KEYS=[Fernet.generate_key().decode()]):
        call = kept("k-1")
        hidden = staff_client("view_recoverableoperation").get(detail(call))
        shown = staff_client("view_recoverableoperation", "view_decrypted_response").get(
            detail(call)
        )

    assert hidden.status_code == shown.status_code == 200
    assert "Hidden." in hidden.content.decode()
    assert "4242-secret" not in hidden.content.decode()
    assert "&quot;card&quot;: &quot;4242-secret&quot;" in shown.content.decode()  # JSON, escaped.
    sealed = bytes(call.arguments)[1:].decode()  # The token at rest: never on either page.
    assert sealed not in hidden.content.decode() and sealed not in shown.content.decode()
    assert 'name="_save"' not in shown.content.decode()


def test_try_again_requeues_a_failed_call_which_the_sweep_then_completes() -> None:
    FAILS[:] = [True, True, True]
    with pytest.raises(ConnectionError):
        deliver(1)
    for _ in range(3):
        recover_operations(policy=NO_BACKOFF)
    failed = RecoverableOperation.objects.get(key="1")
    assert (failed.state, failed.attempts) == (State.FAILED, 2)
    running = kept("k-running")
    retrier = staff_client("view_recoverableoperation", "change_recoverableoperation")

    response = act(retrier, "try_again", failed, running)

    assert messages_of(response) == [
        "Queued 1 failed call for the next recovery sweep. Skipped 1 running call: the sweep"
        " already tries it."
    ]
    failed.refresh_from_db()
    assert (failed.state, failed.attempts, failed.last_error) == (State.RUNNING, 0, "")
    assert recover_operations(policy=NO_BACKOFF).recovered == 1
    status = lookup("1", namespace=DELIVER)
    assert status.state is KeyState.COMPLETED
    assert status.result() == Charge.objects.get(reference="order-1").pk  # Shipped once.


def test_try_again_needs_the_change_permission_and_the_form_stays_read_only() -> None:
    failed = kept("k-failed", state=State.FAILED, attempts=5)
    viewer = staff_client("view_recoverableoperation")
    retrier = staff_client("view_recoverableoperation", "change_recoverableoperation")

    assert "try_again" not in offered(viewer.get(changelist("recoverableoperation")))
    assert "try_again" in offered(retrier.get(changelist("recoverableoperation")))
    assert 'name="_save"' not in retrier.get(detail(failed)).content.decode()

    act(viewer, "try_again", failed)  # Posted by hand all the same.

    assert RecoverableOperation.objects.get().state == State.FAILED


NO_ADMIN = """
import django
from django.conf import settings

settings.IDEMPOTENCY_ADMIN = False
django.setup()

from django.contrib import admin
from django_idempotency.models import RecoverableOperation

print(admin.site.is_registered(RecoverableOperation))
"""


def test_idempotency_admin_false_leaves_the_calls_out_of_the_admin() -> None:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}

    result = subprocess.run(
        [sys.executable, "-c", NO_ADMIN], env=env, capture_output=True, text=True, timeout=120
    )

    assert (result.returncode, result.stdout.strip()) == (0, "False"), result.stderr


# Interrupted at-most-once steps.


@pytest.fixture
def resolver() -> Client:
    return staff_client("view_idempotencyrecord", "change_idempotencyrecord")


def interrupt(client: Client) -> IdempotencyRecord:
    """The first request ships, then dies before the shipment's result is stored."""
    with crash_at("step.ran:ship"), pytest.raises(CrashPoint):
        post(client, "/ship/")
    assert post(client, "/ship/").status_code == 500  # Ambiguous: not run again.
    assert Charge.objects.count() == 1
    return IdempotencyRecord.objects.get(namespace=SHIP)


def test_step_happened_lets_the_retry_resume_after_it(client: Client, resolver: Client) -> None:
    record = interrupt(client)

    response = act(resolver, "step_happened", record)

    assert messages_of(response) == [
        "Marked the interrupted step of 1 record as happened: its retry resumes after it."
    ]
    retried = post(client, "/ship/")
    assert (retried.status_code, retried.json()) == (201, {"shipment": None})
    assert Charge.objects.count() == 1  # Shipped once.


def test_step_did_not_happen_lets_the_retry_run_it(client: Client, resolver: Client) -> None:
    record = interrupt(client)

    response = act(resolver, "step_did_not_happen", record)

    assert messages_of(response) == [
        "Marked the interrupted step of 1 record as not happened: its retry runs it again."
    ]
    assert post(client, "/ship/").status_code == 201
    assert Charge.objects.count() == 2


def test_records_without_an_interrupted_step_or_still_held_are_skipped(
    client: Client, resolver: Client
) -> None:
    record = interrupt(client)
    completed = IdempotencyRecordFactory()
    IdempotencyRecord.objects.filter(pk=record.pk).update(
        lease_expires_at=timezone.now() + timedelta(minutes=1)  # A retry holds it now.
    )

    response = act(resolver, "step_happened", record, completed)

    assert messages_of(response) == [
        "Marked no step as happened. Skipped 1 record a request still holds: resolve it once"
        " its lease ends. Skipped 1 record with no interrupted at-most-once step."
    ]
    # Its lease as the crash left it: ended by the store's clock, which may not be this one's.
    IdempotencyRecord.objects.filter(pk=record.pk).update(lease_expires_at=record.lease_expires_at)
    assert post(client, "/ship/").status_code == 500  # Still unresolved.


def test_resolving_needs_the_change_permission(client: Client, resolver: Client) -> None:
    record = interrupt(client)
    viewer = staff_client("view_idempotencyrecord", "delete_idempotencyrecord")
    resolvers = {"step_happened", "step_did_not_happen"}

    assert not resolvers & offered(viewer.get(changelist("idempotencyrecord")))
    assert resolvers <= offered(resolver.get(changelist("idempotencyrecord")))

    act(viewer, "step_did_not_happen", record)  # Posted by hand all the same.

    assert post(client, "/ship/").status_code == 500
    assert Charge.objects.count() == 1


def test_the_detail_page_names_the_interrupted_step(client: Client, resolver: Client) -> None:
    record = interrupt(client)

    shown = resolver.get(detail(record)).content.decode()
    act(resolver, "step_did_not_happen", record)
    resolved = resolver.get(detail(record)).content.decode()

    assert "Interrupted steps" in shown
    assert '<div class="readonly">ship</div>' in shown
    assert "Interrupted steps" not in resolved
    assert 'name="_save"' not in shown


def test_arguments_sealed_with_a_key_no_longer_configured_say_so() -> None:
    with override_settings(IDEMPOTENCY_ENCRYPTION_KEYS=[Fernet.generate_key().decode()]):
        call = kept("k-2")
    # The key was retired since: the arguments cannot be opened, and the page says why.
    with override_settings(IDEMPOTENCY_ENCRYPTION_KEYS=[Fernet.generate_key().decode()]):
        page = staff_client("view_recoverableoperation", "view_decrypted_response").get(
            detail(call)
        )

    assert page.status_code == 200
    assert "4242-secret" not in page.content.decode()
    assert "cannot be decrypted" in page.content.decode()
