"""A result the store refuses after the work ran: kept as "not stored", never given back."""

from __future__ import annotations

from typing import Any

import pytest
from cryptography.fernet import Fernet
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.test import Client
from django.urls import path

from django_idempotency import idempotent
from tests.models import Charge
from tests.stores import the_record
from tests.utils import assert_problem, post

pytestmark = [pytest.mark.urls(__name__), pytest.mark.django_db(transaction=True)]


def _download(request: HttpRequest) -> HttpResponse:
    """A download whose file name the request chose, reflected as it came: with a NUL in it."""
    name = request.GET["name"]
    Charge.objects.create(reference="download", amount=1)
    response = JsonResponse({"charged": 1}, status=201)
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    return response


urlpatterns = [
    path("lease/", idempotent(mode="lease")(_download)),
    path("atomic/", idempotent(mode="atomic")(_download)),
]


@pytest.mark.parametrize("mode", ["lease", "atomic"])
@pytest.mark.parametrize("encrypted", [False, True], ids=["plain", "encrypted"])
def test_a_response_the_store_refuses_is_never_run_again(
    store: str, mode: str, encrypted: bool, settings: Any
) -> None:
    # PostgreSQL's JSON refuses a NUL: the key was given back and each retry ran the view
    # again (lease mode), or the request answered 500 (atomic mode). Sealed, the headers are
    # part of the encrypted body, which any store takes.
    if encrypted:
        settings.IDEMPOTENCY_ENCRYPTION_KEYS = [Fernet.generate_key()]
    url = f"/{mode}/?name=report%00.pdf"

    first = post(Client(), url, {"amount": 1}, key="nul-1")
    retries = [post(Client(), url, {"amount": 1}, key="nul-1") for _ in range(2)]

    assert first.status_code == 201
    assert Charge.objects.count() == 1  # Whatever each store could keep of the answer.
    assert the_record().status == "completed"
    refused = store == "database" and connection.vendor == "postgresql" and not encrypted
    for retry in retries:
        if refused:
            problem = assert_problem(retry, 410, "response-not-stored")
            assert "could not be stored" in problem["detail"]
        else:
            assert retry["Idempotent-Replayed"] == "true"
            assert retry["Content-Disposition"] == first["Content-Disposition"]
