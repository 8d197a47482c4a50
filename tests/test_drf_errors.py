"""IDEMPOTENCY_ERROR_FORMAT = "drf": the guard's errors go through DRF's EXCEPTION_HANDLER."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from django.test import Client, override_settings
from rest_framework.response import Response
from rest_framework.views import exception_handler

from django_idempotency.contrib.rest_framework.errors import IdempotencyProblem
from tests.factories import IdempotencyRecordFactory
from tests.models import Charge
from tests.utils import assert_problem, fingerprint_of, post

pytestmark = pytest.mark.django_db

VIEWSET = "/viewset/charges/"


def standardized(exc: Exception, context: dict[str, Any]) -> Response | None:
    """A handler in the shape drf-standardized-errors gives every error."""
    response = exception_handler(exc, context)
    if response is None or not isinstance(exc, IdempotencyProblem):
        return response
    response.data = {
        "type": "client_error" if exc.status_code < 500 else "server_error",
        "errors": [{"code": exc.get_codes(), "detail": str(exc.detail), "attr": None}],
    }
    return response


@pytest.fixture
def drf_format() -> Iterator[None]:
    with override_settings(IDEMPOTENCY_ERROR_FORMAT="drf"):
        yield


@pytest.fixture
def standardized_errors(drf_format: None) -> Iterator[None]:
    rest_framework = {
        **settings.REST_FRAMEWORK,
        "EXCEPTION_HANDLER": "tests.test_drf_errors.standardized",
    }
    with override_settings(REST_FRAMEWORK=rest_framework):
        yield


@pytest.mark.usefixtures("standardized_errors")
@pytest.mark.parametrize("url", [VIEWSET, "/apiview/charges/", "/api-view/charges/"])
def test_a_reused_key_is_shaped_by_the_projects_exception_handler(client: Client, url: str) -> None:
    post(client, url, {"amount": 10})
    reused = post(client, url, {"amount": 20})

    assert reused.status_code == 422
    assert reused["Content-Type"] == "application/json"
    assert reused.json() == {
        "type": "client_error",
        "errors": [
            {
                "code": "key-reused",
                "detail": "This key was already used for a different request (method, path or"
                " body differ): send a new key for a new request.",
                "attr": None,
            }
        ],
    }
    assert Charge.objects.count() == 1


@pytest.mark.usefixtures("drf_format")
def test_drfs_default_handler_keeps_status_detail_and_retry_after(client: Client) -> None:
    IdempotencyRecordFactory(
        in_progress=True,
        key="busy",
        path=VIEWSET,
        fingerprint=fingerprint_of(VIEWSET, {"amount": 10}),
    )

    busy = post(client, VIEWSET, key="busy")

    assert busy.status_code == 409
    assert busy["Retry-After"] == "1"
    assert json.loads(busy.content) == {
        "detail": "A request with this key is still being processed: retry after a moment."
    }


@pytest.mark.usefixtures("drf_format")
def test_a_missing_key_and_a_malformed_key_are_drf_errors(client: Client) -> None:
    with override_settings(IDEMPOTENCY_REQUIRED=True):
        missing = post(client, VIEWSET, key=None)
    malformed = post(client, VIEWSET, key="")

    assert (missing.status_code, malformed.status_code) == (400, 400)
    assert "requires an Idempotency-Key header" in missing.json()["detail"]
    assert malformed.json() == {
        "detail": "The key is empty: send 1 to 255 visible ASCII characters."
    }


@pytest.mark.usefixtures("drf_format")
def test_a_lost_store_is_a_drf_503(client: Client, database_down: None) -> None:
    unavailable = post(client, VIEWSET)

    assert unavailable.status_code == 503
    assert unavailable["Retry-After"] == "5"
    assert "cannot be reached" in unavailable.json()["detail"]


@pytest.mark.usefixtures("drf_format")
def test_plain_django_views_keep_problem_json(client: Client) -> None:
    post(client, "/function/charges/", {"amount": 10})

    assert_problem(post(client, "/function/charges/", {"amount": 20}), 422, "key-reused")


def test_problem_json_stays_the_default(client: Client) -> None:
    post(client, VIEWSET, {"amount": 10})

    assert_problem(post(client, VIEWSET, {"amount": 20}), 422, "key-reused")
