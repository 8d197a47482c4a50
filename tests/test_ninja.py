"""Django Ninja: `@idempotent` on Ninja operations, the HTTP table, Ninja's errors and schema."""

from __future__ import annotations

import asyncio
import functools
import json
import urllib.error
import urllib.request
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.core.cache import cache
from django.core.exceptions import ImproperlyConfigured
from django.db import connections
from django.http import HttpRequest
from django.test import Client, override_settings
from ninja import NinjaAPI, Schema
from ninja.decorators import decorate_view
from ninja.security import APIKeyHeader
from ninja.testing import TestAsyncClient, TestClient
from ninja.throttling import AnonRateThrottle

from django_idempotency.contrib.ninja import idempotent
from django_idempotency.core.outcomes import Scope
from testproject.payments.models import Payment
from testproject.payments.ninja_api import api as demo_api
from tests.stores import hold, stored
from tests.utils import DOCS_URL, PROBLEM_TYPE_PREFIX, assert_problem

pytestmark = [pytest.mark.django_db, pytest.mark.urls("testproject.urls")]

SYNC, ASYNC = "/ninja/payments", "/ninja/async/payments"
NAMESPACES = {SYNC: "default", ASYNC: "ninja-async"}


def pay(client: Client, url: str, amount: int = 10, key: str | None = "pay-1") -> Any:
    headers = {} if key is None else {"Idempotency-Key": key}
    body = json.dumps({"amount": amount})
    return client.post(url, body, content_type="application/json", headers=headers)


# The HTTP table through Django's test client, on a sync and an async operation.


