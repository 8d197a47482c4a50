"""The key as a handle: `lookup` tells where a key stands without claiming it, and `wait_for`
waits, across processes, until its work is no longer running."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from cryptography.fernet import Fernet
from django.contrib.auth.models import User
from django.test import Client, override_settings

from django_idempotency import KeyState, idempotent_function, lookup, wait_for
from django_idempotency.conf import conf
from django_idempotency.encryption import UnreadableResponse
from django_idempotency.exceptions import KeyInProgress, ResultNotStored
from django_idempotency.stores import get_store
from tests.clock_processes import HOLD_LEASE, environment, hold
from tests.stores import SHARED_STORES
from tests.utils import wait_for as wait_until

ROOT = Path(__file__).resolve().parent.parent
NAMESPACE = "lookups"
NEW_KEY, OTHER_KEY = Fernet.generate_key(), Fernet.generate_key()
seen: list[Any] = []


@idempotent_function(key="key", namespace=NAMESPACE, owner="tenant", mode="lease")
def charge(key: str, tenant: str, amount: int, fail: bool = False) -> dict[str, int]:
    seen.append(lookup(key, namespace=NAMESPACE, owner=tenant))  # From inside its own work.
    if fail:
        raise RuntimeError("declined")
    return {"charged": amount}


@pytest.fixture(autouse=True)
def nothing_seen() -> None:
    seen.clear()


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("store")
def test_a_key_is_absent_then_in_progress_with_its_lease_then_completed_with_its_result() -> None:
    assert lookup("order-1", namespace=NAMESPACE, owner="acme").state is KeyState.ABSENT
    before = get_store().now()

    charge("order-1", "acme", 100)

    running = seen[0]
    assert running.state is KeyState.IN_PROGRESS
    assert (running.method, running.path) == ("CALL", "tests.test_lookups.charge")
    assert running.lease_expires_at is not None and running.lease_expires_at > before
    assert running.response is None
    with pytest.raises(KeyInProgress):
        running.result()
    done = lookup("order-1", namespace=NAMESPACE, owner="acme")
    assert done.state is KeyState.COMPLETED
    assert done.operation_id == running.operation_id != ""
    assert done.result() == {"charged": 100}
    assert done.response is not None and done.response.status == 200
    assert done.expires_at is not None and done.expires_at > before + conf.TTL / 2
    # Read, not claimed: the next call is a replay, and the work ran once.
    assert charge("order-1", "acme", 100) == {"charged": 100}
    assert len(seen) == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("store")
def test_a_lookup_sees_only_its_own_owner_and_namespace() -> None:
    charge("order-2", "acme", 100)

    assert lookup("order-2", namespace=NAMESPACE, owner="acme").state is KeyState.COMPLETED
    assert lookup("order-2", namespace=NAMESPACE, owner="globex").state is KeyState.ABSENT
    assert lookup("order-2", namespace=NAMESPACE).state is KeyState.ABSENT
    assert lookup("order-2", namespace="elsewhere", owner="acme").state is KeyState.ABSENT


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("store")
def test_a_key_given_back_after_a_failure_is_absent_and_the_next_call_runs() -> None:
    with pytest.raises(RuntimeError):
        charge("order-3", "acme", 100, fail=True)

    absent = lookup("order-3", namespace=NAMESPACE, owner="acme")
    assert absent.state is KeyState.ABSENT
    with pytest.raises(LookupError):
        absent.result()
    assert charge("order-3", "acme", 100) == {"charged": 100}


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("store")
def test_a_key_or_owner_no_record_can_hold_is_absent_on_every_database() -> None:
    # A NUL: refused by every entry point, and by PostgreSQL's text columns (a DataError).
    for key, owner, namespace in [
        ("a\x00b", "", NAMESPACE),
        ("k", "o\x00", NAMESPACE),
        ("k", "", "n\x00"),
    ]:
        assert lookup(key, namespace=namespace, owner=owner).state is KeyState.ABSENT


@pytest.mark.django_db
def test_wait_for_refuses_a_timeout_that_is_not_a_number() -> None:
    with pytest.raises(ValueError, match="timeout=nan"):
        wait_for("order-6", namespace=NAMESPACE, timeout=float("nan"))


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("store")
def test_an_encrypted_result_is_read_opened_and_unreadable_once_its_key_is_retired() -> None:
    with override_settings(IDEMPOTENCY_ENCRYPTION_KEYS=[NEW_KEY]):
        charge("order-5", "acme", 100)
        found = lookup("order-5", namespace=NAMESPACE, owner="acme")
        assert found.result() == {"charged": 100}
        assert found.response is not None and found.response.headers == [
            ("Content-Type", "application/json")
        ]

    with (
        override_settings(IDEMPOTENCY_ENCRYPTION_KEYS=[OTHER_KEY]),
        pytest.raises(UnreadableResponse) as unreadable,
    ):
        lookup("order-5", namespace=NAMESPACE, owner="acme")
    assert unreadable.value.status == 200


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("store")
@override_settings(IDEMPOTENCY_MAX_STORED_BYTES=16)
def test_a_response_not_kept_whole_is_completed_with_its_status_but_not_stored() -> None:
    answer = Client().post("/sized/", HTTP_IDEMPOTENCY_KEY="big-1", HTTP_X_BODY_BYTES="17")
    assert answer.status_code == 200

    found = lookup("big-1", namespace=conf.NAMESPACE)

    assert (found.state, found.status, found.stored) == (KeyState.COMPLETED, 200, False)
    assert found.response is None
    with pytest.raises(ResultNotStored):
        found.result()


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("store")
def test_a_views_key_is_found_under_the_guards_namespace_and_the_users_owner() -> None:
    user = User.objects.create_user("ada")
    client = Client()
    client.force_login(user)
    body = {"amount": 500, "currency": "EUR"}

    answer = client.post(
        "/function/charges/", body, content_type="application/json", HTTP_IDEMPOTENCY_KEY="k-1"
    )

    found = lookup("k-1", namespace=conf.NAMESPACE, owner=str(user.pk))
    assert (found.state, found.status, found.stored) == (KeyState.COMPLETED, 201, True)
    assert (found.method, found.path) == ("POST", "/function/charges/")
    assert found.response is not None
    assert (found.response.status, found.response.body) == (answer.status_code, answer.content)
    assert lookup("k-1", namespace=conf.NAMESPACE).state is KeyState.ABSENT  # Not anonymous.


def _holder(key: str, tmp_path: Path, store: str, seconds: float = 60) -> subprocess.Popen[str]:
    """Another process holding `key` (tests.clock_processes.hold) until `tmp_path`/held.done
    exists, its lease renewed meanwhile."""
    marker = tmp_path / "held"
    holder = subprocess.Popen(
        [sys.executable, "-m", "tests.clock_processes", "hold", key, str(marker), str(seconds)],
        cwd=ROOT,
        env=environment(store),
        stdout=subprocess.PIPE,
        text=True,
    )
    wait_until(marker.exists, 60)
    return holder


HOLD = "tests.clock_processes.hold"  # The namespace of `hold`'s keys: its dotted name.


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("shared_store", SHARED_STORES, indirect=True)
def test_wait_for_waits_for_another_process_to_complete_and_times_out_while_it_runs(
    shared_store: str, tmp_path: Path
) -> None:
    holder = _holder("held-1", tmp_path, shared_store)
    try:
        assert lookup("held-1", namespace=HOLD).state is KeyState.IN_PROGRESS
        with pytest.raises(KeyInProgress, match=r"still running after 0\.3 s"):
            wait_for("held-1", namespace=HOLD, timeout=0.3)

        # Past a lease of the holder's: its heartbeat keeps the key.
        finish = threading.Timer(HOLD_LEASE * 1.5, (tmp_path / "held.done").touch)
        finish.start()
        done = wait_for("held-1", namespace=HOLD, timeout=60)
        # The record completes before the holder prints and exits: read what it said then.
        said, _ = holder.communicate(timeout=60)
    finally:
        holder.kill()  # Only if a failure above left it running.
        holder.wait()

    assert said.strip() == "held"
    assert done.state is KeyState.COMPLETED
    assert done.result() == "held"


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("shared_store", SHARED_STORES, indirect=True)
def test_a_key_whose_process_was_killed_is_abandoned_once_its_lease_ends(
    shared_store: str, tmp_path: Path
) -> None:
    holder = _holder("held-2", tmp_path, shared_store)
    os.kill(holder.pid, signal.SIGKILL)
    holder.communicate(timeout=60)

    found = wait_for("held-2", namespace=HOLD, timeout=60)

    assert found.state is KeyState.ABANDONED
    assert found.lease_expires_at is not None and found.lease_expires_at <= get_store().now()
    with pytest.raises(KeyInProgress):
        found.result()
    # The lookups claimed nothing: the next call takes the key over and completes it.
    assert hold("held-2", str(tmp_path / "again"), 0) == "held"
    assert lookup("held-2", namespace=HOLD).state is KeyState.COMPLETED
