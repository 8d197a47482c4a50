"""Stored responses shown to people: headers as a table, bodies escaped, pretty or cut."""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING

from django.contrib import admin
from django.utils import formats
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext, ngettext

from django_idempotency.conf import conf
from django_idempotency.core.fingerprint import is_json_media_type
from django_idempotency.core.outcomes import StoredResponse
from django_idempotency.encryption import UnreadableResponse, is_sealed, unseal
from django_idempotency.models import IdempotencyRecord

if TYPE_CHECKING:
    RecordAdminBase = admin.ModelAdmin[IdempotencyRecord]
else:
    RecordAdminBase = admin.ModelAdmin

logger = logging.getLogger("django_idempotency")


BODY_PREVIEW_CHARS = 10 * 1024
# Larger bodies are previewed raw: parsing megabytes of JSON only to show its first 10 kB would
# make the page slow for nothing.
PRETTY_PRINT_MAX_BYTES = 1024 * 1024


def _header_pairs(obj: IdempotencyRecord) -> list[tuple[str, str]]:
    headers = obj.response_headers if isinstance(obj.response_headers, list) else []
    return [(str(pair[0]), str(pair[1])) for pair in headers if len(pair) == 2]


# Who may read a response stored encrypted (IDEMPOTENCY_ENCRYPTION_KEYS) in the admin.
DECRYPT_PERMISSION = "django_idempotency.view_decrypted_response"


def _content_type(headers: list[tuple[str, str]]) -> str:
    for name, value in headers:
        if name.lower() == "content-type":
            return value
    return ""


def _stored(obj: IdempotencyRecord) -> StoredResponse:
    body = obj.response_body
    return StoredResponse(
        obj.response_status or 0,
        _header_pairs(obj),
        b"" if body is None else bytes(body),
        obj.response_reason,
    )


def is_encrypted(obj: IdempotencyRecord) -> bool:
    return is_sealed(_stored(obj))


def may_decrypt(obj: IdempotencyRecord) -> bool:
    """Set by the admin's `get_object` from the viewer's permission; False when unknown."""
    return getattr(obj, "may_decrypt", False) is True


def opened(obj: IdempotencyRecord) -> StoredResponse | None:
    """The stored response as the view sent it, or None when it is encrypted and the viewer
    may not read it, or no configured key decrypts it."""
    stored = _stored(obj)
    if not is_sealed(stored):
        return stored
    if not may_decrypt(obj):
        return None
    try:
        return unseal(stored, conf.ENCRYPTION_KEYS)
    except UnreadableResponse:
        return None


def encrypted_note(obj: IdempotencyRecord) -> SafeString:
    """What the admin shows of an encrypted response, in place of it or above it."""
    if not may_decrypt(obj):
        text = gettext(
            "Encrypted at rest. Reading it needs the permission “Can view decrypted stored "
            "responses”."
        )
    elif opened(obj) is None:
        text = gettext(
            "Encrypted at rest with a key no longer in IDEMPOTENCY_ENCRYPTION_KEYS: it cannot "
            "be decrypted."
        )
    else:
        text = gettext("Encrypted at rest; decrypted for you.")
    return format_html('<p class="idempotency-encrypted">{}</p>', text)


def _is_text(media_type: str) -> bool:
    return (
        media_type.startswith("text/")
        or media_type.endswith("+xml")
        or media_type
        in {"application/xml", "application/javascript", "application/x-www-form-urlencoded"}
    )


def render_body(body: bytes, content_type: str) -> SafeString:
    """A stored body for people: JSON indented, text as is, binary as its size and type.

    Everything shown is escaped; a long body is cut to its first 10 kB, with its full size.
    """
    size = len(body)
    media_type, _sep, parameters = content_type.partition(";")
    media_type = media_type.strip().lower()
    text = _decoded(body, media_type, _charset(parameters))
    if text is None:
        return format_html(
            '<p class="idempotency-binary">{}</p>',
            ngettext("%(count)s byte of %(type)s", "%(count)s bytes of %(type)s", size)
            % {
                "count": formats.number_format(size, force_grouping=True),
                "type": media_type or gettext("unknown type"),
            },
        )
    if not text:
        return format_html('<p class="idempotency-empty">{}</p>', gettext("Empty body."))
    if len(text) <= BODY_PREVIEW_CHARS:
        return format_html('<pre class="idempotency-body">{}</pre>', text)
    note = ngettext(
        "Truncated to its first %(shown)s characters; the full body is %(count)s byte.",
        "Truncated to its first %(shown)s characters; the full body is %(count)s bytes.",
        size,
    ) % {
        "shown": formats.number_format(BODY_PREVIEW_CHARS, force_grouping=True),
        "count": formats.number_format(size, force_grouping=True),
    }
    return format_html(
        '<pre class="idempotency-body">{}…</pre><p class="help idempotency-truncated">{}</p>',
        text[:BODY_PREVIEW_CHARS],
        note,
    )


def _charset(parameters: str) -> str:
    for parameter in parameters.split(";"):
        name, _sep, value = parameter.partition("=")
        if name.strip().lower() == "charset" and value.strip():
            return value.strip().strip('"')
    return "utf-8"


def _decoded(body: bytes, media_type: str, charset: str) -> str | None:
    """The body as text to show (JSON indented), or None if it is binary."""
    looks_like_json = is_json_media_type(media_type) or (
        not media_type and body.lstrip()[:1] in (b"{", b"[")
    )
    if looks_like_json and len(body) <= PRETTY_PRINT_MAX_BYTES:
        try:
            return json.dumps(json.loads(body), indent=2, ensure_ascii=False)
        except ValueError:
            pass  # Not valid JSON after all: show it as text, or as binary.
        except RecursionError:
            pass  # Nested too deep to parse or indent within the stack: show it as stored.
    if media_type and not (looks_like_json or _is_text(media_type)):
        return None
    # A large body is only previewed, so decode just enough of it (4 bytes per character at most).
    head = body if len(body) <= PRETTY_PRINT_MAX_BYTES else body[: BODY_PREVIEW_CHARS * 4 + 4]
    if not media_type and b"\x00" in head[:8192]:
        return None  # Untyped, with NUL bytes: binary, as git decides.
    try:
        return head.decode(charset)
    except LookupError:
        return None  # An unknown charset: show the size rather than guess.
    except UnicodeDecodeError as exc:
        if head is not body and exc.start >= len(head) - 4:
            return head[: exc.start].decode(charset)  # The cut fell inside a character.
        return None
