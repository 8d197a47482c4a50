"""The options table: signatures that cannot drift from it, and views' per-request hooks."""

from __future__ import annotations

import dataclasses
import inspect
import re
import typing
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest, HttpResponse
from django.test import Client, override_settings
from django.test.client import AsyncClient
from django.urls import path
from django.views import View
from rest_framework import viewsets
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from django_idempotency import idempotent
from django_idempotency.conf import SETTING_NAMES
from django_idempotency.contrib.rest_framework import IdempotencyMixin
from django_idempotency.http.options import Options, Resolved, resolve
from django_idempotency.models import IdempotencyRecord
from django_idempotency.options import OPTIONS
from tests.models import Charge
from tests.utils import assert_problem, post
from tests.views import _django_response, _drf_response, charge

NAMES = [option.name for option in OPTIONS]


# The table and the public signatures


def test_the_decorators_keyword_arguments_are_the_tables_options() -> None:
    def keywords(function: Any) -> list[str]:
        parameters = inspect.signature(function).parameters.values()
        return [p.name for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY]

    typed = [keywords(overload) for overload in typing.get_overloads(idempotent)]

    assert keywords(idempotent) == NAMES
    assert typed == [[], NAMES]  # @idempotent bare, and @idempotent(...) with every option.


def test_the_mixins_class_attributes_are_the_tables_attributes() -> None:
    declared = [
        name for name in IdempotencyMixin.__annotations__ if name.startswith("idempotency_")
    ]

    assert declared == [option.attribute for option in OPTIONS]
    assert all(getattr(IdempotencyMixin, name) is None for name in declared)


def test_what_a_view_asks_for_and_what_is_in_force_hold_every_option() -> None:
    asked = [f.name for f in dataclasses.fields(Options) if f.init]

    assert asked == NAMES
    assert [f.name for f in dataclasses.fields(Resolved)] == NAMES


def test_a_verify_that_cannot_be_called_is_refused_when_the_decorator_is_applied() -> None:
    """Otherwise every guarded request would fail calling it, with a TypeError."""
    with pytest.raises(ImproperlyConfigured, match="verify must be a callable taking the request"):
        idempotent(verify="whsec_secret")  # type: ignore[arg-type]


# A value other than the default for each setting an option falls back to.
SETTING_VALUES = {
    "required": (True, True),
    "ttl": (60, timedelta(seconds=60)),
    "lease": (5, timedelta(seconds=5)),
    "mode": ("lease", "lease"),
    "on_conflict": ("wait", "wait"),
    "namespace": ("elsewhere", "elsewhere"),
    "header": ("X-Request-Key", "X-Request-Key"),
}


def test_each_option_falls_back_to_the_setting_the_table_names() -> None:
    with_settings = [option for option in OPTIONS if option.setting is not None]
    assert [option.name for option in with_settings] == list(SETTING_VALUES)

    for option in with_settings:
        assert option.setting in SETTING_NAMES
        value, in_force = SETTING_VALUES[option.name]
        with override_settings(**{option.setting: value}):
            assert getattr(resolve(Options(), None), option.name) == in_force


# Views with hooks


class TenantViewSet(IdempotencyMixin, viewsets.ViewSet):
    """Keys are scoped per tenant, named by the request; without one, by the attribute."""

    idempotency_namespace = "attribute"

    def get_idempotency_namespace(self) -> str | None:
        return self.request.headers.get("X-Tenant")

    def get_idempotency_ttl(self) -> int:
        return 3600

    def create(self, request: Request) -> Response:
        return _drf_response(*charge(request))


class DecoratedTenantViewSet(TenantViewSet):
    @idempotent(namespace="decorator")
    def create(self, request: Request) -> Response:
        return _drf_response(*charge(request))


class RequiredOnAskingView(APIView):
    """Requires a key when the request says so, leaves it optional when it says not."""

    def get_idempotency_required(self) -> bool | None:
        return {"yes": True, "no": False}.get(self.request.headers.get("X-Require", ""))

    @idempotent
    def post(self, request: Request) -> Response:
        return _drf_response(*charge(request))


class BadModeView(APIView):
    def get_idempotency_mode(self) -> str:
        return "fast"

    @idempotent
    def post(self, request: Request) -> Response:
        return _drf_response(*charge(request))


