"""drf-spectacular: idempotent operations show the key header, the problem responses, replays."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from cryptography.fernet import Fernet
from django.conf import settings
from django.test import override_settings
from django.urls import URLPattern, URLResolver, include, path
from drf_spectacular.generators import SchemaGenerator
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers, viewsets
from rest_framework.decorators import action, api_view
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.routers import SimpleRouter
from rest_framework.schemas import openapi as drf_openapi

from django_idempotency import idempotent
from django_idempotency.contrib.drf_spectacular.extensions import IdempotentViewExtension
from django_idempotency.contrib.rest_framework import IdempotencyMixin
from django_idempotency.http.openapi import duration
from tests import urls, views

ROOT = Path(__file__).resolve().parent.parent
PROBLEM = "application/problem+json"
PROBLEM_REF = {"$ref": "#/components/schemas/IdempotencyProblem"}
BASE_URL = "tag:django-idempotency.github.io,2026:"
DOCS_URL = "https://github.com/django-idempotency/django-idempotency/blob/main/docs/errors.md"


class ChargeSerializer(serializers.Serializer):
    amount = serializers.IntegerField()


class KeyedChargeViewSet(IdempotencyMixin, viewsets.GenericViewSet):
    """Keys required and read from X-Charge-Key; PUT guarded, PATCH not."""

    serializer_class = ChargeSerializer
    idempotency_required = True
    idempotency_header = "X-Charge-Key"
    idempotent_methods = ("POST", "PUT")

    def create(self, request: Request) -> Response:
        return Response(status=201)

    def update(self, request: Request, pk: str) -> Response:
        return Response()

    def partial_update(self, request: Request, pk: str) -> Response:
        return Response()

    @idempotent(required=False)
    @action(detail=False, methods=["post"])
    def preview(self, request: Request) -> Response:
        return Response()

    @idempotent
    @action(detail=True, methods=["get", "post"])
    def capture(self, request: Request, pk: str) -> Response:
        return Response()


class UnguardedChargeViewSet(viewsets.GenericViewSet):
    serializer_class = ChargeSerializer

    def create(self, request: Request) -> Response:
        return Response(status=201)


@pytest.fixture(autouse=True)
def spectacular_schema_class() -> Iterator[None]:
    """What a project using drf-spectacular sets; tests/settings.py keeps DRF's default."""
    rest_framework = {
        **settings.REST_FRAMEWORK,
        "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    }
    with override_settings(REST_FRAMEWORK=rest_framework):
        yield


def schema(*patterns: URLPattern | URLResolver) -> dict[str, Any]:
    return SchemaGenerator(patterns=list(patterns)).get_schema(public=True)  # type: ignore[no-any-return]


def charges_schema() -> dict[str, Any]:
    """The views of tests/urls.py, bar its @api_view (see `api_views`)."""
    return schema(*urls.router.urls, path("apiview/charges/", views.DrfAPIView.as_view()))


def api_views() -> list[URLPattern]:
    """@api_view takes DEFAULT_SCHEMA_CLASS when applied, so these are made after the fixture."""

    @api_view(["GET", "POST"])
    @idempotent(required=True, header="X-Transfer-Key")
    def transfer(request: Request) -> Response:
        return Response(status=201)

    @api_view(["POST"])
    @idempotent(verify=lambda request: None)
    def webhook(request: Request) -> Response:
        return Response(status=202)

    return [path("transfers/", transfer), path("webhooks/", webhook)]


def local_schema() -> dict[str, Any]:
    router = SimpleRouter()
    router.register("keyed", KeyedChargeViewSet, basename="keyed")
    router.register("unguarded", UnguardedChargeViewSet, basename="unguarded")
    return schema(*api_views(), *router.urls)


def header(operation: dict[str, Any], name: str = "Idempotency-Key") -> dict[str, Any] | None:
    found = [p for p in operation.get("parameters", []) if p["in"] == "header"]
    assert len(found) <= 1, found
    if not found:
        return None
    assert found[0]["name"] == name
    return found[0]


def assert_idempotent(
    operation: dict[str, Any], *, name: str = "Idempotency-Key", required: bool = False
) -> None:
    parameter = header(operation, name)
    assert parameter is not None
    assert parameter.get("required", False) is required
    assert parameter["schema"] == {"type": "string", "minLength": 1, "maxLength": 255}
    assert "retry" in parameter["description"]
    for status in ("400", "409", "422"):
        assert operation["responses"][status]["content"][PROBLEM]["schema"] == PROBLEM_REF


def assert_untouched(operation: dict[str, Any]) -> None:
    assert header(operation) is None
    assert not {"400", "409", "422"} & set(operation["responses"])
    assert all("headers" not in response for response in operation["responses"].values())


def test_the_mixin_documents_its_guarded_methods_and_leaves_get_alone() -> None:
    paths = charges_schema()["paths"]

    assert_idempotent(paths["/viewset/charges/"]["post"])
    assert_untouched(paths["/viewset/charges/"]["get"])


def test_an_action_decorated_with_idempotent_is_documented() -> None:
    paths = charges_schema()["paths"]

    assert_idempotent(paths["/viewset/charges/refund/"]["post"])


def test_an_api_view_function_and_an_apiview_handler_are_documented() -> None:
    paths = local_schema()["paths"]

    assert_idempotent(paths["/transfers/"]["post"], name="X-Transfer-Key", required=True)
    assert_untouched(paths["/transfers/"]["get"])
    paths = charges_schema()["paths"]
    assert_idempotent(paths["/apiview/charges/"]["post"])
    assert_untouched(paths["/apiview/charges/"]["get"])


def test_the_header_and_required_resolve_as_at_runtime() -> None:
    paths = local_schema()["paths"]

    # View attributes: required, another header.
    assert_idempotent(paths["/keyed/"]["post"], name="X-Charge-Key", required=True)
    assert_idempotent(paths["/keyed/{id}/"]["put"], name="X-Charge-Key", required=True)
    # The decorator's option first, the view's header after it.
    assert_idempotent(paths["/keyed/preview/"]["post"], name="X-Charge-Key", required=False)
    # An @api_view function's decorator.
    assert_idempotent(paths["/transfers/"]["post"], name="X-Transfer-Key", required=True)


@override_settings(IDEMPOTENCY_REQUIRED=True, IDEMPOTENCY_HEADER="X-Key")
def test_the_settings_apply_where_the_view_says_nothing() -> None:
    paths = charges_schema()["paths"]

    assert_idempotent(paths["/viewset/charges/"]["post"], name="X-Key", required=True)


def test_methods_and_views_that_are_not_guarded_are_unchanged() -> None:
    paths = local_schema()["paths"]

    assert_untouched(paths["/keyed/{id}/"]["patch"])  # Not in idempotent_methods.
    assert_untouched(paths["/keyed/{id}/capture/"]["get"])  # Safe, though decorated.
    assert_idempotent(paths["/keyed/{id}/capture/"]["post"], name="X-Charge-Key", required=True)
    assert_untouched(paths["/unguarded/"]["post"])
    assert paths["/unguarded/"]["post"]["responses"]["201"]["content"]["application/json"]


def test_the_problems_list_what_the_guard_can_answer() -> None:
    paths = local_schema()["paths"]

    def slugs(operation: dict[str, Any], status: str) -> list[str]:
        return list(operation["responses"][status]["content"][PROBLEM]["examples"])

    required, optional = paths["/keyed/"]["post"], paths["/keyed/preview/"]["post"]
    assert slugs(required, "400") == ["missing-key", "invalid-key", "malformed-request"]
    assert slugs(optional, "400") == ["invalid-key", "malformed-request"]
    assert slugs(paths["/webhooks/"]["post"], "400") == [
        "invalid-key",
        "malformed-request",
        "delivery-rejected",
    ]
    assert slugs(required, "409") == ["request-in-progress"]
    assert slugs(required, "410") == ["response-not-stored"]  # IDEMPOTENCY_MAX_STORED_BYTES
    with override_settings(IDEMPOTENCY_ENCRYPTION_KEYS=[Fernet.generate_key()]):
        encrypted = local_schema()["paths"]["/keyed/"]["post"]
    assert slugs(encrypted, "410") == ["response-not-stored", "response-not-decryptable"]
    assert slugs(required, "422") == ["key-reused"]
    example = required["responses"]["422"]["content"][PROBLEM]["examples"]["key-reused"]["value"]
    assert example["type"] == BASE_URL + "key-reused"
    assert example["status"] == 422
    assert required["responses"]["422"]["description"] == (
        "Idempotency key reused for a different request."
    )


@override_settings(IDEMPOTENCY_MAX_STORED_BYTES=None)
def test_without_a_cap_on_stored_responses_no_410_is_documented() -> None:
    responses = local_schema()["paths"]["/keyed/"]["post"]["responses"]

    assert "410" not in responses
    assert "409" in responses


class ExemptChargeViewSet(UnguardedChargeViewSet):
    idempotency_exempt = True


@override_settings(IDEMPOTENCY_GUARD_ALL_VIEWS=True)
def test_the_project_wide_guard_documents_every_view_it_guards_and_no_exempt_one() -> None:
    router = SimpleRouter()
    router.register("unguarded", UnguardedChargeViewSet, basename="unguarded")
    router.register("exempt", ExemptChargeViewSet, basename="exempt")
    paths = schema(*router.urls)["paths"]

    assert_idempotent(paths["/unguarded/"]["post"])
    assert_untouched(paths["/exempt/"]["post"])


def test_the_problem_schema_has_the_four_members() -> None:
    problem = local_schema()["components"]["schemas"]["IdempotencyProblem"]

    assert problem["required"] == ["type", "title", "status", "detail"]
    assert problem["properties"]["status"]["type"] == "integer"


def test_success_responses_document_the_replay_header() -> None:
    responses = local_schema()["paths"]["/keyed/"]["post"]["responses"]

    replayed = responses["201"]["headers"]["Idempotent-Replayed"]
    assert replayed["schema"] == {"type": "string", "enum": ["true"]}
    assert set(responses["422"]["headers"]) == {"Link"}  # No replay header on a problem.
    assert responses["409"]["headers"]["Retry-After"]["schema"] == {"type": "integer"}


def test_each_operation_publishes_its_expiry_as_the_ietf_draft_asks() -> None:
    paths = charges_schema()["paths"]
    operation = paths["/viewset/charges/"]["post"]

    assert "A key expires 24 hours after its first request" in header(operation)["description"]
    assert operation["x-idempotency"] == {
        "header": "Idempotency-Key",
        "required": False,
        "expiry": 86400,
        "documentation": DOCS_URL,
    }
    assert "x-idempotency" not in paths["/viewset/charges/"]["get"]


@override_settings(IDEMPOTENCY_TTL=90, IDEMPOTENCY_DOCS_URL="https://api.example.com/errors")
def test_the_expiry_and_the_docs_link_follow_the_settings() -> None:
    operation = charges_schema()["paths"]["/viewset/charges/"]["post"]

    assert "A key expires 90 seconds after" in header(operation)["description"]
    assert operation["x-idempotency"]["expiry"] == 90
    assert operation["x-idempotency"]["documentation"] == "https://api.example.com/errors"
    for status in ("400", "409", "422"):
        link = operation["responses"][status]["headers"]["Link"]
        assert "https://api.example.com/errors" in link["description"]


@override_settings(IDEMPOTENCY_DOCS_URL=None)
def test_without_a_docs_url_no_link_is_documented() -> None:
    operation = charges_schema()["paths"]["/viewset/charges/"]["post"]

    assert "documentation" not in operation["x-idempotency"]
    assert all("Link" not in r.get("headers", {}) for r in operation["responses"].values())


@pytest.mark.parametrize(("key_format", "expected"), [("uuid", "uuid"), ("uuid_or_ulid", None)])
def test_a_configured_key_format_is_shown(key_format: str, expected: str | None) -> None:
    with override_settings(IDEMPOTENCY_KEY_FORMAT=key_format):
        parameter = header(charges_schema()["paths"]["/viewset/charges/"]["post"])

    assert parameter is not None
    assert parameter["schema"].get("format") == expected


def test_extend_schema_annotations_are_kept_and_can_replace_the_header() -> None:
    class AnnotatedViewSet(IdempotencyMixin, viewsets.GenericViewSet):
        serializer_class = ChargeSerializer

        @extend_schema(
            summary="Create a charge",
            responses={201: ChargeSerializer, 400: ChargeSerializer},
            parameters=[
                OpenApiParameter(
                    "Idempotency-Key", location=OpenApiParameter.HEADER, description="Ours."
                )
            ],
        )
        def create(self, request: Request) -> Response:
            return Response(status=201)

        @extend_schema(exclude=True)
        def partial_update(self, request: Request, pk: str) -> Response:
            return Response()

    router = SimpleRouter()
    router.register("annotated", AnnotatedViewSet, basename="annotated")
    paths = schema(*router.urls)["paths"]
    operation = paths["/annotated/"]["post"]

    assert operation["summary"] == "Create a charge"
    assert header(operation) == {
        "in": "header",
        "name": "Idempotency-Key",
        "schema": {"type": "string"},
        "description": "Ours.",
    }
    # The documented 400 keeps its body and gains the problem document beside it.
    assert set(operation["responses"]["400"]["content"]) == {"application/json", PROBLEM}
    assert operation["responses"]["409"]["content"][PROBLEM]["schema"] == PROBLEM_REF
    assert "/annotated/{id}/" not in paths


def test_a_view_whose_schema_is_not_drf_spectaculars_is_left_as_it_is() -> None:
    class OtherSchemaViewSet(IdempotencyMixin, viewsets.ViewSet):
        schema = drf_openapi.AutoSchema()

        def create(self, request: Request) -> Response:
            return Response(status=201)

    callback = OtherSchemaViewSet.as_view({"post": "create"})

    assert IdempotentViewExtension(callback).view_replacement() is OtherSchemaViewSet


def test_a_schema_of_one_view_keeps_the_operation_ids_and_tags_it_had() -> None:
    # With a single view class, drf-spectacular guesses no path prefix: the replacement must not
    # change that by being another class on each route.
    router = SimpleRouter()
    router.register("keyed", KeyedChargeViewSet, basename="keyed")
    operation = schema(path("api/", include(router.urls)))["paths"]["/api/keyed/{id}/capture/"]

    assert operation["get"]["operationId"] == "api_keyed_capture_retrieve"
    assert operation["get"]["tags"] == operation["post"]["tags"] == ["api"]


def test_the_replacement_is_a_subclass_that_reads_and_runs_as_the_view() -> None:
    callback = KeyedChargeViewSet.as_view({"post": "create", "patch": "partial_update"})

    replacement = IdempotentViewExtension(callback).view_replacement()

    assert issubclass(replacement, KeyedChargeViewSet)
    assert replacement.__qualname__ == KeyedChargeViewSet.__qualname__
    assert replacement.__doc__ == KeyedChargeViewSet.__doc__
    assert replacement().create(None).status_code == 201
    assert not hasattr(KeyedChargeViewSet.create, "kwargs")  # The view itself is untouched.


def _run(code: str, tmp_path: Path, settings_module: str) -> str:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": settings_module,
        "DATABASE_URL": f"sqlite:///{tmp_path / 'schema.sqlite3'}",
    }
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_nothing_from_drf_spectacular_is_imported_when_it_is_not_installed(
    tmp_path: Path,
) -> None:
    code = (
        "import sys; sys.modules['drf_spectacular'] = None\n"  # What a missing package looks like.
        "import django; django.setup()\n"
        "print(sorted(name for name, module in sys.modules.items()"
        " if 'spectacular' in name and module is not None))"
    )

    assert _run(code, tmp_path, "tests.settings").strip() == "[]"


