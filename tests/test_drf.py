"""DRF specifics: replays only after authentication, permissions and throttles; clear misuse."""

from __future__ import annotations

import json
import logging
from decimal import Decimal
from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.core.cache import cache
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest, HttpResponse
from django.test import Client, override_settings
from django.urls import path
from django.views import View
from rest_framework import permissions, viewsets
from rest_framework.decorators import api_view
from rest_framework.parsers import BaseParser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.routers import SimpleRouter
from rest_framework.views import APIView

from django_idempotency import idempotent
from django_idempotency.models import IdempotencyRecord
from tests.factories import UserFactory
from tests.models import Charge
from tests.utils import assert_problem, post

pytestmark = pytest.mark.django_db


def test_a_replay_never_bypasses_a_permission_revoked_after_the_first_request(
    client: Client,
) -> None:
    user = UserFactory()
    user.user_permissions.add(Permission.objects.get(codename="add_charge"))
    client.force_login(user)
    assert post(client, "/private/charges/").status_code == 201

    user.user_permissions.clear()
    retry = post(client, "/private/charges/")

    assert retry.status_code == 403
    assert "Idempotent-Replayed" not in retry


def test_401_and_403_are_not_stored_so_the_fixed_client_runs(client: Client) -> None:
    assert post(client, "/private/charges/").status_code == 403
    assert not IdempotencyRecord.objects.exists()

    user = UserFactory()
    user.user_permissions.add(Permission.objects.get(codename="add_charge"))
    client.force_login(user)
    assert post(client, "/private/charges/").status_code == 201
    assert Charge.objects.count() == 1


def test_throttles_run_before_a_replay(client: Client) -> None:
    cache.clear()
    assert post(client, "/throttled/charges/").status_code == 201

    retry = post(client, "/throttled/charges/")

    assert retry.status_code == 429
    assert "Idempotent-Replayed" not in retry


def test_an_unmapped_method_on_a_viewset_is_405_not_500(client: Client) -> None:
    response = client.put(
        "/viewset/charges/", "{}", content_type="application/json", headers={"Idempotency-Key": "k"}
    )

    assert response.status_code == 405
    assert not IdempotencyRecord.objects.exists()


def test_patch_is_guarded_by_the_mixin_and_put_is_not_by_default(client: Client) -> None:
    """ChargeViewSet maps neither; LeasedChargeViewSet lists PUT in idempotent_methods."""
    from tests.views import ChargeViewSet, LeasedChargeViewSet

    assert ChargeViewSet().get_idempotent_methods() == {"POST", "PATCH"}
    assert LeasedChargeViewSet().get_idempotent_methods() == {"POST", "PUT"}


def _refusal_logged(caplog: pytest.LogCaptureFixture) -> str:
    [record] = [r for r in caplog.records if r.name == "django_idempotency"]
    assert record.levelno == logging.ERROR
    assert record.exc_info is None  # One line saying the fix, no traceback.
    return record.getMessage()


