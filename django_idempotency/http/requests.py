"""Read a Django (or DRF) request: its key header, its fingerprint, its owner."""

from __future__ import annotations

import hashlib
from typing import Any

from django.conf import settings
from django.http import HttpRequest

from django_idempotency.conf import conf
from django_idempotency.core.fingerprint import canonical_body, canonical_multipart, fingerprint

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE"})


def django_request(request: Any) -> HttpRequest:
    """The underlying `HttpRequest`, whether given that or a DRF `Request` wrapping it."""
    inner = getattr(request, "_request", None)
    return inner if isinstance(inner, HttpRequest) else request


def is_request(value: Any) -> bool:
    return isinstance(value, HttpRequest) or isinstance(
        getattr(value, "_request", None), HttpRequest
    )


def _keep_body_readable(http_request: HttpRequest) -> None:
    """Cache a small multipart body first, so the view may still read ``request.body``.

    Parsing ``POST``/``FILES`` straight from the stream would use it up; bodies too large to
    hold in memory are parsed from the stream as Django would.
    """
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    try:
        length = int(http_request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        return
    if limit is None or length <= limit:
        http_request.body  # noqa: B018 - reading it is the point.


def request_fingerprint(request: Any) -> str:
    """The default IDEMPOTENCY_FINGERPRINT: method, path with query, canonical body."""
    http_request = django_request(request)
    ignore = conf.FINGERPRINT_IGNORE_FIELDS
    if http_request.content_type == "multipart/form-data":
        _keep_body_readable(http_request)
        fields = [(name, value) for name, values in http_request.POST.lists() for value in values]
        files = []
        for name, uploads in http_request.FILES.lists():
            for upload in uploads:
                digest = hashlib.sha256()
                for chunk in upload.chunks():
                    digest.update(chunk)
                upload.seek(0)  # The view reads the file next.
                files.append((name, upload.name or "", digest.hexdigest()))
        body = canonical_multipart(fields, files, ignore)
    else:
        body = canonical_body(http_request.content_type or "", http_request.body, ignore)
    return fingerprint(http_request.method or "", http_request.get_full_path(), body)
