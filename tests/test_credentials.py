"""Views whose responses are credentials: the key is given back, and the token never stored."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from django.contrib import admin
from django.contrib.auth.views import LoginView
from django.http import HttpRequest, JsonResponse
from django.test import Client, override_settings
from django.urls import path
from rest_framework.authtoken.models import Token
from rest_framework.authtoken.views import ObtainAuthToken, obtain_auth_token
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from django_idempotency import idempotent, signals
from django_idempotency.contrib.rest_framework import IdempotencyMixin
from django_idempotency.models import IdempotencyRecord
from tests.factories import UserFactory
from tests.stores import STORE_PARAMS, stored, using_store

PASSWORD = "correct horse battery staple"


@idempotent(credentials="release")
def custom_token(request: HttpRequest) -> JsonResponse:
    """A project's own token view, plain Django: it says its responses are credentials."""
    return JsonResponse({"token": secrets.token_hex(20)})


class SubclassedTokenView(ObtainAuthToken):
    """A subclass of DRF's token view, guarded by a decorator: a credential view by its class."""

    @idempotent
    def post(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().post(request, *args, **kwargs)


class StoredTokenView(IdempotencyMixin, ObtainAuthToken):
    """A credential view that opts in to storing its responses (the project-wide guard leaves
    credential views alone: the mixin guards it)."""

    idempotency_credentials = "store"


class SigningKeyView(APIView):
    """Not a credential view: its response is stored as any other."""

    authentication_classes: list[Any] = []
    permission_classes: list[Any] = []

    def post(self, request: Request) -> Response:
        return Response({"nonce": secrets.token_hex(8)}, status=201)


urlpatterns = [
    path("api-token-auth/", obtain_auth_token),
    path("custom-token/", custom_token),
    path("subclassed-token/", SubclassedTokenView.as_view()),
    path("stored-token/", StoredTokenView.as_view()),
    path("nonce/", SigningKeyView.as_view()),
    path("admin/", admin.site.urls),
    path("accounts/login/", LoginView.as_view()),
]

pytestmark = [pytest.mark.urls(__name__), pytest.mark.django_db]


@pytest.fixture
def guard_all_views() -> Iterator[None]:
    with override_settings(IDEMPOTENCY_GUARD_ALL_VIEWS=True, IDEMPOTENCY_REQUIRED=False):
        yield


@pytest.fixture
def user() -> Any:
    user = UserFactory()
    user.set_password(PASSWORD)
    user.save()
    return user


def log_in(client: Client, url: str, username: str, key: str = "key-1") -> Any:
    return client.post(
        url,
        json.dumps({"username": username, "password": PASSWORD}),
        content_type="application/json",
        headers={"Idempotency-Key": key},
    )


@pytest.mark.usefixtures("guard_all_views")
@pytest.mark.parametrize("store", STORE_PARAMS)
def test_drfs_token_endpoint_under_the_project_wide_guard_never_stores_the_token(
    store: str, user: Any
) -> None:
    client = Client()
    with using_store(store):
        first = log_in(client, "/api-token-auth/", user.username)
        held = stored()
        retry = log_in(client, "/api-token-auth/", user.username)

    token = Token.objects.get(user=user).key
    assert first.status_code == 200 and first.json() == {"token": token}
    assert held == []  # The key was given back: nothing of the token at rest.
    assert retry.status_code == 200 and retry.json() == {"token": token}
    assert "Idempotent-Replayed" not in retry  # Run again, with the credentials checked again.


@pytest.mark.usefixtures("guard_all_views")
def test_a_credential_view_still_holds_its_key_while_it_runs(user: Any) -> None:
    events: list[str] = []

    def note(sender: Any, **kwargs: Any) -> None:
        events.append("claimed")

    def released(sender: Any, **kwargs: Any) -> None:
        events.append("released")

    signals.claimed.connect(note)
    signals.released.connect(released)
    try:
        Client().post("/custom-token/", headers={"Idempotency-Key": "key-1"})
    finally:
        signals.claimed.disconnect(note)
        signals.released.disconnect(released)

    assert events == ["claimed", "released"]


def test_a_custom_token_view_that_says_so_is_never_stored() -> None:
    client = Client()
    first = client.post("/custom-token/", headers={"Idempotency-Key": "key-1"})
    retry = client.post("/custom-token/", headers={"Idempotency-Key": "key-1"})

    assert first.status_code == retry.status_code == 200
    assert not IdempotencyRecord.objects.exists()
    assert first.json()["token"] != retry.json()["token"]  # A new token: nothing replayed.


def test_a_subclass_of_drfs_token_view_with_the_decorator_is_never_stored(user: Any) -> None:
    response = log_in(Client(), "/subclassed-token/", user.username)

    assert response.status_code == 200
    assert not IdempotencyRecord.objects.exists()


@pytest.mark.usefixtures("guard_all_views")
def test_a_credential_view_that_opts_in_is_stored_and_replayed(user: Any) -> None:
    client = Client()
    first = log_in(client, "/stored-token/", user.username)
    retry = log_in(client, "/stored-token/", user.username)

    assert IdempotencyRecord.objects.get().response_status == 200
    assert retry["Idempotent-Replayed"] == "true"
    assert retry.content == first.content


@pytest.mark.usefixtures("guard_all_views")
def test_other_views_are_stored_as_before() -> None:
    client = Client()
    first = client.post("/nonce/", headers={"Idempotency-Key": "key-1"})
    retry = client.post("/nonce/", headers={"Idempotency-Key": "key-1"})

    assert retry["Idempotent-Replayed"] == "true"
    assert retry.content == first.content


@pytest.mark.usefixtures("guard_all_views")
def test_a_refused_login_is_released_as_any_4xx(user: Any) -> None:
    response = Client().post(
        "/api-token-auth/",
        json.dumps({"username": user.username, "password": "wrong"}),
        content_type="application/json",
        headers={"Idempotency-Key": "key-1"},
    )

    assert response.status_code == 400
    assert not IdempotencyRecord.objects.exists()


@pytest.mark.parametrize("url", ["/admin/login/", "/accounts/login/"])
def test_djangos_login_views_under_the_middleware_are_never_stored(url: str) -> None:
    user = UserFactory(is_staff=True)
    user.set_password(PASSWORD)
    user.save()
    middleware = [*settings.MIDDLEWARE, "django_idempotency.middleware.IdempotencyMiddleware"]
    client = Client()
    with override_settings(MIDDLEWARE=middleware):
        response = client.post(
            url,
            {"username": user.username, "password": PASSWORD},
            headers={"Idempotency-Key": "key-1"},
        )

    assert response.status_code == 302  # Logged in, with the session's cookie.
    assert response.cookies[settings.SESSION_COOKIE_NAME].value
    assert not IdempotencyRecord.objects.exists()


def test_a_credentials_value_other_than_release_or_store_is_refused_when_applied() -> None:
    from django.core.exceptions import ImproperlyConfigured

    with pytest.raises(ImproperlyConfigured, match="credentials must be one of release, store"):
        idempotent(credentials="keep")  # type: ignore[call-overload]