def test_the_demo_serves_the_schema_with_the_header_on_payments(tmp_path: Path) -> None:
    code = (
        "import django; django.setup()\n"
        "from django.test import Client\n"
        "client = Client(SERVER_NAME='localhost')\n"
        "print(client.get('/api/docs/').status_code)\n"
        "print(client.get('/api/schema/', headers={'Accept': 'application/json'}).content.decode())"
    )
    docs, body = _run(code, tmp_path, "testproject.settings").split("\n", 1)
    paths = json.loads(body)["paths"]

    assert docs == "200"
    assert_idempotent(paths["/api/payments/"]["post"], required=True)
    assert_untouched(paths["/api/payments/"]["get"])


@pytest.mark.parametrize(
    ("seconds", "words"),
    [
        (1, "1 second"),
        (90, "90 seconds"),
        (120, "2 minutes"),
        (3600, "1 hour"),
        (86400, "24 hours"),
        (7 * 86400, "7 days"),
        (86400 + 1, "86401 seconds"),
    ],
)
def test_the_expiry_is_said_in_its_largest_whole_unit(seconds: int, words: str) -> None:
    assert duration(timedelta(seconds=seconds)) == words


def test_the_key_status_view_documents_its_header_and_its_answers() -> None:
    from django_idempotency.contrib.rest_framework.views import KeyStatusAPIView

    paths = schema(path("api/idempotency/status/", KeyStatusAPIView.as_view()))["paths"]
    operation = paths["/api/idempotency/status/"]["get"]

    key = header(operation)
    assert key is not None and key["required"] is True
    assert set(operation["responses"]) == {"200", "400", "404", "409", "410", "503"}
    for status in ("400", "404", "409", "410", "503"):
        assert set(operation["responses"][status]["content"]) == {"application/problem+json"}
    assert "key-not-found" in operation["responses"]["404"]["description"]
