"""One charge-creating endpoint in every shape of view `@idempotent` supports."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import time
from typing import Any

from asgiref.sync import sync_to_async
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.views import View
from django.views.decorators.csrf import csrf_exempt
from rest_framework import permissions, viewsets
from rest_framework.decorators import action, api_view
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.throttling import AnonRateThrottle
from rest_framework.views import APIView

from django_idempotency import idempotent
from django_idempotency.contrib.rest_framework import IdempotencyMixin
from django_idempotency.webhooks import StandardWebhooks
from tests.models import Charge


class OneAMinute(AnonRateThrottle):
    rate = "1/min"


def _payload(request: Any) -> dict[str, Any]:
    if isinstance(request, Request):
        return dict(request.data)
    try:
        return json.loads(request.body or b"{}")  # type: ignore[no-any-return]
    except ValueError:
        return dict(request.POST.items())


def charge(request: Any) -> tuple[int, dict[str, Any]]:
    """Create a charge, or act out the outcome the test asked for in the X-Outcome header.

    The header is not part of the fingerprint, so a retry without it is the same request.
    """
    data = _payload(request)
    if data.get("sleep"):
        time.sleep(float(data["sleep"]))
    reference = str(request.headers.get("Idempotency-Key", ""))
    outcome = request.headers.get("X-Outcome", "created")
    if outcome == "invalid":
        return 400, {"error": "invalid amount"}
    created = Charge.objects.create(reference=reference, amount=int(data.get("amount", 0)))
    if outcome == "raise":
        raise RuntimeError("the view crashed after writing")
    if outcome == "declined":
        return 402, {"id": created.pk, "declined": True}
    if outcome == "server-error":
        return 500, {"error": "upstream failed"}
    return 201, {"id": created.pk, "amount": created.amount}


def _django_response(status: int, body: dict[str, Any]) -> HttpResponse:
    response = JsonResponse(body, status=status)
    if status == 201:
        response["Location"] = f"/charges/{body['id']}"
        response.set_cookie("session-hint", "secret")
    return response


def _drf_response(status: int, body: dict[str, Any]) -> Response:
    headers = {"Location": f"/charges/{body['id']}"} if status == 201 else None
    response = Response(body, status=status, headers=headers)
    if status == 201:
        response.set_cookie("session-hint", "secret")
    return response


@idempotent
def function_view(request: HttpRequest) -> HttpResponse:
    if request.method == "GET":
        return JsonResponse({"count": Charge.objects.count()})
    return _django_response(*charge(request))


class ClassView(View):
    @idempotent
    def post(self, request: HttpRequest) -> HttpResponse:
        return _django_response(*charge(request))

    def get(self, request: HttpRequest) -> HttpResponse:
        return JsonResponse({"count": Charge.objects.count()})


@api_view(["GET", "POST"])
@idempotent
def drf_function_view(request: Request) -> Response:
    if request.method == "GET":
        return Response({"count": Charge.objects.count()})
    return _drf_response(*charge(request))


class DrfAPIView(APIView):
    @idempotent
    def post(self, request: Request) -> Response:
        return _drf_response(*charge(request))

    def get(self, request: Request) -> Response:
        return Response({"count": Charge.objects.count()})


class ChargeViewSet(IdempotencyMixin, viewsets.ViewSet):
    """The mixin guards create (POST); `refund` opts in on its own with a decorator."""

    def create(self, request: Request) -> Response:
        return _drf_response(*charge(request))

    def list(self, request: Request) -> Response:
        return Response({"count": Charge.objects.count()})

    @idempotent(namespace="refunds")
    @action(detail=False, methods=["post"])
    def refund(self, request: Request) -> Response:
        return _drf_response(*charge(request))


class CanCharge(permissions.BasePermission):
    def has_permission(self, request: Any, view: Any) -> bool:
        return bool(request.user.has_perm("tests.add_charge"))


class PrivateChargeViewSet(IdempotencyMixin, viewsets.ViewSet):
    """Only users holding tests.add_charge may charge; checked before any replay."""

    permission_classes = [permissions.IsAuthenticated, CanCharge]

    def create(self, request: Request) -> Response:
        return _drf_response(*charge(request))


class ThrottledChargeViewSet(IdempotencyMixin, viewsets.ViewSet):
    """One request a minute: a retry is throttled before it could be replayed."""

    throttle_classes = [OneAMinute]

    def create(self, request: Request) -> Response:
        return _drf_response(*charge(request))


class LeasedChargeViewSet(IdempotencyMixin, viewsets.ViewSet):
    idempotency_mode = "lease"
    idempotent_methods = ("POST", "PUT")

    def create(self, request: Request) -> Response:
        return _drf_response(*charge(request))


@idempotent
async def async_view(request: HttpRequest) -> HttpResponse:
    if request.method == "GET":
        return JsonResponse({"count": await Charge.objects.acount()})
    delay = float(_payload(request).get("async_sleep", 0))
    if delay:
        await asyncio.sleep(delay)
    status, body = await sync_to_async(charge)(request)
    return _django_response(status, body)


class AsyncClassView(View):
    """An async class-based view; its idempotency_* attributes apply as on a DRF view."""

    idempotency_namespace = "async-cbv"

    @idempotent
    async def post(self, request: HttpRequest) -> HttpResponse:
        status, body = await sync_to_async(charge)(request)
        return _django_response(status, body)

    async def get(self, request: HttpRequest) -> HttpResponse:
        return JsonResponse({"count": await Charge.objects.acount()})


@idempotent
def binary_view(request: HttpRequest) -> HttpResponse:
    Charge.objects.create(reference=request.headers["Idempotency-Key"], amount=0)
    return HttpResponse(bytes(range(256)) * 4, content_type="application/octet-stream")


@idempotent
def sized_view(request: HttpRequest) -> HttpResponse:
    """A body of as many bytes as the X-Body-Bytes header asks for."""
    Charge.objects.create(reference=request.headers["Idempotency-Key"], amount=0)
    size = int(request.headers["X-Body-Bytes"])
    return HttpResponse(b"\x00'x" * (size // 3) + b"x" * (size % 3), content_type="text/plain")


@idempotent
def streaming_view(request: HttpRequest) -> StreamingHttpResponse:
    Charge.objects.create(reference=request.headers["Idempotency-Key"], amount=0)
    return StreamingHttpResponse(iter([b"a", b"b"]))


WEBHOOK_SECRET = "whsec_" + base64.b64encode(b"tests-only-webhook-signing-key").decode()


@csrf_exempt
@idempotent(
    header="webhook-id",
    namespace="webhooks",
    required=True,
    verify=StandardWebhooks(WEBHOOK_SECRET, tolerance=60),
)
def webhook_view(request: HttpRequest) -> HttpResponse:
    """A Standard Webhooks receiver: each delivery (webhook-id) is handled once."""
    event = json.loads(request.body)
    Charge.objects.create(reference=f"event:{event['id']}", amount=event["amount"])
    return JsonResponse({"received": event["id"]}, status=202)


def unguarded_view(request: HttpRequest) -> HttpResponse:
    """Not idempotent on purpose: every POST creates a charge, whatever key it carries."""
    return _django_response(*charge(request))


@idempotent
def form_view(request: HttpRequest) -> HttpResponse:
    """A plain form endpoint for every unsafe method: it reads the form as Django parsed it
    (a POST's; other methods' bodies Django leaves unparsed) and never `request.body`."""
    amount = request.POST.get("amount", "0") if request.method == "POST" else "0"
    uploads = sum(len(files) for _, files in request.FILES.lists())
    created = Charge.objects.create(
        reference=request.headers.get("Idempotency-Key", ""), amount=int(amount or 0)
    )
    return JsonResponse({"id": created.pk, "uploads": uploads}, status=201)


@csrf_exempt
@idempotent
def upload_view(request: HttpRequest) -> HttpResponse:
    """Answers with what it read: each upload's name and the SHA-256 of its content, the form's
    fields (Django parses them for a POST, and for any method whose body the guard parsed), and,
    asked by X-Read-Body, the length of `request.body`."""
    return JsonResponse(_what_was_uploaded(request), status=201)


class UploadViewSet(IdempotencyMixin, viewsets.ViewSet):
    """upload_view behind DRF: its session authentication checks CSRF, which reads a form."""

    def create(self, request: Request) -> Response:
        return Response(_what_was_uploaded(request), status=201)


def _what_was_uploaded(request: Any) -> dict[str, Any]:
    uploads = {
        field: [[f.name, hashlib.sha256(f.read()).hexdigest()] for f in files]
        for field, files in request.FILES.lists()
    }
    answer: dict[str, Any] = {"uploads": uploads, "fields": dict(request.POST.lists())}
    if "X-Read-Body" in request.headers:
        answer["body"] = len(request.body)
    created = Charge.objects.create(reference=request.headers.get("Idempotency-Key", ""), amount=0)
    return {"id": created.pk, **answer}


@idempotent
def answer_view(request: HttpRequest) -> HttpResponse:
    """Answers with the status and reason phrase the X-Answer header asks for ("204 Done"),
    with no body if X-Empty is sent, and echoes an X-Tag header."""
    status, _, reason = request.headers.get("X-Answer", "200").partition(" ")
    Charge.objects.create(reference=request.headers.get("Idempotency-Key", ""), amount=0)
    empty = status in ("204", "304") or "X-Empty" in request.headers
    body = b"" if empty else b"answered"
    response = HttpResponse(body, status=int(status), reason=reason or None)
    if "X-Tag" in request.headers:
        response["X-Tag"] = request.headers["X-Tag"]
    return response
