"""Every row of the HTTP behaviour table, on every kind of view."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.test import Client, override_settings
from django.utils import timezone

from django_idempotency.core.outcomes import Scope
from tests.models import Charge
from tests.stores import expire_all, hold, stored, the_record
from tests.utils import ViewKind, assert_problem, post

# Every row runs on every store: the table is the same whichever keeps the records.
pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("store")]


def test_first_request_runs_and_its_response_is_stored(client: Client, view_kind: ViewKind) -> None:
    response = post(client, view_kind.url, {"amount": 10})

    assert response.status_code == 201
    assert "Idempotent-Replayed" not in response
    assert Charge.objects.count() == 1
    record = the_record()
    assert (record.namespace, record.owner, record.key) == (view_kind.namespace, "", "key-1")
    assert record.status == "completed"
    assert record.response_status == 201
    assert record.response_body == response.content


def test_retry_replays_status_headers_and_body_without_running_the_view(
    client: Client, view_kind: ViewKind
) -> None:
    first = post(client, view_kind.url, {"amount": 10})
    retry = post(client, view_kind.url, {"amount": 10})

    assert Charge.objects.count() == 1
    assert retry.status_code == first.status_code == 201
    assert retry.content == first.content
    assert retry["Idempotent-Replayed"] == "true"
    assert retry["Content-Type"] == first["Content-Type"]
    assert retry["Location"] == first["Location"]
    assert retry["Content-Length"] == str(len(first.content))
    # The view set a cookie on the first response; a replay never hands it out again.
    assert "session-hint" in first.cookies
    assert "session-hint" not in retry.cookies
    assert "Set-Cookie" not in retry


def test_same_key_while_first_still_runs_is_409(client: Client, view_kind: ViewKind) -> None:
    body = {"amount": 10}
    hold(Scope(view_kind.namespace, "", "key-1"), view_kind.url, body)

    response = post(client, view_kind.url, body)

    assert_problem(response, 409, "request-in-progress")
    assert response["Retry-After"] == "1"
    assert Charge.objects.count() == 0


def test_same_key_different_request_is_422_and_keeps_the_record(
    client: Client, view_kind: ViewKind
) -> None:
    first = post(client, view_kind.url, {"amount": 10})
    before = stored()

    response = post(client, view_kind.url, {"amount": 99})

    problem = assert_problem(response, 422, "key-reused")
    assert Charge.objects.count() == 1
    assert stored() == before
    assert first.content.decode() not in json.dumps(problem)


def test_missing_key_where_required_is_400(client: Client, view_kind: ViewKind) -> None:
    with override_settings(IDEMPOTENCY_REQUIRED=True):
        response = post(client, view_kind.url, key=None)

    problem = assert_problem(response, 400, "missing-key")
    assert problem["detail"] == (
        "This endpoint requires an Idempotency-Key header: send a new unique value (a UUID or"
        " ULID) with each distinct request."
    )
    assert Charge.objects.count() == 0


@pytest.mark.parametrize(
    "key",
    ["", "   ", "k" * 256, "bad\tkey", "bad\x7fkey", "ключ", "two words", '"unterminated', '"a"b"'],
    ids=["empty", "blank", "long", "control", "delete", "non-ascii", "space", "open", "quote"],
)
def test_malformed_key_is_400(client: Client, view_kind: ViewKind, key: str) -> None:
    response = post(client, view_kind.url, key=key)

    assert_problem(response, 400, "invalid-key")
    assert Charge.objects.count() == 0
    assert not stored()


def test_key_in_wrong_format_is_400_when_a_format_is_configured(
    client: Client, view_kind: ViewKind
) -> None:
    with override_settings(IDEMPOTENCY_KEY_FORMAT="uuid"):
        rejected = post(client, view_kind.url, key="01J9ZQ7X5K8VQ4W3N2M1P0R9ST")
        accepted = post(client, view_kind.url, key="6f1c2f0e-3c7a-4e59-9a55-2b8d9f0c1a7e")

    assert_problem(rejected, 400, "invalid-key")
    assert accepted.status_code == 201


def test_missing_key_where_optional_runs_the_view_every_time(
    client: Client, view_kind: ViewKind
) -> None:
    assert post(client, view_kind.url, key=None).status_code == 201
    assert post(client, view_kind.url, key=None).status_code == 201

    assert Charge.objects.count() == 2
    assert not stored()


def test_safe_methods_are_never_touched(client: Client, view_kind: ViewKind) -> None:
    # The refund action maps POST only: DRF answers its GET with 405, never a 500.
    expected = 405 if view_kind is ViewKind.VIEWSET_ACTION else 200
    for _ in range(2):
        response = client.get(view_kind.url, headers={"Idempotency-Key": "key-1"})
        assert response.status_code == expected
        assert "Idempotent-Replayed" not in response
    assert not stored()


def test_sf_string_key_is_the_same_key_as_its_bare_form(
    client: Client, view_kind: ViewKind
) -> None:
    post(client, view_kind.url, key="abc-123")
    retry = post(client, view_kind.url, key='"abc-123"')

    assert retry["Idempotent-Replayed"] == "true"
    assert Charge.objects.count() == 1


# The Redis store's own outage: tests/test_redis_store.py.
@pytest.mark.parametrize("store", ["database"], indirect=True)
def test_store_unreachable_is_503_and_the_view_does_not_run(
    database_down: None, view_kind: ViewKind
) -> None:
    response = post(Client(), view_kind.url)

    assert_problem(response, 503, "store-unavailable")
    assert response["Retry-After"]


def test_expired_record_starts_a_new_request(client: Client, view_kind: ViewKind) -> None:
    post(client, view_kind.url)
    expire_all(timezone.now() - timedelta(days=1))

    again = post(client, view_kind.url)

    assert again.status_code == 201
    assert "Idempotent-Replayed" not in again
    assert Charge.objects.count() == 2
    assert the_record().expires_at > timezone.now()


def test_disabled_switch_turns_everything_off(client: Client, view_kind: ViewKind) -> None:
    with override_settings(IDEMPOTENCY_ENABLED=False, IDEMPOTENCY_REQUIRED=True):
        post(client, view_kind.url)
        post(client, view_kind.url, key=None)

    assert Charge.objects.count() == 2
    assert not stored()


def test_ttl_decides_when_the_record_expires(client: Client, view_kind: ViewKind) -> None:
    with override_settings(IDEMPOTENCY_TTL=60):
        post(client, view_kind.url)

    record = the_record()
    assert (record.expires_at - record.created_at).total_seconds() == 60


@override_settings(IDEMPOTENCY_DOCS_URL="https://api.example.com/docs/idempotency")
def test_problems_link_to_the_documentation_the_project_names(client: Client) -> None:
    post(client, ViewKind.FUNCTION.url, {"amount": 10})

    response = post(client, ViewKind.FUNCTION.url, {"amount": 99})

    assert response.status_code == 422
    assert response["Link"] == (
        '<https://api.example.com/docs/idempotency#key-reused>; rel="describedby"; type="text/html"'
    )


@override_settings(IDEMPOTENCY_DOCS_URL=None)
def test_without_a_docs_url_problems_carry_no_link(client: Client) -> None:
    response = post(client, ViewKind.FUNCTION.url, key="")

    assert response.status_code == 400
    assert "Link" not in response