class DeferringBadModeView(APIView):
    idempotency_mode = "fast"

    def get_idempotency_mode(self) -> None:
        return None  # Defers to the attribute, whose value is refused.

    @idempotent
    def post(self, request: Request) -> Response:
        return _drf_response(*charge(request))


class BadHeaderView(APIView):
    idempotency_header = "Idempotency Key"

    @idempotent
    def post(self, request: Request) -> Response:
        return _drf_response(*charge(request))


class ShopView(View):
    """A Django class-based view whose keys are scoped by its URL."""

    def get_idempotency_namespace(self) -> str:
        return f"shop-{self.kwargs['shop']}"

    @idempotent
    def post(self, request: HttpRequest, shop: str) -> HttpResponse:
        return _django_response(*charge(request))


class AsyncShopView(ShopView):
    @idempotent
    async def post(self, request: HttpRequest, shop: str) -> HttpResponse:
        from asgiref.sync import sync_to_async

        return _django_response(*await sync_to_async(charge)(request))


class UndecoratedShopView(ShopView):
    def post(self, request: HttpRequest, shop: str) -> HttpResponse:
        return _django_response(*charge(request))


class UndecoratedBadTTLView(View):
    idempotency_ttl = -1

    def post(self, request: HttpRequest) -> HttpResponse:
        return _django_response(*charge(request))


class PlainTenantAPIView(APIView):
    def get_idempotency_namespace(self) -> str:
        return "project-guarded"

    def post(self, request: Request) -> Response:
        return _drf_response(*charge(request))


urlpatterns = [
    path("tenant/", TenantViewSet.as_view({"post": "create"})),
    path("decorated-tenant/", DecoratedTenantViewSet.as_view({"post": "create"})),
    path("required/", RequiredOnAskingView.as_view()),
    path("bad-mode/", BadModeView.as_view()),
    path("deferring-bad-mode/", DeferringBadModeView.as_view()),
    path("bad-header/", BadHeaderView.as_view()),
    path("shops/<shop>/", ShopView.as_view()),
    path("async-shops/<shop>/", AsyncShopView.as_view()),
    path("undecorated-shops/<shop>/", UndecoratedShopView.as_view()),
    path("project/", PlainTenantAPIView.as_view()),
    path("undecorated-bad-ttl/", UndecoratedBadTTLView.as_view()),
]

pytestmark = [pytest.mark.urls(__name__), pytest.mark.django_db]


ACME = {"X-Tenant": "acme"}


def namespaces() -> list[str]:
    return sorted(IdempotencyRecord.objects.values_list("namespace", flat=True))


def test_a_hook_gives_each_request_its_value_over_the_views_attribute(client: Client) -> None:
    assert post(client, "/tenant/", **ACME).status_code == 201
    assert post(client, "/tenant/", **{"X-Tenant": "globex"}).status_code == 201
    replay = post(client, "/tenant/", **ACME)

    assert replay["Idempotent-Replayed"] == "true"
    assert Charge.objects.count() == 2  # One key, two tenants: two requests, each run once.
    assert namespaces() == ["acme", "globex"]


def test_a_hook_returning_none_leaves_the_attribute_in_force(client: Client) -> None:
    assert post(client, "/tenant/").status_code == 201

    assert namespaces() == ["attribute"]


def test_a_hooks_value_is_normalised_as_the_attribute_would_be(client: Client) -> None:
    post(client, "/tenant/", **ACME)

    record = IdempotencyRecord.objects.get()
    assert record.expires_at - record.created_at == timedelta(hours=1)


def test_the_decorators_argument_wins_over_the_hook(client: Client) -> None:
    assert post(client, "/decorated-tenant/", **ACME).status_code == 201

    assert namespaces() == ["decorator"]


@pytest.mark.parametrize(("asked", "required"), [("yes", True), ("no", False), ("", None)])
@pytest.mark.parametrize("setting", [True, False])
def test_a_hook_decides_over_the_setting_unless_it_returns_none(
    client: Client, asked: str, required: bool | None, setting: bool
) -> None:
    with override_settings(IDEMPOTENCY_REQUIRED=setting):
        response = post(client, "/required/", key=None, **{"X-Require": asked})

    if (setting if required is None else required) is True:
        assert_problem(response, 400, "missing-key")
    else:
        assert response.status_code == 201


def test_an_invalid_value_from_a_hook_is_refused_naming_the_view_and_hook(client: Client) -> None:
    refusal = (
        "BadModeView.get_idempotency_mode() returned 'fast': mode must be one of atomic, lease;"
        " got 'fast'."
    )

    with pytest.raises(ImproperlyConfigured, match=re.escape(refusal)):
        post(client, "/bad-mode/")


