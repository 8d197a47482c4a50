"""Routes and views for the HTTP property tests: a plain Django view and a DRF view, guarded."""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Mapping
from typing import IO, Any

from django.core.files.uploadedfile import UploadedFile
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import path
from django.utils.datastructures import MultiValueDict
from django.views.decorators.csrf import ensure_csrf_cookie
from django.views.decorators.http import require_GET, require_http_methods
from rest_framework.authentication import SessionAuthentication
from rest_framework.exceptions import ParseError
from rest_framework.parsers import BaseParser, FormParser, JSONParser, MultiPartParser
from rest_framework.permissions import IsAuthenticated
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from django_idempotency import idempotent
from django_idempotency.contrib.rest_framework import IdempotencyMixin
from tests.models import Charge

GUARDED_METHODS = ("POST", "PUT", "PATCH", "DELETE")
FORM = "application/x-www-form-urlencoded"
MULTIPART = "multipart/form-data"
CHARGE_PREFIX = "property:"

# How often each view really ran, by the raw Idempotency-Key header: the tests reset it per
# example. A counter, not only the Charge rows, so that a run whose writes rolled back still counts.
EXECUTIONS: Counter[str] = Counter()


def _execute(request: Any, target: str) -> int:
    raw_key = str(request.META.get("HTTP_IDEMPOTENCY_KEY", ""))
    EXECUTIONS[raw_key] += 1
    # A database write in the guard's transaction, as a real view would make.
    Charge.objects.create(reference=CHARGE_PREFIX + target, amount=EXECUTIONS[raw_key])
    return EXECUTIONS[raw_key]


def _upload_digest(upload: UploadedFile[Any]) -> str:
    digest = hashlib.sha256()
    for chunk in upload.chunks():
        digest.update(chunk)
    upload.seek(0)
    return f"{upload.name}:{digest.hexdigest()}"


def _form_digest(fields: MultiValueDict[str, Any], files: MultiValueDict[str, Any]) -> str:
    """What a view sees of a form: every field's values in order, every file's content."""
    seen: dict[str, list[str]] = {}
    for name, values in fields.lists():
        seen.setdefault(name, []).extend(
            _upload_digest(value) if isinstance(value, UploadedFile) else str(value)
            for value in values
        )
    for name, uploads in files.lists():
        seen.setdefault(name, []).extend(_upload_digest(upload) for upload in uploads)
    return hashlib.sha256(json.dumps(sorted(seen.items())).encode()).hexdigest()


def _status(method: str | None) -> int:
    return 201 if method == "POST" else 200


@ensure_csrf_cookie
@require_GET
def csrf_cookie_view(request: HttpRequest) -> HttpResponse:
    """Hands out the csrftoken cookie, as a page with a form would."""
    return JsonResponse({"csrf": "set"})


@require_http_methods(list(GUARDED_METHODS))
@idempotent
def plain_view(request: HttpRequest) -> HttpResponse:
    execution = _execute(request, "plain")
    if request.method == "POST" and request.content_type in (FORM, MULTIPART):
        # CSRF already parsed a POST form; reading request.body now would raise.
        digest = _form_digest(request.POST, request.FILES)
    else:
        digest = hashlib.sha256(request.body).hexdigest()
    response = JsonResponse(
        {
            "target": "plain",
            "method": request.method,
            "path": request.get_full_path(),
            "execution": execution,
            "digest": digest,
        },
        status=_status(request.method),
    )
    response["X-Execution"] = str(execution)
    return response


class RawBodyParser(BaseParser):
    """application/octet-stream: the body as bytes, for the view to hash."""

    media_type = "application/octet-stream"

    def parse(
        self,
        stream: IO[Any],
        media_type: str | None = None,
        parser_context: Mapping[str, Any] | None = None,
    ) -> Any:  # DRF hands the view whatever a parser returns as request.data.
        return stream.read()


class JSONBodyParser(JSONParser):
    """DRF's JSONParser, with a nesting too deep to parse answered 400 instead of 500.

    DRF lets the RecursionError escape, and for a POST it does so inside its CSRF check, before
    any idempotency guard runs: that 500 is DRF's, not the guard's under test.
    """

    def parse(
        self,
        stream: IO[Any],
        media_type: str | None = None,
        parser_context: Mapping[str, Any] | None = None,
    ) -> Any:
        try:
            return super().parse(stream, media_type, parser_context)
        except RecursionError as exc:
            raise ParseError("JSON nested too deeply.") from exc


class PropertyAPIView(IdempotencyMixin, APIView):
    idempotent_methods = GUARDED_METHODS
    # SessionAuthentication enforces CSRF for a logged-in user, as a browser client meets it.
    authentication_classes = [SessionAuthentication]
    permission_classes = [IsAuthenticated]
    parser_classes = [JSONBodyParser, FormParser, MultiPartParser, RawBodyParser]
    renderer_classes = [JSONRenderer]

    def _answer(self, request: Request) -> Response:
        execution = _execute(request, "drf")
        data = request.data
        if isinstance(data, bytes):
            digest = hashlib.sha256(data).hexdigest()
        elif isinstance(data, MultiValueDict):  # A form: a QueryDict, with any files in it.
            digest = _form_digest(data, request.FILES)
        else:
            digest = hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()
        body = {
            "target": "drf",
            "method": request.method,
            "path": request.get_full_path(),
            "execution": execution,
            "digest": digest,
        }
        return Response(
            body, status=_status(request.method), headers={"X-Execution": str(execution)}
        )

    def post(self, request: Request) -> Response:
        return self._answer(request)

    def put(self, request: Request) -> Response:
        return self._answer(request)

    def patch(self, request: Request) -> Response:
        return self._answer(request)

    def delete(self, request: Request) -> Response:
        return self._answer(request)


urlpatterns = [
    path("csrf/", csrf_cookie_view),
    path("plain/", plain_view),
    path("plain/again/", plain_view),  # The same view under another path: a different request.
    path("drf/", PropertyAPIView.as_view()),
    path("drf/again/", PropertyAPIView.as_view()),
]
