"""Named crash points a project arms in its own tests: with the test client, and in a process."""

from __future__ import annotations

import subprocess
import sys
from datetime import timedelta
from typing import Any

import pytest
from django.http import HttpRequest, JsonResponse
from django.test import Client
from django.urls import path
from django.views.decorators.csrf import csrf_exempt

from django_idempotency import KeyState, idempotent, lookup
from django_idempotency.steps import step
from django_idempotency.testing import POINTS, CrashPoint, crash_at, crash_environment
from tests import clock_processes
from tests.models import Charge
from tests.utils import post

pytestmark = [pytest.mark.urls(__name__), pytest.mark.django_db(transaction=True)]

LEASE = timedelta(seconds=30)


def charge(amount: int) -> int:
    return Charge.objects.create(reference="crash-points", amount=amount).pk


@csrf_exempt
@idempotent(mode="lease", lease=LEASE)
def pay(request: HttpRequest) -> JsonResponse:
    charge_id = step("charge", charge, 5)
    return JsonResponse({"charge": charge_id}, status=201)


urlpatterns = [path("pay/", pay)]


def test_a_crash_after_the_step_ran_runs_it_again_on_the_retry(client: Client) -> None:
    """At least once: the step ran, its result was not stored, so the retry runs it again.
    (What an outbound call with a derived key makes safe: the provider sees the same key.)"""
    with crash_at("step.ran:charge"), pytest.raises(CrashPoint):
        post(client, "/pay/")

    assert post(client, "/pay/").status_code == 201
    assert Charge.objects.count() == 2


def test_a_crash_after_the_step_was_stored_resumes_after_it(client: Client) -> None:
    with crash_at("step.saved:charge"), pytest.raises(CrashPoint):
        post(client, "/pay/")

    response = post(client, "/pay/")

    assert response.status_code == 201
    assert Charge.objects.count() == 1
    assert response.json() == {"charge": Charge.objects.get().pk}


def test_a_crash_before_the_completion_is_resumed_after_its_stored_step(client: Client) -> None:
    """Raised there, the package cleans up as after the view raised: with a step stored, the
    record stays, its lease ended, and the retry resumes it at once."""
    with crash_at("completing"), pytest.raises(CrashPoint):
        post(client, "/pay/")

    assert post(client, "/pay/").status_code == 201
    assert Charge.objects.count() == 1


def test_a_crash_after_the_completion_is_answered_by_the_replay(client: Client) -> None:
    with crash_at("completed"), pytest.raises(CrashPoint):
        post(client, "/pay/")

    response = post(client, "/pay/")

    assert response.headers["Idempotent-Replayed"] == "true"
    assert Charge.objects.count() == 1


def test_a_point_crashes_on_the_arrival_asked_for_and_only_within_the_block(
    client: Client,
) -> None:
    with crash_at("claimed", on=2):
        assert post(client, "/pay/", key="first").status_code == 201
        with pytest.raises(CrashPoint):
            post(client, "/pay/", key="second")
    assert post(client, "/pay/", key="third").status_code == 201


def test_an_action_of_the_test_s_own_runs_at_the_point(client: Client) -> None:
    seen: list[Any] = []
    with crash_at("step.ran:charge", action=lambda: seen.append(Charge.objects.count())):
        post(client, "/pay/")
    assert seen == [1]  # The step had run, and nothing after it yet.


@pytest.mark.parametrize("point", ["nowhere", "step.ran@0", "claimed@x"])
def test_a_misspelt_point_is_refused_at_once(point: str) -> None:
    with pytest.raises(ValueError):
        crash_environment(point)
    with pytest.raises(ValueError), crash_at(point.split("@")[0], on=0):
        pass


def test_every_point_is_documented() -> None:
    assert set(POINTS) == {
        "claimed",
        "step.ran",
        "step.saved",
        "completing",
        "completed",
        "outbox.claimed",
        "outbox.sent",
        "outbox.marked",
    }


def test_a_process_armed_through_its_environment_is_killed_there_holding_its_claim() -> None:
    """A worker killed after its claim leaves the key in progress until the lease ends."""
    env = {**clock_processes.environment("database"), **crash_environment("claimed")}
    child = subprocess.run(
        [sys.executable, "-m", "tests.lease_holder", "crash-key", "/dev/null", "0"],
        env=env,
        capture_output=True,
        timeout=60,
    )

    assert child.returncode == -9, child.stderr.decode()
    status = lookup("crash-key", namespace="tests.lease_holder.hold_the_key")
    assert status.state in (KeyState.IN_PROGRESS, KeyState.ABANDONED)


@pytest.mark.parametrize(
    "point", ["claimed:charge", "completing:x", "outbox.sent:x", "step.ran:", "step.ran:a@2"]
)
def test_a_point_that_would_never_fire_is_refused(point: str) -> None:
    with pytest.raises(ValueError), crash_at(point):
        pass
    if "@" not in point:  # In the environment, "@2" is the arrival: step.ran:a@2 is valid.
        with pytest.raises(ValueError):
            crash_environment(point)


def test_a_block_inside_another_at_the_same_point_leaves_the_outer_one_armed(
    client: Client,
) -> None:
    with crash_at("completed"):
        with crash_at("completed", action=lambda: None):
            post(client, "/pay/", key="inner")
        with pytest.raises(CrashPoint):
            post(client, "/pay/", key="outer")