@pytest.fixture(params=[SYNC, ASYNC])
def url(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("store")
def test_a_retry_replays_the_response_ninja_rendered_without_running_again(
    client: Client, url: str
) -> None:
    first = pay(client, url)
    retry = pay(client, url)

    assert first.status_code == retry.status_code == 201
    assert retry.content == first.content
    assert json.loads(first.content)["amount"] == 10
    assert retry["Idempotent-Replayed"] == "true"
    assert "Idempotent-Replayed" not in first
    assert Payment.objects.count() == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("store")
def test_the_same_key_with_another_body_is_422_and_keeps_the_record(
    client: Client, url: str
) -> None:
    pay(client, url)
    before = stored()

    response = pay(client, url, amount=99)

    assert_problem(response, 422, "key-reused")
    assert stored() == before
    assert Payment.objects.count() == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("store")
def test_the_same_key_while_the_first_runs_is_409(client: Client, url: str) -> None:
    hold(Scope(NAMESPACES[url], "", "pay-1"), url, {"amount": 10})

    response = pay(client, url)

    assert_problem(response, 409, "request-in-progress")
    assert response["Retry-After"] == "1"
    assert Payment.objects.count() == 0


@pytest.mark.django_db(transaction=True)
def test_a_required_key_missing_is_400_and_nothing_runs(client: Client, url: str) -> None:
    response = pay(client, url, key=None)

    assert_problem(response, 400, "missing-key")
    assert Payment.objects.count() == 0


def test_safe_methods_are_never_guarded(client: Client) -> None:
    payment = Payment.objects.create(amount=5)

    response = client.get(f"/ninja/payments/{payment.pk}", headers={"Idempotency-Key": "k"})

    assert response.status_code == 200
    assert not stored()


# Ninja's errors, when asked.


@override_settings(IDEMPOTENCY_ERROR_FORMAT="ninja")
def test_ninja_error_format_answers_as_ninja_errors_keeping_retry_after_and_the_link(
    client: Client,
) -> None:
    missing = pay(client, SYNC, key=None)
    hold(Scope("default", "", "held"), SYNC, {"amount": 10})
    conflict = pay(client, SYNC, key="held")

    assert missing.status_code == 400
    assert missing["Content-Type"] == "application/json; charset=utf-8"
    assert json.loads(missing.content) == {
        "detail": "This endpoint requires an Idempotency-Key header: send a new unique value"
        " (a UUID or ULID) with each distinct request."
    }
    assert missing["Link"].endswith('#missing-key>; rel="describedby"; type="text/html"')
    assert conflict.status_code == 409
    assert conflict["Retry-After"] == "1"
    assert set(json.loads(conflict.content)) == {"detail"}


# Ninja's own checks run first, and its test client works.

calls: list[str] = []


class Token(APIKeyHeader):
    param_name = "X-Token"

    def authenticate(self, request: HttpRequest, key: str | None) -> str | None:
        return key if key == "good" else None


class Refund(Schema):
    amount: int


local_api = NinjaAPI(urls_namespace="idempotency-tests", auth=Token())


@local_api.post("/refunds")
@idempotent(namespace="refunds")
def refund(request: HttpRequest, payload: Refund) -> dict[str, Any]:
    calls.append(request.auth)  # type: ignore[attr-defined]
    return {"refunded": payload.amount, "call": len(calls)}


@local_api.post("/refunds/async")
@idempotent(namespace="async-refunds")
async def refund_async(request: HttpRequest, payload: Refund) -> dict[str, Any]:
    calls.append(request.auth)  # type: ignore[attr-defined]
    return {"refunded": payload.amount, "call": len(calls)}


def test_ninja_test_client_replays_and_a_replay_still_needs_ninjas_auth() -> None:
    calls.clear()
    client = TestClient(local_api)
    headers = {"Idempotency-Key": "r-1", "X-Token": "good"}

    first = client.post("/refunds", json={"amount": 3}, headers=headers)
    retry = client.post("/refunds", json={"amount": 3}, headers=headers)
    refused = client.post("/refunds", json={"amount": 3}, headers={**headers, "X-Token": "bad"})

    assert first.status_code == retry.status_code == 200
    assert retry.json() == first.json() == {"refunded": 3, "call": 1}
    assert retry["Idempotent-Replayed"] == "true"
    assert refused.status_code == 401  # Not replayed to a client Ninja did not authenticate.
    assert calls == ["good"]


@pytest.mark.django_db(transaction=True)  # Its writes are made on the shared sync thread.
def test_ninja_async_test_client_replays() -> None:
    calls.clear()
    client = TestAsyncClient(local_api)
    headers = {"Idempotency-Key": "r-2", "X-Token": "good"}

    async def twice() -> tuple[Any, Any]:
        first = await client.post("/refunds/async", json={"amount": 4}, headers=headers)
        retry = await client.post("/refunds/async", json={"amount": 4}, headers=headers)
        await sync_to_async(connections.close_all)()
        return first, retry

    first, retry = asyncio.run(twice())

    assert retry.json() == first.json() == {"refunded": 4, "call": 1}
    assert retry["Idempotent-Replayed"] == "true"


# The schema: as drf-spectacular's (tests/test_spectacular.py), in Ninja's own.


def operation_schema(api: NinjaAPI, path: str, method: str = "post") -> dict[str, Any]:
    # The test API is mounted nowhere: its paths are given no prefix.
    prefix = None if api is demo_api else ""
    schema = api.get_openapi_schema(path_prefix=prefix)
    return schema["paths"][path][method]  # type: ignore[no-any-return]


def test_the_schema_documents_the_key_the_problems_the_replay_and_the_expiry() -> None:
    operation = operation_schema(demo_api, "/ninja/payments")

    [parameter] = [p for p in operation["parameters"] if p["in"] == "header"]
    assert parameter["name"] == "Idempotency-Key"
    assert parameter["required"] is True
    assert parameter["schema"] == {"type": "string", "minLength": 1, "maxLength": 255}
    assert "A key expires 24 hours after its first request" in parameter["description"]
    responses = operation["responses"]
    assert responses[201]["content"]["application/json"]  # Ninja's own, kept.
    assert responses[201]["headers"]["Idempotent-Replayed"]["schema"]["enum"] == ["true"]
    for status, slugs in {
        400: ["missing-key"],
        409: ["request-in-progress"],
        422: ["key-reused"],
    }.items():
        content = responses[status]["content"]["application/problem+json"]
        assert content["schema"]["required"] == ["type", "title", "status", "detail"]
        assert set(slugs) <= set(content["examples"])
        assert "Link" in responses[status]["headers"]
    assert responses[409]["headers"]["Retry-After"]["schema"] == {"type": "integer"}
    assert operation["x-idempotency"] == {
        "header": "Idempotency-Key",
        "required": True,
        "expiry": 86400,
        "documentation": DOCS_URL,
    }


@override_settings(IDEMPOTENCY_HEADER="X-Request-Key", IDEMPOTENCY_TTL=3600)
def test_the_schema_follows_the_settings_in_force_when_it_is_generated() -> None:
    operation = operation_schema(local_api, "/refunds")

    [parameter] = [p for p in operation["parameters"] if p["in"] == "header" and "Key" in p["name"]]
    assert parameter["name"] == "X-Request-Key"
    assert parameter["required"] is False
    assert (
        "missing-key"
        not in operation["responses"][400]["content"]["application/problem+json"]["examples"]
    )
    assert operation["x-idempotency"]["expiry"] == 3600


@local_api.get("/refunds/{refund_id}")
@idempotent(namespace="refunds")  # On a safe method: never guarded, so nothing to document.
def read_refund(request: HttpRequest, refund_id: int) -> dict[str, Any]:
    return {"id": refund_id}


def test_a_safe_method_operation_documents_no_key_even_when_decorated() -> None:
    operation = operation_schema(local_api, "/refunds/{refund_id}", "get")

    assert [p["name"] for p in operation["parameters"]] == ["refund_id"]
    assert "x-idempotency" not in operation
    assert set(operation["responses"]) == {200}


def test_operations_that_are_not_guarded_are_unchanged() -> None:
    operation = operation_schema(demo_api, "/ninja/payments/{payment_id}", "get")

    assert all(p["in"] != "header" for p in operation["parameters"])
    assert "x-idempotency" not in operation
    assert set(operation["responses"]) == {200}


# Through a real server: Django's live server, the demo's Ninja API over HTTP.


@pytest.mark.django_db(transaction=True)
def test_the_http_table_through_a_real_server(live_server: Any) -> None:
    def send(body: dict[str, Any], key: str | None) -> tuple[int, dict[str, str], bytes]:
        headers = {"Content-Type": "application/json"}
        if key is not None:
            headers["Idempotency-Key"] = key
        request = urllib.request.Request(
            f"{live_server.url}{SYNC}", json.dumps(body).encode(), headers, method="POST"
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, dict(response.headers), response.read()
        except urllib.error.HTTPError as error:
            return error.code, dict(error.headers), error.read()

    first = send({"amount": 7}, "live-1")
    replay = send({"amount": 7}, "live-1")
    reused = send({"amount": 8}, "live-1")
    missing = send({"amount": 7}, None)
    hold(Scope("default", "", "live-2"), SYNC, {"amount": 7})
    conflict = send({"amount": 7}, "live-2")

    assert first[0] == replay[0] == 201
    assert replay[2] == first[2]
    assert replay[1]["Idempotent-Replayed"] == "true"
    assert (reused[0], json.loads(reused[2])["type"]) == (422, PROBLEM_TYPE_PREFIX + "key-reused")
    assert (missing[0], json.loads(missing[2])["type"]) == (
        400,
        PROBLEM_TYPE_PREFIX + "missing-key",
    )
    assert (conflict[0], conflict[1]["Retry-After"]) == (409, "1")
    assert Payment.objects.count() == 1


# Ninja's throttles and validation around the guard.

limited_api = NinjaAPI(urls_namespace="idempotency-tests-throttled")


@limited_api.post("/transfers", throttle=AnonRateThrottle("2/m"), openapi_extra={"x-team": "pay"})
@idempotent(namespace="transfers")
def transfer(request: HttpRequest, payload: Refund) -> dict[str, Any]:
    calls.append("transfer")
    return {"moved": payload.amount}


def test_a_throttle_counts_each_request_once_and_applies_to_replays_too() -> None:
    cache.clear()  # Ninja's throttle history.
    calls.clear()
    client = TestClient(limited_api)
    headers = {"Idempotency-Key": "t-1"}

    answers = [client.post("/transfers", json={"amount": 1}, headers=headers) for _ in range(3)]

    assert [answer.status_code for answer in answers] == [200, 200, 429]
    assert answers[1]["Idempotent-Replayed"] == "true"
    assert calls == ["transfer"]


def test_input_ninja_refuses_releases_the_key_for_a_corrected_retry() -> None:
    cache.clear()
    client = TestClient(limited_api)
    headers = {"Idempotency-Key": "t-2"}

    refused = client.post("/transfers", json={"amount": "many"}, headers=headers)
    corrected = client.post("/transfers", json={"amount": "many"}, headers=headers)

    assert refused.status_code == corrected.status_code == 422
    assert not corrected.has_header("Idempotent-Replayed")  # Nothing was stored to replay.
    assert not [record for record in stored() if record.namespace == "transfers"]


def test_an_operations_own_openapi_extra_is_kept() -> None:
    operation = operation_schema(limited_api, "/transfers")

    assert operation["x-team"] == "pay"
    assert operation["x-idempotency"]["header"] == "Idempotency-Key"


# Where @idempotent goes, and what else decorates the operation.

placed_api = NinjaAPI(urls_namespace="idempotency-tests-placed", auth=Token())


def noting(run: Any) -> Any:
    """A project's own run decorator (Ninja's `decorate_view`), beside the guard, written as
    Ninja's documentation writes one."""

    @functools.wraps(run)
    def noted(request: HttpRequest, **kw: Any) -> Any:
        calls.append("noted")
        return run(request, **kw)

    return noted


@idempotent(namespace="placed-above")  # Above @api.post: the operation already exists.
@placed_api.post("/above")
def above(request: HttpRequest, payload: Refund) -> dict[str, Any]:
    calls.append("above")
    return {"refunded": payload.amount}


@placed_api.post("/decorated-outside")
@decorate_view(noting)
@idempotent(namespace="placed-outside")
def decorated_outside(request: HttpRequest, payload: Refund) -> dict[str, Any]:
    calls.append("decorated_outside")
    return {"refunded": payload.amount}


@placed_api.post("/decorated-inside")
@idempotent(namespace="placed-inside")
@decorate_view(noting)
def decorated_inside(request: HttpRequest, payload: Refund) -> dict[str, Any]:
    calls.append("decorated_inside")
    return {"refunded": payload.amount}


@pytest.mark.parametrize(
    ("path", "noted"),
    [
        ("/above", 0),
        # decorate_view above @idempotent wraps the guard: it sees the replay too.
        ("/decorated-outside", 2),
        # Below it, the guard wraps it: a replay does not reach it.
        ("/decorated-inside", 1),
    ],
)
def test_placed_above_the_route_or_beside_decorate_view_a_retry_is_replayed(
    path: str, noted: int
) -> None:
    calls.clear()
    client = TestClient(placed_api)
    headers = {"Idempotency-Key": f"placed{path}", "X-Token": "good"}

    first = client.post(path, json={"amount": 6}, headers=headers)
    retry = client.post(path, json={"amount": 6}, headers=headers)

    assert first.status_code == retry.status_code == 200
    assert retry.json() == first.json() == {"refunded": 6}
    assert retry["Idempotent-Replayed"] == "true"
    assert calls.count(path.strip("/").replace("-", "_")) == 1
    assert calls.count("noted") == noted
    assert operation_schema(placed_api, path)["x-idempotency"]["header"] == "Idempotency-Key"


@pytest.mark.django_db(transaction=True)
def test_ninja_async_auth_refuses_before_the_key_is_looked_at() -> None:
    calls.clear()
    client = TestAsyncClient(local_api)
    headers = {"Idempotency-Key": "r-3", "X-Token": "bad"}

    async def refused() -> Any:
        answer = await client.post("/refunds/async", json={"amount": 4}, headers=headers)
        await sync_to_async(connections.close_all)()
        return answer

    answer = asyncio.run(refused())

    assert answer.status_code == 401
    assert not calls
    assert not [record for record in stored() if record.namespace == "async-refunds"]


# The project's own openapi_extra, merged into what the guard documents.

extra_api = NinjaAPI(urls_namespace="idempotency-tests-extra")
TRACE_HEADER = {"in": "header", "name": "X-Trace", "schema": {"type": "string"}}


@extra_api.post(
    "/payouts",
    openapi_extra={
        "parameters": [TRACE_HEADER],
        "responses": {409: {"description": "A payout for this key is running."}},
        "x-team": "pay",
    },
)
@idempotent(namespace="payouts")
def payout(request: HttpRequest, payload: Refund) -> dict[str, Any]:
    return {"paid": payload.amount}


def test_an_operations_own_parameters_and_responses_join_the_guards() -> None:
    operation = operation_schema(extra_api, "/payouts")

    headers = [p["name"] for p in operation["parameters"] if p["in"] == "header"]
    assert headers == ["Idempotency-Key", "X-Trace"]
    # A status the project documents itself is its own; the guard's others stay.
    assert operation["responses"][409] == {"description": "A payout for this key is running."}
    assert operation["responses"][422]["content"]["application/problem+json"]
    assert operation["x-team"] == "pay"


def test_an_operations_openapi_extra_reads_as_the_schema_it_documents() -> None:
    # What a project inspecting its operations (a schema test, a doc generator) reads.
    [operation] = extra_api.default_router.path_operations["/payouts"].operations
    extra = operation.openapi_extra
    documented = operation_schema(extra_api, "/payouts")

    assert "x-idempotency" in extra
    assert extra.get("x-idempotency") == extra["x-idempotency"] == documented["x-idempotency"]
    assert extra.get("x-missing", "none") == "none"
    assert set(extra.keys()) == {"parameters", "responses", "x-idempotency", "x-team"}
    assert dict(extra.items())["x-team"] == "pay"
    assert "pay" in list(extra.values())
    assert len(extra) == 4
    assert "'x-team': 'pay'" in repr(extra)


def test_below_a_decorate_view_decorator_that_hides_the_operation_it_says_what_to_change() -> None:
    def hiding(run: Any) -> Any:
        def hidden(request: HttpRequest, **kw: Any) -> Any:  # No functools.wraps.
            return run(request, **kw)

        return hidden

    api = NinjaAPI(urls_namespace="idempotency-tests-hiding")

    with pytest.raises(ImproperlyConfigured, match=r"functools\.wraps, or go above @idempotent"):

        @api.post("/hidden")
        @idempotent(namespace="hidden")
        @decorate_view(hiding)
        def hidden(request: HttpRequest, payload: Refund) -> dict[str, Any]:
            return {"paid": payload.amount}
