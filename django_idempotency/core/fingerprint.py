"""Canonical request fingerprints: equal requests hash equal, whatever their incidental encoding."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Iterable
from typing import Any
from urllib.parse import parse_qsl, urlencode


def canonical_json(value: Any) -> bytes:
    """JSON with object keys sorted recursively, arrays in order, and no whitespace."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    # "\ud800" is valid JSON but a lone surrogate in Python: keep it rather than fail.
    return text.encode("utf-8", "surrogatepass")


def is_json_media_type(media_type: str) -> bool:
    return media_type == "application/json" or media_type.endswith("+json")


def canonical_body(media_type: str, body: bytes, ignore_fields: Collection[str] = ()) -> bytes:
    """The body in canonical form: JSON canonicalised, form data sorted, anything else raw."""
    if is_json_media_type(media_type):
        try:
            data = json.loads(body)
        except ValueError:
            return body  # Not valid JSON: the raw bytes are all there is to compare.
        if ignore_fields and isinstance(data, dict):
            data = {name: item for name, item in data.items() if name not in ignore_fields}
        return canonical_json(data)
    if media_type == "application/x-www-form-urlencoded":
        try:
            text = body.decode()
        except UnicodeDecodeError:
            return body
        pairs = parse_qsl(text, keep_blank_values=True)
        return urlencode(sorted(pair for pair in pairs if pair[0] not in ignore_fields)).encode()
    return body


def canonical_multipart(
    fields: Iterable[tuple[str, str]],
    files: Iterable[tuple[str, str, str]],
    ignore_fields: Collection[str] = (),
) -> bytes:
    """Multipart bodies by their fields and file digests, not by the random boundary.

    ``files`` holds ``(field name, file name, SHA-256 hex digest of the content)`` triples.
    """
    return canonical_json(
        {
            "fields": sorted([name, value] for name, value in fields if name not in ignore_fields),
            "files": sorted([name, filename, digest] for name, filename, digest in files),
        }
    )


def fingerprint(method: str, path: str, body: bytes) -> str:
    """SHA-256 (hex) over the method, the path with its query string, and the canonical body."""
    digest = hashlib.sha256()
    for part in (method.upper().encode(), path.encode()):
        digest.update(len(part).to_bytes(4, "big"))
        digest.update(part)
    digest.update(body)
    return digest.hexdigest()
