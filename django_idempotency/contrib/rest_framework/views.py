"""The key-status view for DRF: a client asks with its key what became of an earlier request."""

from __future__ import annotations

from typing import Any

from django.http.response import HttpResponseBase
from rest_framework.request import Request
from rest_framework.views import APIView

from django_idempotency.views import key_status, uncached


class KeyStatusAPIView(APIView):
    """``GET`` with an ``Idempotency-Key`` header, after DRF's authentication and permission
    checks (the view's, else the project's defaults): what became of the caller's request with
    that key (`django_idempotency.views.key_status`), its owner resolved from DRF's
    ``request.user`` and ``request.auth`` as the guard resolves it."""

    namespace: str | None = None
    http_method_names = ["get", "head", "options"]

    def get(self, request: Request) -> HttpResponseBase:
        return key_status(request, self.namespace)

    def perform_content_negotiation(self, request: Request, force: bool = False) -> Any:
        # The answers are the stored response's own media type or problem+json, never one of
        # the renderers': an Accept none of them offers must not be refused with a 406.
        return super().perform_content_negotiation(request, force=True)

    def finalize_response(
        self, request: Request, response: Any, *args: Any, **kwargs: Any
    ) -> Any:  # DRF's stubs say Response; it is any HttpResponseBase here (a replay, a problem).
        return uncached(super().finalize_response(request, response, *args, **kwargs))
