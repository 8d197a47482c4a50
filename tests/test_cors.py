"""django-cors-headers in front of guarded views: the key may be sent, replays may be read."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from corsheaders.defaults import default_headers
from django.conf import settings
from django.test import Client, override_settings

from tests.factories import IdempotencyRecordFactory
from tests.models import Charge
from tests.utils import assert_problem, fingerprint_of, post

pytestmark = pytest.mark.django_db

URL = "/viewset/charges/"
APP = "https://app.example"


@pytest.fixture(autouse=True)
def cors() -> Iterator[None]:
    """The settings docs/drf.md gives for browser clients."""
    with override_settings(
        MIDDLEWARE=["corsheaders.middleware.CorsMiddleware", *settings.MIDDLEWARE],
        CORS_ALLOWED_ORIGINS=[APP, "https://admin.example"],
        CORS_ALLOW_HEADERS=(*default_headers, "idempotency-key"),
        CORS_EXPOSE_HEADERS=["Idempotent-Replayed", "Retry-After"],
    ):
        yield


def test_a_preflight_allows_the_idempotency_key_header(client: Client) -> None:
    preflight = client.options(
        URL,
        headers={
            "Origin": APP,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type, idempotency-key",
        },
    )

    assert preflight.status_code == 200
    assert "idempotency-key" in preflight["Access-Control-Allow-Headers"]


def test_a_browser_can_read_that_a_response_was_replayed(client: Client) -> None:
    first = post(client, URL, Origin=APP)
    retry = post(client, URL, Origin=APP)

    assert first["Access-Control-Allow-Origin"] == retry["Access-Control-Allow-Origin"] == APP
    assert retry["Idempotent-Replayed"] == "true"
    assert retry["Access-Control-Expose-Headers"] == "Idempotent-Replayed, Retry-After"
    assert Charge.objects.count() == 1


def test_a_replay_carries_the_cors_headers_of_its_own_origin(client: Client) -> None:
    post(client, URL, Origin=APP)
    retry = post(client, URL, Origin="https://admin.example")

    # CORS headers are added after the view, so they are never stored nor replayed.
    assert retry["Idempotent-Replayed"] == "true"
    assert retry["Access-Control-Allow-Origin"] == "https://admin.example"


def test_a_conflict_exposes_retry_after(client: Client) -> None:
    IdempotencyRecordFactory(
        in_progress=True, key="busy", path=URL, fingerprint=fingerprint_of(URL, {"amount": 10})
    )

    busy = post(client, URL, key="busy", Origin=APP)

    assert_problem(busy, 409, "request-in-progress")
    assert busy["Retry-After"] == "1"
    assert "Retry-After" in busy["Access-Control-Expose-Headers"]