def test_an_invalid_attribute_a_hook_defers_to_is_refused_naming_the_attribute(
    client: Client,
) -> None:
    with pytest.raises(ImproperlyConfigured) as refusal:
        post(client, "/deferring-bad-mode/")

    assert str(refusal.value).startswith("DeferringBadModeView.idempotency_mode = 'fast': ")
    assert not Charge.objects.exists()


def test_an_invalid_attribute_is_refused_on_the_request_naming_the_view(client: Client) -> None:
    refusal = (
        "BadHeaderView.idempotency_header = 'Idempotency Key': header 'Idempotency Key' is not an"
        " HTTP header name: use letters, digits and - (e.g. Idempotency-Key, webhook-id)."
    )

    with pytest.raises(ImproperlyConfigured, match=re.escape(refusal)):
        post(client, "/bad-header/")
    assert not Charge.objects.exists()


def test_a_django_class_based_views_hook_sees_the_request_and_url(client: Client) -> None:
    assert post(client, "/shops/north/").status_code == 201
    assert post(client, "/shops/south/").status_code == 201
    assert post(client, "/shops/north/")["Idempotent-Replayed"] == "true"

    assert namespaces() == ["shop-north", "shop-south"]


@pytest.mark.django_db(transaction=True)
def test_an_async_views_hook_is_called_too() -> None:
    async def send() -> Any:
        return await post(AsyncClient(), "/async-shops/east/")

    response = async_to_sync(send)()

    assert response.status_code == 201
    assert namespaces() == ["shop-east"]


@pytest.fixture
def middleware() -> Iterator[None]:
    idempotency = "django_idempotency.middleware.IdempotencyMiddleware"
    with override_settings(MIDDLEWARE=[*settings.MIDDLEWARE, idempotency]):
        yield


@pytest.mark.usefixtures("middleware")
def test_the_middleware_refuses_an_invalid_attribute_naming_the_view_class(client: Client) -> None:
    with pytest.raises(ImproperlyConfigured) as refusal:
        post(client, "/undecorated-bad-ttl/")

    assert str(refusal.value).startswith("UndecoratedBadTTLView.idempotency_ttl = -1: ")
    assert not Charge.objects.exists()


@pytest.mark.usefixtures("middleware")
def test_the_middleware_refuses_a_hook_it_cannot_call(client: Client) -> None:
    """It guards a class-based view before the instance exists: ignoring the hook would apply
    options the view did not ask for."""
    refusal = (
        "UndecoratedShopView.get_idempotency_namespace() cannot be called: IdempotencyMiddleware"
        " guards a class-based view before the view exists. Decorate its handlers with"
        " @idempotent, or set the attribute instead."
    )

    with pytest.raises(ImproperlyConfigured, match=re.escape(refusal)):
        post(client, "/undecorated-shops/west/")
    assert not Charge.objects.exists()


@pytest.mark.usefixtures("middleware")
def test_the_middleware_leaves_a_decorated_handlers_hook_to_the_decorator(client: Client) -> None:
    assert post(client, "/shops/north/").status_code == 201

    assert namespaces() == ["shop-north"]


def test_the_project_wide_guard_calls_the_hooks_of_a_drf_view(client: Client) -> None:
    with override_settings(IDEMPOTENCY_GUARD_ALL_VIEWS=True):
        assert post(client, "/project/").status_code == 201

    assert namespaces() == ["project-guarded"]


def test_the_schema_documents_the_header_a_hook_names() -> None:
    from drf_spectacular.generators import SchemaGenerator

    class KeyedViewSet(IdempotencyMixin, viewsets.ViewSet):
        def get_idempotency_header(self) -> str:
            return "X-Tenant-Key"

        def create(self, request: Request) -> Response:
            return Response(status=201)

    spectacular = {
        **settings.REST_FRAMEWORK,
        "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    }
    with override_settings(REST_FRAMEWORK=spectacular):
        patterns = [path("keyed/", KeyedViewSet.as_view({"post": "create"}))]
        schema = SchemaGenerator(patterns=patterns).get_schema(public=True)

    parameters = schema["paths"]["/keyed/"]["post"]["parameters"]
    assert [p["name"] for p in parameters if p["in"] == "header"] == ["X-Tenant-Key"]
