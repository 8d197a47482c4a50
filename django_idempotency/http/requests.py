"""Read a Django request, or a framework's wrapping one: its fingerprint, its kept body."""

from __future__ import annotations

import hashlib
from io import BytesIO
from typing import Any

from django.conf import settings
from django.http import HttpRequest, QueryDict

from django_idempotency.conf import conf
from django_idempotency.core.fingerprint import (
    canonical_body,
    canonical_form,
    canonical_multipart,
    fingerprint,
)
from django_idempotency.http import frameworks

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE"})
# The form field Django's CSRF protection reads (a name Django fixes, no setting changes it). A
# form re-rendered after a validation error carries a new token: its retry is the same request.
CSRF_FIELD = "csrfmiddlewaretoken"
_FORM = "application/x-www-form-urlencoded"
_MULTIPART = "multipart/form-data"


def django_request(request: Any) -> HttpRequest:
    """The underlying `HttpRequest`, whether given that or a framework's request wrapping it
    (a DRF `Request`: see `http.frameworks`)."""
    if isinstance(request, HttpRequest):
        return request
    framework = frameworks.current
    inner = None if framework is None else framework.http_request(request)
    return request if inner is None else inner


def is_request(value: Any) -> bool:
    """An HttpRequest, or a framework's request wrapping one."""
    if isinstance(value, HttpRequest):
        return True
    framework = frameworks.current
    return framework is not None and framework.http_request(value) is not None


def request_fingerprint(request: Any) -> str:
    """The default IDEMPOTENCY_FINGERPRINT: method, path with query, canonical body.

    Every guarded method's body counts, in every content type, whether or not middleware (CSRF)
    or a parser already read the stream.
    """
    http_request = django_request(request)
    ignore = conf.FINGERPRINT_IGNORE_FIELDS
    media_type = http_request.content_type or ""
    if media_type == _MULTIPART:
        body = _canonical_multipart(http_request)
    elif media_type == _FORM:
        body = _canonical_form(http_request)
    else:
        raw = _readable_body(http_request)
        if raw is not None:
            body = canonical_body(media_type, raw, ignore)
        elif request is not http_request:  # The framework's parser consumed the stream.
            body = frameworks.framework().parsed_body(request, media_type)
        else:
            body = b""
    return fingerprint(http_request.method or "", http_request.get_full_path(), body)


def keep_body_readable(http_request: HttpRequest) -> None:
    """Read and keep a body that fits in memory before a framework's parser may consume its
    stream (as DRF's CSRF check does), so the fingerprint sees its exact bytes."""
    if not _stream_read(http_request) and _fits_in_memory(http_request):
        http_request.body  # noqa: B018 - reading it is the point.


def _readable_body(http_request: HttpRequest) -> bytes | None:
    """The body, read once and kept for the view; None when the stream was consumed unread."""
    body: bytes | None = getattr(http_request, "_body", None)
    if body is not None:
        return body
    if _stream_read(http_request):
        return None
    return http_request.body


def _stream_read(http_request: HttpRequest) -> bool:
    # Django's own request classes set it, and its `body` reads it so too.
    return bool(http_request._read_started)  # type: ignore[attr-defined]


def _canonical_form(http_request: HttpRequest) -> bytes:
    """Form fields as Django parses them, with its limit on their number, for every method."""
    ignore = _ignored_form_fields()
    raw = _readable_body(http_request)
    if http_request.method == "POST" or raw is None:
        data = http_request.POST  # Parsed as for a multipart body (below).
    else:
        try:
            raw.decode()
        except UnicodeDecodeError:  # Not text: the raw bytes are all there is to compare.
            return raw
        data = QueryDict(raw, encoding=http_request.encoding)
    return canonical_form(_pairs(data), ignore)


def _canonical_multipart(http_request: HttpRequest) -> bytes:
    """Fields and file digests, parsed as Django parses a POST, for every method."""
    raw = _readable_body(http_request) if _fits_in_memory(http_request) else None
    if raw is not None and http_request.method != "POST":
        # Django parses forms for POST only; a PATCH's fields count all the same.
        data, uploads = http_request.parse_file_upload(http_request.META, BytesIO(raw))
    else:
        if raw is None and not _stream_read(http_request):
            # Too large to hold: parse from the stream as Django does for a POST, and keep the
            # result where Django (and a framework reading its request) looks for it.
            parsed = http_request.parse_file_upload(http_request.META, http_request)
            http_request._post, http_request._files = parsed  # type: ignore[attr-defined]
        # Django's parse of a POST, ours of a large body (above), or what a framework's parser
        # made of a stream it read first (DRF copies its parse of a form onto the HttpRequest).
        data, uploads = http_request.POST, http_request.FILES
    files = []
    for name, items in uploads.lists():
        for upload in items:
            digest = hashlib.sha256()
            for chunk in upload.chunks():
                digest.update(chunk)
            upload.seek(0)  # The view reads the file next.
            files.append((name, upload.name or "", digest.hexdigest()))
    return canonical_multipart(_pairs(data), files, _ignored_form_fields())


def _ignored_form_fields() -> frozenset[str]:
    """IDEMPOTENCY_FINGERPRINT_IGNORE_FIELDS, the CSRF token and the key's own field
    (IDEMPOTENCY_FORM_FIELD), which only forms carry."""
    own = (CSRF_FIELD,) if conf.FORM_FIELD is None else (CSRF_FIELD, conf.FORM_FIELD)
    return frozenset(conf.FINGERPRINT_IGNORE_FIELDS).union(own)


def _fits_in_memory(http_request: HttpRequest) -> bool:
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    try:
        length = int(http_request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        return False
    return limit is None or length <= limit


def _pairs(data: Any) -> list[tuple[str, str]]:
    return [(name, value) for name, values in data.lists() for value in values]
