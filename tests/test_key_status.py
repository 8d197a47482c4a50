"""The key-status view: a client asks with its key, and only its own key, what became of an
earlier request, without sending it again (Django's view and DRF's)."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client, override_settings

from django_idempotency.conf import conf
from django_idempotency.core.outcomes import Scope
from django_idempotency.http.responses import REPLAYED_HEADER
from django_idempotency.stores import get_store
from tests.stores import claim_request

STATUS_VIEWS = ["/idempotency/status/", "/api/idempotency/status/"]
BODY = {"amount": 500, "currency": "EUR"}

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("store"),
    pytest.mark.parametrize("status_view", STATUS_VIEWS),
]


def signed_in(name: str) -> tuple[Client, User]:
    user = User.objects.create_user(name)
    client = Client()
    client.force_login(user)
    return client, user


def problem_type(answer: Any) -> str:
    """The slug of a problem+json answer's type."""
    return str(answer.json()["type"]).rsplit(":", 1)[-1]


def test_a_completed_requests_key_answers_its_stored_response_as_a_retry_would(
    status_view: str,
) -> None:
    client, _ = signed_in("ada")
    first = client.post(
        "/function/charges/", BODY, content_type="application/json", HTTP_IDEMPOTENCY_KEY="k-1"
    )
    retried = client.post(
        "/function/charges/", BODY, content_type="application/json", HTTP_IDEMPOTENCY_KEY="k-1"
    )

    answer = client.get(status_view, HTTP_IDEMPOTENCY_KEY="k-1")

    assert (answer.status_code, answer.content) == (first.status_code, first.content)
    assert answer[REPLAYED_HEADER] == retried[REPLAYED_HEADER] == "true"
    assert answer["Content-Type"] == first["Content-Type"]
    # One caller's answer, chosen by a header no shared cache keys on: never kept by one.
    assert set(answer["Cache-Control"].split(", ")) == {"private", "no-store"}


def test_another_user_or_nobody_asking_with_the_same_key_is_told_nothing(
    status_view: str,
) -> None:
    ada, _ = signed_in("ada")
    ada.post(
        "/function/charges/", BODY, content_type="application/json", HTTP_IDEMPOTENCY_KEY="k-2"
    )
    bob, _ = signed_in("bob")

    for asker in (bob, Client()):
        answer = asker.get(status_view, HTTP_IDEMPOTENCY_KEY="k-2")
        assert answer.status_code == 404
        assert answer["Content-Type"] == "application/problem+json"
        assert problem_type(answer) == "key-not-found"
        assert b"500" not in answer.content and REPLAYED_HEADER not in answer
        assert "no-store" in answer["Cache-Control"]


def test_a_running_request_is_409_and_one_whose_worker_was_lost_404_to_resume(
    status_view: str,
) -> None:
    client, user = signed_in("ada")
    owner = str(user.pk)
    get_store().begin(claim_request(Scope(conf.NAMESPACE, owner, "running")))
    # Claimed two hours ago, its minute's lease long over: its worker died.
    lost = claim_request(Scope(conf.NAMESPACE, owner, "lost"), lease=60, ttl=3 * 3600)
    get_store().begin(replace(lost, now=lost.now - timedelta(hours=2)))

    running = client.get(status_view, HTTP_IDEMPOTENCY_KEY="running")
    abandoned = client.get(status_view, HTTP_IDEMPOTENCY_KEY="lost")

    assert running.status_code == 409 and running["Retry-After"] == "1"
    assert problem_type(running) == "request-in-progress"
    assert abandoned.status_code == 404 and problem_type(abandoned) == "key-not-found"
    assert "resume" in abandoned.json()["detail"]


def test_a_missing_or_invalid_key_is_a_400_problem(status_view: str) -> None:
    client, _ = signed_in("ada")

    missing = client.get(status_view)
    invalid = client.get(status_view, HTTP_IDEMPOTENCY_KEY="x" * 300)

    assert (missing.status_code, problem_type(missing)) == (400, "missing-key")
    assert (invalid.status_code, problem_type(invalid)) == (400, "invalid-key")


@override_settings(IDEMPOTENCY_MAX_STORED_BYTES=16)
def test_a_response_not_kept_whole_answers_as_its_retry_does(status_view: str) -> None:
    client, _ = signed_in("ada")
    client.post("/sized/", HTTP_IDEMPOTENCY_KEY="big-1", HTTP_X_BODY_BYTES="17")
    retried = client.post("/sized/", HTTP_IDEMPOTENCY_KEY="big-1", HTTP_X_BODY_BYTES="17")

    answer = client.get(status_view, HTTP_IDEMPOTENCY_KEY="big-1")

    assert (answer.status_code, answer.content) == (retried.status_code, retried.content)
    assert problem_type(answer) == "response-not-stored"


def test_every_answer_of_the_view_is_never_kept_by_a_shared_cache(status_view: str) -> None:
    client, _ = signed_in("ada")

    answers = [
        client.post(status_view, HTTP_IDEMPOTENCY_KEY="k-3"),  # 405
        client.options(status_view),
        client.get(status_view, HTTP_IDEMPOTENCY_KEY="k-3", HTTP_ACCEPT="text/plain"),
        Client().get(status_view, HTTP_IDEMPOTENCY_KEY="k-3", HTTP_COOKIE="sessionid=forged"),
    ]

    for answer in answers:
        assert "no-store" in answer["Cache-Control"], (answer.status_code, answer.headers)


def test_a_client_accepting_only_problem_json_is_answered_not_refused(status_view: str) -> None:
    client, _ = signed_in("ada")

    answer = client.get(
        status_view, HTTP_IDEMPOTENCY_KEY="k-4", HTTP_ACCEPT="application/problem+json"
    )

    assert (answer.status_code, problem_type(answer)) == (404, "key-not-found")