def test_idempotent_above_api_view_answers_500_and_never_runs_the_view(
    client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    runs: list[object] = []

    def create(request: object) -> Response:
        runs.append(request)
        return Response({}, status=201)

    # Not raised as the URLconf is imported, which manage.py prints under a traceback: E024
    # reports it (tests/test_checks.py), and a server started without the checks runs nothing.
    view = idempotent(api_view(["POST"])(create))

    class URLs:
        urlpatterns = [path("orders/", view)]

    with override_settings(ROOT_URLCONF=URLs), caplog.at_level(logging.ERROR):
        response = post(client, "/orders/")

    assert_problem(response, 500, "view-misconfigured")
    assert "Retry-After" not in response
    assert runs == []
    assert not IdempotencyRecord.objects.exists()
    # The function the user wrote, not "view", the name of the function @api_view returns.
    assert _refusal_logged(caplog) == (
        "Idempotent view misconfigured: @idempotent was applied to tests.test_drf.create, a view"
        " built by as_view() or @api_view: it would run before authentication, permission and"
        " throttle checks, so each request to it is answered 500 and not run. Place it below"
        " @api_view, or on the handler method."
    )


def test_idempotent_on_a_viewset_class_answers_500_and_says_to_put_it_on_the_actions(
    client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    runs: list[object] = []

    @idempotent
    class OrderViewSet(viewsets.ViewSet):
        def create(self, request: Request) -> Response:
            runs.append(request)
            return Response(status=201)

    router = SimpleRouter()  # Still a class: the router takes it as it is.
    router.register("orders", OrderViewSet, basename="order")

    class URLs:
        urlpatterns = router.urls

    with override_settings(ROOT_URLCONF=URLs), caplog.at_level(logging.ERROR):
        response = post(client, "/orders/")

    assert_problem(response, 500, "view-misconfigured")
    assert runs == []
    assert _refusal_logged(caplog).startswith(
        "Idempotent view misconfigured: @idempotent was applied to the class tests.test_drf."
        "test_idempotent_on_a_viewset_class_answers_500_and_says_to_put_it_on_the_actions."
        "<locals>.OrderViewSet: it cannot guard a class, so each request to it is answered 500"
        " and not run. Put it on the handler methods or actions instead"
    )


def test_idempotent_on_an_async_django_view_class_answers_500_without_running_it(
    client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    runs: list[object] = []

    @idempotent
    class OrderView(View):
        async def post(self, request: HttpRequest) -> HttpResponse:
            runs.append(request)
            return HttpResponse(status=201)

    class URLs:
        urlpatterns = [path("orders/", OrderView.as_view())]

    with override_settings(ROOT_URLCONF=URLs), caplog.at_level(logging.ERROR):
        response = post(client, "/orders/")

    assert_problem(response, 500, "view-misconfigured")
    assert runs == []
    assert "tests.test_drf." in _refusal_logged(caplog)


def test_idempotent_on_something_that_is_not_a_view_is_refused(client: Client) -> None:
    @idempotent
    def not_a_view(value: int) -> int:
        return value

    with pytest.raises(ImproperlyConfigured, match="must decorate a view"):
        not_a_view(1)


# A body a permission parsed before the guard, with a parser of the project's own that reads the
# stream (DRF's JSON and form parsers keep the body): compared as the parser parsed it


class VendorJSONParser(BaseParser):
    media_type = "application/vnd.example+json"

    def parse(self, stream: Any, media_type: Any = None, parser_context: Any = None) -> Any:
        return json.load(stream)


class AmountIsPositive(permissions.BasePermission):
    """Reads the body before the view."""

    def has_permission(self, request: Any, view: Any) -> bool:
        return int(request.data.get("amount", 0)) > 0


class CheckedChargeView(APIView):
    parser_classes = [VendorJSONParser]
    permission_classes = [AmountIsPositive]

    @idempotent
    def post(self, request: Any) -> Response:
        created = Charge.objects.create(reference="checked", amount=request.data["amount"])
        return Response({"id": created.pk}, status=201)


class DecimalJSONParser(BaseParser):
    """Amounts as Decimal, which JSON cannot hold: the fingerprint falls back on their text."""

    media_type = "application/vnd.decimal+json"

    def parse(self, stream: Any, media_type: Any = None, parser_context: Any = None) -> Any:
        return json.load(stream, parse_int=Decimal)


class TextParser(BaseParser):
    """The body as bytes, as a raw parser gives it."""

    media_type = "text/plain"

    def parse(self, stream: Any, media_type: Any = None, parser_context: Any = None) -> Any:
        return stream.read()


class ReadsTheBody(permissions.BasePermission):
    def has_permission(self, request: Any, view: Any) -> bool:
        return bool(request.data)


class ParsedChargeView(APIView):
    parser_classes = [DecimalJSONParser, TextParser]
    permission_classes = [ReadsTheBody]

    @idempotent
    def post(self, request: Any) -> Response:
        created = Charge.objects.create(reference="parsed", amount=1)
        return Response({"id": created.pk}, status=201)


urlpatterns = [
    path("checked/charges/", CheckedChargeView.as_view()),
    path("parsed/charges/", ParsedChargeView.as_view()),
]


def vendor_json(client: Client, body: dict[str, Any]) -> Any:
    return client.post(
        "/checked/charges/",
        json.dumps(body),
        content_type=VendorJSONParser.media_type,
        headers={"Idempotency-Key": "checked-1"},
    )


@pytest.mark.urls(__name__)
@override_settings(IDEMPOTENCY_FINGERPRINT_IGNORE_FIELDS=["nonce"])
def test_a_body_a_permission_parsed_first_is_compared_as_parsed(client: Client) -> None:
    first = vendor_json(client, {"amount": 10, "nonce": "a"})
    again = vendor_json(client, {"nonce": "b", "amount": 10})
    other = vendor_json(client, {"amount": 20, "nonce": "a"})

    assert first.status_code == 201, first.content
    assert again["Idempotent-Replayed"] == "true"
    assert_problem(other, 422, "key-reused")
    assert Charge.objects.count() == 1


@pytest.mark.urls(__name__)
@pytest.mark.parametrize(
    ("media_type", "body", "again", "other"),
    [
        pytest.param(
            VendorJSONParser.media_type,
            {"amount": 10, "nonce": "a"},
            {"nonce": "a", "amount": 10},
            {"amount": 10, "nonce": "b"},  # No field ignored: another nonce is another request.
            id="json",
        ),
        pytest.param(
            DecimalJSONParser.media_type,
            {"amount": 10},
            {"amount": 10},
            {"amount": 11},
            id="not-json-data",
        ),
        pytest.param(TextParser.media_type, "ten", "ten", "eleven", id="raw-bytes"),
    ],
)
def test_a_body_a_parser_consumed_first_still_tells_requests_apart(
    client: Client, media_type: str, body: Any, again: Any, other: Any
) -> None:
    def send(data: Any) -> Any:
        payload = data if isinstance(data, str) else json.dumps(data)
        return client.post(
            "/parsed/charges/"
            if media_type != VendorJSONParser.media_type
            else "/checked/charges/",
            payload,
            content_type=media_type,
            headers={"Idempotency-Key": "parsed-1"},
        )

    first, retry, reused = send(body), send(again), send(other)

    assert first.status_code == 201, first.content
    assert retry["Idempotent-Replayed"] == "true"
    assert_problem(reused, 422, "key-reused")
    assert Charge.objects.count() == 1
