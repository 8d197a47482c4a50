"""Under IDEMPOTENCY_REQUIRED with the middleware or the project-wide guard, the views browsers and
login forms reach are left alone (no 400 missing-key), and a project names more in one setting."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest, HttpResponse
from django.test import Client
from django.urls import path
from django.views import View
from rest_framework.authtoken.views import obtain_auth_token
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from django_idempotency.contrib.rest_framework import IdempotencyMixin
from django_idempotency.http.exempt import is_credential_view
from tests.utils import assert_problem

MIDDLEWARE = "django_idempotency.middleware.IdempotencyMiddleware"


class SignInView(View):
    """A login form of the project's own."""

    def post(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse("signed in")


class OrdersView(View):
    def post(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse("ordered", status=201)


class TokenObtainPairView(APIView):
    """Stands in for djangorestframework-simplejwt's view, which is matched by its dotted path."""

    authentication_classes: list[Any] = []

    def post(self, request: Request) -> Response:
        return Response({"access": "token"})


TokenObtainPairView.__module__ = "rest_framework_simplejwt.views"
TokenObtainPairView.__qualname__ = TokenObtainPairView.__name__ = "TokenViewBase"


class MixinSignInView(IdempotencyMixin, APIView):
    authentication_classes: list[Any] = []

    def post(self, request: Request) -> Response:
        return Response({"signed": "in"})


urlpatterns = [
    path("admin/", admin.site.urls),
    # The admin's templates: the project's own registration/ templates are not what is tested.
    path("accounts/login/", auth_views.LoginView.as_view(template_name="admin/login.html")),
    path("accounts/logout/", auth_views.LogoutView.as_view()),
    path("accounts/password_reset/", auth_views.PasswordResetView.as_view(success_url="/")),
    path("api/token-auth/", obtain_auth_token),
    path("api/token/", TokenObtainPairView.as_view()),
    path("sign-in/", SignInView.as_view()),
    path("orders/", OrdersView.as_view()),
    path("api/sign-in/", MixinSignInView.as_view()),
]

pytestmark = [pytest.mark.django_db, pytest.mark.urls(__name__)]


@pytest.fixture(autouse=True)
def required_everywhere(settings: Any) -> None:
    """docs/migration.md's project-wide set-up: every view guarded, a key required."""
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, MIDDLEWARE]
    settings.IDEMPOTENCY_GUARD_ALL_VIEWS = True
    settings.IDEMPOTENCY_REQUIRED = True


@pytest.mark.parametrize(
    ("url", "form"),
    [
        ("/admin/login/", {"username": "nobody", "password": "wrong"}),
        ("/accounts/login/", {"username": "nobody", "password": "wrong"}),
        ("/accounts/password_reset/", {"email": "nobody@example.com"}),
        ("/accounts/logout/", {}),
    ],
)
def test_djangos_admin_and_auth_forms_need_no_key(client: Client, url: str, form: Any) -> None:
    response = client.post(url, form)

    # The form's own answer (re-rendered with its errors, or redirected), not 400 missing-key.
    assert response.status_code in (200, 302), response.content
    assert response.get("Content-Type") != "application/problem+json"


def test_drfs_token_endpoint_needs_no_key(client: Client) -> None:
    response = client.post("/api/token-auth/", {"username": "nobody", "password": "wrong"})

    # DRF's own answer to wrong credentials.
    assert response.status_code == 400
    assert "non_field_errors" in response.json()


def test_simplejwts_token_views_are_matched_by_dotted_path(client: Client) -> None:
    assert client.post("/api/token/", {}).json() == {"access": "token"}


def test_other_views_still_require_a_key(client: Client) -> None:
    assert_problem(client.post("/orders/", {}), 400, "missing-key")
    assert_problem(client.post("/sign-in/", {}), 400, "missing-key")


def test_a_project_exempts_its_own_views_with_one_setting(client: Client, settings: Any) -> None:
    settings.IDEMPOTENCY_EXEMPT_VIEWS = ["tests.test_exempt.SignInView"]

    response = client.post("/sign-in/", {})

    assert response.status_code == 200
    assert response.content == b"signed in"
    assert_problem(client.post("/orders/", {}), 400, "missing-key")


def test_the_mixin_still_guards_a_view_the_setting_names(client: Client, settings: Any) -> None:
    # The default exemptions are the project-wide guards'; an explicit mixin or decorator wins.
    settings.IDEMPOTENCY_EXEMPT_VIEWS = ["tests.test_exempt.MixinSignInView"]

    assert_problem(client.post("/api/sign-in/", {}), 400, "missing-key")


def test_credential_views_can_be_told_apart_by_other_modules() -> None:
    assert is_credential_view(auth_views.LoginView.as_view())
    assert is_credential_view(obtain_auth_token)
    assert is_credential_view(admin.site.login)
    assert not is_credential_view(SignInView.as_view())


def test_a_bare_string_for_the_setting_is_refused_on_the_first_request(
    client: Client, settings: Any
) -> None:
    # `check` reports it first (E004); a project that skipped it is told the same at run time.
    settings.IDEMPOTENCY_EXEMPT_VIEWS = "tests.test_exempt.SignInView"

    with pytest.raises(ImproperlyConfigured, match="IDEMPOTENCY_EXEMPT_VIEWS must be a list"):
        client.post("/sign-in/", {})
