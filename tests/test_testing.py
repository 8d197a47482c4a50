"""The test helpers users get: pass on an idempotent endpoint, fail clearly on any other."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.test import Client, TestCase, override_settings
from django.urls import path
from rest_framework.test import APIClient

from django_idempotency import idempotent, idempotent_function, testing
from django_idempotency.testing import IdempotencyAssertionsMixin
from tests.factories import IdempotencyRecordFactory
from tests.models import Charge
from tests.utils import fingerprint_of

IDEMPOTENT = "/function/charges/"
UNGUARDED = "/unguarded/charges/"

pytestmark = pytest.mark.django_db


SETTLED: list[int] = []  # The charges `settle` ran for.


@idempotent_function(key="charge_id", namespace="settlements")
def settle(charge_id: int) -> str:
    SETTLED.append(charge_id)
    return f"settled {charge_id}"


@idempotent
def settled_charge_view(request: HttpRequest) -> HttpResponse:
    created = Charge.objects.create(reference="settled", amount=1)
    return JsonResponse({"id": created.pk, "settlement": settle(created.pk)}, status=201)


@idempotent
def slow_charge_view(request: HttpRequest) -> HttpResponse:
    # Slower than the TTL the test sets: the record has expired by the time the retry comes,
    # however fast the machine (a warm request can claim and complete within a millisecond).
    created = Charge.objects.create(reference="slow", amount=1)
    time.sleep(0.01)
    return JsonResponse({"id": created.pk}, status=201)


urlpatterns = [
    path("settled/charges/", settled_charge_view),
    path("slow/charges/", slow_charge_view),
]


def test_the_fixture_passes_on_an_idempotent_endpoint(assert_idempotent: Any) -> None:
    first, second = assert_idempotent("POST", IDEMPOTENT, {"amount": 1})

    assert first.status_code == second.status_code == 201
    assert second["Idempotent-Replayed"] == "true"
    assert Charge.objects.count() == 1


def test_the_fixture_is_bound_to_pytest_djangos_client(assert_idempotent: Any, client: Any) -> None:
    assert assert_idempotent.args == (client,)


def test_the_fixture_fails_on_an_endpoint_that_runs_twice(assert_idempotent: Any) -> None:
    with pytest.raises(AssertionError) as failure:
        assert_idempotent("POST", UNGUARDED, {"amount": 1}, key="order-1")

    message = str(failure.value)
    assert message.startswith("POST /unguarded/charges/ with key 'order-1' is not idempotent:")
    assert re.search(r"body differs: first b'\{.*\}', retry b'\{.*\}'", message)
    assert "the retry lacks `Idempotent-Replayed: true` (it has none)" in message
    assert "the key was never claimed, so the view ran on each request" in message
    assert "status differs" not in message  # Both were 201.
    assert Charge.objects.count() == 2


@pytest.mark.parametrize("client_class", [Client, APIClient], ids=["django", "drf"])
@pytest.mark.parametrize("url", [IDEMPOTENT, "/viewset/charges/", "/async/charges/"])
def test_the_function_works_with_both_test_clients(client_class: type[Client], url: str) -> None:
    first, second = testing.assert_idempotent(client_class(), "post", url, {"amount": 7})

    assert first.json()["amount"] == 7
    assert second.content == first.content
    assert Charge.objects.count() == 1


@pytest.mark.parametrize(
    ("data", "content_type"),
    [
        ({"amount": "3"}, "application/x-www-form-urlencoded"),
        ({"amount": "3"}, "multipart/form-data"),
        ('{"amount": 3}', "application/json"),
        (b'{"amount": 3}', "application/json; charset=utf-8"),
    ],
    ids=["form", "multipart", "json-str", "json-bytes"],
)
@pytest.mark.parametrize("client_class", [Client, APIClient], ids=["django", "drf"])
def test_bodies_are_encoded_for_their_content_type(
    client_class: type[Client], data: Any, content_type: str
) -> None:
    first, _ = testing.assert_idempotent(
        client_class(), "POST", IDEMPOTENT, data, content_type=content_type
    )

    assert first.json()["amount"] == 3


def test_a_body_that_cannot_be_encoded_is_refused() -> None:
    with pytest.raises(TypeError, match=r"Cannot encode dict as text/csv; pass the body as bytes"):
        testing.assert_idempotent(
            Client(), "POST", IDEMPOTENT, {"amount": 1}, content_type="text/csv"
        )


def test_a_response_that_is_not_stored_fails_with_the_reason() -> None:
    # The view answers 400, a status that releases the key: the retry runs the view again.
    with pytest.raises(AssertionError) as failure:
        testing.assert_idempotent(Client(), "POST", IDEMPOTENT, headers={"X-Outcome": "invalid"})

    message = str(failure.value)
    assert (
        "the view ran 2 times for one key, expected once: the first response (400) was not "
        "stored, so the key was released and the retry ran the view again"
    ) in message
    assert "(outcomes signalled for the key: claimed x2, released x2)" in message


def test_a_key_used_before_fails() -> None:
    client = Client()
    testing.assert_idempotent(client, "POST", IDEMPOTENT, {"amount": 1}, key="order-1")

    with pytest.raises(AssertionError, match="the first request was already a replay"):
        testing.assert_idempotent(client, "POST", IDEMPOTENT, {"amount": 1}, key="order-1")


def test_a_key_used_for_another_request_fails() -> None:
    client = Client()
    client.post(
        IDEMPOTENT, {"amount": 2}, content_type="application/json", headers={"Idempotency-Key": "k"}
    )
    with pytest.raises(AssertionError) as failure:
        testing.assert_idempotent(client, "POST", IDEMPOTENT, {"amount": 1}, key="k")

    message = str(failure.value)
    assert (
        "the key was refused as a mismatch: it was used before for a different request" in message
    )
    assert "(outcomes signalled for the key: mismatch x2)" in message


def test_a_status_that_differs_is_reported() -> None:
    # A flaky endpoint: not guarded, and it fails once it has created a charge.
    class Flaky(Client):
        calls = 0

        def generic(self, *args: Any, **kwargs: Any) -> Any:
            Flaky.calls += 1
            if Flaky.calls == 2:
                kwargs["headers"] = {**kwargs["headers"], "X-Outcome": "invalid"}
            return super().generic(*args, **kwargs)

    with pytest.raises(AssertionError, match="status differs: first 201, retry 400"):
        testing.assert_idempotent(Flaky(), "POST", UNGUARDED, {"amount": 1})


def test_a_key_held_by_a_running_request_fails() -> None:
    running = fingerprint_of(IDEMPOTENT, {"amount": 1})
    IdempotencyRecordFactory(in_progress=True, key="k", fingerprint=running)

    with pytest.raises(AssertionError) as failure:
        testing.assert_idempotent(Client(), "POST", IDEMPOTENT, {"amount": 1}, key="k")

    message = str(failure.value)
    assert "the key was refused as in progress: another request holds it" in message
    assert "(outcomes signalled for the key: conflict x2)" in message


def test_a_streaming_response_is_read_and_fails_as_it_is_never_stored() -> None:
    with pytest.raises(AssertionError) as failure:
        testing.assert_idempotent(Client(), "POST", "/streaming/")

    assert "status differs" not in str(failure.value)
    assert "body differs" not in str(failure.value)  # b"ab" both times.
    assert "the view ran 2 times for one key" in str(failure.value)


@pytest.mark.urls(__name__)
@override_settings(IDEMPOTENCY_TTL=0.001)
def test_a_record_expired_before_the_retry_fails_without_blaming_the_storage_policy() -> None:
    # A TTL given in seconds where minutes were meant: the retry finds the record expired,
    # takes the key over and runs the view again. Nothing was released.
    with pytest.raises(AssertionError) as failure:
        testing.assert_idempotent(Client(), "POST", "/slow/charges/", {"amount": 1})

    message = str(failure.value)
    assert "- the view ran 2 times for one key, expected once\n" in message
    assert "the retry lacks `Idempotent-Replayed: true` (it has none)" in message
    assert "released" not in message
    assert Charge.objects.count() == 2


@pytest.mark.urls(__name__)
def test_outcomes_of_other_keys_while_the_requests_run_are_not_counted() -> None:
    # The view settles its charge with an idempotent function of its own key: its claim and
    # completion are not the request's.
    SETTLED.clear()
    first, retry = testing.assert_idempotent(Client(), "POST", "/settled/charges/", {"amount": 1})

    assert first.status_code == 201
    assert retry.content == first.content
    assert Charge.objects.count() == 1
    assert [Charge.objects.get().pk] == SETTLED


@pytest.mark.parametrize("method", ["GET", "head"])
def test_a_safe_method_is_refused(method: str) -> None:
    with pytest.raises(ValueError, match=f"{method.upper()} requests are never guarded"):
        testing.assert_idempotent(Client(), method, IDEMPOTENT)


@pytest.mark.parametrize("key_format", ["uuid", "ulid", "uuid_or_ulid"])
def test_the_fresh_key_fits_the_key_format(key_format: str) -> None:
    with override_settings(IDEMPOTENCY_KEY_FORMAT=key_format):
        testing.assert_idempotent(Client(), "POST", IDEMPOTENT, {"amount": 1})


@override_settings(IDEMPOTENCY_HEADER="X-Request-Key")
def test_the_key_travels_in_the_configured_header_or_the_one_given() -> None:
    testing.assert_idempotent(Client(), "POST", IDEMPOTENT, {"amount": 1})
    testing.assert_idempotent(Client(), "POST", IDEMPOTENT, {"amount": 1}, header="X-Request-Key")

    with pytest.raises(AssertionError, match="the key was never claimed"):
        testing.assert_idempotent(
            Client(), "POST", IDEMPOTENT, {"amount": 1}, header="Idempotency-Key"
        )


class MixinTests(IdempotencyAssertionsMixin, TestCase):
    def test_passes_on_an_idempotent_endpoint(self) -> None:
        first, second = self.assertIdempotent("POST", IDEMPOTENT, {"amount": 1})

        self.assertEqual(first.status_code, 201)
        self.assertEqual(second.content, first.content)
        self.assertEqual(Charge.objects.count(), 1)

    def test_fails_on_an_endpoint_that_runs_twice(self) -> None:
        with self.assertRaisesMessage(AssertionError, "the key was never claimed"):
            self.assertIdempotent("POST", UNGUARDED, {"amount": 1})
        self.assertEqual(Charge.objects.count(), 2)

    def test_takes_another_client(self) -> None:
        self.assertIdempotent("POST", "/viewset/charges/", {"amount": 1}, client=APIClient())


def test_the_helpers_import_without_pytest_only_the_store_contract_needs_it() -> None:
    code = (
        "import sys, django; django.setup(); import django_idempotency.testing; "
        "print('pytest' in sys.modules)"
    )
    root = Path(__file__).parent.parent
    # The tox env's own variables kept (PYTHONPYCACHEPREFIX: without it the child compiles
    # Django afresh, seconds of CPU); pytest is not imported through any of them.
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "PYTHONPATH": str(root)}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=root, check=True
    )

    assert done.stdout.strip() == "False"
